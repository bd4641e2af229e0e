"""Fixtures for the serve tests: a fake upstream and ``serve`` itself, each a real uvicorn server
on a free loopback port, stopped when the test ends; the clients are the official SDKs."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import uvicorn

from ctxkernel.serve.app import create_app
from ctxkernel.serve.config import ServeConfig


def _load(name: str, filename: str) -> Any:
    # helper modules are plain files next to this one; test modules import them by these names
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


FakeUpstream = _load("serve_fake_upstream", "fake_upstream.py").FakeUpstream
_load("serve_clients", "serve_clients.py")


class ServerThread:
    """A uvicorn server in a thread, on 127.0.0.1 and a port the OS picked."""

    def __init__(self, app: Any, *, keep_alive: float = 5) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, timeout_keep_alive=keep_alive
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()


PROFILE = """
[profile]
strategies = {strategies}
{extra_profile}

[model]
provider = "openai"
name = "fake-model"
context_window = {window}
reserved_output_tokens = {reserved}

[store]
backend = "{backend}"
path = "{home}"
{dsn}
{tables}
"""


def write_profile(
    tmp_path: Path,
    *,
    strategies: str = '["basic"]',
    window: int = 8000,
    reserved: int = 1000,
    backend: str = "jsonl",
    dsn: str | None = None,
    tables: str = "",
    extra_profile: str = "",
    name: str = "serve-test",
) -> Path:
    home = tmp_path / "home"
    path = tmp_path / f"{name}.toml"
    path.write_text(
        PROFILE.format(
            strategies=strategies,
            window=window,
            reserved=reserved,
            backend=backend,
            home=home,
            dsn=f'dsn = "{dsn}"' if dsn else "",
            tables=tables,
            extra_profile=extra_profile,
        )
    )
    return path


@pytest.fixture
def fake() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    yield from _fake()


@pytest.fixture
def patient_fake() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    """The fake upstream keeping an idle connection open 10 minutes instead of uvicorn's 5 s: for
    a test whose request takes longer than that before it calls the upstream (under
    ``tracemalloc``), so that serve's pooled connection from the request before is still open."""
    yield from _fake(keep_alive=600)


def _fake(keep_alive: float = 5) -> Iterator[tuple[FakeUpstream, ServerThread]]:
    upstream = FakeUpstream()
    server = ServerThread(upstream.app, keep_alive=keep_alive)
    try:
        yield upstream, server
    finally:
        server.stop()


@pytest.fixture
def on_loopback() -> Iterator[Callable[[Any], str]]:
    """Serve any ASGI app on 127.0.0.1 for the test; gives its base URL."""
    servers: list[ServerThread] = []

    def start(app: Any) -> str:
        servers.append(ServerThread(app))
        return servers[-1].url

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


class Serve:
    """``serve`` under test, restartable (a restart is a new app and server on the same store)."""

    def __init__(self, upstream_url: str, profile: Path, **config: Any) -> None:
        self.upstream_url = upstream_url
        self.profile = profile
        self.config = config
        self.server: ServerThread | None = None
        self.start()

    def start(self) -> None:
        config = ServeConfig(
            profile=str(self.profile),
            upstream=f"{self.upstream_url}/v1",
            anthropic_upstream=self.upstream_url,
            **self.config,
        )
        self.app = create_app(config)
        self.server = ServerThread(self.app)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def proxy(self) -> Any:
        return self.app.state.proxy

    def openai(self, session: str | None = None, api_key: str = "sk-test-client", **kwargs: Any) -> Any:
        headers = {"X-Ctxkernel-Session": session} if session else {}
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key=api_key,
            default_headers=headers,
            max_retries=0,
            timeout=60,
            **kwargs,
        )

    def anthropic(self, session: str | None = None, **kwargs: Any) -> Any:
        headers = {"X-Ctxkernel-Session": session} if session else {}
        return anthropic.Anthropic(
            base_url=self.url,
            api_key="sk-ant-test-client",
            default_headers=headers,
            max_retries=0,
            timeout=60,
            **kwargs,
        )


@pytest.fixture
def serve_factory(fake, tmp_path) -> Iterator[Callable[..., Serve]]:
    _, server = fake
    started: list[Serve] = []

    def make(profile: Path | None = None, **config: Any) -> Serve:
        serve = Serve(server.url, profile or write_profile(tmp_path), **config)
        started.append(serve)
        return serve

    try:
        yield make
    finally:
        for serve in started:
            serve.stop()

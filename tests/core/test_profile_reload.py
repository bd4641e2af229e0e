"""Settings follow the profile file the session runs, from the next step, without a new Kernel
(issue #15): an edited threshold applies, a broken edit or a new strategy set is refused loudly and
the running settings stay."""

from __future__ import annotations

import os
from pathlib import Path

from structlog.testing import capture_logs

from ctxkernel import Kernel, Message

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> None:
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if before:  # a coarse file-system clock must still see a new stamp
        os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def handoff_profile(tmp_path: Path, **handoff: str) -> Path:
    text = (REPO / "profiles" / "handoff.toml").read_text()
    text = text.replace("context_window = 128000", "context_window = 8000").replace(
        "reserved_output_tokens = 8192", "reserved_output_tokens = 1000"
    )
    for key, value in handoff.items():
        lines = [line for line in text.splitlines() if not line.startswith(f"{key} =")]
        at = lines.index("[strategies.handoff]") + 1
        lines.insert(at, f"{key} = {value}")
        text = "\n".join(lines) + "\n"
    path = tmp_path / "live.toml"
    write(path, text)
    return path


def turn(session, text: str) -> None:
    session.user(text)
    session.prepare_request()
    session.commit_reply(Message.assistant("ok " * 60))
    session.end_turn()


def test_an_edited_setting_applies_at_the_next_step_without_a_new_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    path = handoff_profile(tmp_path)
    kernel = Kernel.from_profile(path)
    session = kernel.open_session()
    turn(session, "hello there, build the parser")
    assert session.settings("handoff").enabled is True
    write(path, path.read_text().replace("enabled = true", "enabled = false"))
    session.user("go on")
    session.prepare_request()
    assert session.settings("handoff").enabled is False
    assert kernel.profile.strategy_settings("handoff")["enabled"] is False


def test_a_broken_edit_is_logged_and_the_running_settings_stay(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    path = handoff_profile(tmp_path)
    kernel = Kernel.from_profile(path)
    session = kernel.open_session()
    turn(session, "build the parser")
    for broken, said in (
        (path.read_text().replace("handoff_max_chars = 16000", "handoff_max_chars = 5"), "handoff_max_chars"),
        (path.read_text().replace('strategies = ["handoff", "basic"]', 'strategies = ["basic"]'), "restart"),
    ):
        write(path, broken)
        with capture_logs() as logs:
            session.user("next")
            session.prepare_request()
            session.commit_reply(Message.assistant("ok"))
            session.end_turn()
        errors = [e for e in logs if e.get("log_level") == "error"]
        assert errors and said in errors[0]["error"], logs
        assert session.settings("handoff").handoff_max_chars == 16000
        assert list(kernel.strategies) == ["handoff", "basic"]

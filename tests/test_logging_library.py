"""Used as a library, ctxkernel logs through the standard ``logging`` machinery (issue #13,
item 18): nothing on stdout, nothing below warning unless the application asks, the
application's ``logging`` configuration sees every record, and ``capture_logs`` still works.
The CLI renders the same records to stderr (``configure_logging``)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from ctxkernel import Message, ScriptedModel, StrategySpec, Tool, ToolArgs, ToolCallBlock, hookimpl
from ctxkernel.logging import configure_logging, get_logger, reset_logging
from ctxkernel.loop import AgentLoop
from ctxkernel.testing import build_kernel

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    if sys.argv[1] == "debug":
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s|%(name)s|%(message)s")
    import ctxkernel
    from ctxkernel import Message, ScriptedModel
    from ctxkernel.loop import AgentLoop

    session = ctxkernel.Kernel.from_profile("basic").open_session()   # logs "session created" at debug
    AgentLoop(session, ScriptedModel(["hello"]), max_steps=1).run("hi")
    reopened = session.kernel.open_session(session.id)
    """
)


def _run(tmp_path, mode: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / f"home-{mode}"
    home.mkdir()
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={"CTXKERNEL_HOME": str(home), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        check=True,
    )


def test_a_plain_script_gets_nothing_on_stdout_and_nothing_below_warning(tmp_path):
    done = _run(tmp_path, "plain")
    assert done.stdout == ""
    assert "session created" not in done.stderr and "debug" not in done.stderr.lower()
    assert done.stderr == ""


def test_an_unconfigured_library_prints_not_even_its_warnings():
    script = (
        "import ctxkernel\n"
        "ctxkernel.get_logger('ctxkernel.guard').warning('messages could not be excerpted', session='s')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "" and done.stderr == ""


def test_an_application_logging_config_sees_the_kernel_debug_records(tmp_path):
    done = _run(tmp_path, "debug")
    assert done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.startswith("DEBUG|ctxkernel.")]
    assert any(line.startswith("DEBUG|ctxkernel.kernel|session created session=") for line in lines), done.stderr


def test_records_reach_stdlib_logging_with_level_and_logger_name(caplog):
    caplog.set_level(logging.DEBUG, logger="ctxkernel")
    get_logger("ctxkernel.test").info("something happened", session="s1", count=3)
    record = next(r for r in caplog.records if r.name == "ctxkernel.test")
    assert record.levelno == logging.INFO
    assert record.getMessage() == "something happened session='s1' count=3"


def test_capture_logs_still_captures_kernel_events(make_kernel):
    with capture_logs() as logs:
        make_kernel().open_session()
    assert {"event": "session created", "log_level": "debug"}.items() <= next(
        e for e in logs if e["event"] == "session created"
    ).items()


class _Args(ToolArgs):
    n: int = 0


class Boom:
    """A strategy whose one tool has a bug."""

    @hookimpl
    def register_strategy(self, register):
        register(StrategySpec("boom"))

    @hookimpl
    def register_tools(self, register, session):
        def explode(session, args):
            raise RuntimeError("a bug in the tool")

        register(Tool("explode", "always fails", _Args, explode, strategy="boom"))


def test_a_tool_that_raises_gives_an_error_outcome_and_a_logged_traceback(tmp_path, caplog):
    session = build_kernel(tmp_path, strategies=["basic", "boom"], plugins=[("boom", Boom())]).open_session()
    model = ScriptedModel([Message.assistant("", tool_calls=[ToolCallBlock("c1", "explode", {"n": 1})]), "ok"])
    caplog.set_level(logging.ERROR, logger="ctxkernel")
    result = AgentLoop(session, model).run("go")
    assert result.reason == "completed"
    content = next(e for e in session.events if e.type == "tool/result").data["message"]["content"][0]
    assert content["is_error"] and "explode failed: RuntimeError: a bug in the tool" in content["content"]
    assert "Nothing was written" in content["content"] and "Accepted arguments: {n: integer}" in content["content"]
    record = next(r for r in caplog.records if r.name == "ctxkernel.tools")
    assert record.levelno == logging.ERROR
    # the traceback is on the record (exc_info), or rendered into it when structlog is configured
    assert "in explode" in caplog.text and "RuntimeError: a bug in the tool" in caplog.text


@pytest.fixture
def cli_logging():
    yield
    reset_logging()


def test_the_cli_renders_kernel_records_as_text_lines_on_stderr(cli_logging, capsys):
    configure_logging("debug")
    get_logger("ctxkernel.kernel").debug("session created", session="abc")
    get_logger("ctxkernel.tools").info("below the level", session="abc")
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger("ctxkernel.tools").error("tool raised", tool="t", exc_info=True)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert "[debug" in lines[0] and "session created" in lines[0] and "session=abc" in lines[0]
    assert lines[0][:4].isdigit()  # a timestamp first
    assert not any(line.lstrip().startswith("{") for line in lines)  # text, not JSON
    assert "\x1b[" not in err  # no colors off a terminal
    assert "ValueError: boom" in err


def test_the_cli_level_filters_and_a_second_configure_replaces_the_first(cli_logging, capsys):
    configure_logging("warning")
    configure_logging("warning")
    get_logger("ctxkernel.kernel").info("hidden")
    get_logger("ctxkernel.kernel").warning("shown")
    _, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and "shown" in err and "hidden" not in err
    assert structlog.is_configured()
    configure_logging(None)  # the command's default: no log line at all
    get_logger("ctxkernel.kernel").warning("not shown")
    assert capsys.readouterr().err == ""


def test_the_ctxkernel_command_keeps_its_log_lines_on_stderr(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctxkernel.cli",
            "--log-level",
            "debug",
            "validate",
            str(repo / "profiles" / "basic.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"CTXKERNEL_HOME": str(home), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "session created" not in done.stdout
    assert any("[debug" in line and "session created" in line for line in done.stderr.splitlines())
    quiet = subprocess.run(
        [sys.executable, "-m", "ctxkernel.cli", "validate", str(repo / "profiles" / "basic.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"CTXKERNEL_HOME": str(home), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert quiet.returncode == 0 and quiet.stderr == ""  # no --log-level: no log line


def test_library_log_lines_are_redacted_too(caplog):
    caplog.set_level(logging.WARNING, logger="ctxkernel")
    log = get_logger("ctxkernel.store")
    log.warning("connect failed", dsn="postgresql://app:s3cretpassw0rd@db/app")
    try:
        raise RuntimeError("connect failed for postgresql://app:s3cretpassw0rd@db/app")
    except RuntimeError:
        log.error("store failed", exc_info=True)
    assert "s3cretpassw0rd" not in caplog.text
    assert "postgresql://app:***@db/app" in caplog.text and "RuntimeError" in caplog.text

"""Manual controls (issue #15): compact now and per-session enable/disable, through the Session
API, a second process's view of the log, and the ``ctxkernel compact`` / ``ctxkernel strategy``
commands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

import ctxkernel
from ctxkernel import ControlError, ManualOutcome, Message, SessionBusyError, StrategySpec, Tool, ToolArgs, ToolOutcome
from ctxkernel.cli import main
from ctxkernel.models.scripted import ScriptedModel
from ctxkernel.testing import build_kernel

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Watcher\nA strategy that counts steps."


class NoteArgs(ToolArgs):
    text: str = Field(min_length=1)


class Watcher:
    """A strategy with a tool, a prompt section, a pre_step counter and a manual compaction."""

    def __init__(self) -> None:
        self.steps = 0
        self.manual: list[str] = []

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("watcher"))

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        register(Tool("watch", "watch", NoteArgs, lambda s, a: ToolOutcome("ok"), strategy="watcher"))

    @ctxkernel.hookimpl
    def system_prompt(self, ctx: Any) -> str:
        return SECTION

    @ctxkernel.hookimpl
    def pre_step(self, ctx: Any, step: Any) -> None:
        self.steps += 1

    @ctxkernel.hookimpl
    def compact_now(self, ctx: Any, request: Any) -> ManualOutcome | None:
        if request.action != "compact":
            return None
        self.manual.append(request.by)
        return ManualOutcome(False, "watcher looked and did nothing")


def kernel_with(home: Path, watcher: Watcher, strategies: list[str] | None = None) -> ctxkernel.Kernel:
    return build_kernel(home, strategies=strategies or ["watcher", "basic"], plugins=[("watcher", watcher)])


def step(session: ctxkernel.Session, text: str = "done") -> ctxkernel.Request:
    request = session.prepare_request()
    session.commit_reply(Message.assistant(text))
    return request


def log_bytes(home: Path, session_id: str) -> bytes:
    return (home / "sessions" / f"{session_id}.jsonl").read_bytes()


def tool_names(request: ctxkernel.Request) -> set[str]:
    return {t["function"]["name"] for t in request.tools}


def test_disable_is_logged_takes_effect_at_the_next_step_and_survives_a_restart(tmp_path):
    watcher = Watcher()
    kernel = kernel_with(tmp_path, watcher)
    session = kernel.open_session()
    session.user("hello")
    first = step(session)
    assert "watch" in tool_names(first) and SECTION in first.system and watcher.steps == 1

    assert session.set_strategy_enabled("watcher", False) is True
    assert session.events[-1].type == "session/strategy"
    assert session.events[-1].data == {"strategy": "watcher", "enabled": False, "by": "api"}
    second = step(session)
    assert "watch" not in tool_names(second) and SECTION not in second.system
    assert watcher.steps == 1  # its pre_step did not run
    assert session.enabled_strategies() == ["basic"]

    # a restart: a new kernel over the same store folds the event
    again = Watcher()
    reopened = kernel_with(tmp_path, again).open_session(session.id)
    assert not reopened.strategy_enabled("watcher")
    third = step(reopened)
    assert "watch" not in tool_names(third) and again.steps == 0

    assert reopened.set_strategy_enabled("watcher", True) is True
    fourth = step(reopened)
    assert "watch" in tool_names(fourth) and SECTION in fourth.system and again.steps == 1


def test_a_toggle_from_another_process_reaches_a_running_session_without_a_new_kernel(tmp_path):
    watcher = Watcher()
    running = kernel_with(tmp_path, watcher).open_session()
    running.user("hello")
    step(running)
    # the CLI or the inspector: another kernel, another Session object on the same log
    other = kernel_with(tmp_path, Watcher()).open_session(running.id, repair=False)
    other.set_strategy_enabled("watcher", False, by="cli")
    request = step(running)
    assert "watch" not in tool_names(request) and watcher.steps == 1
    assert not running.strategy_enabled("watcher")


def test_disabling_in_one_session_leaves_the_kernels_other_sessions_alone(tmp_path):
    watcher = Watcher()
    kernel = kernel_with(tmp_path, watcher)
    off, on = kernel.open_session(), kernel.open_session()
    off.set_strategy_enabled("watcher", False)
    for session in (off, on):
        session.user("hi")
    assert "watch" not in tool_names(step(off))
    assert "watch" in tool_names(step(on))
    assert watcher.steps == 1
    assert "watcher" not in off.project()["strategies"] or off.project()["strategies"] == {}


def test_asking_for_the_current_state_writes_nothing(tmp_path):
    session = kernel_with(tmp_path, Watcher()).open_session()
    session.user("hi")
    before = log_bytes(tmp_path, session.id)
    assert session.set_strategy_enabled("watcher", True) is False
    assert log_bytes(tmp_path, session.id) == before


def test_toggle_refusals_name_the_problem_and_write_nothing(tmp_path):
    session = kernel_with(tmp_path, Watcher(), strategies=["watcher"]).open_session()
    session.user("hi")
    before = log_bytes(tmp_path, session.id)
    with pytest.raises(ControlError, match=r"no installed strategy named 'nope'.*runs \['watcher'\]"):
        session.set_strategy_enabled("nope", False)
    with pytest.raises(ControlError, match=r"'basic' is installed but not in profile"):
        session.set_strategy_enabled("basic", False)
    with pytest.raises(ControlError, match="by must be one of"):
        session.set_strategy_enabled("watcher", False, by="../etc")
    session.prepare_request()  # a step at the model
    busy = log_bytes(tmp_path, session.id)
    with pytest.raises(SessionBusyError, match="is at the model; try again between steps"):
        session.set_strategy_enabled("watcher", False)
    assert log_bytes(tmp_path, session.id) == busy
    assert before != busy  # (the request itself wrote its step)


def test_compact_now_asks_strategies_in_profile_order_and_skips_disabled_ones(tmp_path):
    watcher = Watcher()
    kernel = kernel_with(tmp_path, watcher)
    kernel.profile.model = kernel.profile.model.model_copy(
        update={"context_window": 8_000, "reserved_output_tokens": 1_000}
    )
    session = kernel.open_session()
    for turn in range(6):
        session.user(f"turn {turn}: read the parser and report")  # instructions stay small (kept verbatim)
        step(session, "found " * 240)
        session.end_turn()
    outcome = session.compact_now(by="ui")
    assert outcome.strategy == "watcher" and not outcome.committed and watcher.manual == ["ui"]
    assert not any(e.type == "compaction/summary" for e in session.events)

    session.set_strategy_enabled("watcher", False)
    outcome = session.compact_now()
    assert outcome.strategy == "basic" and outcome.committed, outcome
    assert outcome.tokens_after is not None and outcome.tokens_before is not None
    assert outcome.tokens_after < outcome.tokens_before
    summary = next(e for e in session.events if e.type == "compaction/summary")
    assert summary.data["strategy"] == "basic" and summary.data["reason"] == "manual"
    assert watcher.manual == ["ui"]
    assert outcome.to_dict()["ok"] is True


def test_compact_now_refusals_write_nothing(tmp_path):
    session = kernel_with(tmp_path, Watcher(), strategies=["watcher"]).open_session()
    session.user("hi")
    before = log_bytes(tmp_path, session.id)
    with pytest.raises(ControlError, match=r"unknown manual action 'shred'; accepted: \['compact', 'archive'\]"):
        session.compact_now("shred")
    with pytest.raises(ControlError, match="no enabled strategy of session .* handles manual 'archive'"):
        session.compact_now("archive")
    assert log_bytes(tmp_path, session.id) == before
    model = ScriptedModel([Message.assistant("", tool_calls=[ctxkernel.ToolCallBlock("c1", "watch", {"text": "x"})])])
    request = session.prepare_request()
    session.commit_reply(model.complete(request.messages).message)
    waiting = log_bytes(tmp_path, session.id)
    with pytest.raises(SessionBusyError, match=r"tool calls \['c1'\] wait for results"):
        session.compact_now()
    assert log_bytes(tmp_path, session.id) == waiting


@given(st.lists(st.tuples(st.sampled_from(["watcher", "basic"]), st.booleans()), max_size=12))
def test_the_enabled_set_is_folded_from_the_log(tmp_path_factory, toggles):
    home = tmp_path_factory.mktemp("fold")
    kernel = kernel_with(home, Watcher())
    session = kernel.open_session()
    expected = {"watcher", "basic"}
    for name, enabled in toggles:
        session.set_strategy_enabled(name, enabled)
        expected = expected | {name} if enabled else expected - {name}
    assert set(session.enabled_strategies()) == expected
    reopened = kernel_with(home, Watcher()).open_session(session.id)
    assert set(reopened.enabled_strategies()) == expected
    assert sum(e.type == "session/strategy" for e in reopened.events) <= len(toggles)


# -- the commands ------------------------------------------------------------------------------------
@pytest.fixture
def cli_home(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    monkeypatch.setenv("CTXKERNEL_HOME", str(home))
    # a small window, so a few turns outgrow basic's verbatim tail (the CLI's kernel reads it too)
    monkeypatch.setenv("CTXKERNEL_MODEL__CONTEXT_WINDOW", "8000")
    monkeypatch.setenv("CTXKERNEL_MODEL__RESERVED_OUTPUT_TOKENS", "1000")
    monkeypatch.chdir(REPO)  # ./profiles is on the profile search path
    yield home
    from ctxkernel.logging import reset_logging

    reset_logging()


def basic_session(home: Path, turns: int = 8) -> str:
    from ctxkernel.profile import load_profile
    from ctxkernel.store.jsonl import JsonlStore

    profile = load_profile(REPO / "profiles" / "basic.toml")
    kernel = ctxkernel.Kernel(profile, store=JsonlStore(home), entry_points=False)
    session = kernel.open_session()
    for turn in range(turns):
        session.user(f"turn {turn}: " + "please look at this " * 60)
        step(session, "done " * 40)
        session.end_turn()
    return session.id


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_compact_summarises_a_basic_session(capsys, cli_home):
    # past the verbatim tail (16% of the window), and long enough that the summary saves more than
    # the history tools it brings along cost (~830 tokens)
    session_id = basic_session(cli_home, turns=100)
    code, out, err = run_cli(capsys, "compact", session_id, "--json")
    assert code == 0, err
    view = json.loads(out)
    assert view["ok"] is True and view["strategy"] == "basic" and view["session"] == session_id
    assert view["tokens_after"] < view["tokens_before"]
    code, out, _ = run_cli(capsys, "compact", session_id)
    assert code == 1 and out.startswith("nothing compacted by basic")


def test_cli_strategy_disable_then_enable(capsys, cli_home):
    session_id = basic_session(cli_home, turns=1)
    code, out, err = run_cli(capsys, "strategy", "disable", "basic", "--session", session_id, "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "session": session_id,
        "strategy": "basic",
        "enabled": False,
        "changed": True,
        "enabled_strategies": ["history"],  # the basic profile's other strategy
    }
    code, out, _ = run_cli(capsys, "strategy", "disable", "basic", "--session", session_id)
    assert code == 0 and "disabled (already)" in out
    code, _, err = run_cli(capsys, "compact", session_id)
    assert code == 2 and "no enabled strategy" in err
    code, out, _ = run_cli(capsys, "strategy", "enable", "basic", "--session", session_id)
    assert code == 0 and "running: basic" in out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["strategy", "disable", "decay", "--session", "{id}"], "not in profile 'basic'"),
        (["strategy", "disable", "nope", "--session", "{id}"], "no installed strategy named 'nope'"),
        (["strategy", "disable", "basic", "--session", "../etc"], "../etc"),
        (["compact", "missing-session"], "no session 'missing-session'"),
        (["compact", "{id}", "--action", "archive"], "handles manual 'archive'"),
    ],
)
def test_cli_usage_errors_exit_2_and_write_nothing(capsys, cli_home, argv, said):
    session_id = basic_session(cli_home, turns=1)
    before = log_bytes(cli_home, session_id)
    code, out, err = run_cli(capsys, *[a.replace("{id}", session_id) for a in argv])
    assert code == 2 and not out and said in err
    assert log_bytes(cli_home, session_id) == before


def test_cli_refuses_a_busy_session_with_exit_1(capsys, cli_home):
    from ctxkernel.profile import load_profile
    from ctxkernel.store.jsonl import JsonlStore

    kernel = ctxkernel.Kernel(load_profile(REPO / "profiles" / "basic.toml"), store=JsonlStore(cli_home))
    session = kernel.open_session()
    session.user("hello")
    session.prepare_request()  # the harness is waiting for the model
    before = log_bytes(cli_home, session.id)
    code, _, err = run_cli(capsys, "compact", session.id)
    assert code == 1 and "busy" in err and "between steps" in err
    code, _, err = run_cli(capsys, "strategy", "disable", "basic", "--session", session.id)
    assert code == 1 and "busy" in err
    assert log_bytes(cli_home, session.id) == before

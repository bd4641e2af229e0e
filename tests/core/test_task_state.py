"""The session's task state (issue #15, seed 001): a goal and todos the harness sets through the
API, updated by TodoWrite-style calls, carried by handoff, rollover and chapters; without a goal
set, the first substantive instruction (not a trivial opener) is the goal."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxkernel import EventError, Kernel, Message, ToolCallBlock
from ctxkernel.recall.history import History
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.task import substantive
from ctxkernel.testing import build_kernel, make_profile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


@pytest.fixture
def session(tmp_path):
    return build_kernel(tmp_path, strategies=["basic"]).open_session()


def turn(session, text: str, reply: str = "ok") -> None:
    session.user(text)
    session.prepare_request()
    session.commit_reply(Message.assistant(reply))
    session.end_turn()


@pytest.mark.parametrize("opener", ["hi", "Hello!", "hey there", "thanks", "ok", "continue", "  ", "Good morning."])
def test_a_trivial_opener_is_not_the_goal(session, opener):
    assert not substantive(opener)
    turn(session, opener)
    turn(session, "Fix the failing test in parser.py")
    history = History.for_session(session)
    assert history.goal_text() == "Fix the failing test in parser.py"
    assert history.read_item("goal")["content"] == "Fix the failing test in parser.py"


def test_a_short_real_instruction_is_a_goal(session):
    turn(session, "fix parser.py")
    assert History.for_session(session).goal_text() == "fix parser.py"


def test_the_harness_sets_goal_and_todos_and_they_survive_a_restart(tmp_path):
    kernel = build_kernel(tmp_path, strategies=["basic"])
    session = kernel.open_session()
    turn(session, "hi")
    seq = session.set_task(goal="Ship the 0.3 release", todos=["tag it", {"text": "publish", "status": "in_progress"}])
    assert session.events[seq].type == "session/task"
    reopened = build_kernel(tmp_path, strategies=["basic"]).open_session(session.id)
    history = History.for_session(reopened)
    assert history.goal_text() == "Ship the 0.3 release"
    assert [(t.text, t.status) for t in history.checklist()] == [("tag it", "pending"), ("publish", "in_progress")]
    assert reopened.task["goal"] == "Ship the 0.3 release"
    todo = history.checklist()[1].ref
    assert history.read_item(todo)["content"] == "[in_progress] publish"
    # None leaves a part as it is; "" clears the goal (back to the first substantive instruction)
    reopened.set_task(todos=[])
    reopened.set_task(goal="")
    turn(reopened, "then benchmark the parser")
    history = History.for_session(reopened)
    assert history.checklist() == [] and history.goal_text() == "then benchmark the parser"


def test_the_newer_todo_list_wins_whoever_wrote_it(session):
    session.set_task(todos=["from the harness"])
    session.user("plan it")
    session.prepare_request()
    todos = {"todos": [{"content": "from the model", "status": "pending"}]}
    session.commit_reply(Message.assistant("", [ToolCallBlock("t", "TodoWrite", todos)]))
    session.tool_result("t", "ok")
    history = History.for_session(session)
    assert [t.text for t in history.checklist()] == ["from the model"]
    session.set_task(todos=[{"text": "harness again", "status": "completed"}])
    assert [(t.text, t.open) for t in History.for_session(session).checklist()] == [("harness again", False)]


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({}, "needs a goal"),
        ({"goal": 3}, "goal must be a string"),
        ({"goal": "x" * 8_001}, "at most 8000 characters"),
        ({"todos": "one"}, "todos must be a list"),
        ({"todos": [{"text": "a", "status": "done"}]}, "status must be one of"),
        ({"todos": [{"status": "pending"}]}, "todos[0].text must be a non-empty string"),
        ({"todos": [7]}, "todos[0] must be a string or"),
        ({"goal": "g", "by": "model"}, "by must be one of"),
    ],
)
def test_bad_task_input_is_refused_and_writes_nothing(session, kwargs, said):
    before = len(session.events)
    with pytest.raises(EventError, match=said.replace("[", r"\[").replace("]", r"\]")):
        session.set_task(**kwargs)
    assert len(session.events) == before


@given(st.text(max_size=60))
def test_substantive_never_raises_and_blank_is_never_a_goal(text):
    assert substantive(text) in (True, False)
    if not text.strip():
        assert not substantive(text)


def shipped(name: str, home: Path) -> Kernel:
    profile = make_profile(
        PROFILES / f"{name}.toml",
        model={"provider": "scripted", "name": "scripted-1", "context_window": 20_000, "reserved_output_tokens": 1_000},
    )
    profile.model_policies = []
    return Kernel(profile, store=JsonlStore(home), home=home, entry_points=True)


def grown(kernel: Kernel):
    session = kernel.open_session()
    turn(session, "hi")
    for i in range(8):
        turn(session, f"step {i}: look at module {i} " + "carefully " * 100, "done " * 100)
    session.set_task(
        goal="GOAL-FROM-HARNESS: port the parser", todos=["OPEN-TODO-1", {"text": "x", "status": "completed"}]
    )
    return session


@pytest.mark.parametrize("name", ["handoff", "rollover"])
def test_handoff_and_rollover_carry_the_task_state_into_the_new_window(tmp_path, name):
    session = grown(shipped(name, tmp_path))
    assert session.compact_now().committed
    seed = next(n.message.text for n in session.surface.nodes if n.message.source.kind == "plugin")
    assert "GOAL-FROM-HARNESS: port the parser" in seed
    assert "OPEN-TODO-1" in seed


def test_chapters_carries_the_task_state_into_the_continuation(tmp_path):
    kernel = shipped("chapters", tmp_path)
    session = grown(kernel)
    outcome = session.compact_now()
    assert outcome.committed and outcome.continued_in
    seed = kernel.open_session(outcome.continued_in).surface.nodes[0].message.text
    assert "GOAL-FROM-HARNESS: port the parser" in seed and "OPEN-TODO-1" in seed


def test_a_trivial_opener_is_not_the_goal_of_a_handoff(tmp_path):
    session = shipped("handoff", tmp_path).open_session()
    turn(session, "hi")
    for i in range(8):
        turn(session, f"step {i}: look at module {i} " + "carefully " * 100, "done " * 100)
    assert session.compact_now().committed
    seed = next(n.message.text for n in session.surface.nodes if n.message.source.kind == "plugin")
    goal_line = next(line for line in seed.splitlines() if line.startswith("Goal"))
    assert "step 0: look at module 0" in goal_line or "quoted below" in goal_line
    assert goal_line.rstrip().endswith("hi") is False

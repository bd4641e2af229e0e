"""reconcile: a framework's whole history, shown again and again, is appended to the log once."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from ctxkernel import Message, ToolCallBlock, ToolOutcome
from ctxkernel.integrations import IntegrationError, LogIndex, ManagedSession, reconcile
from ctxkernel.testing import build_kernel

from .conftest import conversations


def _conversation_events(session):
    return [e.data["message"] for e in session.events if e.type in ("user/message", "assistant/message", "tool/result")]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(conversations())
def test_every_prefix_shown_again_appends_each_message_once(tmp_path, messages):
    kernel = build_kernel(tmp_path / "home")
    session = kernel.open_session()
    index = LogIndex()
    # a framework shows its growing history before each call, and sometimes twice
    for end in range(1, len(messages) + 1):
        reconcile(session, messages[:end], index)
        reconcile(session, messages[:end], index)
    assert _conversation_events(session) == [m.to_dict() for m in messages]


def test_a_retried_call_does_not_repeat_the_user_message(tmp_path):
    managed = ManagedSession(build_kernel(tmp_path / "home"), origin="test")
    history = [Message.user("fix the bug")]
    managed.prepare(history)
    managed.prepare(history)  # the model call failed; the framework retries with the same history
    users = [e for e in managed.session.events if e.type == "user/message"]
    assert len(users) == 1


def test_a_result_for_a_call_the_session_never_made_is_refused_and_nothing_is_written(tmp_path):
    managed = ManagedSession(build_kernel(tmp_path / "home"), origin="test")
    managed.prepare([Message.user("go")])
    managed.commit(Message.assistant("", [ToolCallBlock("c1", "grep", {"q": "x"})]))
    before = list(managed.session.events)
    stray = [
        Message.user("go"),
        Message.assistant("", [ToolCallBlock("c1", "grep", {"q": "x"})]),
        Message.tool("c9", "?"),
    ]
    try:
        managed.sync(stray)
    except IntegrationError as exc:
        assert "'c9'" in str(exc) and "'c1'" in str(exc)
    else:
        raise AssertionError("a result for an unknown call was accepted")
    assert managed.session.events == before


def test_a_history_refused_part_way_writes_none_of_it(tmp_path):
    # the result for c1 and the new user message came before the stray result: none is written
    managed = ManagedSession(build_kernel(tmp_path / "home"), origin="test")
    managed.prepare([Message.user("go")])
    managed.commit(Message.assistant("", [ToolCallBlock("c1", "grep", {"q": "x"})]))
    before = list(managed.session.events)
    shown = [
        Message.user("go"),
        Message.assistant("", [ToolCallBlock("c1", "grep", {"q": "x"})]),
        Message.tool("c1", "hit"),
    ]
    for tail in (
        [Message.user("more"), Message.tool("c9", "?")],
        [Message.assistant("", [ToolCallBlock("c2", "ls", {})]), Message.user("x")],
    ):
        try:
            managed.sync([*shown, *tail])
        except IntegrationError as exc:
            assert "history[" in str(exc)
        else:
            raise AssertionError(f"a history ending {tail} was accepted")
        assert managed.session.events == before
    managed.sync(shown)  # the session still continues
    assert managed.session.events[-2].type == "tool/result"


def test_a_strategy_tool_result_is_committed_as_the_tools_own_outcome(tmp_path):
    managed = ManagedSession(build_kernel(tmp_path / "home"), origin="test")
    managed.prepare([Message.user("go")])
    call = ToolCallBlock("c1", "remember", {})
    managed.commit(Message.assistant("", [call]))
    managed._outcomes["c1"] = ToolOutcome("kept", defer_message="read this next step")
    managed.sync([Message.user("go"), Message.assistant("", [call]), Message.tool("c1", "kept")])
    assert managed.session._composer.deferred == [("kernel", "read this next step")]
    assert "c1" not in managed._outcomes


def test_two_replies_that_read_the_same_are_both_kept(tmp_path):
    # found by the property above: a second "OK" was taken for the first and never logged
    managed = ManagedSession(build_kernel(tmp_path / "home"), origin="test")
    first = [Message.user("step one"), Message.assistant("OK")]
    managed.prepare(first[:1])
    managed.sync(first)  # a lazy framework shows the reply with the next call
    second = [*first, Message.user("step two"), Message.assistant("OK"), Message.user("step three")]
    managed.prepare(second[:3])
    managed.prepare(second)
    replies = [e for e in managed.session.events if e.type == "assistant/message"]
    assert len(replies) == 2


def test_the_package_imports_without_any_framework():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('langchain', 'langchain_core', 'langgraph', 'pydantic_ai', 'agents'): sys.modules[name] = None\n"
        "import ctxkernel.integrations as i; print(sorted(i.__all__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "ManagedSession" in done.stdout

"""Reconcile invariants (no HTTP): whatever prefixes of a history a client sends, and in any
order of growth, the log ends up holding that history exactly once; a resend appends nothing;
a rewrite never changes an event already written."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.errors import EventError
from ctxkernel.events import MESSAGE_TYPES
from ctxkernel.messages import Message, ToolCallBlock
from ctxkernel.serve.reconcile import check_history, ledger_for, message_hash, reconcile
from ctxkernel.testing import build_kernel


def history_from(shapes: list[tuple[int, int]]) -> list[Message]:
    """A well-formed history: per turn a user message, then steps with 0..n tool calls each."""
    out: list[Message] = []
    call = 0
    for turn, (steps, calls_per_step) in enumerate(shapes):
        out.append(Message.user(f"turn {turn}"))
        for step in range(steps):
            ids = [f"c{call + i}" for i in range(calls_per_step)]
            call += calls_per_step
            out.append(Message.assistant(f"t{turn}s{step}", [ToolCallBlock(i, "read_file", {"path": i}) for i in ids]))
            out += [Message.tool(i, f"result {i}") for i in ids]
        out.append(Message.assistant(f"answer {turn}"))
    return out


def clean_cut(history: list[Message], cut: int) -> int:
    """The longest prefix up to ``cut`` that leaves no tool call waiting (what a client sends)."""
    cut = min(cut, len(history))
    while cut and (history[cut - 1].tool_calls or (cut < len(history) and history[cut].role == "tool")):
        cut -= 1
    return cut


shapes = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=5)


def logged(session) -> list[str]:
    return [message_hash(Message.from_dict(e.data["message"])) for e in session.events if e.type in MESSAGE_TYPES]


@settings(max_examples=40)
@given(shapes=shapes, cuts=st.lists(st.integers(1, 60), max_size=6))
def test_growing_prefixes_log_the_history_once(shapes, cuts):
    history = history_from(shapes)
    with tempfile.TemporaryDirectory() as home:
        session = build_kernel(Path(home)).open_session("p", create=True)
        for cut in sorted({clean_cut(history, c) for c in cuts}) + [len(history)]:
            reconcile(session, history[:cut])
        assert logged(session) == [message_hash(m) for m in history]
        assert ledger_for(session).hashes == [message_hash(m) for m in history]
        size = len(session.events)
        reconcile(session, history)  # a resend
        assert len(session.events) == size


@settings(max_examples=40)
@given(shapes=shapes, keep=st.integers(0, 60), extra=st.integers(1, 3))
def test_a_rewrite_never_changes_what_was_written(shapes, keep, extra):
    history = history_from(shapes)
    with tempfile.TemporaryDirectory() as home:
        session = build_kernel(Path(home)).open_session("p", create=True)
        reconcile(session, history)
        before = [(e.seq, e.type, e.data) for e in session.events]
        keep = clean_cut(history, keep)  # then the client says something else
        rewritten = history[:keep] + [Message.user(f"instead {i}") for i in range(extra)]
        result = reconcile(session, rewritten)
        assert [(e.seq, e.type, e.data) for e in session.events[: len(before)]] == before
        if result.rewrite == "fork":
            assert len(session.events) == len(before)  # a fork writes nothing here
        else:
            visible = [message_hash(n.message) for n in session.surface.nodes]
            assert visible == [message_hash(m) for m in rewritten]
            assert ledger_for(session).hashes == visible


@pytest.mark.parametrize(
    ("history", "words"),
    [
        ([Message.tool("x", "r")], "answers no earlier tool call"),
        ([Message.assistant("", [ToolCallBlock("a", "f", {})]), Message.user("hi")], "still wait"),
        (
            [Message.assistant("", [ToolCallBlock("a", "f", {})]), Message.tool("a", "1"), Message.tool("a", "2")],
            "already answered",
        ),
        (
            [
                Message.assistant("", [ToolCallBlock("a", "f", {})]),
                Message.tool("a", "1"),
                Message.assistant("", [ToolCallBlock("a", "f", {})]),
            ],
            "used twice",
        ),
    ],
)
def test_histories_that_do_not_pair_are_refused(history, words):
    with pytest.raises(EventError, match=words):
        check_history(history)


def test_hash_ignores_spelling_but_not_content():
    a = Message.assistant("hi", [ToolCallBlock("1", "f", {"b": 1, "a": [1, 2]})], reasoning="thought")
    b = Message.assistant("hi", [ToolCallBlock("1", "f", {"a": [1, 2], "b": 1})])
    assert message_hash(a) == message_hash(b)
    assert message_hash(a) != message_hash(Message.assistant("hi", [ToolCallBlock("1", "f", {"a": [1, 2], "b": 2})]))
    assert message_hash(Message.user("x")) != message_hash(Message.assistant("x"))


def test_a_batch_with_missing_results_is_refused():
    calls = [ToolCallBlock("a", "f", {}), ToolCallBlock("b", "f", {})]
    with pytest.raises(EventError, match="have no results"):
        check_history([Message.user("go"), Message.assistant("", calls), Message.tool("a", "1")])


def strays(history: list[Message]) -> list[list[Message]]:
    """Tails that break the pairing of ``history`` only through the calls it already made."""
    ids = [c.id for m in history for c in m.tool_calls]
    out: list[list[Message]] = [[Message.tool("nobody", "r")]]
    for call_id in ids[:2]:
        out.append([Message.tool(call_id, "again")])  # answered before
        out.append([Message.assistant("", [ToolCallBlock(call_id, "f", {})]), Message.tool(call_id, "x")])  # reused
    return out


@settings(max_examples=40)
@given(shapes=shapes, cuts=st.lists(st.integers(1, 60), max_size=5), bad=st.integers(0, 4), at=st.integers(0, 5))
def test_the_resumed_pairing_check_refuses_what_the_whole_check_refuses(shapes, cuts, bad, at):
    # reconcile checks only what follows the last history that passed; a tail that reuses or
    # re-answers a call of that history is refused all the same, with the log unchanged
    history = history_from(shapes)
    with tempfile.TemporaryDirectory() as home:
        session = build_kernel(Path(home)).open_session("p", create=True)
        sends = sorted({clean_cut(history, c) for c in cuts}) + [len(history)]
        for i, cut in enumerate(sends):
            reconcile(session, history[:cut])
            tails = strays(history[:cut])
            if i == min(at, len(sends) - 1):
                wrong = history[:cut] + [Message.user("more")] + tails[bad % len(tails)]
                with pytest.raises(EventError) as whole:
                    check_history(wrong)
                size = len(session.events)
                with pytest.raises(EventError) as resumed:
                    reconcile(session, wrong)
                assert str(resumed.value) == str(whole.value)
                assert len(session.events) == size
        assert logged(session) == [message_hash(m) for m in history]


def test_serve_state_lives_beside_the_session_and_goes_with_it():
    """serve's ledger is kept beside the Session object, not in ``session.state`` (which the
    kernel walks at every step end), and is dropped with the object: a process that reopens
    sessions from the store (the LRU of ``Proxy.sessions``) does not accumulate them; a new
    Session object rebuilds the same ledger from the log."""
    import gc
    import weakref

    from ctxkernel.serve import reconcile as reconcile_module

    history = history_from([(1, 2), (0, 0)])
    with tempfile.TemporaryDirectory() as home:
        kernel = build_kernel(Path(home))
        session = kernel.open_session("kept", create=True)
        reconcile(session, history)
        hashes = list(ledger_for(session).hashes)
        assert hashes == [message_hash(m) for m in history]
        assert not [key for key in session.state if key.startswith("serve")]
        held = weakref.ref(reconcile_module.kept(session))
        del session
        gc.collect()
        assert held() is None  # the ledger went with its Session object
        reopened = kernel.open_session("kept")
        assert ledger_for(reopened).hashes == hashes

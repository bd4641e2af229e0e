"""A message counted before it is appended (the reply's estimate in ``commit_reply``, a front
door's ledger through ``Session.count_message``) is tokenised once: its surface node takes the
count of its exact text. The meter's total stays exact."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import Message, ToolCallBlock
from ctxkernel import events as ev
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.session import COUNTED_ENTRIES
from ctxkernel.testing import CountingTokenizer, build_kernel


def counted_session(tmp_path: Path) -> tuple[Any, CountingTokenizer]:
    session = build_kernel(tmp_path).open_session()
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    return session, counting


def recount(session: Any) -> int:
    """The surface's tokens counted from nothing by a fresh meter."""
    fresh = Meter(get_tokenizer())
    return sum(fresh.count_message(node.message) for node in session.surface.nodes)


def test_a_reply_is_tokenised_once_by_the_kernel(tmp_path: Path) -> None:
    session, counting = counted_session(tmp_path)
    session.user("start the work")
    session.prepare_request()
    request_tokens = session._composer.request_estimate
    reply = "the reply, counted for the estimate and on the surface " * 5
    session.commit_reply(Message.assistant(reply), usage={"prompt_tokens": 30, "completion_tokens": 70})
    session.user("and the next thing")
    session.prepare_request()
    assert counting.texts.count(reply) == 1
    assert session.meter.surface_tokens() == recount(session)
    [event] = [e for e in session.events if e.type == ev.ASSISTANT_MESSAGE]
    assert event.data["estimate"] == request_tokens + Meter(get_tokenizer()).count_message(Message.assistant(reply))


def test_messages_counted_before_their_append_are_tokenised_once(tmp_path: Path) -> None:
    session, counting = counted_session(tmp_path)
    history = [
        Message.user("the user's instruction"),
        Message.assistant("calling", [ToolCallBlock("c1", "read", {"path": "a.txt"})]),
        Message.tool("c1", "the file's text"),
    ]
    counts = [session.count_message(m) for m in history]  # as a front door's ledger does
    session.append_history(history)
    session.meter.surface_tokens()
    assert counts == [Meter(get_tokenizer()).count_message(m) for m in history]
    assert len(counting.texts) == len(history)
    assert session.meter.surface_tokens() == recount(session)
    assert not session._counts.pending  # every count was taken by its node


def test_a_count_of_other_text_is_not_taken(tmp_path: Path) -> None:
    session, counting = counted_session(tmp_path)
    session.count_message(Message.user("what was counted"))
    session.user("what was appended")
    assert session.meter.surface_tokens() == recount(session)
    assert counting.texts == ["what was counted", "what was appended"]


def test_the_kept_counts_are_bounded(tmp_path: Path) -> None:
    session, _ = counted_session(tmp_path)
    for index in range(5 * COUNTED_ENTRIES):
        session.count_message(Message.user(f"never appended {index}"))
        assert len(session._counts.pending) <= COUNTED_ENTRIES


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["user", "reply", "call"]), texts, st.booleans(), st.booleans()),
        min_size=1,
        max_size=10,
    )
)
def test_the_meter_total_stays_exact_whatever_was_counted_first(steps) -> None:
    """Messages counted before their append (the same text, another text, or not at all), through
    user(), commit_reply() and append_history(): the total equals a fresh count of the surface,
    and no counted text is tokenised twice."""
    with tempfile.TemporaryDirectory() as home:
        session, counting = counted_session(Path(home))
        session.user("begin")
        for index, (kind, text, precount, same) in enumerate(steps):
            if kind == "user":
                message = Message.user(text or "x")
            elif kind == "reply":
                message = Message.assistant(text)
            else:
                message = Message.assistant(text, [ToolCallBlock(f"c{index}", "read", {"path": text})])
            if precount:
                session.count_message(message if same else Message.user(text + "!"))
            if kind == "user":
                session.user(message)
            else:
                session.prepare_request()
                session.commit_reply(message, usage={"prompt_tokens": 10, "completion_tokens": 5})
                if message.tool_calls:
                    session.append_history([Message.tool(f"c{index}", text)])
            assert session.meter.surface_tokens() == recount(session)

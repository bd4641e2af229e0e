"""A front door that brings a long history counts every message before it lands (``serve``'s
ledger record of a resumed session's first request: hundreds of messages); each is still
tokenised once, and the counts kept for it are let go once they are taken."""

from __future__ import annotations

from pathlib import Path

from ctxkernel import Message, ToolCallBlock
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.session.log import COUNTED_CHARS
from ctxkernel.testing import CountingTokenizer, build_kernel


def test_a_long_history_counted_before_it_lands_is_tokenised_once(tmp_path: Path) -> None:
    session = build_kernel(tmp_path).open_session()
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    history: list[Message] = []
    for n in range(300):  # 900 messages: a 100k-token coding history has about as many
        history += [
            Message.user(f"step {n}: read the module and fix it"),
            Message.assistant(f"reading {n}", [ToolCallBlock(f"c{n}", "read", {"path": f"m{n}.py"})]),
            Message.tool(f"c{n}", f"the text of m{n}.py " * 20),
        ]
    counts = [session.count_message(m) for m in history]  # as serve's ledger record does
    session.append_history(history)
    assert session.meter.surface_tokens() == sum(counts)
    assert counts == [Meter(get_tokenizer()).count_message(m) for m in history]
    assert len(counting.texts) == len(history)  # not once for the ledger and again on the surface
    assert not session._counts.pending and session._counts.chars == 0


def test_the_kept_counts_are_bounded_in_characters(tmp_path: Path) -> None:
    session = build_kernel(tmp_path).open_session()
    text = "x" * (COUNTED_CHARS // 3)
    for index in range(10):
        session.count_message(Message.user(f"{index} {text}"))
        assert session._counts.chars <= COUNTED_CHARS

"""The ledger remakes the protected instructions of a long live session together
(``instructions._repack``: a compaction then reads them from a few memory pages, not one page
each). The copies must be the instructions the log holds, with the search keys a fresh
computation gives, and every answer the ledger gives must stay what a session reopened from the
same log (whose instructions were never remade) gives."""

from __future__ import annotations

from typing import Any

import drawn_support as drawn

from ctxkernel.instructions import _search_kept, budget_tokens, ledger_of, normalized, pin_lost, protected, within
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 60000, "reserved_output_tokens": 500}


def _chat(session: Any, turns: range, landed: dict[int, Any]) -> None:
    for n in turns:
        drawn.drawn_chat_step(session, "user", f"step {n}: keep   the parser\tstrict, rule {n % 7}", False)
        item = session.instruction_ledger.own[-1]
        landed[item.seq] = item  # the instruction as it was made when its message landed
        drawn.drawn_chat_step(session, "reply", f"done {n}", True)
        if n % 5 == 4:
            drawn.drawn_chat_step(session, "compact", 1, False)


def test_remade_instructions_are_the_logs_and_answer_as_a_reopened_session(tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path, fsync=False, model=WINDOW)
    session = kernel.open_session()
    landed: dict[int, Any] = {}
    _chat(session, range(40), landed)
    protected(session)
    before = {item.seq: item for item in session.instructions}
    _chat(session, range(40, 80), landed)
    chosen = protected(session)
    book = session.instruction_ledger
    assert [i for i in chosen if landed[i.seq] is not i], "the protected instructions were remade"
    assert all(before[i.seq] is i for i in chosen if i.seq in before), "and only once each"
    assert 0 <= len(book.own) - book.packed < max(1, len(chosen) // 4)

    # the copies are the log's instructions, with the keys a fresh computation gives
    assert session.instructions == ledger_of(session.id, session.events)
    for item in session.instructions:
        assert item._keys is not None
        assert (item.normalized, list(item.inner_words)) == (normalized(item.text), item.text.split()[1:-1])
    fresh = within(session.instructions, budget_tokens(session), {}, session.meter.count_text)
    assert protected(session) == fresh

    # a session reopened from the same log gives the same answers
    reopened = build_kernel(tmp_path, fsync=False, model=WINDOW).open_session(session.id)
    assert protected(reopened) == protected(session)
    cited = {n.seq for n in session.surface.nodes[:-1]}
    assert [i.seq for i in _search_kept(reopened, reopened.instructions, cited)] == [
        i.seq for i in _search_kept(session, session.instructions, cited)
    ]
    ours, theirs = pin_lost(session, cited, [None]), pin_lost(reopened, cited, [None])
    assert [m.text if m else None for m in ours[0]] == [m.text if m else None for m in theirs[0]]
    assert [i.seq for i in ours[1]] == [i.seq for i in theirs[1]]

"""The ledger's memos answer what a fresh computation answers (issue 21, item 2): the protected
instructions, the search of the kept surface for lost instructions (kept per surface revision and
cited set, so a strategy's sizing and its transaction search once) and each instruction's line in
the block. Checked after every step of drawn sequences of user messages, replies and compactions,
asking twice at each point (the second ask is answered from the memo)."""

from __future__ import annotations

from typing import Any

import drawn_support as drawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel.instructions import (
    Instruction,
    _kept_as_sent,
    _missing_from_kept,
    _not_kept_as_sent,
    _search_kept,
    _unquoted,
    block_text,
    block_tokens,
    budget_tokens,
    normalized,
    protected,
    within,
)
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 60000, "reserved_output_tokens": 500}
WORDS = st.sampled_from(["keep", "the", "parser", "strict", "tabs", "use", "short", "x.", "42"])
TEXTS = st.lists(WORDS, min_size=1, max_size=7).map(" ".join)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), TEXTS),
        st.tuples(st.just("reply"), TEXTS),
        st.tuples(st.just("compact"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=14,
)


def _check(session: Any, data: st.DataObject) -> None:
    fresh_protected = within(session.instructions, budget_tokens(session), {}, session.meter.count_text)
    for _ in range(2):  # the second ask is answered by the memos
        assert protected(session) == fresh_protected
    seqs = [n.seq for n in session.surface.nodes]
    cited = set(data.draw(st.lists(st.sampled_from(seqs), max_size=len(seqs)))) if seqs else set()
    # the scan that skips the budget's choice when every instruction stays as sent
    assert _not_kept_as_sent(session, cited) == [i for i in fresh_protected if not _kept_as_sent(session, i, cited)]
    items = session.instructions
    some = data.draw(st.lists(st.sampled_from(items), max_size=len(items))) if items else []
    expected = _search_kept(session, items, cited) if items else []
    assert _missing_from_kept(session, some, cited) == [i for i in some if i in expected]
    assert _missing_from_kept(session, items, cited) == expected
    assert _missing_from_kept(session, items, set(cited)) == expected
    lost = [i for i in items if i.text.strip()]
    if lost:
        whole = session.meter.count_text(block_text(lost, session.id))
        assert block_tokens(session, lost) == whole
        assert block_tokens(session, lost) == whole


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(STEPS, st.data())
def test_the_ledger_memos_answer_as_a_fresh_computation(tmp_path_factory: Any, steps: list, data: Any) -> None:
    kernel = build_kernel(tmp_path_factory.mktemp("memos"), fsync=False, model=WINDOW)
    session = kernel.open_session()
    turn_open = False
    for kind, value in steps:
        turn_open = drawn.drawn_chat_step(session, kind, value, turn_open)
        _check(session, data)


SPACED = st.lists(st.tuples(WORDS, st.sampled_from([" ", "  ", "\n", "\t", " \n "])), min_size=1, max_size=8).map(
    lambda pairs: "".join(w + s for w, s in pairs)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(SPACED, min_size=1, max_size=3), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200))), st.data()
)
def test_the_quotes_found_raw_first_are_the_normalised_search(texts: list[str], cuts: list, data: Any) -> None:
    # instructions cut raw out of one text, out of the texts joined (across two), or drawn anew
    joined = "\n".join(texts)
    items = []
    for n, (a, b) in enumerate(cuts):
        source = data.draw(st.sampled_from([*texts, joined]))
        text = source[min(a, b) : max(a, b)] or data.draw(SPACED)
        items.append(Instruction("s", n, data.draw(st.sampled_from([text, text.strip(), " " + text]))))
    expected = [i for i in items if i.normalized not in "\n".join(normalized(t) for t in texts)]
    assert _unquoted(items, texts) == expected

"""An instruction's search keys (its normalised text and inner words) are computed as a live
user message lands (``Ledger.fold(..., live=True)``), so a session's first compaction reads them
instead of computing every cited one (issue 21, item 2: moved, not removed). They must be what a
fresh computation gives, for a live session and for one reopened from its log (a replay leaves
them to the first search)."""

from __future__ import annotations

from typing import Any

import drawn_support as drawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message
from ctxkernel.instructions import Instruction, _search_kept, normalized, pin_lost
from ctxkernel.testing import build_kernel

WINDOW = {"context_window": 60000, "reserved_output_tokens": 500}
WORDS = st.sampled_from(["keep", "the", "parser", "x.", "42", "é", "ﬁ"])
SPACES = st.sampled_from([" ", "  ", "\n", "\t", " \n "])
TEXTS = st.lists(st.tuples(WORDS, SPACES), min_size=1, max_size=6).map(lambda pairs: "".join(w + s for w, s in pairs))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.tuples(SPACES, TEXTS).map("".join)),
        st.tuples(st.just("reply"), TEXTS),
        st.tuples(st.just("compact"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=12,
)


def _fresh_keys(item: Instruction) -> tuple[str, list[str]]:
    return normalized(item.text), item.text.split()[1:-1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(STEPS)
def test_keys_computed_at_landing_are_a_fresh_computation(tmp_path_factory: Any, steps: list) -> None:
    home = tmp_path_factory.mktemp("keys")
    kernel = build_kernel(home, fsync=False, model=WINDOW)
    session = kernel.open_session()
    turn_open = False
    for kind, value in steps:
        turn_open = drawn.drawn_chat_step(session, kind, value, turn_open)
        for item in session.instructions:
            assert "_keys" in item.__dict__  # computed as it landed, before any search
            assert (item.normalized, item.inner_words) == _fresh_keys(item)
    # a replay (another process opening the log) computes them on first use, to the same answers
    reopened = build_kernel(home, fsync=False, model=WINDOW).open_session(session.id)
    replayed = reopened.instructions
    assert [(i.seq, i.text) for i in replayed] == [(i.seq, i.text) for i in session.instructions]
    for item in replayed:
        assert (item.normalized, item.inner_words) == _fresh_keys(item)
    cited = {n.seq for n in reopened.surface.nodes[:-1]}
    assert [i.seq for i in _search_kept(reopened, replayed, cited)] == [
        i.seq for i in _search_kept(session, session.instructions, cited)
    ]
    assert [i.seq for i in pin_lost(reopened, cited, [None])[1]] == [i.seq for i in pin_lost(session, cited, [None])[1]]


def test_an_inherited_ledger_gets_its_keys_as_its_event_lands(tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path, fsync=False, model=WINDOW)
    parent = kernel.open_session()
    for text in ("use  the staging\tdatabase", "never deploy on a Friday"):
        parent.user(text)
        parent.prepare_request()
        parent.commit_reply(Message.assistant("ok"))
        parent.end_turn()
    child = kernel.open_session(create=True, instructions_from=parent.id)
    child.user("now deploy")
    child.prepare_request()  # the first request records the inheritance
    inherited = [i for i in child.instructions if i.session == parent.id]
    assert [i.text for i in inherited] == ["use  the staging\tdatabase", "never deploy on a Friday"]
    for item in child.instructions:
        assert "_keys" in item.__dict__
        assert (item.normalized, item.inner_words) == _fresh_keys(item)

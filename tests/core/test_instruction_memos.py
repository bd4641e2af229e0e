"""The instruction ledger's memos and shortcuts answer what a fresh computation answers: the
protected instructions and the search for lost ones, each instruction's search keys computed as
its message lands, the search that skips texts an instruction cannot occur in, and the block's
count taken from its parts. One section per property, each with the description it was written
with."""

from __future__ import annotations

from typing import Any

import drawn_support as drawn
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Source, Span, ToolCallBlock
from ctxkernel import instructions as instructions_module
from ctxkernel.compaction import checkpoint_message
from ctxkernel.instructions import (
    FILTER_WORDS,
    Instruction,
    _kept_as_sent,
    _kept_texts,
    _missing_from_kept,
    _missing_in,
    _not_kept_as_sent,
    _search_kept,
    _unquoted,
    block_message,
    block_text,
    block_tokens,
    budget_tokens,
    carried_tokens,
    normalized,
    pin_lost,
    protected,
    with_block,
    within,
)
from ctxkernel.messages import TextBlock
from ctxkernel.testing import build_kernel

# -- the ledger's memos ----------------------------------------------------------------------------
# The ledger's memos answer what a fresh computation answers (issue 21, item 2): the protected
# instructions, the search of the kept surface for lost instructions (kept per surface revision and
# cited set, so a strategy's sizing and its transaction search once) and each instruction's line in
# the block. Checked after every step of drawn sequences of user messages, replies and compactions,
# asking twice at each point (the second ask is answered from the memo).


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


# -- search keys computed as a message lands -------------------------------------------------------
# An instruction's search keys (its normalised text and inner words) are computed as a live
# user message lands (``Ledger.fold(..., live=True)``), so a session's first compaction reads them
# instead of computing every cited one (issue 21, item 2: moved, not removed). They must be what a
# fresh computation gives, for a live session and for one reopened from its log (a replay leaves
# them to the first search).


LANDING_WORDS = st.sampled_from(["keep", "the", "parser", "x.", "42", "é", "ﬁ"])
LANDING_SPACES = st.sampled_from([" ", "  ", "\n", "\t", " \n "])
LANDING_TEXTS = st.lists(st.tuples(LANDING_WORDS, LANDING_SPACES), min_size=1, max_size=6).map(
    lambda pairs: "".join(w + s for w, s in pairs)
)
LANDING_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.tuples(LANDING_SPACES, LANDING_TEXTS).map("".join)),
        st.tuples(st.just("reply"), LANDING_TEXTS),
        st.tuples(st.just("compact"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=12,
)


def _fresh_keys(item: Instruction) -> tuple[str, list[str]]:
    return normalized(item.text), item.text.split()[1:-1]


def _keys_of(item: Instruction) -> tuple[str, list[str]]:
    return item.normalized, list(item.inner_words)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(LANDING_STEPS)
def test_keys_computed_at_landing_are_a_fresh_computation(tmp_path_factory: Any, steps: list) -> None:
    home = tmp_path_factory.mktemp("keys")
    kernel = build_kernel(home, fsync=False, model=WINDOW)
    session = kernel.open_session()
    turn_open = False
    for kind, value in steps:
        turn_open = drawn.drawn_chat_step(session, kind, value, turn_open)
        for item in session.instructions:
            assert item._keys is not None  # computed as it landed, before any search
            assert _keys_of(item) == _fresh_keys(item)
    # a replay (another process opening the log) computes them on first use, to the same answers
    reopened = build_kernel(home, fsync=False, model=WINDOW).open_session(session.id)
    replayed = reopened.instructions
    assert [(i.seq, i.text) for i in replayed] == [(i.seq, i.text) for i in session.instructions]
    for item in replayed:
        assert _keys_of(item) == _fresh_keys(item)
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
        assert item._keys is not None
        assert _keys_of(item) == _fresh_keys(item)


# -- the search for lost instructions --------------------------------------------------------------
# The search for the protected instructions a compaction would take off the surface answers what
# the plain search does (every kept text normalised and searched), while normalising and searching
# only when an instruction's inner words all occur among the kept texts' words.


#: few words, so kept texts and instructions share most of them; white space of several kinds
SEARCH_WORDS = st.sampled_from(["tabs", "use", "keep", "the", "parser", "strict", "ab", "a", "b", "tabsuse", "x."])
SEARCH_SPACES = st.sampled_from([" ", "  ", "\n", "\t", " \n "])


@st.composite
def texts(draw: Any, max_words: int = 8) -> str:
    words = draw(st.lists(SEARCH_WORDS, min_size=1, max_size=max_words))
    out = draw(st.sampled_from(["", " ", "\n"]))
    for word in words:
        out += word + draw(SEARCH_SPACES)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts(14), min_size=1, max_size=8), st.lists(texts(12), min_size=1, max_size=8), st.data())
def test_the_search_for_lost_instructions_is_the_plain_search(tmp_path_factory, messages, wanted, data):
    # instructions of up to 12 words: past FILTER_WORDS inner words, only the longest rule texts out
    kernel = build_kernel(tmp_path_factory.mktemp("search"), fsync=False, model=WINDOW)
    session = kernel.open_session()
    for text in messages:
        session.user(text)
        session.prepare_request()
        session.commit_reply(Message.assistant(data.draw(texts())))
        session.end_turn()
    seqs = [n.seq for n in session.surface.nodes]
    cited = set(data.draw(st.lists(st.sampled_from(seqs), max_size=len(seqs))))
    # an instruction is drawn anew, or cut out of a message (so a kept text may quote it mid-word)
    items = []
    for n, text in enumerate(wanted):
        source = normalized(data.draw(st.sampled_from([text, *messages])))
        a = data.draw(st.integers(0, len(source)))
        b = data.draw(st.integers(a, len(source)))
        items.append(Instruction(session.id, n, data.draw(st.sampled_from([text, source[a:b] or text]))))
    expected = _missing_in(items, _kept_texts(session, cited))
    assert _missing_from_kept(session, items, cited) == expected
    assert [i for i in items if i.normalized not in "\n".join(_kept_texts(session, cited))] == expected


def test_an_instruction_keeps_a_few_words_and_no_copy_of_its_text():
    text = "keep " + " ".join(f"w{'x' * n}" for n in range(30)) + " done"
    item = Instruction("s", 1, text)
    assert item.normalized is text  # already normalised: the text itself
    assert list(item.inner_words) == [f"w{'x' * n}" for n in range(29, 29 - FILTER_WORDS, -1)]
    spaced = Instruction("s", 2, "keep  the\nparser strict")
    assert spaced.normalized == "keep the parser strict" and list(spaced.inner_words) == ["the", "parser"]


def test_an_instruction_no_kept_text_can_hold_is_not_searched_for(tmp_path, monkeypatch):
    kernel = build_kernel(tmp_path, fsync=False, model=WINDOW)
    session = kernel.open_session()
    session.user("keep the parser strict and the tests fast")
    session.user("something else entirely, said later")
    first = session.surface.nodes[0].seq
    lost = Instruction(session.id, first, "keep the parser strict and the tests fast")
    quoted = Instruction(session.id, 99, "else entirely, said")
    normalised: list[str] = []
    real = instructions_module.normalized
    monkeypatch.setattr(instructions_module, "normalized", lambda t: normalised.append(t) or real(t))
    assert _missing_from_kept(session, [lost], {first}) == [lost]
    assert normalised == []  # no kept text was normalised: "parser" is in none of them
    assert _missing_from_kept(session, [lost, quoted], {first}) == [lost]
    assert normalised == ["something else entirely, said later"]  # searched, for the quoted one


# -- the block counted from its parts --------------------------------------------------------------
# The replacement that carries the user's instructions is counted from its parts (issue 21,
# item 2): the block from the counts the ledger already holds for each instruction, the strategy's
# replacement from its own count. Checked against the tokenizer on the whole text, for any
# instructions (own and inherited, surrounding white space, punctuation, several lines) and any
# replacement, with and without its count known.


PIECES = st.sampled_from(
    ["keep", " it", " short", ".", "!", "\n", "  ", "\t", "é", "\u00a0", "42", "'s", "/", ")", "中文", "<x>", "\n\n"]
)
BLOCK_TEXTS = st.lists(PIECES, min_size=1, max_size=14).map("".join)


@pytest.fixture(scope="module")
def session(tmp_path_factory: Any) -> Any:
    kernel = build_kernel(tmp_path_factory.mktemp("block"), fsync=False)
    return kernel.open_session()


@st.composite
def instructions(draw: st.DrawFn, session_id: str) -> list[Instruction]:
    items = []
    for seq in range(draw(st.integers(1, 8))):
        owner = session_id if draw(st.booleans()) else "parent-session"
        items.append(Instruction(owner, seq * 3 + 1, draw(BLOCK_TEXTS)))
    return items


@settings(
    max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None
)
@given(st.data())
def test_the_block_and_its_carrier_are_counted_as_the_tokenizer_counts_them(session: Any, data: st.DataObject) -> None:
    meter = session.meter
    items = data.draw(instructions(session.id))
    session.instruction_costs.clear()
    for item in items:  # the ledger knows some counts (exact ones: the surface's or the budget's)
        if data.draw(st.booleans()):
            session.instruction_costs[(item.session, item.seq)] = meter.count_text(item.text)
    assert block_tokens(session, items) == meter.count_text(block_text(items, session.id))
    assert carried_tokens(session, None, None, items) == meter.count_message(block_message(items, session.id))
    own = data.draw(
        st.one_of(
            BLOCK_TEXTS.map(lambda t: checkpoint_message(t, "basic")),
            BLOCK_TEXTS.map(lambda t: Message.user(t, Source.plugin_form("s", "summary"))),
            st.lists(BLOCK_TEXTS, min_size=2, max_size=3).map(
                lambda ts: Message("user", tuple(TextBlock(t) for t in ts), Source.plugin_form("s", "summary"))
            ),
        )
    )
    whole = meter.count_message(with_block(own, items, session.id))
    assert carried_tokens(session, own, None, items) == whole
    assert carried_tokens(session, own, meter.count_message(own), items) == whole


def test_the_block_puts_each_id_after_its_instruction(session: Any) -> None:
    items = [Instruction(session.id, 5, "  keep answers short.\n"), Instruction("parent", 9, "use tabs")]
    lines = block_text(items, session.id).splitlines()
    assert lines[2:] == ["keep answers short. [item_5]", "use tabs", "</user-instructions>"]


def test_a_commit_records_the_carriers_exact_count(tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path, model={"context_window": 8000, "reserved_output_tokens": 500}, fsync=False)
    session = kernel.open_session()
    for n in range(8):
        session.user(f"rule {n}: end every answer with a period." if n % 2 else f"rule {n} (no period)")
        session.prepare_request()
        session.commit_reply(Message.assistant(" ".join(f"w{n}x{i}" for i in range(40))))
        session.end_turn()
    nodes = session.surface.nodes
    result = session.compact(Span(nodes[0].seq, nodes[-3].seq, summary="the head"), strategy="basic")
    node = session.surface.node(result.spans[0].replacement_seq)
    assert "[item_" in node.message.text  # the block was pinned
    assert result.spans[0].tokens_after == node.tokens == session.meter.count_message(node.message)


# -- a transaction of tool-result rewrites -----------------------------------------------------------
# A tool result rewritten in place (a mask, an excerpt) cannot take a user message off the surface,
# so such a transaction pins nothing and does not search the surface for the protected
# instructions (that search grew with the session: bench_compaction_flat.py's mask row). A
# transaction with a removal still gets the block, in its first removal.


def test_a_transaction_of_tool_result_rewrites_pins_nothing_and_searches_nothing(tmp_path: Any, monkeypatch) -> None:
    kernel = build_kernel(tmp_path, model={"context_window": 8000, "reserved_output_tokens": 500}, fsync=False)
    session = kernel.open_session()
    for n in range(6):
        session.user(f"rule {n}: keep every answer under {n + 3} lines")
        session.prepare_request()
        session.commit_reply(Message.assistant(" ".join(f"w{n}x{i}" for i in range(30))))
        session.end_turn()
    nodes = session.surface.nodes
    session.compact(Span(nodes[0].seq, nodes[-3].seq, summary="the head"), strategy="basic")
    session.user("read the file")
    session.prepare_request()
    call = ToolCallBlock("c1", "read_file", {"path": "a.py"})
    session.commit_reply(Message.assistant("", [call]))
    result_seq = session.tool_result("c1", "x = 1\n" * 50)
    assert _not_kept_as_sent(session, {result_seq})  # protected instructions are off the surface as sent
    searched: list[set[int]] = []
    real = instructions_module._not_kept_as_sent
    monkeypatch.setattr(instructions_module, "_not_kept_as_sent", lambda s, c: searched.append(c) or real(s, c))
    masked = Message.tool("c1", "[masked]")
    assert pin_lost(session, {result_seq}, [masked]) == ([masked], [], -1)
    assert searched == []
    user_seq = session.surface.nodes[-3].seq  # "read the file": a removal takes it off the surface
    replacements, pinned, carrier = pin_lost(session, {result_seq, user_seq}, [masked, None])
    assert searched == [{result_seq, user_seq}]
    assert pinned and carrier == 1 and replacements[0] is masked
    assert replacements[1] == block_message(pinned, session.id)

"""The table of contents counted from its pieces (issue 21, sixth round): each user instruction's
quote is counted once, at the step it starts, and a compaction adds those counts instead of
tokenising the whole table of contents. The text is the one the whole render wrote, and the
count is the whole text's count, exactly."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

from helpers_chapters import chapters_kernel, do_turn, reading_script
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import Event, Message, Source
from ctxkernel.messages import USER
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.testing import CountingTokenizer
from ctxkernel_chapters import plugin as chapters_plugin
from ctxkernel_chapters import toc
from ctxkernel_chapters.strategy import state

METER = Meter(get_tokenizer())


def render_whole(
    t: toc.Toc, *, handoff="", count=None, bullet_budget=None, instruction_budget=None, at_most=None
) -> tuple[str, int]:
    """The oracle: ``toc.render`` as it was before it was cut into pieces (verbatim)."""
    entries = list(t.bullets.items())
    shortened = folded = 0
    if count is not None and bullet_budget is not None:
        entries, shortened, folded = toc._fit(entries, count, bullet_budget, at_most)
    lines = [line for _, line in entries]
    parts = [toc.TOC_OPEN, toc.INTRO, "", toc.CHAPTERS]
    parts += lines or ["(no chapters yet)"]
    if shortened or folded:
        parts.append(
            f"({shortened} bullet(s) shortened, {folded} folded to fit the bullet budget; the manifest keeps every summary)"
        )
    instructions, left_out = toc._pick_instructions(t.instructions, count, instruction_budget, at_most)
    if instructions:
        parts += ["", toc.INSTRUCTIONS, "\n\n".join(toc._quote(x) for x in instructions)]
    if left_out:
        parts.append(f"({left_out} earlier or longer instruction(s) are in the chapters only)")
    if handoff.strip():
        parts += ["", toc.HANDOFF, toc._escape(handoff.strip())]
    if t.carried:
        parts += ["", toc.CARRIED, toc._escape("\n\n".join(t.carried))]
    parts.append(toc.TOC_CLOSE)
    return "\n".join(parts), shortened + folded


# instructions as users write them: several lines, blank lines, indentation, markers, tags,
# trailing spaces, CJK and emoji (a quote's count must not depend on what follows it)
_line = st.lists(
    st.sampled_from(list("ab z.,:;-_()`'\"0123456789\t") + ["é", "漢", "🙂", "<", ">", "[[", "]]", "  ", "\r"]),
    max_size=40,
).map("".join)
_instruction = st.lists(_line, min_size=1, max_size=4).map("\n".join)
_record = st.builds(
    lambda n, title, summary: {
        "path": f"root/chapters/{n:03d}-x.md",
        "number": n,
        "title": title,
        "start_seq": n * 10,
        "end_seq": n * 10 + 9,
        "tokens": 100 + n,
        "summary": summary,
    },
    st.integers(1, 40),
    _line,
    _line,
)


@st.composite
def tables(draw):
    records = draw(st.lists(_record, max_size=4, unique_by=lambda r: r["number"]))
    instructions = draw(st.lists(_instruction, max_size=8))
    carried = draw(st.lists(_instruction, max_size=2))
    merged = toc.merged([], records, "chapters", carried, instructions=instructions)
    handoff = draw(st.sampled_from(["", "carry on with the parser", "  \n"]))
    budgets = draw(st.sampled_from([(None, None), (40, 30), (4000, 4000), (10, 5)]))
    return merged, handoff, budgets


# 100 examples: a table has at most 4 records and 8 quotes and one of 4 budget pairs, so 100 draws
# meet every budget pair, bounded or not, many times over; more only lengthened `make test`
@settings(max_examples=100, deadline=None)
@given(tables(), st.booleans())
def test_the_pieces_join_to_the_whole_render(drawn, bounded):
    merged, handoff, (bullets, quoted) = drawn
    kwargs = {
        "handoff": handoff,
        "count": METER.count_text,
        "bullet_budget": bullets,
        "instruction_budget": quoted,
        "at_most": toc.byte_bound if bounded else None,
    }
    pieces, changed = toc.render_pieces(merged, **kwargs)
    assert ("".join(pieces), changed) == render_whole(merged, **kwargs) == toc.render(merged, **kwargs)
    quotes = [toc.quote_piece(x) for x in merged.instructions]
    # every quote but the last is a piece of its own, as count_new_quotes counted it
    assert all(p in quotes for p in pieces[1:-2])


# 100 examples: the same small tables as above, each with a drawn subset of quotes counted earlier
@settings(max_examples=100, deadline=None)
@given(tables(), st.data())
def test_a_table_counted_from_its_pieces_is_the_whole_count(drawn, data):
    merged, handoff, _ = drawn
    pieces, _ = toc.render_pieces(merged, handoff=handoff)
    # any subset of the quotes counted earlier (a session reopened counts none of its old ones)
    quotes = [toc.quote_piece(x) for x in merged.instructions]
    known = data.draw(st.lists(st.sampled_from(quotes), unique=True) if quotes else st.just([]))
    kept = {piece: METER.count_text(piece) for piece in known}
    assert chapters_plugin.count_toc(METER, pieces, kept) == get_tokenizer().count("".join(pieces))


def _turns(session, instructions: list[str], model=None):
    model = model or reading_script(1)
    for text in instructions:
        do_turn(session, model, text, tool_output=lambda call: "x = compute(1, 2)\n" * 30)
    return model


INSTRUCTIONS = [
    f"task {t}: look at module {t}\n\n  and then\tthe parser 漢 🙂 >quoted< {t}, its tests and the docs  "
    for t in range(24)
]


def test_a_compaction_tokenises_only_the_tables_new_pieces(tmp_path):
    """The quotes were counted at the steps their instructions started: the compaction tokenises
    the head (with the new bullet) and the end once, the transaction looks the whole count up,
    and what the commit records is the whole text's exact count."""
    kernel = chapters_kernel(tmp_path, window=200_000, reserve=8_000, auto=False)
    # no instruction protected by the kernel's block: the table of contents quotes them all
    kernel.profile.instructions.budget_ratio = 0
    session = kernel.open_session()
    _turns(session, INSTRUCTIONS)
    kept = state(session.context)["quote_counts"]
    assert set(kept) == {toc.quote_piece(x) for x in INSTRUCTIONS}
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    assert chapters_plugin.compact_in_place(session.context, 300, reason="manual")
    summary = next(e for e in reversed(session.events) if e.type == "compaction/summary")
    text = Message.from_dict(session.events[summary.seq + 1].data["message"]).text
    quoted = [x for x in INSTRUCTIONS if toc.quote_piece(x).rstrip("\n") in text]
    assert len(quoted) >= 3 and len(text) >= chapters_plugin.TOC_COUNTED_FROM_PIECES_CHARS
    assert not [t for t in counting.texts if toc.quote_piece(quoted[0]) in t]  # an earlier quote: added
    assert not [t for t in counting.texts if toc.TOC_CLOSE in t and toc.TOC_OPEN in t]  # never the whole
    assert summary.data["tokens_after"] == counting.inner.count(text) + session.meter.count_message(Message.user(""))
    assert session.meter.surface_tokens() == sum(session.meter.count_message(n.message) for n in session.surface.nodes)


def test_a_reopened_session_counts_its_table_whole_and_exactly(tmp_path: Path):
    """Quote counts live in the process: a session opened again keeps none of its earlier
    instructions' (an open stays O(new events)), so its compaction tokenises them, exactly."""
    kernel = chapters_kernel(tmp_path, window=200_000, reserve=8_000, auto=False)
    session = kernel.open_session()
    model = _turns(session, INSTRUCTIONS[:12])
    again = chapters_kernel(tmp_path, window=200_000, reserve=8_000, auto=False).open_session(session.id)
    assert not state(again.context).get("quote_counts")
    _turns(again, INSTRUCTIONS[12:], model)
    assert set(state(again.context)["quote_counts"]) == {toc.quote_piece(x) for x in INSTRUCTIONS[12:]}
    assert chapters_plugin.compact_in_place(again.context, 300, reason="manual")
    summary = next(e for e in reversed(again.events) if e.type == "compaction/summary")
    text = Message.from_dict(again.events[summary.seq + 1].data["message"]).text
    assert summary.data["tokens_after"] == again.meter.count_message(Message.user(text))
    assert summary.data["tokens_after"] == get_tokenizer().count(text) + again.meter.count_message(Message.user(""))


def test_a_long_instruction_is_not_kept_and_the_count_stays_exact(tmp_path):
    """What a user pastes is kept only up to a bound (the kept quote holds the user's text): a
    longer instruction's quote is counted when a table of contents cites it, exactly, and the
    kept counts stay bounded in number."""
    kernel = chapters_kernel(tmp_path, window=200_000, reserve=8_000, auto=False)
    session = kernel.open_session()
    long = "paste: " + "the parser fails on line 3 of the header block.\n" * 200
    assert len(long) > chapters_plugin.QUOTE_KEPT_MAX_CHARS
    _turns(session, [*INSTRUCTIONS[:10], long, *INSTRUCTIONS[10:]])
    kept = state(session.context)["quote_counts"]
    assert toc.quote_piece(long) not in kept and len(kept) == len(INSTRUCTIONS)
    assert chapters_plugin.compact_in_place(session.context, 300, reason="manual")
    summary = next(e for e in reversed(session.events) if e.type == "compaction/summary")
    text = Message.from_dict(session.events[summary.seq + 1].data["message"]).text
    assert summary.data["tokens_after"] == get_tokenizer().count(text) + session.meter.count_message(Message.user(""))
    st_ = {"quotes_cursor": 0, "quote_counts": {f"> {n}\n\n": 1 for n in range(chapters_plugin.QUOTE_COUNTS_KEPT)}}
    chapters_plugin.count_new_quotes(session.context, st_)
    assert len(st_["quote_counts"]) == chapters_plugin.QUOTE_COUNTS_KEPT  # the oldest made room


class _Landing:
    """What ``count_new_quotes`` reads of a session: its log and its meter."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.meter = METER

    def land(self, text: str, *, by_user: bool) -> None:
        source = USER if by_user else Source.plugin_form("chapters", "notice")
        message = Message.user(text, source).to_dict()
        self.events.append(Event(len(self.events), "user/message", {"message": message}, surface={"op": "append"}))


_landed = st.lists(
    st.tuples(st.one_of(_instruction, st.sampled_from(["", "  \n", "same", " same ", "x" * 50])), st.booleans()),
    max_size=12,
)


# 80 examples: at most four batches of landed quotes and a bound of 2 to 6, so 80 draws reach
# every bound with batches of every length; 200 only lengthened `make test`
@settings(max_examples=80, deadline=None)
@given(st.lists(_landed, min_size=1, max_size=4), st.integers(2, 6))
def test_the_kept_quotes_are_the_fresh_quotes_after_drawn_steps(steps, bound):
    """The quotes (and their counts) kept at each step, drawn in batches, with duplicates, blank
    messages, plugin notices and a small bound, are what quoting and counting each anew gives, and a
    table of contents rendered from the kept quotes is the one rendered without them."""
    session, st_ = _Landing(), {"quotes_cursor": 0}
    with patch.object(chapters_plugin, "QUOTE_COUNTS_KEPT", bound):
        for batch in steps:
            for text, by_user in batch:
                session.land(text, by_user=by_user)
            chapters_plugin.count_new_quotes(session, st_)  # a stand-in ctx: its log and its meter
            pieces, counts = st_.get("quote_pieces", {}), st_.get("quote_counts", {})
            assert len(pieces) <= bound and len(counts) <= bound
            assert all(piece == toc.quote_piece(text) and text == text.strip() for text, piece in pieces.items())
            assert all(n == METER.count_text(piece) for piece, n in counts.items())
    users = [text for batch in steps for text, by_user in batch if by_user and text.strip()]
    merged = toc.merged([], [], "chapters", instructions=users)
    kept = lambda text: pieces.get(text) or toc.quote_piece(text)  # noqa: E731 - as toc_for_region serves them
    assert toc.render_pieces(merged, quote=kept) == toc.render_pieces(merged)


def test_the_fixed_head_is_counted_once_per_tokenizer_and_the_count_stays_exact():
    """Every table of contents starts with ``toc.FIXED_HEAD``: counted once per tokenizer, then added."""
    merged = toc.merged([], [], "chapters", instructions=INSTRUCTIONS[:6])
    pieces, _ = toc.render_pieces(merged)
    assert pieces[0].startswith(toc.FIXED_HEAD)
    meter = Meter(get_tokenizer())
    counting = meter.tokenizer = CountingTokenizer(meter.tokenizer)  # the meter still knows its cuts
    for _ in range(2):
        assert chapters_plugin.count_toc(meter, pieces, {}) == get_tokenizer().count("".join(pieces))
    assert [t for t in counting.texts if toc.FIXED_HEAD in t] == [toc.FIXED_HEAD]

"""A seed's exact token count from its parts' counts (issue 21 item 3).

The seed is cut after a line end, before a tag or a heading, where cl100k_base's counts of the two
sides add up to the count of the whole (``Meter.joins_exactly``). These tests hold the real seed
layouts (full, fitted to a small budget, minimal; notes shown and hidden; pending input,
instructions and an error) against the encoding itself, with texts that start with white space,
end without a line end, hold '<', CJK, emoji and Unicode line separators.
"""

from __future__ import annotations

from helpers_rollover import rollover_kernel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.recall.notes import Note, Notes
from ctxkernel_rollover.plugin import inject_note
from ctxkernel_rollover.seed import WINDOW, NoteCache, SeedInput, compose_seed, window_texts
from ctxkernel_rollover.switch import switch

PIECES = st.sampled_from(
    [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\r", "<", ">", "</note>", "<user-input>", "</context-window>", "解析器"]
    + ["🙂", "\u00a0", "\u2028", "\x85", "\x1c", "123", "4567", "'s", "!!", "—", "## x", "a"]
)
TEXT = st.lists(st.one_of(st.text(max_size=20), PIECES), max_size=12).map("".join)
NOTE_CHARS = 8_000


def tokenizer_and_meter() -> tuple[object, Meter]:
    tokenizer = get_tokenizer()
    return tokenizer, Meter(tokenizer)


@settings(max_examples=150, deadline=None)
@given(
    goal=st.one_of(st.none(), TEXT),
    pending=st.lists(TEXT, max_size=3),
    instructions=st.lists(TEXT, max_size=2),
    error=st.one_of(st.none(), TEXT),
    contents=st.lists(TEXT, max_size=6),
    hidden=st.lists(st.sampled_from(["a", "b/c"]), max_size=2),
    prepared=st.lists(st.booleans(), min_size=6, max_size=6),
    budget=st.sampled_from([40, 300, 3_000, 10_000_000]),
    figure=st.sampled_from(["0 of 1000", "982403 of 992000", "123456789012 of 999999999999"]),
    chain=st.sampled_from(
        [
            ("w2", "w1", "w1", 2, 0, 9),
            ("019ad2b0-7c3e-7f00-8a11-3b2c1d0e9f87", None, "w0", 1, 0, 0),
            ("019ad2b0-7c3e-7f01-9b22-0c1d2e3f4a5b", "019ad2b0-7c3e-7f00-8a11-3b2c1d0e9f87", "w0", 12, 4410, 98765),
        ]
    ),
    window_ahead=st.booleans(),
)
def test_a_seed_counted_from_its_parts_is_the_count_of_the_whole(
    goal, pending, instructions, error, contents, hidden, prepared, budget, figure, chain, window_ahead
):
    tokenizer, meter = tokenizer_and_meter()
    notes = [
        Note(f"n_{i}", f"n/{i}", text or "-", "model-authored", "w1", "t0", "t1", 1, i, i)
        for i, text in enumerate(contents)
    ]
    cache = NoteCache()
    for note, early in zip(notes, prepared, strict=False):
        if early:  # counted when the note was written
            cache.prepare(note, NOTE_CHARS, meter.count_text)
    current, previous, first, number, archived_from, archived_to = chain
    if window_ahead:  # the window's fixed parts, counted in its first step
        cache.prepare_window(previous or "-", window_texts(previous, first, number, archived_from), meter.count_text)
    seed = SeedInput(
        current,
        previous,
        first,
        number,
        "overflow",
        goal,
        "test",
        list(enumerate(pending)),
        notes,
        archived_from,
        archived_to,
        error=error,
        hidden_note_paths=hidden,
        instructions=list(enumerate(instructions)),
    )
    parts, _, _ = compose_seed(
        seed,
        budget_tokens=budget,
        count=meter.count_text,
        goal_chars=4_000,
        pending_chars=16_000,
        note_chars=NOTE_CHARS,
        note_cache=cache,
    )
    parts.count_all_but_figure(meter.count_text, cache)
    filled = parts.with_figure(figure)
    whole = tokenizer.count(filled.text)
    assert meter.count_joined(filled.parts, filled.counts) == whole
    # every cut is exact, so nothing is glued and tokenised again: the sum of the parts' own counts
    assert all(meter.joins_exactly(a, b) for a, b in zip(filled.parts, filled.parts[1:], strict=False))
    assert sum(tokenizer.count(p) for p in filled.parts) == whole
    # the counts the seed took from the cache (a note's part, counted when written) are its own
    for part, known in zip(filled.parts, filled.counts, strict=True):
        assert known is None or known == tokenizer.count(part)
    # the parts fixed from the window's start are the texts counted ahead, found by their text
    window_parts = [part for part, key in zip(filled.parts, filled.keys, strict=True) if key == WINDOW]
    assert set(window_parts) <= set(window_texts(previous, first, number, archived_from))
    if window_ahead:
        assert all(cache.window[part] == tokenizer.count(part) for part in window_parts)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(TEXT.filter(str.strip), min_size=1, max_size=8),
    injected=st.lists(st.booleans(), min_size=8, max_size=8),
    window=st.sampled_from([8_000, 128_000, 1_000_000]),
)
def test_the_switch_counts_its_seed_as_the_kernel_does(tmp_path_factory, texts, injected, window):
    session = rollover_kernel(tmp_path_factory.mktemp("parts"), window=window, reserve=1_000).open_session()
    session.user("  start the work on the parser\n")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading"))
    api = Notes.for_session(session)
    for i, (text, early) in enumerate(zip(texts, injected, strict=False)):
        if early:
            inject_note(session.context, f"n/{i}", text)  # rendered and counted as it is written
        else:
            api.write(f"n/{i}", text)  # first counted by the switch
    meter = session.meter
    counts: list[int] = []

    def count_joined(parts, known=None, _inner=meter.count_joined):
        counts.append(_inner(parts, known))
        return counts[-1]

    meter.count_joined = count_joined  # type: ignore[method-assign]
    result = switch(session.context, "manual")
    # the plugin's count from the parts (with the message framing) is what the kernel recorded
    assert counts and counts[-1] + 4 == result.tokens_after
    assert result.tokens_after == 4 + get_tokenizer().count(session.surface.nodes[0].message.text)

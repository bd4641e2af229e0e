"""What a switch does around its commit (issue 21 item 3): its seed is counted from its parts
(a note's part when the note is written or first shown, never again while it is unchanged; the
rest when the switch builds it), and the pending input and the goal come from folded state
instead of a walk back through the log. Each is checked against the result of the slower way it
replaced: a count of the whole text, a seed rendered afresh, a walk back."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from helpers_rollover import call, rollover_kernel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message
from ctxkernel.events import TURN_START, USER_MESSAGE
from ctxkernel.meter import get_tokenizer
from ctxkernel.recall.notes import Note, Notes, render_note
from ctxkernel.testing import CountingTokenizer
from ctxkernel.text import guard
from ctxkernel_rollover import seed as seed_module
from ctxkernel_rollover import switch as switch_module
from ctxkernel_rollover.plugin import inject_note
from ctxkernel_rollover.state import state_of
from ctxkernel_rollover.switch import FIGURE_SLACK, current_turn_inputs, switch


def session_with_notes(tmp_path, window: int, notes: int = 12):
    session = rollover_kernel(tmp_path, window=window, reserve=4_000).open_session()
    session.user("refactor the parser module and keep its API")
    for i in range(6):
        session.prepare_request()
        session.commit_reply(Message.assistant(f"step {i}", [call(f"c{i}", "read_file", path=f"m{i}.py")]))
        session.tool_result(f"c{i}", "def f():\n    return 1\n" * 30)
    api = Notes.for_session(session)
    for i in range(notes):
        api.write(f"notes/{i}", f"decision {i}: keep the parser's API; next, step {i}.\n" * 6)
    session.end_turn()
    session.user("continue")
    return session


def seed_texts(texts: list[str]) -> tuple[list[str], list[str]]:
    """Of the texts a tokenizer was asked to count: those holding several note blocks (a whole
    seed) and those holding exactly one (a note's part)."""
    return [t for t in texts if t.count("<note ") > 1], [t for t in texts if t.count("<note ") == 1]


@pytest.mark.parametrize("window", [128_000, 1_000_000])
def test_the_plugin_tokenises_only_new_parts_and_an_unchanged_note_never_again(tmp_path, monkeypatch, window):
    # notes written through the notes API (not the model's tools): the first switch counts each
    # note's part on its own, once; the second finds every one of them counted
    session = session_with_notes(tmp_path, window)
    counting = CountingTokenizer(session.meter.tokenizer)
    monkeypatch.setattr(session.meter, "tokenizer", counting)
    # the header with the recall tools the first switch brings: the header guard counted it at
    # the first request, with the tokenizer this test replaced (the meter's memo is per tokenizer)
    session.full_header()
    for round_ in range(2):
        counting.texts.clear()
        result = switch(session.context, "manual")
        seed = session.surface.nodes[0].message.text
        assert seed.count("<note ") == 12
        whole, single = seed_texts(counting.texts)
        # nobody tokenises the whole seed: the plugin counts it from its parts, and the kernel's
        # count at the commit (tokens_after, exact below) finds that count in the meter's memo
        assert whole == [], "the seed was tokenised whole"
        assert max(Counter(counting.texts).values()) == 1, "a text was tokenised twice"
        assert len(single) == (12 if round_ == 0 else 0)
        assert sum(len(t) for t in counting.texts) < 2_000 + (len(seed) if round_ == 0 else 0)
        assert result.tokens_after == 4 + get_tokenizer().count(seed)
        session.user(f"go on {round_}")


def test_notes_the_model_writes_are_counted_then_and_the_switch_tokenises_none_of_them(tmp_path, monkeypatch):
    session = rollover_kernel(tmp_path, window=128_000, reserve=4_000).open_session()
    session.user("refactor the parser module and keep its API")
    session.prepare_request()
    calls = [
        call(f"n{i}", "note_create", path=f"n/{i}", content=f"  decision {i}: 解析器 <keep> it\r\n" * 3)
        for i in range(6)
    ]
    calls.append(call("u", "note_update", note="n/0", content="\tthe goal, updated"))
    calls.append(call("a", "note_append", path="n/1", text=" and more"))
    session.commit_reply(Message.assistant("saving", calls))
    for c in session.pending_calls:
        session.tool_result(c.id, session.run_tool(c))
    inject_note(session.context, "user/ask", "the user's own note, no line end")
    cache = state_of(session.context).note_cache
    # one entry per note: an update's or an append's older version went
    assert sorted(k[0] for k in cache.tokens) == sorted({k[0] for k in cache.tokens})
    assert len(cache.tokens) == len(cache.blocks) == 7
    for (_, _, _), block in cache.blocks.items():
        assert block.startswith("<note ")
    counted = {cache.blocks[k] + "\n": n for k, n in cache.tokens.items()}
    assert all(get_tokenizer().count(part) == n for part, n in counted.items())
    session.end_turn()
    session.user("continue")
    counting = CountingTokenizer(session.meter.tokenizer)
    monkeypatch.setattr(session.meter, "tokenizer", counting)
    switch(session.context, "manual")
    seed = session.surface.nodes[0].message.text
    assert seed.count("<note ") == 7
    whole, single = seed_texts(counting.texts)
    assert single == [] and whole == []  # the commit's count of the seed is the memo's
    assert all(part in seed for part in counted)


def figure_and_truth(session) -> tuple[int, int, int]:
    """The seed's remaining-tokens figure, the room actually left after the switch, the window."""
    seed = session.surface.nodes[0].message.text
    match = re.search(r"Context remaining: about (\d+) of (\d+) tokens", seed)
    assert match, seed[:600]
    pressure = session.pressure()
    return int(match.group(1)), pressure.effective_window - pressure.tokens, int(match.group(2))


NOTE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=400)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(NOTE_TEXT, min_size=1, max_size=10),
    window=st.sampled_from([8_000, 32_000, 128_000, 1_000_000]),
    joins=st.booleans(),
)
def test_the_remaining_figure_never_overstates_the_room_and_understates_it_by_at_most_the_slack(
    tmp_path_factory, texts, window, joins
):
    session = rollover_kernel(tmp_path_factory.mktemp("figure"), window=window, reserve=1_000).open_session()
    if not joins:  # a tokenizer whose counts do not add across the seed's cuts (not cl100k_base)
        session.meter.joins_exactly = lambda left, right: False  # type: ignore[method-assign]
    session.user("start the work on the parser")
    session.prepare_request()
    session.commit_reply(Message.assistant("reading", [call("c", "read_file", path="a.py")]))
    session.tool_result("c", "x = 1\n" * 50)
    api = Notes.for_session(session)
    for i, text in enumerate(texts):
        api.write(f"n/{i}", text)
    switch(session.context, "manual")
    figure, truth, shown_window = figure_and_truth(session)
    assert shown_window == session.pressure().effective_window
    # its own digits are counted with the seed: a few tokens either way; counted from its parts,
    # the seed's count is exact, so the figure is too (else it may understate by the slack)
    slack = 0 if joins else FIGURE_SLACK * shown_window
    assert truth - slack - 8 <= figure <= truth + 8


def walk_back(session, limit: int = 8) -> list[tuple[int, str]]:
    """The pending input found by walking back through the open turn (the reference)."""
    if not session.turn_open:
        return []
    found = []
    for event in reversed(session.events):
        if event.type == TURN_START:
            break
        if (
            event.type == USER_MESSAGE
            and (event.surface or {}).get("op") == "append"
            and event.data["message"].get("source", {}).get("kind", "user") == "user"
        ):
            found.append((event.seq, Message.from_dict(event.data["message"]).text))
            if len(found) >= limit:
                break
    return list(reversed(found))


ACTIONS = st.lists(st.sampled_from(["user", "step", "end", "switch", "restart", "remind"]), max_size=30)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS)
def test_pending_input_from_the_folded_state_is_the_walk_back(tmp_path_factory, actions):
    home = tmp_path_factory.mktemp("pending")
    session = rollover_kernel(home, window=64_000).open_session()
    session.user("start the work")
    for n, action in enumerate(actions):
        if action == "user":
            session.user(f"more input {n} " * (n % 3 + 1))
        elif action == "step" and session.turn_open:
            session.prepare_request()
            session.commit_reply(Message.assistant(f"done {n}"))
        elif action == "end" and session.turn_open:
            session.end_turn()
        elif action == "switch" and session.turn_open and not session.surface.pending_calls:
            switch(session.context, "manual")
        elif action == "restart":
            session = rollover_kernel(home, window=64_000).open_session(session.id)
        elif action == "remind" and session.turn_open:
            session.emit("other", "event", {"n": n})
        for limit in (1, 3, 8):
            assert current_turn_inputs(session.context, limit) == walk_back(session, limit)


NOTE_EDITS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["write", "delete"]), st.text(max_size=30)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=NOTE_EDITS, budget=st.sampled_from([60, 400, 5_000]))
def test_a_seed_rendered_with_the_cache_is_the_seed_rendered_afresh(tmp_path_factory, edits, budget):
    session = rollover_kernel(tmp_path_factory.mktemp("cache"), window=64_000).open_session()
    notes = Notes.for_session(session)
    cache = seed_module.NoteCache()
    count = session.meter.count_text
    for path, op, text in edits:
        if op == "write":
            notes.write(path, text or "-")
        elif notes.exists(path):
            notes.delete(path)
        seed = seed_module.SeedInput(
            "w2", "w1", "w1", 2, "manual", "the goal", "test", [], list(reversed(notes.active())), 0, 9
        )
        kwargs = {"budget_tokens": budget, "count": count, "goal_chars": 500, "pending_chars": 500, "note_chars": 300}
        warm = seed_module.render_seed(seed, note_cache=cache, **kwargs)
        assert warm == seed_module.render_seed(seed, **kwargs)
        live = {(n.id, n.version) for n in notes.active()}
        assert {(k[0], k[1]) for k in cache.blocks} <= live, "the cache kept a block no seed uses"
    assert state_of(session.context).note_cache.blocks == {}  # the session's own cache: only switches fill it


FRAME_TEXT = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.sampled_from(
            [
                "<context-window",
                "</Context-Window >",
                "< / USER-INPUT",
                "<user-input item='x'>",
                "<note",
                "</note>",
                "</user-instructions>",
                "<Work-Ledger>",
                "< /context-checkpoint",
            ]
        ),
        st.sampled_from(["<", ">", "\u017f", "\u212a", "\u0130", "\n"]),  # long s, Kelvin sign, dotted I
    ),
    max_size=12,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(content=FRAME_TEXT, chars=st.sampled_from([200, 1_000, 8_000]), path=st.sampled_from(["goal", "a/b-2.md"]))
def test_a_note_block_skips_the_frame_guard_only_when_the_guard_would_change_nothing(content, chars, path):
    # the seed's frames are guarded in a note's block only when its content holds a '<': the
    # attributes are escaped and the note's own frame opens no seed frame, so the block is the same
    note = Note("n_1", path, content, "tool-output", "w1", "t0", "t1", 3, 1, 2)
    _, block = seed_module.NoteCache().block(note, chars)
    assert block == guard(render_note(note, max_chars=chars), *seed_module.NOTE_FRAMES)


def test_the_goal_note_is_the_seed_goal_even_when_a_protective_switch_does_not_show_it(tmp_path):
    session = session_with_notes(tmp_path, 128_000, notes=0)
    api = Notes.for_session(session)
    api.write("goal", "GOAL-NOTE: port the parser")
    for i in range(4):
        api.write(f"later/{i}", f"later note {i}")
    session = rollover_kernel(tmp_path, window=128_000, reserve=4_000, protective_keep_notes=2).open_session(session.id)
    switch(session.context, "overflow", error="the provider refused the request")
    seed = session.surface.nodes[0].message.text
    assert "## Goal (note 'goal')\nGOAL-NOTE: port the parser" in seed
    assert '<note path="goal"' not in seed  # only the two newest notes are shown
    assert seed.count("<note ") == 2


HOSTILE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)


@settings(max_examples=60, deadline=None)
@given(
    goal=HOSTILE_TEXT,
    pending=st.lists(HOSTILE_TEXT, max_size=3),
    contents=st.lists(HOSTILE_TEXT.filter(bool), max_size=6),
    window=st.sampled_from([1_000, 99_999_999]),
)
def test_a_seed_sized_by_its_byte_bound_never_costs_more_than_the_bound(goal, pending, contents, window):
    # a wide budget: render_seed answers with the byte bound instead of tokenising; filled in with
    # the longest remaining-tokens figure the window allows, the seed still costs no more than it
    tokenizer = get_tokenizer()
    notes = [
        Note(f"n_{i}", f"n/{i}", text, "tool-output", "w1", "t0", "t1", 1, i, i) for i, text in enumerate(contents)
    ]
    seed = seed_module.SeedInput(
        "w2", "w1", "w1", 2, "manual", goal or None, "test", list(enumerate(pending)), notes, 0, 9
    )
    text, bound, counted = seed_module.render_seed(
        seed,
        budget_tokens=10_000_000,
        count=tokenizer.count,
        goal_chars=4_000,
        pending_chars=16_000,
        note_chars=8_000,
    )
    assert not counted
    filled = text.replace(seed_module.REMAINING_PLACEHOLDER, f"{window} of {window}")
    assert tokenizer.count(filled) <= bound
    assert seed_module.byte_bound(goal) >= tokenizer.count(goal)


def test_the_parts_fixed_from_a_windows_start_are_counted_in_its_first_step_and_never_by_the_switch(
    tmp_path, monkeypatch
):
    # the chain's ids and where the window's items begin exist from the window's start: pre_step
    # counts them once, so the switch that ends the window tokenises neither of them; a switch
    # that comes before the next window's first step (a retry after an overflow) counts them itself
    session = session_with_notes(tmp_path, 1_000_000)  # its steps ran the first window's pre_step
    counting = CountingTokenizer(session.meter.tokenizer)
    monkeypatch.setattr(session.meter, "tokenizer", counting)
    # the header with the recall tools the first switch brings: the header guard counted it at
    # the first request, with the tokenizer this test replaced (the meter's memo is per tokenizer)
    session.full_header()
    for round_ in range(2):
        state = state_of(session.context)
        ahead = dict(state.note_cache.window)
        assert state.note_cache.window_of == state.current
        assert sorted(ahead) == sorted(seed_module.window_texts(*switch_module._chain(state)))
        assert all(get_tokenizer().count(text) == tokens for text, tokens in ahead.items())
        counting.texts.clear()
        result = switch(session.context, "manual")
        seed = session.surface.nodes[0].message.text
        assert all(text in seed for text in ahead)
        assert not any(' previous="' in text or "history_lookup(window=" in text for text in counting.texts)
        assert result.tokens_after == 4 + get_tokenizer().count(seed)
        session.user(f"go on {round_}")
        counting.texts.clear()
        for _ in range(2):  # the new window's first step counts its parts, a later one nothing
            session.prepare_request()
            session.commit_reply(Message.assistant(f"step {round_}"))
        assert sum(' previous="' in text for text in counting.texts) == 1
    # no step of the new window ran: the switch counts that window's parts itself, exactly
    switch(session.context, "manual")
    counting.texts.clear()
    result = switch(session.context, "manual")
    assert sum(' previous="' in text for text in counting.texts) == 1
    assert result.tokens_after == 4 + get_tokenizer().count(session.surface.nodes[0].message.text)

"""A switch counts the part of its handoff before the activity lines from its parts (issue 21,
item 2, seventh round): the fixed texts once per process, the numbers between fixed texts from
their digits, the rest tokenised. Each is checked here against a fresh count, and the handoff-log
line's first line against ``first_line``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxkernel_handoff
import ctxkernel_handoff.engine as engine
from ctxkernel.text import first_line
from ctxkernel_handoff.engine import LEADING_CHARS, leading_line
from ctxkernel_handoff.handoff import FIXED_PARTS, Handoff, Numbered, _lead_counts, fixed_count

#: instructions of odd text: white space of every kind at either end, tags, non-Latin scripts,
#: and some longer than the snapshot's clip (1,000 characters)
PIECE = st.text(st.sampled_from(list("ab c\t\n\r\u2028.é中🙂<>-!:0123")), min_size=1, max_size=40)
INSTRUCTION = st.one_of(PIECE, st.builds(lambda p, n: p * n, PIECE, st.integers(30, 80)))
STEP = st.one_of(INSTRUCTION, st.just("/switch"))


@given(
    head=st.text(st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x85\u2028ab<>")), max_size=30),
    middle=st.integers(0, 2 * LEADING_CHARS),
    tail=st.text(st.sampled_from(list(" \t\n\r\u2028ab")), max_size=30),
)
@settings(max_examples=300, deadline=None)
def test_the_leading_line_is_the_first_line_stripped(head, middle, tail):
    text = head + "x" * middle + tail
    assert leading_line(text) == first_line(text).strip()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=2, max_size=7))
def test_a_switch_counts_its_lead_from_parts_exactly(handoff_kernel, agent, monkeypatch, tmp_path_factory, steps):
    """Drawn turns and switches: the parts of the handoff before its activity lines are its text,
    the count from them is the whole message's count, and every part counted without
    tokenising (a fixed text, kept for the process; a number between fixed texts) has its fresh
    count."""
    kernel = handoff_kernel(window=200_000, home=tmp_path_factory.mktemp("home"))
    session = kernel.open_session()
    a = agent(session)
    meter = session.meter
    seen: list[Handoff] = []
    original = engine.handoff_tokens

    def spy(session_: Any, handoff: Handoff) -> int:
        seen.append(handoff)
        return original(session_, handoff)

    checked = 0
    with monkeypatch.context() as patch:
        patch.setattr(engine, "handoff_tokens", spy)
        for step in [*steps, "continue", "/switch"]:
            if step != "/switch":
                a.turn(step)
                continue
            seen.clear()
            outcome = ctxkernel_handoff.compact_now(session.context)
            if not outcome.committed or not seen or not seen[-1].lead:
                continue
            handoff = seen[-1]
            assert original(session, handoff) == meter.count_message(handoff.message())
            texts, counts = _lead_counts(meter, handoff.lead)
            assert "".join(texts) == handoff.pieces[0]
            for text, tokens in zip(texts, counts, strict=True):
                assert tokens is None or tokens == meter.count_text(text)
            checked += 1
    assert checked  # the last switch, at least, built an extractive body with lines


def test_the_fixed_parts_and_numbers_count_as_their_texts(handoff_kernel):
    meter = handoff_kernel(window=200_000).open_session().meter
    for text in FIXED_PARTS:
        assert fixed_count(meter, text) == meter.count_text(text)
    assert fixed_count(meter, "not a fixed part") is None
    for number in (0, 7, 12, 999, 1000, 123456789):
        part = Numbered(" whose items start at item_", number, ").")
        texts, counts = _lead_counts(meter, (part,))
        assert texts == [str(part)] and counts == [meter.count_text(str(part))]

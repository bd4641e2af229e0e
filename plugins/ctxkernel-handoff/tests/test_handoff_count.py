"""A switch counts its handoff from the lines counted when their excerpts were rendered (issue 21,
item 2): exactly the meter's count of the whole message, tokenising only the lines nobody counted.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxkernel_handoff
import ctxkernel_handoff.engine as engine
from ctxkernel import Summary
from ctxkernel.events import COMPACTION_SUMMARY
from ctxkernel.recall.history import History
from ctxkernel.testing import build_kernel
from ctxkernel_handoff.engine import state_for
from ctxkernel_handoff.handoff import Handoff, handoff_tokens

#: characters that stress the pretokenizer at a line break: whitespace of every kind, letters,
#: digits, punctuation, the handoff's own tag characters, non-Latin scripts and emoji
LINE_ALPHABET = st.sampled_from(list(" \t\r\u00a0\u2028\u3000abcXYZ019.,;:!?'\"-_<>/()[]{}#*&é中文🙂ß\u0301"))
LINES = st.lists(st.text(LINE_ALPHABET, max_size=40), min_size=1, max_size=25)


def _message_tokens(session: Any, text: str) -> int:
    """The meter's own count of the handoff message, tokenising the whole text (no memo)."""
    return session.meter.count_message(Handoff(text, text, Summary(text)).message())


@pytest.fixture(scope="module")
def counting_session(tmp_path_factory: Any) -> Any:
    """One session of the bundled profile (cl100k_base), for its meter."""
    return build_kernel(tmp_path_factory.mktemp("count")).open_session()


@settings(max_examples=300, deadline=None)
@given(lines=LINES, known=st.lists(st.booleans(), min_size=25, max_size=25))
def test_a_handoff_counted_from_known_lines_is_its_exact_count(counting_session, lines, known):
    """Any text, any subset of its lines known (each line with its line break, counted apart):
    the count from the parts equals the meter's count of the whole message."""
    session = counting_session
    text = "\n".join(lines)
    line_tokens = {
        line: session.meter.count_text(line + "\n") for line, take in zip(lines[:-1], known, strict=False) if take
    }
    handoff = Handoff(text, text, Summary(text))
    assert handoff_tokens(session, handoff, line_tokens) == _message_tokens(session, text)


def _spy_counts(monkeypatch: Any) -> list[tuple[int, int, int, int]]:
    """Wrap the switch's count: (count from parts, whole count, characters tokenised for it,
    characters of the text that were warmed lines) per call."""
    seen: list[tuple[int, int, int, int]] = []
    original = engine.handoff_tokens

    def spy(session: Any, handoff: Handoff, line_tokens: Any) -> int:
        tokenised: list[str] = []
        count_text = session.meter.count_text
        monkeypatch.setattr(session.meter, "count_text", lambda text: tokenised.append(text) or count_text(text))
        try:
            tokens = original(session, handoff, line_tokens)
        finally:
            monkeypatch.setattr(session.meter, "count_text", count_text)
        lines = handoff.text.split("\n")
        warmed = sum(len(line) + 1 for line in lines[:-1] if line in line_tokens)
        seen.append((tokens, _message_tokens(session, handoff.text), sum(map(len, tokenised)), warmed))
        return tokens

    monkeypatch.setattr(engine, "handoff_tokens", spy)
    return seen


INSTRUCTION = st.text(st.sampled_from(list("ab c\t\n.é中🙂<>-!")), min_size=1, max_size=60)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(instructions=st.lists(INSTRUCTION, min_size=3, max_size=6))
def test_a_switch_counts_its_handoff_exactly_and_tokenises_only_what_no_step_counted(
    handoff_kernel, agent, monkeypatch, tmp_path_factory, instructions
):
    """A real switch over turns of odd text: the count the fit uses is the whole message's count,
    the activity lines rendered at step ends are not tokenised again, and the commit records the
    count of what landed."""
    kernel = handoff_kernel(window=200_000, home=tmp_path_factory.mktemp("home"))
    session = kernel.open_session()
    a = agent(session)
    for text in instructions:
        a.turn(text)
    a.turn("continue")  # a step after the last reply: its lines are rendered too
    with monkeypatch.context() as patch:  # one example's patches end with it
        seen = _spy_counts(patch)
        outcome = ctxkernel_handoff.compact_now(session)
    assert outcome.committed, outcome.detail
    (tokens, whole, tokenised, warmed) = seen[0]
    assert tokens == whole
    assert warmed > 0
    handoff = session.surface.nodes[0]
    assert tokenised <= len(handoff.message.text) - warmed
    summary = next(e for e in reversed(session.events) if e.type == COMPACTION_SUMMARY)
    assert summary.data["spans"][0]["tokens_after"] == session.meter.count_message(handoff.message)


def test_the_kernel_checks_the_shrink_when_the_switch_could_not_prove_it(handoff_kernel, agent, monkeypatch):
    """The transaction's shrink check is skipped only when the switch's own exact count proved
    the handoff smaller than its region; otherwise the kernel counts and decides, as before."""
    kernel = handoff_kernel(window=200_000)
    session = kernel.open_session()
    a = agent(session)
    for t in range(4):
        a.turn(f"instruction {t}: keep the parser strict " + "detail " * 20)
    calls: list[dict[str, Any]] = []
    handle = type(engine.STRATEGY.on(session))
    compact = handle.compact
    monkeypatch.setattr(handle, "compact", lambda self, spans, **kw: calls.append(kw) or compact(self, spans, **kw))
    assert ctxkernel_handoff.compact_now(session).committed
    assert calls[-1]["check_shrink"] is False  # proven by the exact count from parts
    a.turn("instruction 9: and now the tests " + "detail " * 20)
    # the switch's count says no shrink (whatever the budget): the kernel's check runs
    monkeypatch.setattr(engine, "handoff_tokens", lambda session, handoff, line_tokens: 10**9)
    outcome = ctxkernel_handoff.compact_now(session)
    assert calls[-1]["check_shrink"] is True
    assert outcome.committed  # the kernel's own count finds the handoff smaller: it commits
    assert state_for(session).switches == 2


def test_the_counted_lines_follow_the_excerpts_held(handoff_kernel, agent):
    """Lines are counted as their excerpts are rendered at step ends, and forgotten with them
    (a switch forgets the nodes it replaced), so the counts stay bounded by the surface."""
    kernel = handoff_kernel(window=200_000)
    session = kernel.open_session()
    a = agent(session)
    for t in range(5):
        a.turn(f"instruction {t}: keep the parser strict")
    excerpts = state_for(session).excerpts
    held = {
        entry for node in session.surface.nodes for entry in excerpts.of(History.for_session(session), node).entries
    }
    assert held and set(excerpts.line_tokens) <= held
    for line, tokens in excerpts.line_tokens.items():
        assert tokens == session.meter.count_text(line + "\n")
    assert ctxkernel_handoff.compact_now(session).committed
    a.turn("instruction 6: and the tests")
    held = {
        entry for node in session.surface.nodes for entry in excerpts.of(History.for_session(session), node).entries
    }
    assert set(excerpts.line_tokens) <= held

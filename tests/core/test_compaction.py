"""The compaction transaction's refusals: unbalanced ranges, the shrink check, the stability check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ctxkernel
from ctxkernel import (
    CompactionBusyError,
    Message,
    ShrinkCheckError,
    Span,
    StrategySpec,
    Summary,
    SurfaceChangedError,
    ToolCallBlock,
    UnbalancedCutError,
)
from ctxkernel.context import session_of
from ctxkernel.testing import build_kernel, throwaway_plugin


def conversation(session: Any) -> None:
    """user, assistant(2 calls), result, result, assistant(1 call), result, assistant, user."""
    session.user("fix the parser " + "please " * 40)
    session.prepare_request()
    session.commit_reply(
        Message.assistant(
            "looking " * 30, [ToolCallBlock("a", "read", {"path": "p.py"}), ToolCallBlock("b", "grep", {"q": "x"})]
        )
    )
    session.tool_result("a", "def parse():\n" + "    pass\n" * 80)
    session.tool_result("b", "p.py:1: x\n" * 40)
    session.prepare_request()
    session.commit_reply(Message.assistant("editing", [ToolCallBlock("c", "edit", {"path": "p.py"})]))
    session.tool_result("c", "ok " * 50)
    session.prepare_request()
    session.commit_reply(Message.assistant("Fixed it. " * 20))
    session.end_turn()
    session.user("thanks, now the tests")


def nodes(session: Any) -> list[tuple[int, str]]:
    return [(n.seq, n.role) for n in session.surface]


def snapshot(session: Any) -> tuple[list[int], list[dict[str, Any]]]:
    return [n.seq for n in session.surface], [n.message.to_dict() for n in session.surface]


@pytest.fixture
def session(tmp_path: Path) -> Any:
    kernel = build_kernel(tmp_path)
    s = kernel.open_session()
    conversation(s)
    return s


def compaction_events(session: Any, since: int) -> list[Any]:
    return [e for e in session.events[since:] if e.type.startswith("compaction/")]


@pytest.mark.parametrize(
    ("start_index", "end_index", "why"),
    [
        (0, 1, "has no result yet|outside the range"),  # ends on an assistant whose results follow
        (0, 2, "outside the range"),  # splits the two results of one batch
        (2, 4, "answers call"),  # starts on a tool result whose call is before the range
    ],
)
def test_an_unbalanced_range_is_refused_and_nothing_is_written(
    session: Any, start_index: int, end_index: int, why: str
) -> None:
    path = session.store.path(session.id)
    before = path.read_bytes()
    surface = snapshot(session)
    seqs = [n.seq for n in session.surface]
    with pytest.raises(UnbalancedCutError, match=why):
        session.compact(Span(seqs[start_index], seqs[end_index], summary="s"), strategy="basic")
    assert path.read_bytes() == before  # refused before the lock event: byte-identical
    assert snapshot(session) == surface


def test_a_balanced_range_commits_summary_replacement_and_end(session: Any) -> None:
    seqs = [n.seq for n in session.surface]
    since = len(session.events)
    result = session.compact(Span(seqs[0], seqs[6], summary="they fixed the parser"), strategy="basic")
    kinds = [e.type for e in session.events[since:]]
    assert kinds == ["compaction/start", "compaction/summary", "user/message", "compaction/end"]
    assert "error" not in session.events[-1].data
    assert result.cites == seqs[:7]
    assert [n.seq for n in session.surface] == [result.spans[0].replacement_seq, seqs[7]]
    assert result.tokens_after < result.tokens_before


def test_the_shrink_check_refuses_with_exactly_one_error_end(session: Any) -> None:
    seqs = [n.seq for n in session.surface]
    surface = snapshot(session)
    since = len(session.events)
    with pytest.raises(ShrinkCheckError, match="not fewer than"):
        session.compact(Span(seqs[-1], seqs[-1], summary="a much longer summary " * 50), strategy="basic")
    events = compaction_events(session, since)
    assert [e.type for e in events] == ["compaction/start", "compaction/end"]
    assert "ShrinkCheckError" in events[1].data["error"]
    assert events[0].data["compaction_id"] == events[1].data["compaction_id"]
    assert snapshot(session) == surface
    assert session.open_compaction is None  # the lock is released: a next compaction may run
    session.compact(Span(seqs[0], seqs[6], summary="short"), strategy="basic")


class Interferer:
    """A summarize hook that lets another writer change the surface mid-transaction."""

    def __init__(self, action: Any) -> None:
        self.action = action

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("interferer"))

    @ctxkernel.hookimpl(tryfirst=True)
    def summarize(self, ctx: Any, region: Any) -> Summary:
        self.action(session_of(ctx))  # the test plays another writer: it needs the Session itself
        return Summary("short")


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_the_stability_check_refuses_when_another_writer_replaced_a_node(session: Any, where: str) -> None:
    seqs = [n.seq for n in session.surface]
    tool_seqs = [n.seq for n in session.surface if n.role == "tool"]
    target = tool_seqs[0] if where == "inside" else tool_seqs[-1]
    span = Span(seqs[0], seqs[3])  # the user message and the first tool batch
    assert (target in seqs[:4]) == (where == "inside")

    def other_writer(s: Any) -> None:
        # a second Session object on the same log: another process in all but the pid
        other = s.kernel.open_session(s.id, repair=False)
        other.replace_tool_result(target, "[pruned]", strategy="other")

    kernel = session.kernel
    with throwaway_plugin(kernel, Interferer(other_writer), "interferer"):
        since = len(session.events)
        with pytest.raises(SurfaceChangedError):
            session.compact(span, strategy="basic")
    events = compaction_events(session, since)
    assert [e.type for e in events] == ["compaction/start", "compaction/prune", "compaction/end"]
    assert "SurfaceChangedError" in events[-1].data["error"]
    assert not any(e.type == "compaction/summary" for e in session.events[since:])
    # the surface is exactly the other writer's: the failed transaction changed nothing
    fresh = kernel.open_session(session.id, repair=False)
    assert snapshot(session) == snapshot(fresh)
    assert [n.seq for n in session.surface] == [s if s != target else session.events[-2].seq for s in seqs]


def test_appends_by_another_writer_do_not_fail_a_transaction(session: Any) -> None:
    seqs = [n.seq for n in session.surface]

    def other_writer(s: Any) -> None:
        s.kernel.open_session(s.id, repair=False).emit("other", "note", {"x": 1})

    with throwaway_plugin(session.kernel, Interferer(other_writer), "interferer"):
        result = session.compact(Span(seqs[0], seqs[6]), strategy="basic")
    assert result.spans[0].replacement_seq is not None
    assert any(e.type == "other/note" for e in session.events)


def test_a_second_compaction_while_one_is_open_is_refused_naming_it(session: Any) -> None:
    seqs = [n.seq for n in session.surface]
    caught: list[Exception] = []

    def nested(s: Any) -> None:
        try:
            s.compact(Span(seqs[-1], seqs[-1], summary="x"), strategy="basic")
        except CompactionBusyError as exc:
            caught.append(exc)

    with throwaway_plugin(session.kernel, Interferer(nested), "interferer"):
        session.compact(Span(seqs[0], seqs[6]), strategy="basic")
    assert caught and "by strategy 'basic' is open since seq" in str(caught[0])


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([(0, 3), (1, 5)], "span 1 .* overlaps span 0 at seq {1}$"),
        ([(4, 5), (0, 6)], "span 1 .* overlaps span 0 at seq {4}$"),
        ([(6, 6), (4, 5), (0, 6)], "span 2 .* overlaps span 1 at seq {4}$"),  # the first node shared with any
        ([(1, 3), (0, 0), (0, 0)], "span 2 .* overlaps span 1 at seq {0}$"),
    ],
)
def test_overlapping_spans_are_refused_naming_the_first_shared_node(
    session: Any, ranges: list[tuple[int, int]], message: str
) -> None:
    path = session.store.path(session.id)
    before = path.read_bytes()
    seqs = [n.seq for n in session.surface]
    spans = [Span(seqs[a], seqs[b], summary="s") for a, b in ranges]
    with pytest.raises(ctxkernel.CompactionError, match=message.format(*seqs)):
        session.compact(spans, strategy="basic")
    assert path.read_bytes() == before


class CostedSummarizer:
    """A summarize hook that reports a model and its usage, as a plugin's own model call would."""

    def __init__(self, usage: Any, provider: Any = "p", model: Any = "m") -> None:
        self.usage, self.provider, self.model = usage, provider, model

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("costed"))

    @ctxkernel.hookimpl(tryfirst=True)
    def summarize(self, ctx: Any, region: Any) -> Summary:
        return Summary("short", provider=self.provider, model=self.model, usage=self.usage)


def test_a_summarizers_usage_is_recorded_in_the_kernels_form(session: Any) -> None:
    seqs = [n.seq for n in session.surface]
    usage = {"prompt_tokens": 900, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 800}}
    with throwaway_plugin(session.kernel, CostedSummarizer(usage), "costed"):
        session.compact(Span(seqs[0], seqs[6]), strategy="basic")
    span = next(e for e in session.events if e.type == "compaction/summary").data["spans"][0]
    assert (span["provider"], span["model"]) == ("p", "m")
    assert span["usage"] == {"input_tokens": 900, "output_tokens": 40, "cached_input_tokens": 800}


@pytest.mark.parametrize(
    ("usage", "provider", "model", "named"),
    [
        ({"input_tokens": -5}, "p", "m", "usage.input_tokens"),
        ({"input_tokens": 2**60}, "p", "m", "usage.input_tokens"),
        ("many", "p", "m", "usage must be a mapping"),
        ({"input_tokens": 1}, 7, "m", "provider"),
        ({"input_tokens": 1}, "p", ["m"], "model"),
        ({"input_tokens": 1}, "p" * 10_000, "m", "provider"),
    ],
)
def test_a_summarizers_bad_usage_fails_the_compaction_naming_it(
    session: Any, usage: Any, provider: Any, model: Any, named: str
) -> None:
    seqs = [n.seq for n in session.surface]
    surface = snapshot(session)
    since = len(session.events)
    summarizer = CostedSummarizer(usage, provider, model)
    with (
        throwaway_plugin(session.kernel, summarizer, "costed"),
        pytest.raises(ctxkernel.CompactionError, match=named) as caught,
    ):
        session.compact(Span(seqs[0], seqs[6]), strategy="basic")
    assert "summary for strategy 'basic'" in str(caught.value)
    events = compaction_events(session, since)
    assert [e.type for e in events] == ["compaction/start", "compaction/end"]
    assert snapshot(session) == surface

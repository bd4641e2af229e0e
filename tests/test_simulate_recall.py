"""Measured recall: hidden messages are fetched back through the strategy's own tools."""

from __future__ import annotations

from typing import Any

import pytest

from ctxkernel.recall.history import History
from ctxkernel.simulate import Options, build_workload, compare, recall
from ctxkernel.simulate.replay import run_profile

PROFILES = ["none", "basic", "decay", "handoff", "rollover", "chapters"]


@pytest.fixture(scope="module")
def long_report() -> dict[str, Any]:
    return compare(PROFILES, build_workload("coding-long"), Options())


def _row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["profiles"] if p["profile"] == name)


@pytest.mark.slow
def test_measured_recall_never_exceeds_the_declared_figure(long_report):
    for row in long_report["profiles"]:
        assert row["status"] == "ok", row["error"]
        assert 0.0 <= row["history_recoverable"] <= row["history_recoverable_declared"] <= 1.0
        if row["recall_method"] is None:  # nothing to call: measured is what the surface shows
            assert row["history_recoverable"] == row["history_recoverable_declared"]
            assert row["recall_calls"] == row["recall_tokens"] == 0


@pytest.mark.slow
def test_history_tools_bring_every_hidden_message_back_at_a_cost(long_report):
    for name, method in (("handoff", "history"), ("rollover", "lookup")):
        row = _row(long_report, name)
        assert row["recall_method"] == method
        assert row["history_recoverable"] == 1.0
        assert row["recall_probed"] == recall.MAX_TARGETS  # the long workload hides more than the cap
        assert row["recall_calls"] > row["recall_probed"]  # listings plus one read per message at least
        assert row["recall_tokens"] > row["recall_calls"]


@pytest.mark.slow
def test_chapters_gives_back_a_continued_parents_turn_in_progress(long_report):
    # the parent's turn in progress at a continuation is its last chapter, listed in the child's
    # table of contents: measured recall reaches the declared figure (before: below it)
    row = _row(long_report, "chapters")
    assert row["recall_method"] == "chapters"
    assert row["compactions"].get("continue", 0) > 0
    assert row["history_recoverable"] == row["history_recoverable_declared"] == 1.0


def test_only_content_that_comes_back_counts(monkeypatch):
    recording = build_workload("coding-long")
    options = Options(window=20_000)
    intact = run_profile("handoff", recording, options)
    original = History.read_item

    def clipped(self: History, item_id: str, **kw: Any) -> dict[str, Any]:
        out = original(self, item_id, **kw)
        out["content"] = out["content"][:8]  # the id resolves, the content does not come back
        out.pop("next_offset_chars", None)
        return out

    monkeypatch.setattr(History, "read_item", clipped)
    broken = run_profile("handoff", recording, options)
    assert intact["history_recoverable"] == 1.0
    assert broken["recall_calls"] > 0
    assert broken["history_recoverable"] < 0.5
    assert broken["history_recoverable_declared"] == intact["history_recoverable_declared"]


def test_recall_work_is_capped_and_the_sample_scaled(monkeypatch):
    monkeypatch.setattr(recall, "MAX_TARGETS", 10)
    row = run_profile("handoff", build_workload("coding-long"), Options(window=20_000))
    assert row["recall_probed"] == 10
    assert row["history_recoverable"] == 1.0
    monkeypatch.setattr(recall, "MAX_CALLS", 3)  # listings alone use them up: nothing is read
    starved = run_profile("handoff", build_workload("coding-long"), Options(window=20_000))
    assert starved["history_recoverable"] < row["history_recoverable"]


def test_sample_is_evenly_spaced_and_bounded():
    assert recall.sample(list(range(10)), 20) == list(range(10))
    picked = recall.sample(list(range(1000)), 7)
    assert len(picked) == 7
    assert picked == sorted(set(picked))
    assert picked[0] == 0
    assert picked[-1] > 800


@pytest.mark.slow
def test_errors_seen_leave_the_surface_and_come_back_through_tools(long_report):
    unmanaged, basic, handoff = (_row(long_report, n)["probes"]["errors_seen"] for n in ("none", "basic", "handoff"))
    assert unmanaged["count"] > 20
    assert unmanaged["visible"] == unmanaged["recoverable"] == 1.0
    assert basic["visible"] < 0.5  # summarised away...
    assert basic["recoverable"] == 1.0  # ...and fetched back through basic's history recall
    assert handoff["visible"] < 0.5
    assert handoff["recoverable"] == 1.0


def test_folded_chapters_of_a_long_table_of_contents_are_read_too():
    # regression: a folded line names a range of chapter numbers, which the prober used to skip
    toc = (
        "<chapters-toc>\n"
        "- [fold:archive/s1] 001–004: 4 earlier chapter(s) in archive/s1/, listed with their summaries\n"
        '- [archive/s1/005.md] 005 "Fix the parser" · seqs 40–52 · 300 tokens\n'
        "</chapters-toc>"
    )
    assert recall.chapter_numbers(toc) == ["5", "1", "2", "3", "4"]

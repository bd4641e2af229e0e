"""Measured recall: hidden messages are fetched back through the strategy's own tools."""

from __future__ import annotations

from typing import Any

import pytest
from simulate_support import replayed, workload

from ctxkernel.recall.history import History
from ctxkernel.simulate import Options, compare, recall
from ctxkernel.simulate.replay import run_profile

PROFILES = ["none", "basic", "decay", "handoff", "rollover", "chapters"]


@pytest.fixture(scope="module")
def long_report() -> dict[str, Any]:
    return compare(PROFILES, workload("coding-long"), Options())


def _row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["profiles"] if p["profile"] == name)


@pytest.mark.slow
def test_measured_recall_never_exceeds_the_declared_figure(long_report):
    for row in long_report["profiles"]:
        assert row["status"] == "ok", row["error"]
        assert 0.0 <= row["history_reachable"] <= row["history_reachable_declared"] <= 1.0
        if row["history_reachable_method"] is None:  # nothing to call: measured is what the surface shows
            assert row["history_reachable"] == row["history_reachable_declared"]
            assert row["history_reachable_calls"] == row["history_reachable_tokens"] == 0


@pytest.mark.slow
def test_history_tools_bring_every_hidden_message_back_at_a_cost(long_report):
    for name, method in (("handoff", "history"), ("rollover", "lookup")):
        row = _row(long_report, name)
        assert row["history_reachable_method"] == method
        assert row["history_reachable"] == 1.0
        assert row["history_reachable_probed"] == recall.MAX_TARGETS  # the long workload hides more than the cap
        # listings plus one read per message at least
        assert row["history_reachable_calls"] > row["history_reachable_probed"]
        assert row["history_reachable_tokens"] > row["history_reachable_calls"]


@pytest.mark.slow
def test_chapters_gives_back_a_continued_parents_turn_in_progress(long_report):
    # the parent's turn in progress at a continuation is its last chapter, listed in the child's
    # table of contents: measured recall reaches the declared figure (before: below it)
    row = _row(long_report, "chapters")
    assert row["history_reachable_method"] == "chapters"
    assert row["compactions"].get("continue", 0) > 0
    assert row["history_reachable"] == row["history_reachable_declared"] == 1.0


def test_only_content_that_comes_back_counts(monkeypatch):
    intact = replayed("handoff", "coding-long", window=20_000)
    original = History.read_item

    def clipped(self: History, item_id: str, **kw: Any) -> dict[str, Any]:
        out = original(self, item_id, **kw)
        out["content"] = out["content"][:8]  # the id resolves, the content does not come back
        out.pop("next_offset_chars", None)
        return out

    monkeypatch.setattr(History, "read_item", clipped)
    broken = run_profile("handoff", workload("coding-long"), Options(window=20_000))
    assert intact["history_reachable"] == 1.0
    assert broken["history_reachable_calls"] > 0
    assert broken["history_reachable"] < 0.5
    assert broken["history_reachable_declared"] == intact["history_reachable_declared"]


def test_masked_results_are_read_back_by_the_ids_their_placeholders_show(monkeypatch):
    # mask offers no listing: a model reads the item ids its placeholders print, and so does
    # the prober (before: no family it knew, so every masked result counted as unreachable)
    row = replayed("mask", "coding-long", window=40_000)
    assert row["compactions"].get("mask", 0) > 0
    assert row["history_reachable_method"] == "shown"
    assert row["history_reachable"] == row["history_reachable_declared"] == 1.0
    assert row["history_reachable_calls"] >= row["history_reachable_probed"] > 0
    original = History.read_item

    def clipped(self: History, item_id: str, **kw: Any) -> dict[str, Any]:
        out = original(self, item_id, **kw)
        out["content"] = out["content"][:8]
        out.pop("next_offset_chars", None)
        return out

    monkeypatch.setattr(History, "read_item", clipped)
    broken = run_profile("mask", workload("coding-long"), Options(window=40_000))
    assert broken["history_reachable_method"] == "shown"
    assert broken["history_reachable"] < 0.6  # what the surface still shows: the masked results are gone


def test_recall_work_is_capped_and_the_sample_scaled(monkeypatch):
    monkeypatch.setattr(recall, "MAX_TARGETS", 10)
    row = run_profile("handoff", workload("coding-long"), Options(window=20_000))
    assert row["history_reachable_probed"] == 10
    assert row["history_reachable"] == 1.0
    monkeypatch.setattr(recall, "MAX_CALLS", 3)  # listings alone use them up: nothing is read
    starved = run_profile("handoff", workload("coding-long"), Options(window=20_000))
    assert starved["history_reachable"] < row["history_reachable"]


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


# -- cued recall ------------------------------------------------------------------------------------------
def _slice(items: int = 160):
    from ctxkernel.simulate import Recording

    recording = workload("coding-long")
    return Recording(recording.items[:items], recording.source, recording.system)


@pytest.fixture(scope="module")
def cued_report() -> dict[str, Any]:
    return compare(["none", "basic", "handoff", "rollover", "chapters"], _slice(), Options(window=12_000))


def test_cued_recall_needs_only_what_was_hidden_and_stays_in_its_budget(cued_report):
    none = _row(cued_report, "none")
    assert none["recall_needs"] == 0 and none["recall_cued"] is None  # nothing is hidden unmanaged
    for name in ("basic", "handoff", "rollover", "chapters"):
        row = _row(cued_report, name)
        assert row["recall_method"] == "cued"
        assert row["recall_needs"] > 0, name
        assert 0 <= row["recall_found"] <= row["recall_needs"]
        assert row["recall_cued"] == round(row["recall_found"] / row["recall_needs"], 4)
        assert row["recall_calls"] <= recall.NEED_CALLS * row["recall_needs"]
        window = row["effective_window"]
        assert row["recall_tokens"] <= row["recall_needs"] * int(window * recall.NEED_OUTPUT_SHARE)
    assert _row(cued_report, "handoff")["recall_tools"] == "history"
    assert _row(cued_report, "rollover")["recall_tools"] == "lookup"
    assert _row(cued_report, "chapters")["recall_tools"] == "chapters"
    # search tools bring most needs back; chapters' search covers what its artifacts hold
    for name in ("handoff", "rollover", "chapters"):
        assert _row(cued_report, name)["recall_cued"] >= 0.5, name


def test_candidates_are_cues_that_appeared_before():
    from ctxkernel import Message, ToolCallBlock
    from ctxkernel.simulate import AssistantItem, Recording, ToolResultItem, UserItem
    from ctxkernel.simulate.cues import candidates, cues_in

    assert cues_in("fix src/app/lexer.py: parse_records fails with TS2345 and a KeyError in loadConfig") == [
        "src/app/lexer.py",
        "parse_records",
        "TS2345",
        "KeyError",
        "loadConfig",
    ]
    items = [
        UserItem("Run `make check-all` before you push."),
        AssistantItem(Message.assistant("", [ToolCallBlock("c1", "Read", {"file_path": "src/old_module.py"})])),
        ToolResultItem("c1", "def load_config():\n    raise KeyError('x')"),
        AssistantItem(
            Message.assistant("load_config raises.", [ToolCallBlock("c2", "Bash", {"command": "make check-all"})])
        ),
        AssistantItem(Message.assistant("", [ToolCallBlock("c3", "Read", {"file_path": "src/new_module.py"})])),
    ]
    found = candidates(Recording(items))
    assert sorted(found) == [3]  # the new path is no need: it never appeared before
    assert [c.cue for c in found[3]] == ["make check-all", "load_config"]
    assert found[3][1].evidence == ("def load_config():",)


class _OpaqueRecall:
    """A test strategy whose one recall tool reads a message by an id it never shows anywhere."""

    @staticmethod
    def secret(seq: int) -> str:
        import hashlib

        return "h" + hashlib.sha256(f"secret:{seq}".encode()).hexdigest()[:20]

    def __init__(self) -> None:
        from pydantic import BaseModel, ConfigDict

        import ctxkernel

        class Settings(BaseModel):
            model_config = ConfigDict(extra="forbid")

        class ReadArgs(ctxkernel.ToolArgs):
            id: str

        self._spec = ctxkernel.StrategySpec("opaquerecall", settings=Settings, capabilities={"recall"})
        self._args = ReadArgs

    def _read(self, ctx: Any, args: Any) -> Any:
        import ctxkernel

        for event in ctx.events:
            if self.secret(event.seq) == args.id and "message" in event.data:
                return ctxkernel.ToolOutcome(str(event.data["message"]))
        return ctxkernel.ToolOutcome(f"no item {args.id!r}", is_error=True)


def _opaque_plugin() -> Any:
    import ctxkernel

    holder = _OpaqueRecall()

    class Plugin:
        @ctxkernel.hookimpl
        def register_strategy(self, register: Any) -> None:
            register(holder._spec)

        @ctxkernel.hookimpl
        def register_tools(self, register: Any, ctx: Any) -> None:
            register(
                ctxkernel.Tool(
                    "history_read_item", "read an item by id", holder._args, holder._read, strategy="opaquerecall"
                )
            )

    return Plugin(), holder


def test_a_recall_tool_whose_ids_are_never_shown_scores_zero(tmp_path):
    from ctxkernel.simulate.replay import Replay
    from ctxkernel.testing import build_kernel

    plugin, holder = _opaque_plugin()
    kernel = build_kernel(
        tmp_path / "home",
        strategies=["basic", "opaquerecall"],
        plugins=[("opaquerecall", plugin)],
        model={"context_window": 12_000, "reserved_output_tokens": 1_500},
        fsync=False,
    )
    replay = Replay(kernel, _slice(), Options())
    replay.run()
    m = replay.metrics()
    assert m["recall_needs"] > 0 and m["recall_tools"] == "read-only"
    assert m["recall_found"] == 0 and m["recall_cued"] == 0.0
    # the tool works: a prober that knew the replay's seqs (a model does not) would read them back
    outcome = replay.session.run_tool({"id": "x", "name": "history_read_item", "arguments": {"id": holder.secret(1)}})
    assert not outcome.is_error


def test_an_artifact_read_in_pieces_comes_back_whole():
    """``chapters_artifact`` reads a line over 2,000 characters in pieces (``N+`` continues the
    line before, on the same page or the last): the prober joins them back, so a one-line JSON
    result counts as recovered only when it comes back intact."""
    from ctxkernel_chapters import artifacts

    text = "first line\n" + "".join(f"{i:07d} " for i in range(6_000)) + "\n\nx" + "y" * 4_500 + "\nlast"

    class Pages:
        def call(self, name: str, arguments: dict[str, Any]) -> str:
            assert name == "chapters_artifact" and arguments["op"] == "read"
            return artifacts.page(text, arguments["offset"], arguments["limit"])

    assert recall._artifact_text(Pages(), "root/artifacts/" + "0" * 64 + ".txt") == text  # type: ignore[arg-type]

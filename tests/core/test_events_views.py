"""The public event vocabulary: typed views of every event, and each surface node's turn and step."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ctxkernel import Event, Message, Span, ToolCallBlock
from ctxkernel import events as ev
from ctxkernel.testing import build_kernel

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def session(tmp_path):
    kernel = build_kernel(tmp_path, model={"context_window": 16_000, "reserved_output_tokens": 1_000})
    session = kernel.open_session()
    for turn in (1, 2):
        session.user(f"task {turn}: read the file")
        session.prepare_request()
        session.commit_reply(Message.assistant("reading", [ToolCallBlock(f"c{turn}", "read", {"path": "a.py"})]))
        session.tool_result(f"c{turn}", "line\n" * 200)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done with task {turn}"))
        session.end_turn()
    return session


def places(session):
    return [(n.role, n.turn, n.step) for n in session.surface]


def test_nodes_carry_their_turn_and_step(session):
    assert places(session) == [
        ("user", 1, 0),
        ("assistant", 1, 1),
        ("tool", 1, 1),
        ("assistant", 1, 2),
        ("user", 2, 0),
        ("assistant", 2, 1),
        ("tool", 2, 1),
        ("assistant", 2, 2),
    ]
    assert all(n.cites == () and not n.pruned for n in session.surface)


def test_a_replacement_keeps_the_place_of_the_first_node_it_replaced(session):
    first_tool = session.surface.nodes[2]
    seq = session.replace_tool_result(first_tool.seq, "[masked]", strategy="basic", reason="mask")
    masked = session.surface.node(seq)
    assert masked.pruned and masked.cites == (first_tool.seq,) and (masked.turn, masked.step) == (1, 1)
    nodes = session.surface.nodes
    session.compact(Span(nodes[4].seq, nodes[7].seq, summary="turn 2 read a.py"), strategy="basic")
    summary = session.surface.nodes[4]
    assert (summary.turn, summary.step) == (2, 0) and len(summary.cites) == 4
    reopened = build_kernel(session.store.home, model=session.kernel.profile.model.model_dump()).open_session(
        session.id
    )
    assert places(reopened) == places(session)


def test_every_event_has_a_typed_view(session):
    seqs = session.surface.seqs()
    seq = session.replace_tool_result(seqs[2], "[masked]", strategy="basic", reason="mask")
    session.compact(Span(seqs[0], seqs[3], summary="turn 1"), strategy="basic")
    session.emit("basic", "note", {"x": 1})
    typed = [ev.view(e) for e in session.events]
    kinds = {type(t) for t in typed}
    assert {ev.TurnStart, ev.TurnEnd, ev.StepStart, ev.StepEnd, ev.MessageRecord, ev.HeaderRecord} <= kinds
    assert {ev.RouteRecord, ev.CompactionStart, ev.CompactionSummary, ev.CompactionEnd, ev.CompactionPrune} <= kinds
    (prune,) = [t for t in typed if isinstance(t, ev.CompactionPrune)]
    assert prune.target == seqs[2] and prune.strategy == "basic" and prune.reason == "mask"
    assert prune.chars_before == 1000 and prune.chars_after == len("[masked]")
    (record,) = [t for _, t in ev.views(session.events, ev.MessageRecord) if t.pruned]
    assert record.role == "tool" and record.cites == (seqs[2],)
    assert session.events[seq].type == ev.TOOL_RESULT
    (summary,) = [t for _, t in ev.views(session.events, ev.CompactionSummary)]
    assert summary.strategy == "basic" and summary.summary == "turn 1" and len(summary.cites) == 4
    (plugin,) = [t for _, t in ev.views(session.events, ev.PluginRecord)]
    assert plugin == ev.PluginRecord("basic", "note", {"x": 1})
    turns = [t.turn for _, t in ev.views(session.events, ev.TurnEnd)]
    assert turns == [1, 2]


def test_a_view_reads_optional_keys_defensively():
    # an older log's compaction/start has no kind or turn; a hostile one has the wrong types
    old = Event(0, ev.COMPACTION_START, {"compaction_id": "a", "strategy": "s", "turn": True, "kind": 3})
    assert ev.view(old) == ev.CompactionStart("a", "s", "summary", None)
    end = Event(1, ev.STEP_END, {"turn": 1, "step": 2, "reason": {"x": 1}})
    assert ev.view(end) == ev.StepEnd(1, 2, None)


def imported_event_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "ctxkernel.events":
            names |= {alias.name for alias in node.names}
    return names


def test_strategies_import_only_the_public_event_vocabulary():
    sources = [
        *REPO.glob("plugins/*/src/**/*.py"),
        *REPO.glob("plugins/*/tests/**/*.py"),
        *REPO.glob("examples/*/src/**/*.py"),
        *REPO.glob("src/ctxkernel/default_plugins/**/*.py"),
    ]
    assert sources
    private = {str(p.relative_to(REPO)): imported_event_names(p) - set(ev.__all__) for p in sources}
    assert {k: v for k, v in private.items() if v} == {}

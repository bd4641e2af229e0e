"""Property tests over random sessions of appends, compressions, drops and foreign compactions.

After every operation: the live state equals a replay of the log; visible anchors are unique;
every visible node is addressable or deliberately unanchored; no block edge separates a tool
call from its results. A refused tool call leaves the log byte-identical. At the end, another
kernel opening the same session folds the same state.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, Span, ToolCallBlock, whole_surface_but_last
from ctxkernel.testing import check_snapshot_equivalence
from ctxkernel_decay import current_state, replay
from ctxkernel_decay.state import is_addressable
from ctxkernel_decay.testing import decay_kernel, log_bytes

OPS = ("user", "text", "calls", "end", "compress", "compress", "drop", "basic", "prune")


def check_invariants(session) -> None:
    state = current_state(session.context)
    assert state.to_dict() == replay(session.events).to_dict()
    surface = session.surface
    visible = {n.seq for n in surface}
    ids = []
    for node in surface:
        pid = state.anchor_of.get(node.seq)
        if pid is None:
            assert not is_addressable(node.message), f"addressable node {node.seq} has no anchor"
        else:
            ids.append(pid)
        block = state.blocks.get(node.seq)
        if block is not None and block.right is not None:
            ids.append(block.right)
    assert len(ids) == len(set(ids)), f"duplicate visible anchors {sorted(ids)}"
    assert set(state.owner) == set(ids) and set(state.owner.values()) <= visible
    assert set(state.anchor_of) <= visible and set(state.blocks) <= visible
    assert not set(state.free) & set(ids)
    # blocks never split a tool group: both edges of every block are balanced cuts
    results_of: dict[str, set[int]] = {}  # call id -> its result's seqs (the original and any pruned copy)
    for e in session.events:
        if e.type == "tool/result":
            results_of.setdefault(e.data["message"]["content"][0]["call_id"], set()).add(e.seq)
    by_seq = {e.seq: e for e in session.events}
    for seq, block in state.blocks.items():
        pos = surface.position(seq)
        assert surface.is_balanced_cut(pos) and surface.is_balanced_cut(pos + 1)
        sources = set(block.sources)
        for s in block.sources:
            event = by_seq[s]
            if event.type == "assistant/message":
                for call in Message.from_dict(event.data["message"]).tool_calls:
                    assert results_of.get(call.id, set()) & sources, (
                        f"call {call.id} in block {block.left} without its result"
                    )


def _kernel(home: Path, snapshots: bool = True, **settings_: Any) -> Any:
    kernel = decay_kernel(home, window=400_000, reserve=1_000, settings={"max_spans": 3, **settings_})
    kernel.profile.store = kernel.profile.store.model_copy(update={"snapshot_every": 1000 if snapshots else 0})
    return kernel


@pytest.mark.slow
@settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_sessions_keep_every_invariant(data):
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        session = _random_session(home, data, check=True)
        again = _kernel(home, snapshot=False).open_session(session.id)
        assert current_state(again.context).to_dict() == current_state(session.context).to_dict()
        assert [n.seq for n in again.surface] == [n.seq for n in session.surface]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_open_from_a_snapshot_at_random_cuts_equals_the_full_fold(data):
    """The position state restored from a session snapshot and folded on over the tail is the
    state a fold of the whole log builds, wherever the snapshot was taken (mid-turn, mid-compaction
    included); the open reads no event before the snapshot."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        session = _random_session(home, data, check=False)
        length = len(session.events)
        cuts = []
        for _ in range(3):
            cut = data.draw(st.integers(1, length), label="cut")
            cuts.append((cut, data.draw(st.integers(cut, length), label="end")))
        checked = check_snapshot_equivalence(lambda on: _kernel(home, on), session.id, cuts)
        assert [c.loaded_before_snapshot for c in checked] == [0] * len(cuts)


def _random_session(home: Path, data: Any, *, check: bool) -> Any:
    """A session of random appends, compressions, drops, foreign compactions and prunes."""
    session = _kernel(home).open_session()
    session.user("start")
    for n in range(1, 1 + data.draw(st.integers(10, 45), label="ops")):
        op = data.draw(st.sampled_from(OPS), label="op")
        if op == "user":
            session.user(f"user says {n}")
        elif op in ("text", "calls"):
            if not session.turn_open:
                session.user(f"new turn {n}")
            session.prepare_request()
            if op == "text":
                session.commit_reply(Message.assistant(f"answer {n}"))
            else:
                k = data.draw(st.integers(1, 3), label="calls")
                text = data.draw(st.sampled_from(["", "", f"calling {n}"]), label="text")
                calls = [ToolCallBlock(f"c{n}_{i}", "read", {"path": f"{n}.{i}"}) for i in range(k)]
                session.commit_reply(Message.assistant(text, calls))
                for call in calls:
                    session.tool_result(call.id, f"output {call.id} " * data.draw(st.integers(1, 40), label="size"))
        elif op == "end":
            session.end_turn()
        elif op == "compress":
            _random_compress(session, data, n)
        elif op == "drop":
            _random_drop(session, data)
        elif op == "basic":
            region = whole_surface_but_last(session.surface, data.draw(st.integers(1, 6), label="keep"))
            if region is not None and session.surface.position(region[1]) - session.surface.position(region[0]) >= 2:
                try:
                    session.compact(Span(*region), strategy="basic", kind="summary")
                except Exception as exc:  # a summary that would not shrink is refused by the kernel
                    assert "ShrinkCheck" in type(exc).__name__ or "fewer" in str(exc), exc
        elif op == "prune":
            tools = [node for node in session.surface if node.role == "tool"]
            if tools:
                node = data.draw(st.sampled_from(tools), label="pruned")
                session.replace_tool_result(node.seq, "pruned", strategy="test")
        if check:
            check_invariants(session)
    return session


def _anchor_choices(session):
    state = current_state(session.context)
    out = []
    for node in session.surface:
        if node.seq in state.anchor_of:
            out.append(state.anchor_of[node.seq])
        if node.seq in state.blocks and state.blocks[node.seq].right is not None:
            out.append(state.blocks[node.seq].right)
    return out + [999]  # an unknown anchor now and then


def _random_compress(session, data, n) -> None:
    choices = _anchor_choices(session)
    spans = []
    for i in range(data.draw(st.integers(1, 3), label="spans")):
        a = data.draw(st.sampled_from(choices), label="from")
        b = data.draw(st.sampled_from(choices), label="to")
        form = data.draw(st.sampled_from(["⟦p{}⟧", "p{}", "int"]), label="form")
        spans.append(
            {
                "from": a if form == "int" else form.format(a),
                "to": b if form == "int" else form.format(b),
                "summary": data.draw(st.sampled_from(["s", f"summary {n}.{i} ⟦p3⟧", "x " * 30]), label="summary"),
            }
        )
    before = log_bytes(session)
    count = len(session.events)
    out = session.run_tool({"id": f"k{n}", "name": "compress", "arguments": {"spans": spans}})
    if out.is_error:
        assert "Nothing was changed" in out.content, out.content
        assert log_bytes(session) == before and len(session.events) == count
    else:
        starts = [e for e in session.events[count:] if e.type == "compaction/start"]
        assert len(starts) == 1  # every span of one call in one transaction


def _random_drop(session, data) -> None:
    state = current_state(session.context)
    blocks = list(state.blocks.values())
    choices = _anchor_choices(session)
    if blocks and data.draw(st.booleans(), label="exact"):
        block = data.draw(st.sampled_from(blocks), label="block")
        pair = (block.left, block.right if block.right is not None else block.left)
    else:
        pair = (data.draw(st.sampled_from(choices), label="left"), data.draw(st.sampled_from(choices), label="right"))
    before = log_bytes(session)
    out = session.run_tool({"id": "d", "name": "drop", "arguments": {"left": pair[0], "right": pair[1]}})
    if out.is_error:
        assert log_bytes(session) == before
    else:
        summary = [e for e in session.events if e.type == "compaction/summary"][-1]
        if not summary.data.get("instructions"):
            assert not any(b.left == pair[0] for b in current_state(session.context).blocks.values())
        # else the range held the user's instructions: the kernel keeps them verbatim in its place
        # (instructions.py), so a block holding only them stays where the dropped one was


def _instruction_seq(session) -> int | None:
    """The seq of the open turn's user instruction (the first user-authored message since its start)."""
    if not session.turn_open:
        return None
    start = max(e.seq for e in session.events if e.type == "turn/start")
    return next(
        e.seq
        for e in session.events[start:]
        if e.type == "user/message"
        and e.surface["op"] == "append"
        and e.data["message"].get("source", {}).get("kind", "user") == "user"
    )


def _leaves(events, seq: int) -> set[int]:
    """The appended messages a surface node stands for (itself, or what its replacement cited)."""
    op = events[seq].surface or {}
    if op.get("op") == "append":
        return {seq}
    return set().union(*(_leaves(events, c) for c in op.get("cites", ())))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_accepted_compression_covers_the_open_turn(data):
    """Issue #15 / seed §7: whatever spans the model asks for, in multi-step turns and after a
    foreign summary, no accepted compression covers a message at or after the open turn's
    instruction; a refusal touching the turn names the range a span may cover."""
    with tempfile.TemporaryDirectory() as tmp:
        session = decay_kernel(Path(tmp), window=400_000, reserve=1_000).open_session()
        n = 0
        for _ in range(data.draw(st.integers(1, 4), label="turns")):
            session.user(f"instruction {n}")
            for _ in range(data.draw(st.integers(1, 4), label="steps")):
                n += 1
                session.prepare_request()
                calls = [
                    ToolCallBlock(f"c{n}_{i}", "read", {"path": f"{n}.{i}"})
                    for i in range(data.draw(st.integers(1, 2)))
                ]
                session.commit_reply(Message.assistant(data.draw(st.sampled_from(["", f"step {n}"])), calls))
                for call in calls:
                    session.tool_result(call.id, f"output {call.id} " * data.draw(st.integers(5, 40), label="size"))
                if data.draw(st.integers(0, 9), label="basic") == 0:
                    region = whole_surface_but_last(session.surface, data.draw(st.integers(1, 4), label="keep"))
                    if region is not None and region[0] != region[1]:
                        try:
                            session.compact(Span(*region), strategy="basic", kind="summary")
                        except Exception as exc:  # a summary that would not shrink is refused by the kernel
                            assert "ShrinkCheck" in type(exc).__name__ or "fewer" in str(exc), exc
                instruction = _instruction_seq(session)
                count = len(session.events)
                choices = _anchor_choices(session)
                spans = [
                    {
                        "from": data.draw(st.sampled_from(choices), label="from"),
                        "to": data.draw(st.sampled_from(choices), label="to"),
                        "summary": "what the span held",
                    }
                    for _ in range(data.draw(st.integers(1, 2), label="spans"))
                ]
                out = session.run_tool({"id": f"k{n}", "name": "compress", "arguments": {"spans": spans}})
                if out.is_error:
                    assert len(session.events) == count
                    if "current turn" in out.content:
                        assert "compressible: ⟦p" in out.content or "nothing before the current turn" in out.content
                    continue
                replaced = [
                    e for e in session.events[count:] if e.type == "user/message" and e.surface["op"] == "replace"
                ]
                assert replaced, out.content
                for event in replaced:
                    covered = set().union(*(_leaves(session.events, c) for c in event.surface["cites"]))
                    assert max(covered) < instruction, (out.content, sorted(covered), instruction)
            session.end_turn()

"""Position state: ids by replay, free list and reuse, blocks and tiers, restarts, snapshots."""

from __future__ import annotations

import json
import subprocess
import sys

from ctxkernel import Span
from ctxkernel_decay import current_state, replay


def _history(driver, turns: int = 3) -> None:
    for t in range(turns):
        driver.user(f"task {t}")
        driver.calls([f"result {t}a\n" * 30, f"result {t}b\n" * 30], text=f"reading for {t}")
        driver.calls([f"more {t}\n" * 30])  # a tool-call-only turn: unanchored
        driver.text(f"finished {t}")
        driver.session.end_turn()


def _anchors(session):
    state = current_state(session.context)
    return [(n.role, state.anchor_of.get(n.seq)) for n in session.surface]


def _compress(driver, first, last, summary="summary of the span"):
    out = driver.run_tool("compress", {"spans": [{"from": first, "to": last, "summary": summary}]})
    assert not out.is_error, out.content
    return out


def test_every_addressable_node_gets_an_id_and_tool_call_only_turns_none(driver, session):
    _history(driver, 1)
    assert _anchors(session) == [
        ("user", 1),
        ("assistant", 2),
        ("tool", 3),
        ("tool", 4),
        ("assistant", None),
        ("tool", 5),
        ("assistant", 6),
    ]


def test_compressed_interior_ids_are_freed_and_reused_smallest_first(driver, session):
    _history(driver, 2)
    driver.user("now")
    _compress(driver, "p2", "p6")  # the first turn's assistant .. its final reply
    state = current_state(session.context)
    block = next(iter(state.blocks.values()))
    assert (block.left, block.right, block.tier) == (2, 6, 1)
    assert sorted(state.free) == [3, 4, 5]
    driver.calls(["new result\n" * 5], text="again")
    # the newest nodes took the freed ids: numeric order is not message order
    assert [a for _, a in _anchors(session)][-2:] == [3, 4]
    assert state.reuse_count == 2 and [pid for pid, _ in state.reused] == [3, 4]


def test_recompressing_a_block_raises_its_tier_and_merges_edges(driver, session):
    _history(driver, 3)
    driver.user("now")
    _compress(driver, "p2", "p6")
    _compress(driver, "⟦p2⟧", "⟦p12⟧", "first two turns, merged")  # the block plus the second turn
    state = current_state(session.context)
    (block,) = state.blocks.values()
    assert (block.left, block.right, block.tier) == (2, 12, 2)
    assert block.summary == "first two turns, merged"
    # a block stands for the original events, not for the earlier block
    originals = [e.seq for e in session.events if e.type in ("assistant/message", "tool/result", "user/message")]
    assert (
        set(block.sources) <= set(originals) and len(block.sources) == 13
    )  # 6 nodes of turn 1 after its user message, 7 of turn 2


def test_naming_a_blocks_right_edge_as_to_ends_the_span_with_the_block(driver, session):
    _history(driver, 3)
    driver.user("now")
    _compress(driver, "p8", "p12")
    _compress(driver, 1, 12, "all of it")  # 12 is the block's right edge
    (block,) = current_state(session.context).blocks.values()
    assert (block.left, block.right, block.tier) == (1, 12, 2)


def test_drop_frees_both_edges(driver, session):
    _history(driver, 2)
    driver.user("now")
    _compress(driver, "p2", "p6")
    out = driver.run_tool("drop", {"left": "⟦p2⟧", "right": "⟦p6⟧"})
    assert not out.is_error, out.content
    state = current_state(session.context)
    assert not state.blocks and sorted(state.free) == [2, 3, 4, 5, 6]
    assert all(n.message.source.plugin != "decay" for n in session.surface)


def test_restart_and_a_second_process_rebuild_the_same_state(driver, session, make_decay_kernel, tmp_path):
    _history(driver, 3)
    driver.user("now")
    _compress(driver, "p2", "p6")
    driver.calls(["x\n" * 10], text="more")
    live = current_state(session.context).to_dict()
    assert replay(session.events).to_dict() == live
    again = make_decay_kernel().open_session(session.id)
    assert current_state(again.context).to_dict() == live
    code = (
        "import json, sys; from ctxkernel_decay.testing import decay_kernel; from pathlib import Path;"
        "from ctxkernel_decay import current_state;"
        "s = decay_kernel(Path(sys.argv[2]), settings={'snapshot': False}).open_session(sys.argv[3]);"
        "print(json.dumps(current_state(s.context).to_dict()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "-", str(tmp_path / "home"), session.id],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == json.loads(json.dumps(live))


def test_a_basic_checkpoint_is_an_ordinary_node_not_a_block(driver, session):
    _history(driver, 2)
    driver.user("now")
    _compress(driver, "p2", "p6")
    seqs = [n.seq for n in session.surface]
    session.compact(Span(seqs[0], seqs[-2]), strategy="basic", kind="summary")
    state = current_state(session.context)
    assert not state.blocks  # the decay block was inside the checkpoint
    checkpoint = session.surface.nodes[0]
    assert checkpoint.message.source.plugin == "basic"
    assert state.anchor_of[checkpoint.seq] == 1  # a fresh id for an ordinary node, reused smallest first
    assert replay(session.events).to_dict() == state.to_dict()


def test_a_pruned_tool_result_keeps_its_id(driver, session):
    _history(driver, 1)
    driver.user("now")
    result = next(n for n in session.surface if n.role == "tool")
    before = current_state(session.context).anchor_of[result.seq]
    new_seq = session.replace_tool_result(result.seq, "short", strategy="test")
    assert current_state(session.context).anchor_of[new_seq] == before


def test_the_session_snapshot_restores_the_state_and_the_open_folds_only_the_tail(driver, session, make_decay_kernel):
    _history(driver, 2)
    driver.user("now")
    _compress(driver, "p2", "p6")
    assert session.store.snapshot_get(session.id) is None  # not inside the tool: at the step boundary
    driver.text("the step after the compression")  # its step/start writes the commit's snapshot
    covers, _ = session.store.snapshot_get(session.id)
    driver.text("after the snapshot")
    again = make_decay_kernel().open_session(session.id)
    assert again.state["decay"]["source"] == "snapshot"
    assert again.events.loaded == 0  # no event before the snapshot was read
    assert (
        current_state(again.context).to_dict()
        == replay(session.events).to_dict()
        == current_state(session.context).to_dict()
    )
    assert len(again.events) > covers


def _rewrite_snapshot(store, session_id, change) -> None:
    """Store the session's snapshot with its body changed by ``change`` and a matching digest (a
    well-formed snapshot whose decay part is what the test says)."""
    import hashlib

    import orjson

    covers, payload = store.snapshot_get(session_id)
    first_line, _, body_bytes = payload.partition(b"\n")
    magic_and_version = first_line.rsplit(b" ", 1)[0]  # the kernel's format line, its digest replaced
    body = orjson.loads(body_bytes)
    change(body["strategies"])
    data = orjson.dumps(body)
    digest = hashlib.sha256(data).hexdigest().encode()
    store.snapshot_put(session_id, covers, magic_and_version + b" " + digest + b"\n" + data)


def test_a_decay_part_of_another_version_or_malformed_is_set_aside_and_the_log_folded(
    driver, session, make_decay_kernel, caplog
):
    _history(driver, 2)
    driver.user("now")
    _compress(driver, "p2", "p6")
    driver.text("the step after the compression")  # its step/start writes the commit's snapshot
    want = current_state(session.context).to_dict()

    def other_version(parts):
        parts["decay"]["version"] = 99

    def malformed(parts):
        del parts["decay"]["data"]["anchor_of"]

    def past_the_log(parts):
        parts["decay"]["data"]["cursor"] = 10**6

    def missing(parts):
        del parts["decay"]

    for change in (other_version, malformed, past_the_log, missing):
        _rewrite_snapshot(session.store, session.id, change)
        again = make_decay_kernel().open_session(session.id)
        assert again.state["decay"]["source"] == "replay", change.__name__
        assert current_state(again.context).to_dict() == want
        assert not again.snapshot_states
    assert "folding the whole log" in caplog.text and "state version 99, this plugin reads 1" in caplog.text


def test_snapshot_false_leaves_the_state_out_of_the_session_snapshot(driver, session, make_decay_kernel):
    import orjson

    kernel = make_decay_kernel(settings={"snapshot": False})
    quiet = kernel.open_session()
    for n in range(3):
        quiet.user(f"task {n}")
        quiet.prepare_request()
        quiet.commit_reply(_reply(n))
        quiet.end_turn()
    quiet.write_snapshot()
    body = orjson.loads(quiet.store.snapshot_get(quiet.id)[1].partition(b"\n")[2])
    assert "decay" not in body["strategies"]
    assert kernel.open_session(quiet.id).state["decay"]["source"] == "replay"


def _reply(n):
    from ctxkernel import Message

    return Message.assistant(f"answer {n}")


def test_a_kernel_without_the_decoration_seam_is_refused_at_activation(make_decay_kernel, monkeypatch):
    import pytest

    from ctxkernel import ConfigError, Request

    kernel = make_decay_kernel()
    monkeypatch.delattr(Request, "decorate")
    with pytest.raises(ConfigError, match=r"decoration seam.*Request\.decorate"):
        kernel.open_session()


def test_to_dict_is_the_generic_dataclass_form(driver, session):
    """``to_dict`` is written field by field for speed (issue 21); it must stay the generic
    ``dataclasses.asdict`` form with the JSON key conversions, for every field the state has."""
    import dataclasses

    _history(driver, 3)
    driver.user("now")
    _compress(driver, "p2", "p6")
    driver.calls(["x\n" * 10], text="more")
    state = current_state(session.context)
    assert state.blocks and state.owner and state.anchor_of
    generic = dataclasses.asdict(state)
    generic["free"] = sorted(state.free)
    for name in ("anchor_of", "owner", "fired"):
        generic[name] = {str(k): v for k, v in sorted(getattr(state, name).items())}
    generic["blocks"] = {str(k): dataclasses.asdict(v) for k, v in sorted(state.blocks.items())}
    assert state.to_dict() == generic
    assert list(state.to_dict()) == [f.name for f in dataclasses.fields(state)]

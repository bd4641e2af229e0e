"""The panel (``project``, shown by ``ctxkernel inspect``) and the optional audit log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel_decay.plugin import audit_jsonl

REPO = Path(__file__).resolve().parents[3]


def _work(session) -> None:
    for t in range(2):
        session.user(f"task {t}")
        session.prepare_request()
        session.commit_reply(Message.assistant(f"reading {t}", [ToolCallBlock(f"c{t}", "read", {"path": "a"})]))
        session.tool_result(f"c{t}", "content\n" * 40)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"done {t}"))
        session.end_turn()
    session.user("now")
    out = session.run_tool(
        {
            "id": "k",
            "name": "compress",
            "arguments": {"spans": [{"from": "p1", "to": "p4", "summary": "read a", "topic": "reading"}]},
        }
    )
    assert not out.is_error, out.content


def test_project_shows_pressure_blocks_and_positions_newest_first(driver, session):
    _work(session)
    panel = session.project()["strategies"]["decay"]
    pressure = panel["pressure"]
    assert {"ratio", "effective_window", "context_window", "reserved_output_tokens", "total_occupancy"} <= set(pressure)
    assert pressure["context_window"] - pressure["reserved_output_tokens"] == pressure["effective_window"]
    (block,) = panel["blocks"]
    assert (block["left"], block["right"], block["tier"], block["topic"]) == (1, 4, 1, "reading")
    positions = panel["positions"]
    # surface order reversed (the block replaced the oldest nodes, so its seq is not the smallest)
    assert [p["seq"] for p in positions] == [n.seq for n in reversed(session.surface.nodes)]
    assert (
        positions[0]["anchor"] == "⟦p9⟧" and positions[-1]["anchor"] == "⟦p1⟧…⟦p4⟧" and positions[-1]["kind"] == "block"
    )
    assert panel["ids"]["free"] == [2, 3]
    assert "state_source" not in panel  # how this process got its state is not part of the log's view
    assert session.state["decay"]["source"] == "replay"
    json.dumps(panel)


def test_ctxkernel_inspect_shows_the_panel(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    profile = REPO / "profiles" / "decay.toml"
    session = Kernel.from_profile(profile).open_session()
    _work(session)
    env = {**os.environ, "CTXKERNEL_HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "ctxkernel.cli", "inspect", session.id, "--profile", str(profile)]
    out = subprocess.run([*cli, "--json"], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    panel = json.loads(out.stdout)["strategies"]["decay"]
    assert panel["blocks"][0]["left"] == 1 and panel["positions"][0]["anchor"] == "⟦p9⟧"
    human = subprocess.run(cli, capture_output=True, text=True, cwd=REPO, env=env)
    assert human.returncode == 0 and "decay" in human.stdout


def test_audit_writes_one_record_per_request_and_compression(make_decay_kernel):
    session = make_decay_kernel(settings={"audit": True}).open_session()
    _work(session)
    # the records are in the store's blob table (files under <home>/blobs on jsonl), in order
    assert [i.key.split("/")[:2] for i in session.store.blob_list("decay/")] == [["decay", "audit"]] * 5
    records = [orjson.loads(line) for line in audit_jsonl(session.context).splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds.count("request") == 4 and kinds.count("compress") == 1
    compression = next(r for r in records if r["kind"] == "compress")
    assert compression["blocks"] == [{"left": 1, "right": 4, "tier": 1, "topic": "reading"}]
    assert all(r["session"] == session.id for r in records)
    # ctxkernel export writes them as the seed lays the audit out
    assert session.kernel.hooks.export_files(session)["decay"] == {"decay/audit.jsonl": audit_jsonl(session.context)}


def test_no_audit_file_unless_enabled(make_decay_kernel):
    session = make_decay_kernel().open_session()
    _work(session)
    assert audit_jsonl(session.context) == b"" and session.store.blob_list() == []

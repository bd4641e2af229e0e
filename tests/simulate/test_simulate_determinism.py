"""The same answer twice: two runs of one simulation give byte-identical JSON (apart from
``wall_seconds``), and a replayed session's times are the recording's own."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from ctxkernel.events import random_hex, replay_clock, utc_now
from ctxkernel.simulate import Options, Recording, build_workload, compare, load_recording
from ctxkernel.store.jsonl import JsonlStore


def _without_wall_time(report: dict) -> bytes:
    for profile in report["profiles"]:
        profile.pop("wall_seconds")
    return orjson.dumps(report, option=orjson.OPT_SORT_KEYS)


def _slice(recording: Recording, items: int) -> Recording:
    return Recording(recording.items[:items], recording.source, recording.system)


def test_two_runs_of_every_strategy_are_byte_identical():
    # a long enough stretch of the coding workload for every strategy to compact, continue or roll over
    recording = _slice(build_workload("coding-long", 7), 160)
    profiles = ["none", "basic", "decay", "handoff", "rollover", "chapters", "mask"]
    first = compare(profiles, recording, Options(window=12_000))
    second = compare(profiles, recording, Options(window=12_000))
    managed = [p for p in first["profiles"] if p["strategies"] and p["status"] == "ok"]
    assert len(managed) == 6 and all(sum(p["compactions"].values()) for p in managed)
    assert _without_wall_time(first) == _without_wall_time(second)


def test_replayed_times_are_the_recordings_own(tmp_path):
    lines = [
        {
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "timestamp": "2025-06-01T09:00:00.000Z",
            "message": {"role": "user", "content": "Summarise the log."},
        },
        {
            "type": "assistant",
            "uuid": "a1",
            "parentUuid": "u1",
            "timestamp": "2025-06-01T09:00:07.250Z",
            "message": {"id": "m1", "role": "assistant", "content": [{"type": "text", "text": "It is short."}]},
        },
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    kept = tmp_path / "kept"
    kept.mkdir()
    report = compare(["none"], load_recording(path), Options(keep_sessions=kept))
    (session_id,) = report["profiles"][0]["session_ids"]
    store = JsonlStore(kept)
    times = {event.time for event in store.read(session_id, 0)}
    assert times <= {"2025-06-01T09:00:00.000Z", "2025-06-01T09:00:07.250Z"}
    assert store.header(session_id).created == "2025-06-01T09:00:00.000Z"


def test_the_replay_clock_and_ids_apply_only_inside_the_block():
    with replay_clock(lambda: 0.5, "seed"):
        inside = (utc_now(), random_hex(16))
    with replay_clock(lambda: 0.5, "seed"):
        again = (utc_now(), random_hex(16))
    assert inside == again == ("1970-01-01T00:00:00.500Z", inside[1])
    assert utc_now()[:4] not in ("1970",) and random_hex(16) != inside[1]


def test_a_store_that_already_holds_sessions_gets_new_ids(tmp_path):
    recording = build_workload("chat-short", 7)
    first = compare(["basic"], recording, Options(keep_sessions=tmp_path))
    second = compare(["basic"], recording, Options(keep_sessions=tmp_path))
    assert first["profiles"][0]["session_ids"] != second["profiles"][0]["session_ids"]
    assert len(list(Path(tmp_path, "sessions").glob("*.jsonl"))) == 2

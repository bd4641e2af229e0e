"""The importers of ``ctxkernel simulate`` read hostile shapes in linear time: each at 2n against n.

    python benchmarks/run.py -k import

Imported recordings are hostile input, and four shapes once made an importer quadratic (the
CHANGELOG's "in linear time" lines). Each row writes one shape at n and at 2n into the bench's
scratch folder, with the builders the tests use (``tests/simulate``; copied here, benchmarks do
not import tests), and times ``load_recording`` of each file: sniffing, parsing, the importer,
the renaming of reused call ids and the accounting, as ``ctxkernel simulate`` reads a file. CPU
time, the collector paused, rounds alternating n and 2n.

``import_<shape>_2n_vs_n``: ``ratio`` = the load time at 2n over the load time at n. Target
<= 2.5 (ours: linear work gives about 2, quadratic about 4; 2.5 leaves room for the allocator
and caches at the larger size without letting a quadratic term through). ``median`` is the load
time at 2n in seconds; ``n`` is the size of the smaller file in the shape's unit. The shapes:

- ``missing_parents``: a Claude Code file of 3m user lines (``n`` counts lines) whose main chain
  alternates missing parents with lines leading back up, so the walk crosses one block of walked
  lines at every jump (``test_a_walk_of_many_missing_parents_replays_every_line_but_one``). n =
  12,000 lines (m = 4,000).
- ``one_reply_claude_code``: one API message of n tool calls written one line per call, as Claude
  Code writes them (``test_a_reply_of_very_many_calls_keeps_every_call``). n = 15,000 calls.
- ``one_reply_openhands``: the same reply as OpenHands V1 SDK events: n ``ActionEvent`` of one
  ``llm_response_id``, then their n ``ObservationEvent``. n = 15,000 calls.
- ``reused_call_id``: OpenAI chat messages where every one of n replies calls ``call_0``, renamed
  ``call_0~2``, ``call_0~3``, ... (``test_an_id_every_reply_reuses_gets_the_next_name_each_time``).
  n = 10,000 replies.

``--quick`` divides every n by 5. Five rounds (quick: three).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from _bench import Bench

from ctxkernel.simulate import load_recording

TARGET = ("<=", 2.5)


def _user(uuid: str, parent: str | None, content: Any) -> dict[str, Any]:
    line = {"type": "user", "uuid": uuid, "parentUuid": parent, "isSidechain": False, "sessionId": "s"}
    return {**line, "message": {"role": "user", "content": content}}


def missing_parents(folder: Path, n: int) -> Path:
    """``test_simulate_accounting.missing_parents_walk`` with m = n / 3."""
    m = n // 3
    parent: dict[int, str | None] = {3 * m - 1: "u" + str(m)}
    parent.update({m + i: "u" + str(m + i + 1) for i in range(m)})  # the block, walked first
    for k in range(m - 1):
        parent[2 * m + k] = "cut-off"  # a missing parent: back past the block ...
        parent[m - 1 - k] = "u" + str(2 * m + k + 1)  # ... to a line that leads up again
    path = folder / f"missing-parents-{n}.jsonl"
    path.write_text("".join(json.dumps(_user(f"u{i}", parent.get(i), "x")) + "\n" for i in range(3 * m)))
    return path


def one_reply(fmt: str) -> Callable[[Path, int], Path]:
    """``test_simulate_import_validation._one_reply_of_calls`` for one format."""

    def build(folder: Path, n: int) -> Path:
        if fmt == "claude-code":  # one line per call of one API message
            lines: list[Any] = [{"type": "user", "uuid": "u", "message": {"role": "user", "content": "go"}}]
            for i in range(n):
                content = [{"type": "tool_use", "id": f"t{i}", "name": "R"}]
                message = {"id": "m1", "role": "assistant", "content": content}
                lines.append(
                    {"type": "assistant", "uuid": f"a{i}", "parentUuid": lines[-1]["uuid"], "message": message}
                )
            path = folder / f"one-reply-{n}.jsonl"
            path.write_text("".join(json.dumps(v) + "\n" for v in lines))
            return path
        events: list[Any] = [
            {"kind": "MessageEvent", "id": "m", "source": "user", "llm_message": {"role": "user", "content": "go"}}
        ]
        for i in range(n):  # V1 SDK events: the calls of one model response, then their results
            call = {"tool_call_id": f"t{i}", "tool_name": "terminal", "tool_call": {"arguments": "{}"}}
            events.append({"kind": "ActionEvent", "id": f"a{i}", "source": "agent", "llm_response_id": "r1", **call})
        for i in range(n):
            result = {"tool_call_id": f"t{i}", "observation": {"content": "ok"}}
            events.append({"kind": "ObservationEvent", "id": f"o{i}", "source": "environment", **result})
        path = folder / f"events-{n}.json"
        path.write_text(json.dumps(events))
        return path

    return build


def reused_call_id(folder: Path, n: int) -> Path:
    """``test_an_id_every_reply_reuses_gets_the_next_name_each_time``'s file with n replies."""
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    reply = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_0"}]
    path = folder / f"chat-{n}.json"
    path.write_bytes(orjson.dumps([{"role": "user", "content": "go"}, *reply * n]))
    return path


#: (shape, builder, n at full size, what n counts, the items a file of n loads to)
SHAPES: list[tuple[str, Callable[[Path, int], Path], int, str, Callable[[int], int]]] = [
    ("missing_parents", missing_parents, 12_000, "lines", lambda n: n - 1),
    ("one_reply_claude_code", one_reply("claude-code"), 15_000, "calls", lambda n: 2),  # no results
    ("one_reply_openhands", one_reply("openhands"), 15_000, "calls", lambda n: n + 2),
    ("reused_call_id", reused_call_id, 10_000, "replies", lambda n: 2 * n + 1),
]


def run(bench: Bench) -> None:
    folder = Path(bench.scratch) / "import"
    folder.mkdir(parents=True, exist_ok=True)
    for shape, build, full, unit, items in SHAPES:
        n = full // 5 if bench.quick else full
        small, large = build(folder, n), build(folder, 2 * n)
        for path, size in ((small, n), (large, 2 * n)):  # what is timed reads the whole shape
            loaded = len(load_recording(path).items)
            assert loaded == items(size), (shape, size, loaded)
        bench.compare(
            f"import_{shape}_2n_vs_n",
            lambda large=large: load_recording(large),
            lambda small=small: load_recording(small),
            target=TARGET,
            repeat=3 if bench.quick else 5,
            n=n,
            n_counts=unit,
        )
        small.unlink()
        large.unlink()


if __name__ == "__main__":
    import sys
    import tempfile

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))

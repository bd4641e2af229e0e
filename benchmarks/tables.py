"""Markdown tables from the JSON lines of a benchmark run, one table per measure.

    python benchmarks/run.py --out .bench/results.jsonl
    python benchmarks/tables.py .bench/results.jsonl > .bench/tables.md

A row gives the median and spread, the ratio to the floor or peer, the target, whether it was
met (``figure`` for a row kept without a target), and the one command that re-runs it. Lines without ``ratio`` (machine, skips) are listed
under the tables. ``make bench`` runs both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: (title, name prefixes, module keyword for ``run.py -k``): the issue's measures, in its order
MEASURES = (
    ("1. Per-request overhead (prepare_request + commit_reply)", ("request_", "step_cost", "pressure_"), None),
    (
        "2. Cold open (read + repair + replay + meter) vs orjson-parsing the same bytes",
        ("cold_open_", "cold_replay_", "store_cold_read_"),
        None,
    ),
    (
        "3. Compaction: flat in session length; beside one durable append (figures, no target)",
        ("compaction_", "rollover_commit"),
        None,
    ),
    ("4. Recall vs a raw substring scan; paging vs position", ("recall_", "history "), None),
    ("5. Memory opening a session vs its log size", ("memory_",), None),
    ("6. Simulation throughput (events/s) vs the unmanaged kernel", ("simulate_",), None),
    ("Store appends (durable) vs raw write+fsync", ("store_append",), None),
    (
        "serve: CPU per request against LiteLLM's proxy, the first request, memory, the fixed cost",
        ("serve_",),
        None,
    ),
    ("Fleet: requests/s with 2 and 4 worker processes on one PostgreSQL vs 1", ("fleet_",), None),
)
MODULE_OF = {
    "request_": "request",
    "step_cost": "kernel",
    "pressure_": "kernel",
    "cold_open_snapshot_": "snapshot",  # before "cold_open_": the first matching prefix wins
    "cold_open_": "open",
    "cold_replay_": "kernel",
    "store_": "store",
    "compaction_": "compaction",
    "rollover_": "rollover",
    "recall_": "recall",
    "history ": "handoff",
    "memory_": "memory",
    "simulate_": "simulate",
    "fleet_": "fleet",
    "serve_": "serve",
}


def command(name: str) -> str:
    for prefix, module in MODULE_OF.items():
        if name.startswith(prefix):
            return f"`.venv/bin/python benchmarks/run.py -k {module}`"
    return "`make bench`"


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(lines: list[dict]) -> str:
    results = [r for r in lines if "name" in r and "ratio" in r]
    others = [r for r in lines if r not in results]
    out: list[str] = []
    used: set[str] = set()
    for title, prefixes, _ in MEASURES:
        rows = [r for r in results if r["name"].startswith(prefixes) and r["name"] not in used]
        if not rows:
            continue
        out += [
            f"### {title}",
            "",
            "| name | median | unit | spread | ratio | target | met | reproduce |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            used.add(r["name"])
            met = "figure" if r.get("target") == "none" else "yes" if r.get("met") else "**missing**"
            out.append(
                f"| {r['name']} | {fmt(r.get('median'))} | {r.get('unit', '')} | {fmt(r.get('spread'))} | {fmt(r['ratio'])} | {r.get('target', '')} | {met} | {command(r['name'])} |"
            )
        out.append("")
    rest = [r for r in results if r["name"] not in used]
    if rest:
        out += ["### Other results", ""] + [f"- `{json.dumps(r)}`" for r in rest] + [""]
    if others:
        out += ["### Run notes", ""] + [f"- `{json.dumps(r)}`" for r in others] + [""]
    return "\n".join(out)


def main() -> int:
    source = Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read()
    lines = []
    for raw in source.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    sys.stdout.write(render(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

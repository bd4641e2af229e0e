"""benchmarks/tables.py: the performance record's tables show misses and skips, never hide them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

TABLES = Path(__file__).resolve().parents[2] / "benchmarks" / "tables.py"


def load_tables():
    spec = importlib.util.spec_from_file_location("bench_tables", TABLES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_missed_target_is_marked_missing_and_a_skip_is_listed() -> None:
    tables = load_tables()
    lines = [
        {
            "name": "request_basic_flat_100k_vs_1k",
            "ratio": 1.01,
            "target": "<= 2",
            "unit": "s",
            "median": 0.0006,
            "spread": 0.9,
            "met": True,
        },
        {
            "name": "request_handoff_flat_100k_vs_1k",
            "ratio": 2.3,
            "target": "<= 2",
            "unit": "s",
            "median": 0.0015,
            "spread": 0.3,
            "met": False,
        },
        {"name": "cold_open_postgres", "skipped": "set CTXKERNEL_TEST_PG_DSN"},
    ]
    out = tables.render(lines)
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| request_")}
    assert "| yes |" in rows["request_basic_flat_100k_vs_1k"]
    assert "**missing**" in rows["request_handoff_flat_100k_vs_1k"]
    assert "-k request" in rows["request_handoff_flat_100k_vs_1k"]
    assert "### 1. Per-request overhead" in out
    assert json.dumps(lines[2]) in out  # the skip and its reason are in the record


def test_an_unknown_result_is_still_shown() -> None:
    out = load_tables().render([{"name": "something_new", "ratio": 3.0, "target": ">= 1", "met": True}])
    assert "something_new" in out


def test_snapshot_rows_name_their_own_module() -> None:
    tables = load_tables()
    assert "-k snapshot" in tables.command("cold_open_snapshot_100k")
    assert "-k open" in tables.command("cold_open_sqlite_100k")


def test_a_row_without_a_target_is_a_figure_not_a_miss() -> None:
    import sys

    sys.path.insert(0, str(TABLES.parent))
    from _bench import NO_TARGET, Bench

    class Sink:
        def write(self, _text: str) -> None: ...

        def flush(self) -> None: ...

    bench = Bench(out=Sink())
    line = bench.report("compaction_basic_vs_durable_append", 6.7, NO_TARGET, "s", 0.0024, 0.3)
    assert line["met"] is True
    assert line["target"] == "none"
    missed = bench.report("serve_cpu_vs_litellm_1k", 0.14, ("<=", 0.1), "s", 0.002, 0.2)
    assert missed["met"] is False
    out = load_tables().render([line, missed])
    rows = {row.split("|")[1].strip(): row for row in out.splitlines() if row.startswith("| ")}
    assert "| figure |" in rows["compaction_basic_vs_durable_append"]
    assert "**missing**" in rows["serve_cpu_vs_litellm_1k"]
    assert "-k serve" in rows["serve_cpu_vs_litellm_1k"]

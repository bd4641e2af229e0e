"""docs/performance.md: the current record, one line per benchmark module, and the log (benchmarks/LOG.md)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "performance.md"
LOG = REPO / "benchmarks" / "LOG.md"


def modules() -> set[str]:
    return {p.name for p in (REPO / "benchmarks").glob("bench_*.py")}


def test_every_benchmark_module_is_described_on_the_page() -> None:
    table = PAGE.read_text().split("## What the rows compare", 1)[1]
    described = set(re.findall(r"^\| `(bench_\w+\.py)` \|", table, re.MULTILINE))
    assert described == modules(), (
        f"not described: {sorted(modules() - described)}; no such module: {sorted(described - modules())}"
    )


def test_the_record_names_only_modules_that_exist() -> None:
    record = PAGE.read_text().split("## The current record", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\*\*`(bench_\w+\.py)`\*\*", record))
    assert named, "the current record has no module tables"
    assert named <= modules(), sorted(named - modules())


def test_the_page_links_the_log_and_the_log_holds_every_round() -> None:
    assert "(../benchmarks/LOG.md)" in PAGE.read_text()
    log = LOG.read_text()
    assert log.startswith("# Performance log")
    for heading in ("## Records", "## Compaction against one durable append", "## `ctxkernel serve`"):
        assert f"\n{heading}" in log, heading

"""Recall: history search and chapter search over 100,000 events against a raw substring scan,
and the cost of a page against its position.

    python benchmarks/run.py -k recall

Sessions of the realistic mix (``_profiles.py``) at 100,000 events. CPU time, alternating
subject and floor (``_bench.py``).

* ``recall_history_search_<N>k_vs_scan``: ``ctxkernel.recall.history`` searching the whole log
  for a string it does not hold (every page followed to the end: each page scans at most 2,000
  events), against ``query in text`` over the same events' texts, already in a list. Target <= 2
  (issue 21).
* ``recall_history_page_last_vs_first``: one ``list_items`` page (50 items) at 95% of the log,
  reached by its cursor, against the first page. Target <= 1.5 (the page's position must not
  matter).
* ``recall_chapter_search_<N>k_vs_scan``: ``ctxkernel_chapters``' ``chapters_search`` over every
  chapter the ``chapters`` profile archived in that session, against reading the same chapter
  files (the jsonl store's blob files) and scanning their lower-cased text for the query.
  Target <= 2 (#21: verification results are cached by content hash, not re-hashed per search).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _bench import Bench
from _profiles import built, open_kernel, sizes

from ctxkernel.recall.history import History

ABSENT = "zq-not-in-any-event"


def run(bench: Bench) -> None:
    size = sizes(bench)[-1]
    label = f"{size // 1000}k" if size % 1000 == 0 else str(size)
    repeat = 3 if bench.quick else 7
    history_search(bench, size, label, repeat)
    chapter_search(bench, size, label, repeat)


def history_search(bench: Bench, size: int, label: str, repeat: int) -> None:
    b = built(bench, "basic")[size]
    session = open_kernel("basic", b.home).open_session(b.session_id)
    history = History.for_session(session)
    texts = [history.text_of(event) for event in session.events]

    def search_all() -> int:
        pages, cursor = 0, None
        while True:
            page = history.search(ABSENT, cursor=cursor)
            pages += 1
            if not page["has_more"]:
                return pages
            cursor = page["next_cursor"]

    def scan() -> list[int]:
        return [i for i, t in enumerate(texts) if ABSENT in t]

    pages = search_all()
    bench.compare(
        f"recall_history_search_{label}_vs_scan",
        search_all,
        scan,
        target=("<=", 2),
        repeat=repeat,
        events=len(session.events),
        pages=pages,
        chars=sum(len(t) for t in texts),
    )

    cursors: list[str | None] = [None]
    while True:
        page = history.list_items(limit=50, cursor=cursors[-1])
        if not page["has_more"]:
            break
        cursors.append(page["next_cursor"])
    late = cursors[int(len(cursors) * 0.95)]
    bench.compare(
        "recall_history_page_last_vs_first",
        lambda: history.list_items(limit=50, cursor=late),
        lambda: history.list_items(limit=50),
        target=("<=", 1.5),
        repeat=repeat * 3,
        pages=len(cursors),
    )


def chapter_search(bench: Bench, size: int, label: str, repeat: int) -> None:
    from ctxkernel_chapters.tools import SearchArgs, chapters_search

    b = built(bench, "chapters")[size]
    session = open_kernel("chapters", b.home).open_session(b.session_id)
    where = session.store.blob_path("chapters")  # the strategy's blobs: files on the jsonl store
    files = sorted(p for p in Path(where).rglob("*/chapters/*.md") if p.is_file())
    args = SearchArgs(query=ABSENT)
    needle = ABSENT.lower()

    def scan() -> int:
        return sum(p.read_text(encoding="utf-8").lower().count(needle) for p in files)

    def search() -> Any:
        return chapters_search(session.context, args)

    outcome = search()
    if outcome.is_error or not files:
        bench.report(
            f"recall_chapter_search_{label}_vs_scan",
            float("inf"),
            ("<=", 2),
            "s",
            0.0,
            0.0,
            error=f"no chapters to search ({len(files)} files; {str(outcome)[:200]})",
        )
        return
    bench.compare(
        f"recall_chapter_search_{label}_vs_scan",
        search,
        scan,
        target=("<=", 2),
        repeat=repeat,
        events=b.events,
        chapter_files=len(files),
        chapter_bytes=sum(p.stat().st_size for p in files),
    )


if __name__ == "__main__":
    import sys
    import tempfile

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))

"""docs/compaction.md: its Python blocks run in order as one program, so every example and every
assert on the page holds for the current kernel."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "compaction.md"


def test_the_chapter_is_linked_from_the_tutorial_and_the_hooks_page():
    for doc in ("writing-a-strategy.md", "hooks.md"):
        assert "(compaction.md" in (REPO / "docs" / doc).read_text(), doc


def test_the_chapter_names_every_exported_compaction_helper_and_argument():
    import inspect

    import ctxkernel
    from ctxkernel.compaction import run_transaction

    text = PAGE.read_text()
    for name in ("Span", "balanced_cut_at_or_before", "head_region", "whole_surface_but_last", "CommitResult"):
        assert name in ctxkernel.__all__ and f"ctxkernel.{name}" in text, name
    arguments = [p for p in inspect.signature(run_transaction).parameters if p not in ("session", "strategy")]
    for argument in arguments:
        assert f"| `{argument}` |" in text, f"compact's argument {argument!r} is not in the table"
    for error in ("UnbalancedCutError", "CompactionBusyError", "ShrinkCheckError", "SurfaceChangedError"):
        assert f"| `{error}` |" in text, error


def test_the_chapters_code_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the page's mkdtemp() lands in tmp_path
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert len(blocks) >= 6
    namespace: dict[str, Any] = {"__name__": "compaction_md"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/compaction.md block {i + 1}", "exec"), namespace)  # our own doc

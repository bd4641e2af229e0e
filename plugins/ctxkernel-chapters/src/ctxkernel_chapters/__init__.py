"""ctxkernel strategy ``chapters``: archive the conversation as Markdown chapters.

The plugin module is :mod:`ctxkernel_chapters.plugin` (entry point ``chapters``). The pieces a
harness or a CLI may call without an agent turn are re-exported here.
"""

from .chapter_file import ChapterFile, parse_chapter, render_chapter_file
from .registry import Registry, manifest
from .segment import ChapterPlan, propose_chapters
from .settings import ChaptersSettings

__all__ = [
    "ChapterFile",
    "ChapterPlan",
    "ChaptersSettings",
    "Registry",
    "manifest",
    "parse_chapter",
    "propose_chapters",
    "render_chapter_file",
]

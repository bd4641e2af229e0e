"""Frames: the pseudo-XML tags that wrap injected text, and the guard that keeps a body inside
its frame. A leaf module (no kernel imports), so that the kernel's own framing (the user's
instructions, ``instructions.py``) and the strategies' toolkit (:mod:`ctxkernel.text`, which
re-exports :func:`guard`) share one implementation.
"""

from __future__ import annotations

import re

#: the kernel's own frames, which share a compaction's replacement message: the checkpoint
#: (``spans.CHECKPOINT_OPEN``), the user's pinned instructions (``instructions.BLOCK_FRAME``) and the
#: work ledger (``ledger.BLOCK_FRAME``). No text the kernel or a strategy quotes into that message (a
#: summary, a ledger entry, an instruction, a strategy's seed) may open or close one of them
KERNEL_FRAMES = ("context-checkpoint", "user-instructions", "work-ledger")


def guard(text: str, *names: str) -> str:
    """``text`` with every opening or closing tag of the frames ``names`` neutralised
    (``<note`` becomes ``&lt;note``, ``</note`` becomes ``&lt;/note``; any letter case), so a
    body cannot end the block that frames it or open a forged one. Other text is unchanged."""
    if not names or "<" not in text:
        return text
    return _guard_pattern(names).sub(lambda m: "&lt;" + m.group(0)[1:], text)


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def _guard_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    pattern = _PATTERNS.get(names)
    if pattern is None:
        alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        # a tag name ends at anything that cannot continue a name (space, '>', '/', end of text)
        pattern = _PATTERNS[names] = re.compile(rf"<\s*/?\s*(?:{alternatives})(?![\w.-])", re.IGNORECASE)
    return pattern


__all__ = ["KERNEL_FRAMES", "guard"]

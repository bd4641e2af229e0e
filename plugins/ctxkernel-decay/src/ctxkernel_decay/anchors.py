"""Anchor text: formatting, argument parsing, request decoration and reply sanitizing.

Anchors are presentation only. They are computed from :class:`~ctxkernel_decay.state.DecayState`
and added to the request copy of each message; the durable log never holds them, and text in a
message that merely looks like ``⟦p12⟧`` is content, never an address.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ctxkernel import Message, TextBlock, ToolResultBlock

if TYPE_CHECKING:
    from .state import DecayState

OPEN, CLOSE = "⟦", "⟧"
_ANY_ANCHOR = re.compile(r"\s*⟦p\d+⟧\s*")
_LEADING_RUN = re.compile(r"^\s*(?:⟦p\d+⟧\s*)+")
_ARG_FORMS = (re.compile(r"⟦p([0-9]{1,18})⟧"), re.compile(r"p([0-9]{1,18})"), re.compile(r"([0-9]{1,18})"))


def fmt(pid: int) -> str:
    return f"{OPEN}p{pid}{CLOSE}"


def parse_anchor(value: object) -> int | None:
    """An anchor argument as ``"⟦p12⟧"``, ``"p12"`` or ``12``; None when it is none of these."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        text = value.strip()
        for form in _ARG_FORMS:
            match = form.fullmatch(text)
            if match:
                number = int(match.group(1))
                return number if number > 0 else None
    return None


def strip_anchors(text: str) -> str:
    """Summaries must not carry anchors: they would look like live addresses."""
    if OPEN not in text:  # no anchor to strip (the pattern's leading \s* makes a scan costly)
        return text.strip()
    return _ANY_ANCHOR.sub(" ", text).strip()


def strip_leading_anchors(text: str) -> str:
    return _LEADING_RUN.sub("", text, count=1)


def decorate_message(message: Message, left: int, right: int | None) -> Message | None:
    """The request copy of ``message`` with its anchors, or None when it cannot carry one.

    User and tool messages get a prefix; assistant messages only by rewriting their first
    non-empty text block (tool calls keep their ids, order and block indexes). A block's right
    edge is a suffix on its last text block. An assistant message loses a copied leading run of
    anchors first (then, with no text left, it is sent cleaned and unanchored).
    """
    prefix = f"{fmt(left)} "
    original = message
    if message.role == "assistant":
        # a copied leading run is stripped when the request is built too, not only before commit:
        # replies that reached the log another way (a proxy's history) never passed sanitize_reply
        message = sanitize_assistant(message)
    blocks = list(message.content)
    if message.role == "tool":
        result = blocks[0]
        assert isinstance(result, ToolResultBlock)
        return message.with_content(
            [ToolResultBlock(result.call_id, prefix + result.content, result.is_error, result.name)]
        )
    texts = [i for i, b in enumerate(blocks) if b.type == "text" and (message.role != "assistant" or b.text.strip())]
    if not texts:
        if message.role == "assistant":
            return None if message is original else message  # (the cleaned copy, unanchored)
        return message.with_content(
            [TextBlock(prefix.strip() + (f" {fmt(right)}" if right is not None else "")), *blocks]
        )
    first, last = texts[0], texts[-1]
    blocks[first] = TextBlock(prefix + blocks[first].text)  # type: ignore[union-attr]
    if right is not None:
        blocks[last] = TextBlock(blocks[last].text + f" {fmt(right)}")  # type: ignore[union-attr]
    return message.with_content(blocks)


def sanitize_assistant(message: Message) -> Message:
    """Strip a leading run of anchors the model copied into its reply's first text block."""
    blocks = list(message.content)
    for i, block in enumerate(blocks):
        if block.type != "text":
            continue
        cleaned = strip_leading_anchors(block.text)
        if cleaned == block.text:
            return message
        if cleaned.strip() or len(blocks) == 1:
            blocks[i] = TextBlock(cleaned)
        else:
            del blocks[i]
        return message.with_content(blocks)
    return message


def visible_anchors(state: DecayState, seqs: list[int]) -> list[tuple[int, int, int | None]]:
    """``(seq, left, right)`` of every anchored node in surface order."""
    out = []
    for seq in seqs:
        left = state.anchor_of.get(seq)
        if left is not None:
            out.append((seq, left, state.right_of(seq)))
    return out


def describe_visible(state: DecayState, seqs: list[int], limit: int = 80) -> str:
    """The current visible anchors, oldest first, as a model would quote them."""
    parts = []
    for _, left, right in visible_anchors(state, seqs):
        parts.append(f"{fmt(left)}…{fmt(right)}" if right is not None else fmt(left))
    if not parts:
        return "(none)"
    if len(parts) > limit:
        head, tail = parts[: limit // 4], parts[-(limit - limit // 4) :]
        return " ".join(head) + f" … ({len(parts) - len(head) - len(tail)} more) … " + " ".join(tail)
    return " ".join(parts)

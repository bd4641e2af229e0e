"""Untrusted text: making it storable, and rendering it into the headers the model reads.

Two jobs, for text that came from a model, a tool or a file rather than from kernel code:

**Storable.** A Python ``str`` may hold lone surrogates (``os.listdir`` of a non-UTF-8 file name
gives ``"\\udcff"`` under the ``surrogateescape`` handler; a JSON ``"\\ud800"`` escape from a
hostile server decodes to one). UTF-8 cannot encode them, so the log could not store such text.
:func:`storable` replaces every lone surrogate with U+FFFD (the replacement character, what any
UTF-8 decoder shows for bytes it cannot read) and joins a well-formed surrogate pair into the
character it encodes. Text without surrogates is returned as the same object, at the cost of one
encode for non-ASCII text and nothing for ASCII.

**Rendered.** Strategies frame injected text in pseudo-XML tags (``<note path="..." trust="...">``).
An attribute value is written with :func:`attr` (``&``, ``<``, ``>``, ``"``, ``'`` and line
breaks escaped), so a value cannot close its attribute and add a forged one; a body is passed
through :func:`guard`, which neutralises an opening or closing tag of the frames it names, so a
body cannot end its own block or open a fake one with a better trust mark.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (pairs joined); the same object when clean."""
    if text.isascii():  # O(1) in CPython: the string carries the flag
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 with surrogatepass joins each well-formed pair back into its character; the
        # decoder then replaces only what is left alone
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def storable(value: Any) -> Any:
    """``value`` with :func:`storable_text` applied to every string in it (keys too), through
    dicts, lists and tuples. Returns the same object when nothing had to change."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        changed = False
        out = {}
        for key, item in value.items():
            new_key = storable_text(key) if isinstance(key, str) else key
            new_item = storable(item)
            changed = changed or new_key is not key or new_item is not item
            out[new_key] = new_item
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [storable(item) for item in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


_ATTR = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def attr(value: object) -> str:
    """``value`` as the inside of a double-quoted pseudo-XML attribute: it cannot end the
    attribute, add another one, close the tag or break the header line."""
    return str(value).translate(_ATTR)


def tag(name: str, **attributes: object) -> str:
    """An opening tag ``<name key="value" ...>`` with every value escaped by :func:`attr`
    (attribute names are written as given)."""
    parts = [name, *(f'{key}="{attr(value)}"' for key, value in attributes.items())]
    return "<" + " ".join(parts) + ">"


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


__all__ = ["REPLACEMENT", "attr", "guard", "storable", "storable_text", "tag"]

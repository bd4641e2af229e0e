"""The text toolkit every strategy shares (public: ``ctxkernel.text``): clipping and summarising,
and untrusted text made storable and safe to render.

``clip`` shortens text for a summary line or a seed without splitting a grapheme (combining
marks, joiners, variation selectors, emoji modifiers, regional-indicator pairs, surrogate
halves) and, for multi-line text, without leaving a fenced code block open. ``extractive_summary``
is the deterministic, model-free eight-section summary (the ``SUMMARY_SECTIONS`` of a
``compaction/summary``) that ``basic`` writes without a summarizer model and that
``ctxkernel simulate`` uses as its offline summarizer model; it folds an earlier checkpoint's
bullets in instead of nesting them. A strategy with a summary format of its own (decay's block
lines, handoff's item-cited activity list) builds it from the same pieces: ``first_line`` of a
result, ``string_arguments`` of a call (``PATH_KEYS``, ``COMMAND_KEYS``), ``failed`` for an
error result, and ``keep_newest`` to fit a budget, giving up the oldest lines first.

For untrusted text, two jobs (text that came from a model, a tool or a file rather than from
kernel code):

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
import unicodedata
from collections.abc import Callable
from typing import Any

from .frames import KERNEL_FRAMES, guard
from .messages import Message, ToolCallBlock, ToolResultBlock
from .spans import CHECKPOINT_CLOSE, CHECKPOINT_OPEN, SUMMARY_SECTIONS

#: what a clipped line ends with
ELLIPSIS = "…"
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})")


# -- safe cuts ---------------------------------------------------------------------------------------
def _joins_previous(ch: str) -> bool:
    """True when ``ch`` belongs to the grapheme of the character before it."""
    cp = ord(ch)
    return (
        unicodedata.combining(ch) != 0
        or unicodedata.category(ch) in ("Mn", "Me", "Mc")
        or cp == 0x200D  # zero-width joiner
        or 0xFE00 <= cp <= 0xFE0F  # variation selectors
        or 0xE0100 <= cp <= 0xE01EF
        or 0x1F3FB <= cp <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xE0020 <= cp <= 0xE007F  # emoji tag sequences
        or 0xDC00 <= cp <= 0xDFFF  # a lone low surrogate (text decoded with surrogatepass)
    )


def _is_ri(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def safe_cut(text: str, position: int) -> int:
    """The largest cut ``<= position`` that does not split a grapheme cluster."""
    position = max(0, min(position, len(text)))
    while 0 < position < len(text):
        ch, prev = text[position], text[position - 1]
        if _joins_previous(ch) or ord(prev) == 0x200D:
            position -= 1
            continue
        if _is_ri(ch) and _is_ri(prev):
            run = 0
            i = position - 1
            while i >= 0 and _is_ri(text[i]):
                run += 1
                i -= 1
            if run % 2 == 1:  # the flag started before the cut: keep its pair together
                position -= 1
                continue
        break
    return position


def open_fence(text: str) -> tuple[int, str] | None:
    """Where the fenced code block still open at the end of ``text`` starts, and its fence."""
    opened: tuple[int, str] | None = None
    offset = 0
    for line in text.splitlines(keepends=True):
        m = _FENCE.match(line)
        if m:
            fence = m.group(1)
            if opened is None:
                opened = (offset, fence)
            elif fence[0] == opened[1][0] and len(fence) >= len(opened[1]) and not line.strip()[len(fence) :].strip():
                opened = None
        offset += len(line)
    return opened


def cut_text(text: str, limit: int) -> tuple[str, str | None]:
    """At most ``limit`` characters of ``text``, safe for graphemes and code fences.

    Returns the excerpt and a note when the fence repair retreated or was refused.
    """
    if len(text) <= limit:
        return text, None
    cut = safe_cut(text, limit)
    excerpt = text[:cut]
    fence = open_fence(excerpt)
    if fence is None:
        return excerpt, None
    start, delimiter = fence
    closing = ("" if excerpt.endswith("\n") else "\n") + delimiter
    room = safe_cut(text, limit - len(closing) - 1)
    first_line_end = text.find("\n", start)
    if first_line_end != -1 and room > first_line_end:
        inner = text[:room]
        return inner + ("" if inner.endswith("\n") else "\n") + delimiter, None
    # the closing fence does not fit with any of the block's content: retreat out of the block
    retreat = text[:start].rstrip("\n")
    if not retreat.strip():
        return (
            excerpt,
            "fence repair refused (it would delete every remaining character); the excerpt ends inside a code block",
        )
    return retreat, f"retreated out of a code block, dropping {len(excerpt) - len(retreat)} characters"


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(text.split())


def clip(text: str, limit: int, *, single_line: bool = False, overflow: str | None = None) -> str:
    """At most about ``limit`` characters of ``text``, cut where :func:`cut_text` allows.

    ``single_line`` first collapses whitespace (:func:`one_line`). A clipped text ends with
    :data:`ELLIPSIS` (counted in ``limit``), or, when ``overflow`` is given, with a line
    ``[… N more characters; <overflow>]`` after ``limit`` characters of text, telling the
    reader where the rest is."""
    if single_line:
        text = one_line(text)
    if len(text) <= limit:
        return text
    if overflow is not None:
        body, _ = cut_text(text, max(0, limit))
        return f"{body}\n[… {len(text) - len(body)} more characters; {overflow}]"
    body, _ = cut_text(text, max(0, limit - 1))
    return body + ELLIPSIS


# -- extracting from messages ----------------------------------------------------------------------
#: tool-call argument keys that name a file
PATH_KEYS = ("path", "file", "file_path", "filename", "filepath", "notebook_path")
#: tool-call argument keys that hold a shell command
COMMAND_KEYS = ("command", "cmd")
#: words that mark a tool result as a failure when the tool did not flag it (searched in its
#: first 2,000 characters)
ERROR_MARKERS = re.compile(r"\b(Error|Exception|Traceback|FAILED)\b")


def first_line(text: str, empty: str = "") -> str:
    """The first line of ``text`` once stripped, or ``empty`` when nothing is left."""
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else empty


def string_arguments(call: ToolCallBlock, keys: tuple[str, ...] = PATH_KEYS) -> list[str]:
    """The string values of a tool call's arguments under ``keys``, in the order of ``keys``
    (arguments that are not an object give none)."""
    args = call.arguments if isinstance(call.arguments, dict) else {}
    return [value for key in keys if isinstance(value := args.get(key), str)]


def failed(result: ToolResultBlock, markers: re.Pattern[str] = ERROR_MARKERS) -> bool:
    """True when a tool result is an error: flagged so, or its start shows ``markers``."""
    if result.is_error:
        return True
    head = result.content[:2000]
    if markers is ERROR_MARKERS and not (
        # the words of ERROR_MARKERS: a text holding none cannot match, and four substring scans
        # cost a fraction of one regex search with word boundaries (a generator over them, half)
        "Error" in head or "Exception" in head or "Traceback" in head or "FAILED" in head
    ):
        return False
    return bool(markers.search(head))


def keep_newest(lines: list[str], budget: int, *, spare: Callable[[str], bool] | None = None) -> list[str]:
    """The newest of ``lines`` that fit in ``budget`` characters (each line counts its length
    plus one for its line break), in their order: the oldest go first. With ``spare``, lines it
    accepts go last: every other line is given up, oldest first, before the oldest spared one."""
    if spare is None:  # the longest suffix that fits, found from the newest end
        start, size = len(lines), 0
        while start and size + len(lines[start - 1]) + 1 <= budget:
            start -= 1
            size += len(lines[start]) + 1
        return lines[start:]
    kept = list(lines)
    size = sum(len(line) + 1 for line in kept)
    for sparing in (True, False):
        i = 0
        while size > budget and i < len(kept):
            if sparing and spare(kept[i]):
                i += 1
                continue
            size -= len(kept[i]) + 1
            del kept[i]
    return kept


# -- the extractive summary -----------------------------------------------------------------------
_SECTION_RE = re.compile(r"^## (.+)$", re.MULTILINE)


def _previous_sections(text: str) -> dict[str, list[str]]:
    """Bullets of an earlier checkpoint, by section, so they merge instead of nesting."""
    body = text.split(CHECKPOINT_OPEN, 1)[-1].split(CHECKPOINT_CLOSE, 1)[0]
    sections: dict[str, list[str]] = {}
    current = None
    for line in body.splitlines():
        heading = _SECTION_RE.match(line)
        if heading:
            current = heading.group(1).strip()
            sections.setdefault(current, [])
        elif current and line.startswith("- "):
            sections[current].append(line[2:])
    return sections


#: the tool-call argument keys the extractive summary reads (one set test per call)
_ARGUMENT_KEYS = frozenset(PATH_KEYS + COMMAND_KEYS)
_PATH_KEY_SET = frozenset(PATH_KEYS)


def _line(text: str, limit: int) -> str:
    """``clip(text, limit, single_line=True)``, without the call when the line is short."""
    line = " ".join(text.split())
    return line if len(line) <= limit else clip(line, limit)


# over the complexity cap: one pass that fills all eight sections (a compaction summarises ~200
# messages inside its transaction); a pass per section would read them eight times
def extractive_summary(messages: list[Message], *, max_chars: int = 12_000) -> str:  # noqa: C901
    """Eight sections built from the messages alone: deterministic and model-free.

    One pass over the messages that reads only what a section uses (a compaction summarises
    ~200 messages inside its transaction): an assistant message's text is joined only for the
    last one that has any, a tool call's arguments are looked up only under the keys present."""
    found: dict[str, list[str]] = {s: [] for s in SUMMARY_SECTIONS}
    requests, files, errors, ran = (
        found["Primary Request and Intent"],
        found["Files and Code"],
        found["Errors and Fixes"],
        found["Critical Context"],
    )
    assistants: list[Message] = []
    tools_used: dict[str, None] = {}  # insertion-ordered set
    # an argument's line is a function of its value, and calls repeat their paths and commands
    # (a session reads the same files again): each distinct value is collapsed and clipped once
    argument_lines: dict[str, str] = {}
    for message in messages:
        role = message.role
        if role == "user":
            kind = message.source.kind
            if kind == "user":
                requests.append("User: " + _line(message.text, 600))
            elif kind == "plugin":
                text = message.text
                if CHECKPOINT_OPEN in text:
                    for section, bullets in _previous_sections(text).items():
                        if section in found:
                            found[section].extend(bullets)
        elif role == "assistant":
            assistants.append(message)
            for call in message.content:
                if call.type != "tool_call":
                    continue
                name = call.name
                tools_used[name] = None
                args = call.arguments
                if not isinstance(args, dict) or not args:
                    continue
                present = _ARGUMENT_KEYS.intersection(args)
                if not present:
                    continue
                if len(present) == 1:  # the usual call: one path or one command, no order to keep
                    (key,) = present
                    if isinstance(value := args[key], str):
                        line = argument_lines.get(value)
                        if line is None:
                            line = argument_lines[value] = _line(value, 200)
                        if key in _PATH_KEY_SET:
                            files.append(f"{name}: {line}")
                        else:
                            ran.append(f"ran: {line}")
                    continue
                for key in PATH_KEYS:
                    if key in present and isinstance(value := args[key], str):
                        files.append(f"{name}: {_line(value, 200)}")
                for key in COMMAND_KEYS:
                    if key in present and isinstance(value := args[key], str):
                        ran.append(f"ran: {_line(value, 200)}")
        elif role == "tool":
            result = message.tool_result
            assert result is not None
            if failed(result):
                errors.append(f"{result.name or result.call_id}: {_line(first_line(result.content), 240)}")
    if tools_used:
        found["Key Technical Concepts"].append("tools used: " + ", ".join(list(tools_used)[:30]))
    last_assistant = next((text for m in reversed(assistants) if (text := m.text).strip()), "")
    if last_assistant:
        found["Current Work"].append(clip(last_assistant, 800, single_line=True))
        tail = re.split(r"(?<=[.!?])\s+", last_assistant.strip())[-1]
        found["Next Step"].append(f"continue from: {clip(tail, 300, single_line=True)}")
    budget = max_chars // len(SUMMARY_SECTIONS)
    parts = []
    for section in SUMMARY_SECTIONS:
        bullets = list(dict.fromkeys(found[section]))  # de-duplicate, keep order
        lines: list[str] = []
        used = 0
        # newest facts matter most: keep from the end, then restore order
        for bullet in reversed(bullets):
            line = f"- {bullet}"
            if used + len(line) > budget and lines:
                break
            lines.append(line[:budget])
            used += len(line) + 1
        lines.reverse()
        if len(lines) < len(bullets):
            lines.insert(0, f"- ({len(bullets) - len(lines)} earlier item(s) omitted)")
        parts.append(f"## {section}\n" + ("\n".join(lines) if lines else "(none)"))
    return "\n\n".join(parts)


# -- untrusted text --------------------------------------------------------------------------------
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


_ATTR = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
)


def attr(value: object) -> str:
    """``value`` as the inside of a double-quoted pseudo-XML attribute: it cannot end the
    attribute, add another one, close the tag or break the header line."""
    return str(value).translate(_ATTR)


def tag(name: str, **attributes: object) -> str:
    """An opening tag ``<name key="value" ...>`` with every value escaped by :func:`attr`
    (attribute names are written as given)."""
    parts = [name, *(f'{key}="{attr(value)}"' for key, value in attributes.items())]
    return "<" + " ".join(parts) + ">"


__all__ = [
    "COMMAND_KEYS",
    "KERNEL_FRAMES",
    "ELLIPSIS",
    "ERROR_MARKERS",
    "PATH_KEYS",
    "REPLACEMENT",
    "attr",
    "clip",
    "cut_text",
    "extractive_summary",
    "failed",
    "first_line",
    "guard",
    "keep_newest",
    "one_line",
    "open_fence",
    "safe_cut",
    "storable",
    "storable_text",
    "string_arguments",
    "tag",
]

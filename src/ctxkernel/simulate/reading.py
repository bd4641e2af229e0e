"""What every importer shares: reading a file within its bounds (:func:`read_document`,
:func:`read_lines`), JSON lines with their numbers (:class:`Lines`), and the checks of usage and of
each item before it joins a recording (:func:`check_usage`, :func:`check_item`).

A malformed value raises :class:`RecordingError` naming the file, the line (or position), what was
expected and what was found; with ``lenient`` it is skipped and listed instead. A file or a line
past its bound (:data:`FILE_LIMIT`, :data:`LINE_LIMIT`) is refused before it is read into memory,
with or without ``lenient``. A UTF-8 byte order mark at the start of a file is skipped.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..convert import arguments_from_json
from ..errors import EventError
from ..jsonbytes import loads
from ..messages import Message, check_new_calls
from ..session import normalize_usage
from .recording import AssistantItem, Item, MarkerItem, RecordingError, ToolResultItem, UserItem

#: what an importer's own checks, and the converters it calls, raise for a malformed value
SHAPE_ERRORS = (EventError, TypeError, ValueError, AttributeError, KeyError)
#: the usage counters :func:`normalize_usage` reads; each must be a non-negative integer when present
_USAGE_COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "prompt_tokens",
    "completion_tokens",
)
_MAX_TOKENS = 2**53  # a token count past this is not a count
_MAX_EPOCH = 4_102_444_800.0  # 2100-01-01: a recorded time past it is not a time
#: the largest recording file read: a JSON document is read whole, and a JSONL file's lines are
#: held until its importer has walked them (the largest recording seen is a few MB)
FILE_LIMIT = 1024 * 1024 * 1024
#: the longest line of a JSONL recording (a Codex session_meta or a pasted message can be long,
#: the longest seen is under 1 MB); a line past this is not a recording line
LINE_LIMIT = 64 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"  # the UTF-8 byte order mark some editors write first
_CHUNK = 1024 * 1024


def _size(n: int) -> str:
    """A limit as people write it: ``64 MiB (67,108,864 bytes)``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:g} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def check_file_size(path: Path, read: int = 0) -> int:
    """The file's size; a file past :data:`FILE_LIMIT` is refused naming its size, before any of it
    is read (or once ``read`` bytes of it are past the limit: it grew after its size was checked)."""
    size = max(path.stat().st_size, read)
    if size > FILE_LIMIT:
        msg = (
            f"{path}: the file is {size:,} bytes, larger than the {_size(FILE_LIMIT)} a recording "
            "may hold; split the session or pass a smaller file"
        )
        raise RecordingError(msg)
    return size


def read_document(path: Path) -> bytes:
    """The whole file (one JSON document), its byte order mark skipped; refused past :data:`FILE_LIMIT`."""
    check_file_size(path)
    with open(path, "rb") as f:
        data = f.read(FILE_LIMIT + 1)  # one byte past the limit tells a file that grew past it since
    check_file_size(path, len(data))
    return data.removeprefix(_BOM)


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of a JSONL file, the byte order mark skipped; a line longer than
    :data:`LINE_LIMIT` is refused naming it and its length, without holding more than the limit."""
    check_file_size(path)
    limit, total = LINE_LIMIT, 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
            if len(raw) > limit and not raw.endswith(b"\n"):
                length = len(raw) + _rest_of_line(f)  # the newline not counted
                msg = (
                    f"{path}:{lineno}: the line is {length:,} bytes, longer than the {_size(limit)} a "
                    "recording line may hold; this is not a recording line"
                )
                raise RecordingError(msg)
            total += len(raw)
            if total > FILE_LIMIT:
                check_file_size(path, total)
            yield lineno, raw.removeprefix(_BOM) if lineno == 1 else raw


def _rest_of_line(f: Any) -> int:
    """How many bytes are left of the current line before its newline, read in chunks and dropped."""
    n = 0
    while chunk := f.readline(_CHUNK):
        if chunk.endswith(b"\n"):
            return n + len(chunk) - 1
        n += len(chunk)
    return n


class Lines:
    """JSON lines of a file with their numbers; malformed ones raise or are skipped (lenient)."""

    def __init__(self, path: Path, lenient: bool) -> None:
        self.path = path
        self.lenient = lenient
        self.skipped: list[dict[str, Any]] = []

    def bad(self, lineno: int | str, expected: str, got: str) -> None:
        if self.lenient:
            self.skipped.append({"line": lineno, "expected": expected, "got": got[:200]})
            return
        where = f"{self.path}:{lineno}" if isinstance(lineno, int) else f"{self.path}: {lineno}"
        msg = f"{where}: expected {expected}, got {got[:200]}; fix the line or pass --lenient to skip it"
        raise RecordingError(msg)

    def add(self, items: list[Item], where: int | str, item: Item) -> None:
        """Append ``item`` after checking its shape; a bad one is refused (or skipped) naming ``where``."""
        problem = check_item(item)
        if problem is None:
            items.append(item)
        else:
            self.bad(where, problem[0], problem[1])

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for lineno, raw in read_lines(self.path):
            if not raw.strip():
                continue
            try:
                value = loads(raw)
            except orjson.JSONDecodeError as exc:
                self.bad(lineno, "one JSON object per line", f"invalid JSON ({exc})")
                continue
            if not isinstance(value, dict):
                self.bad(lineno, "a JSON object", type(value).__name__)
                continue
            yield lineno, value


def parse_time(value: Any) -> float | None:
    """A recorded timestamp as seconds since the epoch: an ISO 8601 string (``Z`` or an offset; a
    naive one is UTC) or a number of seconds; None for anything else (no time is then known)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        return seconds if 0 <= seconds < _MAX_EPOCH else None
    if not isinstance(value, str) or not 10 <= len(value) <= 40:
        return None
    try:
        moment = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.UTC)
    seconds = moment.timestamp()
    return seconds if 0 <= seconds < _MAX_EPOCH else None


def check_usage(raw: Any, field: str = "usage") -> dict[str, int] | None:
    """Recorded usage in the kernel's form; a counter that is not a non-negative integer is refused."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        msg = f"{field} must be an object of token counts, got {type(raw).__name__}"
        raise EventError(msg)
    counters = [(k, raw.get(k)) for k in _USAGE_COUNTERS]
    details = raw.get("prompt_tokens_details")
    if details is not None:
        if not isinstance(details, dict):
            msg = f"{field}.prompt_tokens_details must be an object, got {type(details).__name__}"
            raise EventError(msg)
        counters.append(("prompt_tokens_details.cached_tokens", details.get("cached_tokens")))
    for key, value in counters:
        if value is not None and (type(value) is not int or not 0 <= value < _MAX_TOKENS):
            msg = f"{field}.{key} must be a non-negative integer token count, got {value!r:.60}"
            raise EventError(msg)
    return normalize_usage(raw)


def check_item(item: Item) -> tuple[str, str] | None:
    """``(what is accepted, what was found)`` when an item is not well-typed, else None."""
    if isinstance(item, UserItem):
        if not isinstance(item.text, str):
            return "a user message whose text is a string", type(item.text).__name__
        return None
    if isinstance(item, ToolResultItem):
        for name, value, types in (
            ("call_id", item.call_id, (str,)),
            ("content", item.content, (str,)),
            ("is_error", item.is_error, (bool,)),
            ("name", item.name, (str, type(None))),
        ):
            if not isinstance(value, types):
                return (
                    f"a tool result whose {name} is {' or '.join(t.__name__ for t in types)}",
                    f"{type(value).__name__} {value!r:.60}",
                )
        return None
    if isinstance(item, AssistantItem):
        message = item.message
        if not isinstance(message, Message) or message.role != "assistant":
            return "an assistant message", repr(message)[:120]
        try:
            source = message.source  # checked first: serializing an unhashable provider would raise
            if not all(v is None or isinstance(v, str) for v in (source.provider, source.model)):
                msg = f"the message's provider and model must be strings, got {source.provider!r:.60}, {source.model!r:.60}"
                raise EventError(msg)
            data = message.to_dict()
            Message.from_dict(data)  # the kernel's own check of every block's fields
            check_new_calls(message, ids=False)  # an id past the bound is renamed (unique_call_ids)
            check_usage(item.usage)
            # as deep as the replay's log writes it (the message in its event's data, in the event's
            # record): orjson reads deeper JSON than it writes
            orjson.dumps([[data]])
        except EventError as exc:
            return "a well-typed assistant message", str(exc)
        except orjson.JSONEncodeError as exc:
            return (
                "an assistant message whose arguments are JSON nested at most 254 levels, counted from its stored event",
                str(exc),
            )
        return None
    if isinstance(item, MarkerItem):
        if not isinstance(item.kind, str) or not isinstance(item.data, dict):
            return "a marker", repr(item)[:120]
        return None
    return "a recording item", type(item).__name__


def json_arguments(raw: Any) -> dict[str, Any]:
    # lenient, unlike convert's: a recording with odd arguments still replays
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        return arguments_from_json(raw)
    return {}

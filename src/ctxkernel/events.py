"""The event envelope and the kernel's event vocabulary.

A session is an append-only log of events. Every event has a contiguous ``seq`` (its index), a
``type``, a UTC ``time``, a JSON ``data`` payload and, on the three surface event types, a
``surface`` operation. Plugin-owned events are typed ``<plugin>/<kind>`` and flagged
``ignorable`` so that a session written with a plugin still opens without it.

Surface operations (HOST-MODEL §2)::

    {"op": "append"}                                        push this event's message
    {"op": "replace", "start": S, "end": E, "cites": [...]} nodes S..E (surface order) become this one
    {"op": "remove",  "start": S, "end": E, "cites": [...]} nodes S..E leave the surface (kernel `surface/drop`)
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

from .errors import EventError

# -- vocabulary -----------------------------------------------------------------------------------
TURN_START = "turn/start"
TURN_END = "turn/end"
STEP_START = "step/start"
STEP_END = "step/end"
USER_MESSAGE = "user/message"
ASSISTANT_MESSAGE = "assistant/message"
TOOL_RESULT = "tool/result"
REQUEST_HEADER = "request/header"
REQUEST_CONTEXT = "request/context"
COMPACTION_START = "compaction/start"
COMPACTION_SUMMARY = "compaction/summary"
COMPACTION_END = "compaction/end"
COMPACTION_PRUNE = "compaction/prune"
SURFACE_DROP = "surface/drop"
#: a person enabled or disabled a strategy for this session (manual controls, ``controls.py``)
SESSION_STRATEGY = "session/strategy"
#: the harness set the session's task state: goal and/or todos (``Session.set_task``)
SESSION_TASK = "session/task"

#: Event types whose message reaches the model.
MESSAGE_TYPES = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT})
#: Every event type the kernel itself writes; anything else must be an ignorable plugin event.
KERNEL_TYPES = frozenset(
    {
        TURN_START,
        TURN_END,
        STEP_START,
        STEP_END,
        USER_MESSAGE,
        ASSISTANT_MESSAGE,
        TOOL_RESULT,
        REQUEST_HEADER,
        REQUEST_CONTEXT,
        COMPACTION_START,
        COMPACTION_SUMMARY,
        COMPACTION_END,
        COMPACTION_PRUNE,
        SURFACE_DROP,
        SESSION_STRATEGY,
        SESSION_TASK,
    }
)
KERNEL_NAMESPACES = frozenset(t.split("/")[0] for t in KERNEL_TYPES)
TURN_END_REASONS = ("completed", "aborted", "error", "max-tokens", "interrupted")
SURFACE_OPS = ("append", "replace", "remove")

#: Required data keys (and their JSON types) per kernel event type; extra keys are allowed.
_REQUIRED_DATA: dict[str, dict[str, type | tuple[type, ...]]] = {
    TURN_START: {"turn": int},
    TURN_END: {"turn": int, "reason": str},
    STEP_START: {"turn": int, "step": int},
    STEP_END: {"turn": int, "step": int},
    USER_MESSAGE: {"message": dict},
    ASSISTANT_MESSAGE: {"message": dict},
    TOOL_RESULT: {"message": dict},
    REQUEST_HEADER: {"system": str, "tools": list, "hash": str},
    REQUEST_CONTEXT: {"provider": str, "model": str, "context_window": int, "reserved_output_tokens": int},
    COMPACTION_START: {"compaction_id": str, "strategy": str},
    COMPACTION_SUMMARY: {"compaction_id": str, "summary": str, "cites": list},
    COMPACTION_END: {"compaction_id": str},
    COMPACTION_PRUNE: {"target": int, "strategy": str},
    SURFACE_DROP: {"strategy": str},
    SESSION_STRATEGY: {"strategy": str, "enabled": bool},
    SESSION_TASK: {"by": str},
}


@dataclass(frozen=True)
class EventSpec:
    """An event to append; the session assigns its seq and time."""

    type: str
    data: dict[str, Any]
    surface: dict[str, Any] | None = None
    ignorable: bool = False


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Event:
    """One immutable entry of a session log."""

    seq: int
    type: str
    data: dict[str, Any]
    time: str = ""
    surface: dict[str, Any] | None = None
    ignorable: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "type": self.type, "time": self.time, "data": self.data}
        if self.surface is not None:
            out["surface"] = self.surface
        if self.ignorable:
            out["ignorable"] = True
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Event:
        """Build and validate an event read from storage (raises :class:`EventError`)."""
        if not isinstance(raw, dict):
            msg = f"an event must be a JSON object, got {type(raw).__name__}"
            raise EventError(msg)
        if not _ENVELOPE_KEYS.issuperset(raw):  # cheaper than a set difference on every replayed event
            unknown = set(raw) - _ENVELOPE_KEYS
            msg = f"event has unknown keys {sorted(unknown)}; accepted: {sorted(_ENVELOPE_KEYS)}"
            raise EventError(msg)
        seq = raw.get("seq")
        if type(seq) is not int or seq < 0:  # exact type: bool is an int subclass and not a seq
            msg = f"event seq must be a non-negative integer, got {seq!r}"
            raise EventError(msg)
        get: Any = raw.get  # validate_shape checks every field's type right after
        # positional: a frozen dataclass's keyword init is measurably slower, and replay makes one per event
        event = cls(seq, get("type"), get("data"), get("time", ""), get("surface"), get("ignorable", False))
        validate_shape(event)
        return event

    @property
    def message_dict(self) -> dict[str, Any] | None:
        return self.data.get("message") if self.type in MESSAGE_TYPES else None


_ENVELOPE_KEYS = frozenset({"seq", "type", "time", "data", "surface", "ignorable"})


def is_plugin_type(event_type: str) -> bool:
    ns, _, kind = event_type.partition("/")
    return bool(ns) and bool(kind) and ns not in KERNEL_NAMESPACES


def validate_shape(event: Event) -> None:
    """Check an event's envelope and required data, independent of the log it joins."""
    etype = event.type
    if not isinstance(etype, str) or "/" not in etype:
        msg = f"event type must be a '<namespace>/<kind>' string, got {etype!r}"
        raise EventError(msg)
    if not isinstance(event.data, dict):
        msg = f"{etype} event data must be an object, got {type(event.data).__name__}"
        raise EventError(msg)
    if not isinstance(event.time, str):
        msg = f"{etype} event time must be an ISO-8601 string"
        raise EventError(msg)
    if not isinstance(event.ignorable, bool):
        msg = f"{etype} event 'ignorable' must be a boolean"
        raise EventError(msg)
    if etype not in KERNEL_TYPES:
        if not is_plugin_type(etype):
            msg = (
                f"unknown event type {etype!r}: kernel types are {sorted(KERNEL_TYPES)}; "
                "plugin events are '<plugin>/<kind>' outside the kernel namespaces"
            )
            raise EventError(msg)
        if not event.ignorable:
            msg = f"plugin event {etype!r} must be flagged ignorable so sessions open without the plugin"
            raise EventError(msg)
        if event.surface is not None:
            msg = f"plugin event {etype!r} cannot carry a surface operation"
            raise EventError(msg)
        return
    for key, typ in _REQUIRED_DATA[etype].items():
        value = event.data.get(key)
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            want = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            msg = f"{etype} event needs data.{key} of type {want}, got {value!r:.80}"
            raise EventError(msg)
    if etype == TURN_END and event.data["reason"] not in TURN_END_REASONS:
        msg = f"turn/end reason must be one of {list(TURN_END_REASONS)}, got {event.data['reason']!r}"
        raise EventError(msg)
    _validate_surface_op(event)


def _validate_surface_op(event: Event) -> None:
    op = event.surface
    carries = event.type in MESSAGE_TYPES or event.type == SURFACE_DROP
    if op is None:
        if carries:
            msg = f"{event.type} event needs a surface operation ({list(SURFACE_OPS)})"
            raise EventError(msg)
        return
    if not carries:
        msg = f"{event.type} event cannot carry a surface operation"
        raise EventError(msg)
    if not isinstance(op, dict) or op.get("op") not in SURFACE_OPS:
        msg = f"surface operation must be an object with op in {list(SURFACE_OPS)}, got {op!r:.120}"
        raise EventError(msg)
    kind = op["op"]
    if (kind == "remove") != (event.type == SURFACE_DROP):
        msg = "the remove operation is carried only by surface/drop events, and surface/drop only removes"
        raise EventError(msg)
    if kind == "append":
        if set(op) != {"op"}:
            msg = f"append takes no arguments, got {sorted(set(op) - {'op'})}"
            raise EventError(msg)
        return
    for key in ("start", "end"):
        if not isinstance(op.get(key), int) or isinstance(op.get(key), bool):
            msg = f"{kind} needs integer '{key}' (a surface node's seq), got {op.get(key)!r}"
            raise EventError(msg)
    cites = op.get("cites")
    if (
        not isinstance(cites, list)
        or not cites
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in cites)
    ):
        msg = f"{kind} needs 'cites': the non-empty list of every shadowed node's seq, got {cites!r:.120}"
        raise EventError(msg)
    extra = set(op) - {"op", "start", "end", "cites"}
    if extra:
        msg = f"{kind} has unknown keys {sorted(extra)}; accepted: ['op', 'start', 'end', 'cites']"
        raise EventError(msg)


def append_op() -> dict[str, Any]:
    return {"op": "append"}


def replace_op(cites: list[int]) -> dict[str, Any]:
    return {"op": "replace", "start": cites[0], "end": cites[-1], "cites": list(cites)}


def remove_op(cites: list[int]) -> dict[str, Any]:
    return {"op": "remove", "start": cites[0], "end": cites[-1], "cites": list(cites)}

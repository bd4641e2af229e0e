"""The event envelope and the kernel's event vocabulary (public: strategies import it).

A session is an append-only log of events. Every event has a contiguous ``seq`` (its index), a
``type``, a UTC ``time``, a JSON ``data`` payload and, on the three surface event types, a
``surface`` operation. Plugin-owned events are typed ``<plugin>/<kind>`` and flagged
``ignorable`` so that a session written with a plugin still opens without it.

Surface operations (docs/design/host-model.md §2)::

    {"op": "append"}                                        push this event's message
    {"op": "replace", "start": S, "end": E, "cites": [...]} nodes S..E (surface order) become this one
    {"op": "remove",  "start": S, "end": E, "cites": [...]} nodes S..E leave the surface (kernel `surface/drop`)

Read an event through :func:`view` (one frozen dataclass per kernel event type, and
:class:`PluginRecord` for ``<plugin>/<kind>`` events) rather than its raw ``data`` dict;
:func:`views` filters a log by view class. Only the names in ``__all__`` are public.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import random as _random
import secrets
import time as _time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any, TypeVar

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


#: the clock of a replay (``ctxkernel simulate``): a function giving the recording's time, so a
#: replayed session's times (and every note or handoff that quotes them) are the same twice
_CLOCK: ContextVar[Callable[[], float] | None] = ContextVar("ctxkernel_clock", default=None)
#: the random source of a replay: ids (sessions, notes, chapters, compactions) drawn from a seed,
#: so ids quoted on the surface count the same tokens on every run of one command
_RANDOM: ContextVar[_random.Random | None] = ContextVar("ctxkernel_random", default=None)


def replaying() -> bool:
    """True inside :func:`replay_clock` (``ctxkernel simulate``'s replays)."""
    return _CLOCK.get() is not None


def now_seconds() -> float:
    """Seconds since the epoch: the system clock, or the replay clock under :func:`replay_clock`."""
    clock = _CLOCK.get()
    return _time.time() if clock is None else clock()


def random_bits(bits: int) -> int:
    """``bits`` random bits for an id: the system's randomness, or under :func:`replay_clock` the
    replay's seeded generator (never for secrets: tokens and keys use :mod:`secrets`)."""
    rng = _RANDOM.get()
    return secrets.randbits(bits) if rng is None else rng.getrandbits(bits)


def random_hex(chars: int) -> str:
    """``chars`` random hex digits for an id (see :func:`random_bits`)."""
    return f"{random_bits(chars * 4):0{chars}x}"


def utc_now() -> str:
    """The time events (and strategies' notes) carry: now, or the replay clock's time under
    :func:`replay_clock`, as ISO 8601 UTC with milliseconds."""
    clock = _CLOCK.get()
    if clock is None:
        return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    moment = _dt.datetime.fromtimestamp(clock(), _dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextlib.contextmanager
def replay_clock(seconds: Callable[[], float], seed: str) -> Iterator[None]:
    """Within the block, in this context, :func:`utc_now` and :func:`now_seconds` read
    ``seconds()`` (seconds since the epoch) instead of the system clock, and :func:`random_bits`
    draws from a generator seeded with ``seed``: a replay's times come from the recording it
    replays, and two runs of one replay write the same log."""
    tokens = (_CLOCK.set(seconds), _RANDOM.set(_random.Random(seed)))
    try:
        yield
    finally:
        _CLOCK.reset(tokens[0])
        _RANDOM.reset(tokens[1])


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """One immutable entry of a session log."""

    seq: int
    type: str
    data: dict[str, Any]
    time: str = ""
    surface: dict[str, Any] | None = None
    ignorable: bool = False

    def __init__(
        self,
        seq: int,
        type: str,  # the field's name
        data: dict[str, Any],
        time: str = "",
        surface: dict[str, Any] | None = None,
        ignorable: bool = False,
    ) -> None:
        # the dataclass's own frozen __init__, setting each field through the slots' descriptors
        # instead of object.__setattr__ (a lookup by name per field): ~40% less per event, and
        # every appended, replayed or read event is built here
        _set_seq(self, seq)
        _set_type(self, type)
        _set_data(self, data)
        _set_time(self, time)
        _set_surface(self, surface)
        _set_ignorable(self, ignorable)

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
        surface = get("surface")
        if surface == _APPEND_OP:  # the one shared dict (append_op) for a read event too
            surface = _APPEND_OP
        event = cls(seq, get("type"), get("data"), get("time", ""), surface, get("ignorable", False))
        validate_shape(event)
        return event

    @property
    def message_dict(self) -> dict[str, Any] | None:
        return self.data.get("message") if self.type in MESSAGE_TYPES else None


_ENVELOPE_KEYS = frozenset({"seq", "type", "time", "data", "surface", "ignorable"})
# each slot's own setter (the frozen class refuses setattr; these are what it would reach)
_set_seq, _set_type, _set_data, _set_time, _set_surface, _set_ignorable = (
    Event.__dict__[f.name].__set__ for f in fields(Event)
)


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
    if event.surface is None and etype not in _CARRIERS:
        return  # most of a log: no surface operation, and none wanted (_validate_surface_op's first case)
    _validate_surface_op(event)


#: the event types that carry a surface operation (and only they)
_CARRIERS = MESSAGE_TYPES | {SURFACE_DROP}


def _validate_surface_op(event: Event) -> None:
    op = event.surface
    carries = event.type in _CARRIERS
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
        if len(op) != 1:  # "op" is in it (checked above): nothing else may be
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
        # every element exactly an int (a compaction cites ~200): one pass in C; else the slow
        # test, which also accepts int subclasses other than bool
        or (set(map(type, cites)) != {int} and not all(isinstance(c, int) and not isinstance(c, bool) for c in cites))
    ):
        msg = f"{kind} needs 'cites': the non-empty list of every shadowed node's seq, got {cites!r:.120}"
        raise EventError(msg)
    extra = set(op) - {"op", "start", "end", "cites"}
    if extra:
        msg = f"{kind} has unknown keys {sorted(extra)}; accepted: ['op', 'start', 'end', 'cites']"
        raise EventError(msg)


#: every appended message's operation: one dict, shared by all their events (read-only, as all
#: event data is), not one per event
_APPEND_OP: dict[str, Any] = {"op": "append"}


def append_op() -> dict[str, Any]:
    """The ``append`` surface operation (one shared dict: never change it)."""
    return _APPEND_OP


def replace_op(cites: list[int]) -> dict[str, Any]:
    return {"op": "replace", "start": cites[0], "end": cites[-1], "cites": list(cites)}


def remove_op(cites: list[int]) -> dict[str, Any]:
    return {"op": "remove", "start": cites[0], "end": cites[-1], "cites": list(cites)}


def original_seq(events: Sequence[Event], seq: int) -> int:
    """The seq of the full text behind the tool result at ``seq``: a result rewritten in place (a
    strategy's prune or shrink, the kernel's excerpt) points back, through the log's citations, to
    the result it shadows. Never read from the result's text, which a tool wrote."""
    event = events[seq]
    while event.type == TOOL_RESULT and (event.surface or {}).get("op") == "replace":
        cites = (event.surface or {}).get("cites") or []
        if len(cites) != 1:
            break
        event = events[cites[0]]
    return event.seq


# -- typed views ----------------------------------------------------------------------------------
# The required keys of each type are checked by validate_shape before an event joins a log; the
# optional ones are read defensively (older logs lack them), so a view never raises.


@dataclass(frozen=True, slots=True)
class TurnStart:
    """``turn/start``: a user turn opens (turns count from 1)."""

    turn: int


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """``turn/end``: the turn closed, with one of :data:`TURN_END_REASONS`."""

    turn: int
    reason: str


@dataclass(frozen=True, slots=True)
class StepStart:
    """``step/start``: a model request of the turn (steps count from 1); ``cache_prefix_tokens``
    is how many of its tokens repeated the previous request's prefix (None in logs before 0.3)."""

    turn: int
    step: int
    cache_prefix_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class StepEnd:
    """``step/end``: the step closed; ``reason`` is ``abandoned`` etc., ``None`` for a normal end."""

    turn: int
    step: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """``user/message``, ``assistant/message`` or ``tool/result``: a message on the surface.
    ``message`` is its JSON form (the surface node holds the parsed ``Message``); ``cites`` are
    the seqs it replaced (empty for an appended message); ``pruned`` marks a tool result shrunk by
    ``replace_tool_result``."""

    role: str
    message: dict[str, Any]
    cites: tuple[int, ...]
    pruned: bool


@dataclass(frozen=True, slots=True)
class HeaderRecord:
    """``request/header``: the system prompt and tool schemas every request carries from here on."""

    system: str
    tools: list[Any]
    hash: str


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """``request/context``: the provider, model and window requests are routed to from here on."""

    provider: str
    model: str
    context_window: int
    reserved_output_tokens: int


@dataclass(frozen=True, slots=True)
class CompactionStart:
    """``compaction/start``: a compaction transaction took the session's lock."""

    compaction_id: str
    strategy: str
    kind: str
    turn: int | None


@dataclass(frozen=True, slots=True)
class CompactionSummary:
    """``compaction/summary``: what the transaction wrote (its replacements follow it)."""

    compaction_id: str
    strategy: str
    kind: str
    summary: str
    cites: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CompactionEnd:
    """``compaction/end``: the transaction closed; ``error`` says why when it failed."""

    compaction_id: str
    error: str | None


@dataclass(frozen=True, slots=True)
class CompactionPrune:
    """``compaction/prune``: one tool result (seq ``target``) is shrunk by the next event."""

    target: int
    strategy: str
    reason: str
    chars_before: int | None
    chars_after: int | None


@dataclass(frozen=True, slots=True)
class SurfaceDrop:
    """``surface/drop``: the cited nodes left the surface with no replacement."""

    strategy: str
    cites: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StrategyToggle:
    """``session/strategy``: a person enabled or disabled a strategy for this session."""

    strategy: str
    enabled: bool
    by: str


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """``session/task``: the harness set the goal and/or the todos (None: left as they were)."""

    goal: str | None
    todos: tuple[dict[str, Any], ...] | None
    by: str


@dataclass(frozen=True, slots=True)
class PluginRecord:
    """An ignorable ``<strategy>/<kind>`` event a strategy emitted (``handle.emit``)."""

    strategy: str
    kind: str
    data: dict[str, Any]


EventView = (
    TurnStart
    | TurnEnd
    | StepStart
    | StepEnd
    | MessageRecord
    | HeaderRecord
    | RouteRecord
    | CompactionStart
    | CompactionSummary
    | CompactionEnd
    | CompactionPrune
    | SurfaceDrop
    | StrategyToggle
    | TaskRecord
    | PluginRecord
)
V = TypeVar("V", bound=EventView)


def _opt(data: dict[str, Any], key: str, typ: type) -> Any:
    value = data.get(key)
    return value if isinstance(value, typ) and not (typ is int and isinstance(value, bool)) else None


def _cites(event: Event) -> tuple[int, ...]:
    op = event.surface
    return tuple(op["cites"]) if op is not None and op.get("op") != "append" else ()


def view(event: Event) -> EventView:
    """The typed view of one event of a log."""
    d, t = event.data, event.type
    if t in MESSAGE_TYPES:
        return MessageRecord(_ROLE_OF[t], d["message"], _cites(event), d.get("prune") is True)
    if t == TURN_START:
        return TurnStart(d["turn"])
    if t == TURN_END:
        return TurnEnd(d["turn"], d["reason"])
    if t == STEP_START:
        return StepStart(d["turn"], d["step"], _opt(d, "cache_prefix_tokens", int))
    if t == STEP_END:
        return StepEnd(d["turn"], d["step"], _opt(d, "reason", str))
    if t == REQUEST_HEADER:
        return HeaderRecord(d["system"], d["tools"], d["hash"])
    if t == REQUEST_CONTEXT:
        return RouteRecord(d["provider"], d["model"], d["context_window"], d["reserved_output_tokens"])
    if t == COMPACTION_START:
        return CompactionStart(
            d["compaction_id"], d["strategy"], _opt(d, "kind", str) or "summary", _opt(d, "turn", int)
        )
    if t == COMPACTION_SUMMARY:
        strategy, kind = _opt(d, "strategy", str) or "", _opt(d, "kind", str) or "summary"
        return CompactionSummary(d["compaction_id"], strategy, kind, d["summary"], tuple(d["cites"]))
    if t == COMPACTION_END:
        return CompactionEnd(d["compaction_id"], _opt(d, "error", str))
    if t == COMPACTION_PRUNE:
        reason = _opt(d, "reason", str) or "prune"
        return CompactionPrune(
            d["target"], d["strategy"], reason, _opt(d, "chars_before", int), _opt(d, "chars_after", int)
        )
    if t == SURFACE_DROP:
        return SurfaceDrop(d["strategy"], _cites(event))
    if t == SESSION_STRATEGY:
        return StrategyToggle(d["strategy"], d["enabled"], d.get("by", "api"))
    if t == SESSION_TASK:
        todos = d.get("todos")
        return TaskRecord(_opt(d, "goal", str), tuple(todos) if isinstance(todos, list) else None, d["by"])
    strategy, _, kind = t.partition("/")
    return PluginRecord(strategy, kind, d)


def views(events: Iterable[Event], cls: type[V]) -> Iterator[tuple[Event, V]]:
    """Each event of ``events`` whose view is a ``cls``, with that view, in log order:
    ``for event, prune in views(session.events, CompactionPrune)``."""
    types = _TYPES_OF.get(cls)
    for event in events:
        if types is None or event.type in types:
            typed = view(event)
            if isinstance(typed, cls):
                yield event, typed


_ROLE_OF = {USER_MESSAGE: "user", ASSISTANT_MESSAGE: "assistant", TOOL_RESULT: "tool"}
#: the event types each kernel view comes from (PluginRecord: any other type)
_TYPES_OF: dict[type, frozenset[str]] = {
    TurnStart: frozenset({TURN_START}),
    TurnEnd: frozenset({TURN_END}),
    StepStart: frozenset({STEP_START}),
    StepEnd: frozenset({STEP_END}),
    MessageRecord: MESSAGE_TYPES,
    HeaderRecord: frozenset({REQUEST_HEADER}),
    RouteRecord: frozenset({REQUEST_CONTEXT}),
    CompactionStart: frozenset({COMPACTION_START}),
    CompactionSummary: frozenset({COMPACTION_SUMMARY}),
    CompactionEnd: frozenset({COMPACTION_END}),
    CompactionPrune: frozenset({COMPACTION_PRUNE}),
    SurfaceDrop: frozenset({SURFACE_DROP}),
    StrategyToggle: frozenset({SESSION_STRATEGY}),
    TaskRecord: frozenset({SESSION_TASK}),
}

__all__ = [
    "ASSISTANT_MESSAGE",
    "COMPACTION_END",
    "COMPACTION_PRUNE",
    "COMPACTION_START",
    "COMPACTION_SUMMARY",
    "KERNEL_TYPES",
    "MESSAGE_TYPES",
    "REQUEST_CONTEXT",
    "REQUEST_HEADER",
    "SESSION_STRATEGY",
    "SESSION_TASK",
    "STEP_END",
    "STEP_START",
    "SURFACE_DROP",
    "TOOL_RESULT",
    "TURN_END",
    "TURN_END_REASONS",
    "TURN_START",
    "USER_MESSAGE",
    "CompactionEnd",
    "CompactionPrune",
    "CompactionStart",
    "CompactionSummary",
    "Event",
    "EventSpec",
    "EventView",
    "HeaderRecord",
    "MessageRecord",
    "PluginRecord",
    "RouteRecord",
    "StepEnd",
    "StepStart",
    "StrategyToggle",
    "SurfaceDrop",
    "TaskRecord",
    "TurnEnd",
    "TurnStart",
    "append_op",
    "now_seconds",
    "original_seq",
    "random_bits",
    "random_hex",
    "replay_clock",
    "replaying",
    "utc_now",
    "view",
    "views",
]

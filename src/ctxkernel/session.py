"""The Session API that integrators call, once per model request.

::

    session.user("Fix the failing test")
    while True:
        request = session.prepare_request()      # pre_step hooks, header, decorations, pressure
        reply = my_model(request)                # the harness calls the model
        session.commit_reply(reply, usage=...)   # sanitize_reply hooks, then assistant/message
        if not session.wants_another_step: break
        for call in session.pending_calls:       # the batch's tool calls, in the model's order
            session.tool_result(call.id, session.run_tool(call) if session.owns_tool(call.name) else mine(call))
    session.end_turn()

Everything a session knows is derived from its log: opening it again (in this process or
another) replays the same surface, pressure anchor, open turn and strategy state.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from . import events as ev
from .compaction import CommitResult, Span, run_transaction
from .errors import (
    ConfigError,
    ConflictError,
    ContextOverflowError,
    CorruptionError,
    EventError,
    ModelError,
    RequestTooLargeError,
    StoreError,
    SurfaceError,
    ToolError,
)
from .events import Event, EventSpec, validate_shape
from .guard import excerpt_oversized, fit_composed, shrink_to_fit
from .instructions import PENDING_NAMESPACE, Instruction, Ledger, inheritance_batch, pending_of
from .lease import CompactionLease, host_id
from .logging import get_logger
from .messages import Message, Source, ToolCallBlock, ToolResultBlock
from .meter import (
    USAGE_SLACK_TOKENS,
    USAGE_TOLERANCE_FACTOR,
    Meter,
    Pressure,
    message_text_for_count,
    usage_in_band,
)
from .redact import redact
from .snapshot import LazyEvents, SnapshotIndex, SnapshotRejected, SnapshotWriter
from .snapshot import decode as decode_snapshot
from .snapshot import restore as restore_snapshot
from .store.base import deferred_sync
from .surface import Surface
from .text import storable
from .timeline import Timeline
from .tools import Tool, ToolOutcome, ToolRegistry, preview

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .controls import ManualOutcome
    from .kernel import Kernel
    from .profile import ModelSettings
    from .store.base import SessionHeader

log = get_logger("ctxkernel.session")

#: the appends at which a snapshot a compaction commit made due is written (Session._snapshot_after)
_BOUNDARIES = frozenset({ev.STEP_START, ev.STEP_END, ev.TURN_END})

#: the ``request/context`` key of a window given with the route (``set_route(..., context_window=)``)
ROUTE_WINDOW_KEY = "routed_window"

#: per class of a ``session.state`` entry: whether it is a SnapshotIndex with a ``sync()`` that
#: Session._sync_indexes calls. Decided once per class (the isinstance check of a runtime-checkable
#: Protocol costs ~10 us, twice a request): classes are the program's, shared by every session
_INDEX_CLASSES: dict[type, bool] = {}
_INDEX_CLASSES_MAX = 1024

#: message counts :meth:`Session.count_message` keeps until their message lands (texts are kept)
COUNTED_ENTRIES = 16


@dataclass(frozen=True)
class RequestHeader:
    """What every request carries before the surface: the composed system prompt, the tool
    schemas (strategies' and the harness's) and their token count."""

    system: str
    tools: list[dict[str, Any]]
    tokens: int


@dataclass
class StepContext:
    """The step about to start, handed to ``pre_step``."""

    turn: int
    step: int
    first_of_turn: bool
    attempt: int = 0
    reminders: list[tuple[str, str]] = field(default_factory=list)

    def remind(self, text: str, *, strategy: str) -> None:
        """Queue a notice for the model; it is written as a plugin message before the request."""
        self.reminders.append((strategy, text))


@dataclass
class Request:
    """A composed model request. ``messages[i]`` shows surface node ``seqs[i]``."""

    messages: list[Message]
    seqs: list[int]
    system: str
    tools: list[dict[str, Any]]
    turn: int
    step: int
    pressure: Pressure
    provider: str
    model: str
    decorated: dict[int, Message] = field(default_factory=dict)  # index -> undecorated original

    def decorate(self, index: int, message: Message) -> None:
        """Replace ``messages[index]`` for presentation only; tool ids and order must not change."""
        original = self.decorated.get(index, self.messages[index])
        if [c.id for c in message.tool_calls] != [c.id for c in original.tool_calls] or message.role != original.role:
            msg = f"a decoration of message {index} changed its role or tool calls"
            raise EventError(msg)
        if original.tool_result and (
            message.tool_result is None or message.tool_result.call_id != original.tool_result.call_id
        ):
            msg = f"a decoration of message {index} changed its tool result pairing"
            raise EventError(msg)
        self.decorated.setdefault(index, original)
        self.messages[index] = message

    @property
    def prompt_tokens(self) -> int:
        return self.pressure.tokens

    def to_openai(self) -> list[dict[str, Any]]:
        from .convert import to_openai_messages

        return to_openai_messages(self.messages, system=self.system)

    def to_anthropic(self) -> dict[str, Any]:
        from .convert import to_anthropic_request

        return to_anthropic_request(self.messages, system=self.system, tools=self.tools)


@dataclass
class ReplyDraft:
    """A model reply on its way to the log; ``sanitize_reply`` hooks may replace ``message``."""

    message: Message
    usage: dict[str, int] | None = None


def normalize_usage(usage: Any) -> dict[str, int] | None:
    """Provider usage as ``{input_tokens, output_tokens, cached_input_tokens}``.

    Accepts OpenAI (prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens) and
    Anthropic (input_tokens, output_tokens, cache_read/cache_creation_input_tokens) names.
    """
    if usage is None:
        return None
    if hasattr(usage, "model_dump"):
        usage = usage.model_dump()
    if not isinstance(usage, dict):
        msg = f"usage must be a mapping of token counts, got {type(usage).__name__}"
        raise EventError(msg)

    def num(*keys: str) -> int:
        for key in keys:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if value < 0:
                    msg = f"usage.{key} must be >= 0, got {value}"
                    raise EventError(msg)
                return value
        return 0

    cached = num("cached_input_tokens", "cache_read_input_tokens")
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        cached = details["cached_tokens"]
    if "prompt_tokens" in usage:
        input_tokens = num("prompt_tokens")
    else:  # Anthropic counts cache reads and writes apart from input_tokens
        input_tokens = num("input_tokens") + num("cache_read_input_tokens") + num("cache_creation_input_tokens")
    return {
        "input_tokens": input_tokens,
        "output_tokens": num("completion_tokens", "output_tokens"),
        "cached_input_tokens": cached,
    }


#: what Session.pressure() reads: its estimate, the header digest, the usage anchor, the window and
#: the output reservation
_PressureKey = tuple[int, str, tuple[int, int, str | None] | None, int, int]


class Session:
    """One agent session: its log, surface, meter and tools. Create it with ``Kernel.open_session``."""

    def __init__(self, kernel: Kernel, header: SessionHeader) -> None:
        self.kernel = kernel
        self.store = kernel.store
        self.header = header
        self.id = header.id
        #: the whole log in order; opened from a snapshot, a :class:`LazyEvents` that reads the
        #: events before the snapshot from the store on first use
        self.events: list[Event] | LazyEvents = []
        self.surface = Surface()
        self.meter = Meter(kernel.tokenizer)
        self.surface.listeners.append(self.meter)
        self.tools = ToolRegistry()
        self.harness_tools: list[dict[str, Any]] = []
        #: the harness's own system prompt; None means the profile's ``system_prompt``
        self.harness_system: str | None = None
        #: per-strategy state, keyed by strategy name; strategies rebuild it from the log
        self.state: dict[str, Any] = {}
        #: opened from a snapshot: the state each strategy put into it (``{"version", "data"}`` by
        #: name), until the strategy takes it with ``StrategyHandle.restored``
        self.snapshot_states: dict[str, dict[str, Any]] = {}
        #: likewise the session-wide indexes (:class:`ctxkernel.snapshot.SnapshotIndex`: the
        #: history index and the notes), by their ``state`` key, until each is first built
        self.snapshot_indexes: dict[str, Any] = {}
        # who runs a compaction (written in its start event): host id, pid and this Session object;
        # whether that holder is alive is the compaction lease's business (lease.py)
        self.holder: dict[str, Any] = {
            "host": host_id(kernel.profile.store),
            "pid": os.getpid(),
            "token": uuid.uuid4().hex,
        }
        self._lock = threading.RLock()
        # derived from the log by _track
        self.turn = 0
        self.turn_open = False
        self.step = 0
        self.step_open = False
        self.open_compaction: dict[str, Any] | None = None
        #: one row per compaction/summary event, in log order: what ``project`` lists (strategy,
        #: kind, tokens before and after, how many seqs it cites), not the event's whole data, so
        #: a snapshot and memory stay small however many compactions a session has had
        self.compaction_summaries: list[dict[str, Any]] = []
        self._instructions = Ledger()  # folded with each event (see _track and the instructions property)
        self._inheritance_checked = False  # a continuation's pending inheritance (instructions.py)
        self.header_hash: str | None = None
        self.route: dict[str, Any] | None = None  # last request/context data
        #: strategies a person disabled for this session (``session/strategy`` events)
        self.disabled_strategies: frozenset[str] = frozenset()
        self.strategy_toggles = 0  # how many such events: what depends on the set rebuilds when it moves
        #: the task state the harness set (``session/task``): ``goal`` and ``todos`` when set
        self.task: dict[str, Any] = {}
        self._anchor: tuple[int, int, str | None] | None = None  # (provider tokens, our estimate, header hash)
        self._implausible_usage_warned = False  # the out-of-band warning is logged once per Session
        #: counts of messages taken before they were appended (count_message), by the exact text
        #: counted: the node that lands with that text takes its count instead of counting again
        self._counted: dict[str, int] = {}
        #: events validated and folded but not yet written: a proxy's history, held by
        #: ``prepare_request(history=...)`` so that the strategies see it and it is written with
        #: the request's ``step/start`` (or with whatever the strategies append first), one write
        self._held: list[Event] = []
        #: True after a write of held events failed: this object is ahead of its log and must be
        #: reopened (every later append refuses)
        self.stale = False
        # this process's pending work (not durable by design: it lives within one step)
        self.conclude_turn = False
        self._deferred: list[tuple[str, str]] = []
        self._last_decoration_delta = 0
        #: the last pressure() answer and what it was computed from (its estimate, header digest,
        #: anchor and window): a request asks three to five times with nothing changed between
        self._pressure_memo: tuple[_PressureKey, Pressure] | None = None
        #: (log length, effective window) at which guard.excerpt_oversized last found no message
        #: over its bound: the surface is a fold of the log, so a second pass at the same length
        #: and window (basic's pre_step, then the kernel's own) would find none either
        self._oversized_clear_at: tuple[int, int] | None = None
        #: (the meter's large_changes, the cap) at which that pass found nothing, for a cap the
        #: meter's index of large nodes answers: the next request's first pass reads it
        self._oversized_large_clear_at: tuple[int, int] | None = None
        #: while a request is prepared (``_preparing``): the route and profile of the last
        #: model_settings() answer, and that answer; a request asks for it up to seven times
        self._settings_memo: tuple[dict[str, Any] | None, Any, ModelSettings] | None = None
        self._preparing = 0
        self._system_cache: tuple[int, str, list[dict[str, Any]], str, int] | None = None
        self._tools_generation = -1
        self._header_tools: list[dict[str, Any]] = []
        self._snapshots = SnapshotWriter()
        self._snapshot_at = 0  # events covered by the newest snapshot written or loaded
        self._snapshot_due = False  # a compaction committed since: snapshot at the next step boundary

    # -- log access -------------------------------------------------------------------------------
    @property
    def next_seq(self) -> int:
        return len(self.events)

    @property
    def instructions(self) -> list[Instruction]:
        """The user's instructions, oldest first: those inherited from the session this one
        continues, then its own (the ledger ``[instructions]`` protects, :mod:`ctxkernel.instructions`)."""
        return self._instructions.sync(self.id, self.events)

    @property
    def instruction_ledger(self) -> Ledger:
        """The ledger behind :attr:`instructions` (its counts and the last search answers)."""
        return self._instructions

    @property
    def instruction_costs(self) -> dict[tuple[str, int], int]:
        """Tokens of each instruction, by (session, seq), counted once per process."""
        return self._instructions.costs

    @property
    def instruction_texts(self) -> dict[int, tuple[Message, str]]:
        """Normalised texts of surface messages, by seq, for the search for lost instructions."""
        return self._instructions.normalized_texts

    def settings(self, strategy: str) -> BaseModel:
        """The validated settings of ``strategy`` for the currently routed model."""
        model = self.model_settings()
        return self.kernel.strategy_settings(strategy, model.provider, model.name)

    def model_settings(self) -> ModelSettings:
        """The routed model's settings: the profile's ``[model]`` with the matching per-model
        policy applied, and the window a route gave explicitly (``set_route(...,
        context_window=...)``, folded from the log, so a reopened session keeps it).

        While a request is prepared the answer is read once per route and profile object: the
        profile is reloaded before the strategies run (``refresh_profile``) and a route changes
        by an event, which folds a new ``route``; an edit in place applies from the next request."""
        route, profile = self.route, self.kernel.profile
        memo = self._settings_memo
        if memo is not None and memo[0] is route and memo[1] is profile:
            return memo[2]
        given = route or {}
        settings = profile.model_for(given.get("provider"), given.get("model"))
        window = given.get(ROUTE_WINDOW_KEY)
        if isinstance(window, int) and window != settings.context_window:
            settings = settings.with_window(window)
        if self._preparing:
            self._settings_memo = (route, profile, settings)
        return settings

    @property
    def lock(self) -> threading.RLock:
        """The session's re-entrant lock: hold it to make several calls one atomic unit within
        this process (every mutating call takes it too)."""
        return self._lock

    def refresh(self) -> int:
        """Fold events other writers appended since we last looked; returns how many.

        Events a deferred :meth:`prepare_request` folded and did not write yet (its request
        ended without a commit, a failure or an abandoned step that would write them) are
        written first: the log is compared with what it holds, never with what this object
        only holds in memory."""
        with self._lock:
            if self._held and not self.stale:
                self.append([], durable=False)
            behind = self.store.next_seq(self.id) - len(self.events)
            if behind <= 0:
                return 0
            new = list(self.store.read(self.id, len(self.events)))
            for event in new:
                self._fold(event)
            return len(new)

    def _fold(self, event: Event, message: Message | None = None, *, checked: bool = False) -> None:
        if event.seq != len(self.events):
            msg = f"session {self.id}: event seq {event.seq} does not follow {len(self.events) - 1}"
            raise CorruptionError(msg)
        if event.type not in ev.KERNEL_TYPES and not event.ignorable:
            msg = f"session {self.id}: event {event.seq} has unknown type {event.type!r} and is not ignorable"
            raise CorruptionError(msg)
        try:
            self.surface.apply(event, message, checked=checked)
        except (SurfaceError, EventError) as exc:
            msg = f"session {self.id}: event {event.seq} ({event.type}) cannot be replayed: {exc}"
            raise CorruptionError(msg) from None
        self.events.append(event)
        self._track(event, live=checked)

    def _track(self, event: Event, *, live: bool = False) -> None:
        t, d = event.type, event.data
        if self._instructions.cursor == event.seq:
            self._instructions.fold(self.id, event, live=live)
        if t == ev.TURN_START:
            self.turn, self.turn_open, self.step = d["turn"], True, 0
        elif t == ev.TURN_END:
            self.turn_open = False
            self.step_open = False
            self.conclude_turn = False
        elif t == ev.STEP_START:
            self.step, self.step_open = d["step"], True
        elif t == ev.STEP_END:
            self.step_open = False
        elif t == ev.COMPACTION_START:
            self.open_compaction = {**d, "seq": event.seq}
        elif t == ev.COMPACTION_SUMMARY:
            self.compaction_summaries.append(
                {
                    "strategy": d.get("strategy"),
                    "kind": d.get("kind"),
                    "tokens_before": d.get("tokens_before"),
                    "tokens_after": d.get("tokens_after"),
                    "cites": len(d.get("cites") or ()),
                }
            )
        elif t == ev.COMPACTION_END:
            if self.open_compaction and self.open_compaction["compaction_id"] == d["compaction_id"]:
                self.open_compaction = None
        elif t == ev.REQUEST_HEADER:
            self.header_hash = d["hash"]
            self._header_tools = d["tools"]
        elif t == ev.REQUEST_CONTEXT:
            self.route = d
        elif t == ev.SESSION_STRATEGY:
            name = d["strategy"]
            off = self.disabled_strategies
            self.disabled_strategies = off - {name} if d["enabled"] else off | {name}
            self.strategy_toggles += 1
        elif t == ev.SESSION_TASK:
            self.task = {**self.task, **{k: d[k] for k in ("goal", "todos") if k in d}}
        elif t == ev.ASSISTANT_MESSAGE:
            self._last_decoration_delta = d.get("decoration_tokens", 0)
            usage = d.get("usage")
            estimate = d.get("estimate")
            if usage and isinstance(estimate, int) and d.get("tokenizer") == self.meter.tokenizer.name:
                tokens = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
                self._anchor = (tokens, estimate, self.header_hash)

    # -- appending ----------------------------------------------------------------------------------
    def append(
        self, batch: Sequence[EventSpec], *, durable: bool = True, _parsed: dict[int, Message] | None = None
    ) -> int:
        """Validate and durably append a batch (all or nothing); returns the first seq.

        Every event is checked against the surface before anything is written, so a refused
        batch leaves the log byte-identical. ``durable=False`` does not wait for the disk
        (:func:`ctxkernel.store.base.deferred_sync`): for a write whose loss in a power cut loses
        nothing acknowledged, such as a compaction's lock, which the commit's sync makes durable.
        ``_parsed`` is the kernel's own (compaction.py): by index in ``batch``, a message whose
        ``to_dict()`` that entry's ``data["message"]`` is, so the surface check need not parse it.
        """
        with self._lock:
            built, messages = self._checked(batch, _parsed)
            held, start = self._held, (self._held[0].seq if self._held else len(self.events))
            try:
                with contextlib.nullcontext() if durable else deferred_sync(self.store):
                    self.store.append(self.id, [*held, *built] if held else built, start)
            except BaseException:
                if held:
                    self.stale = True  # the held events are folded here and not in the log
                raise
            self._held = []
            for event in built:
                self._fold(event, messages.get(event.seq), checked=True)
            if self._counted:
                self._take_counts(built)
            self._snapshot_after([*held, *built] if held else built)
            return built[0].seq if built else len(self.events)

    def _checked(
        self, batch: Sequence[EventSpec], parsed: dict[int, Message] | None = None
    ) -> tuple[list[Event], dict[int, Message | None]]:
        """The batch as events after the log's (held events included), each checked against the
        surface; raises with nothing changed when one is refused."""
        if self.stale:
            msg = f"session {self.id}: a write failed after its events were folded; reopen the session"
            raise StoreError(msg)
        with self._lock:
            start = len(self.events)
            time = ev.utc_now()
            built = [Event(start + i, s.type, s.data, time, s.surface, s.ignorable) for i, s in enumerate(batch)]
            for i, event in enumerate(built):
                validate_shape(event)
                try:
                    orjson.dumps(event.data)
                except TypeError as exc:
                    # the one place every text enters the log: a lone surrogate (a non-UTF-8 file
                    # name, a "\ud800" escape from a server) becomes U+FFFD instead of failing the turn
                    cleaned = storable(event.data)
                    try:
                        orjson.dumps(cleaned)
                    except TypeError:
                        msg = f"{event.type} event data is not JSON-serialisable: {exc}"
                        raise EventError(msg) from None
                    built[i] = event = Event(event.seq, event.type, cleaned, event.time, event.surface, event.ignorable)
            surface_events = [e for e in built if e.type in ev.MESSAGE_TYPES or e.type == ev.SURFACE_DROP]
            messages: dict[int, Message | None] = {}
            known: dict[int, Message] = {}
            for i, message in (parsed or {}).items():
                if built[i].data is batch[i].data:  # not cleaned by storable(): the dict is the message's
                    known[start + i] = message
            if len(surface_events) <= 1:
                probe = self.surface
                saved = probe.applied
                probe.applied = start
                try:
                    for event in built:
                        # the surface_events test by type: `in` would compare events field by field
                        if event.type in ev.MESSAGE_TYPES or event.type == ev.SURFACE_DROP:
                            probe.applied = event.seq
                            messages[event.seq] = probe.check(event, known.get(event.seq))
                finally:
                    probe.applied = saved
            else:
                probe = _clone_surface(self.surface)
                for event in built:
                    messages[event.seq] = probe.check(event, known.get(event.seq))
                    probe.apply(event, messages[event.seq], checked=True)
            return built, messages

    def _hold(self, batch: Sequence[EventSpec]) -> None:
        """Check and fold ``batch`` without writing it: the next append writes it first, in the
        same store write (``prepare_request(history=...)``). Refused with nothing changed, as
        an append is."""
        built, messages = self._checked(batch)
        for event in built:
            self._fold(event, messages.get(event.seq), checked=True)
        if self._counted:
            self._take_counts(built)
        self._held.extend(built)

    def count_message(self, message: Message) -> int:
        """Tokens of ``message`` (as ``session.meter.count_message`` counts them), kept until a
        message with the same text lands on the surface, whose node then takes the count: a
        message counted before it is appended (a reply's estimate, a front door's ledger) is
        tokenised once. Kept per session, as a count holds for its exact text only."""
        text = message_text_for_count(message)
        tokens = self._counted.get(text)
        if tokens is None:
            tokens = self.meter.count_message(message)
            if len(self._counted) >= COUNTED_ENTRIES:
                self._counted.clear()  # bounded: counts nobody appended are only dropped
            self._counted[text] = tokens
        return tokens

    def _take_counts(self, built: Sequence[Event]) -> None:
        """Give each message node of ``built`` the count taken of its exact text before it landed."""
        for event in built:
            if event.type in ev.MESSAGE_TYPES:
                node = self.surface.node(event.seq)
                if node is not None and node.tokens is None:
                    tokens = self._counted.pop(message_text_for_count(node.message), None)
                    if tokens is not None:
                        node.tokens = tokens  # the meter's total takes it as if it had counted

    def _snapshot_after(self, built: Sequence[Event]) -> None:
        """Write a snapshot every ``[store] snapshot_every`` events, and after a compaction commit
        at the next step boundary (``step/start``, ``step/end`` or ``turn/end``, or the return of
        ``request_failed``): not inside the commit, whose cost is one durable
        write, and once for several commits of one step. The snapshot is a cache: a crash before
        it is written costs a longer replay, never an event."""
        every = self.kernel.profile.store.snapshot_every
        if not every:
            return
        types = {e.type for e in built}
        if ev.COMPACTION_END in types:
            self._snapshot_due = True
        if len(self.events) - self._snapshot_at >= every or (self._snapshot_due and not types.isdisjoint(_BOUNDARIES)):
            self.write_snapshot()
        elif ev.STEP_END in types or ev.TURN_END in types:
            self._sync_indexes()

    def _sync_indexes(self) -> None:
        """Fold the snapshot's indexes (the timeline, and recall's history index once in use) up
        to the end of a step, a few events each time, so that the snapshot a compaction commit
        calls for folds only the events of its own step, not all since the last snapshot; and
        serialise the step's nodes for it."""
        self._snapshots.warm(self)
        Timeline.for_session(self)
        strategies = self.kernel.strategies
        for key, value in self.state.items():
            if key not in strategies and _syncs_as_index(value):
                value.sync()

    def write_snapshot(self) -> None:
        """Write a snapshot of the folded state now (the session does so at each compaction
        commit and every ``[store] snapshot_every`` events, after the batch is durable). A failed
        write is logged and only makes the next open replay more."""
        with self._lock:
            if not self.events:
                return
            if self._held:  # a snapshot never covers events the log does not hold yet
                self._snapshot_due = True
                return
            Timeline.for_session(self)  # the inspector's timeline rides in every snapshot (timeline.py)
            self._snapshot_at = len(self.events)
            self._snapshot_due = False
            try:
                self.store.snapshot_put(self.id, len(self.events), self._snapshots.encode(self))
            except (StoreError, OSError) as exc:
                log.warning("snapshot not written", session=self.id, seq=len(self.events), error=str(exc))

    def _read_before_snapshot(self, start: int, end: int) -> list[Event]:
        return list(self.store.read(self.id, start, end))

    def open_from_snapshot(self, covers: int, payload: bytes) -> bool:
        """Install a stored snapshot of the first ``covers`` events into this fresh session
        (see :mod:`ctxkernel.snapshot`); False, with a warning naming the reason, when it cannot
        be trusted, and the session is untouched for a full replay."""
        try:
            body = decode_snapshot(payload, self.id, covers, self.store.next_seq(self.id))
            last = next(iter(self.store.read(self.id, covers - 1, covers)), None)
            restore_snapshot(self, body, last, self._read_before_snapshot)
        except SnapshotRejected as exc:
            log.warning("snapshot set aside; replaying the whole log", session=self.id, reason=str(exc))
            return False
        self._snapshot_at = covers
        return True

    def append_one(self, type: str, data: dict[str, Any], surface: dict[str, Any] | None = None) -> int:
        return self.append([EventSpec(type, data, surface)])

    def emit(self, strategy: str, kind: str, data: dict[str, Any]) -> int:
        """Append an ignorable plugin event ``<strategy>/<kind>``."""
        return self.append([EventSpec(f"{strategy}/{kind}", data, ignorable=True)])

    def add_message(self, message: Message, *, event_type: str = ev.USER_MESSAGE) -> int:
        """Append a surface message (e.g. a plugin notice) and return its seq."""
        return self.append_one(event_type, {"message": message.to_dict()}, ev.append_op())

    # -- turns ---------------------------------------------------------------------------------------
    def user(self, text: str | Message) -> int:
        """Append the user's message, opening a turn if none is open. Returns its seq."""
        message = text if isinstance(text, Message) else Message.user(text)
        if message.role != "user":
            msg = f"user() takes a user message, got role {message.role!r}"
            raise EventError(msg)
        batch = []
        if not self.turn_open:
            batch.append(EventSpec(ev.TURN_START, {"turn": self.turn + 1}))
        batch.append(EventSpec(ev.USER_MESSAGE, {"message": message.to_dict()}, ev.append_op()))
        return self.append(batch) + len(batch) - 1

    def end_turn(self, reason: str = "completed") -> None:
        """Close the turn. Calls still waiting get error results first, so pairing holds."""
        if reason not in ev.TURN_END_REASONS:
            msg = f"turn end reason must be one of {list(ev.TURN_END_REASONS)}, got {reason!r}"
            raise EventError(msg)
        if not self.turn_open:
            return
        batch = self._closers(reason, f"the turn ended ({reason}) before this call had a result")
        batch.append(EventSpec(ev.TURN_END, {"turn": self.turn, "reason": reason}))
        self.append(batch)
        self.conclude_turn = False

    def _closers(self, reason: str, result_text: str) -> list[EventSpec]:
        batch = [
            EventSpec(
                ev.TOOL_RESULT,
                {"message": Message.tool(call_id, result_text, is_error=True).to_dict(), "synthetic": True},
                ev.append_op(),
            )
            for call_id in list(self.surface.pending_calls)
        ]
        if self.step_open:
            batch.append(EventSpec(ev.STEP_END, {"turn": self.turn, "step": self.step, "reason": reason}))
        return batch

    def abandon_step(self, reason: str = "interrupted") -> None:
        """Close the open step without ending the turn: calls still waiting get error results,
        then ``step/end {reason}``. For a harness whose step was cut short (a client that went
        away mid-reply): the turn stays open, so the next ``prepare_request`` continues it."""
        with self._lock:
            batch = self._closers(reason, f"the step was abandoned ({reason}) before this call had a result")
            if batch:
                self.append(batch)

    def append_history(self, messages: Sequence[Message], *, trailer: Sequence[EventSpec] = ()) -> list[int]:
        """Append messages the harness already holds (e.g. the history a proxy's client sent), in
        one durable batch, and return the seq of each message.

        Assistant messages are written as they are (no model call, no ``sanitize_reply``); a user
        message after a final reply (one with no tool calls) closes that turn and opens the next;
        a tool result that answers the last waiting call closes its step. Pairing is checked as
        for any append: a result for an unknown call, or a user message while calls wait, is
        refused with nothing written. ``trailer`` events (e.g. a front door's bookkeeping) end the
        same batch, so they are durable exactly when the messages are.
        """
        with self._lock:
            batch, seqs = self._history_batch(messages, trailer)
            if batch:
                self.append(batch)
            return seqs

    def _history_batch(
        self, messages: Sequence[Message], trailer: Sequence[EventSpec]
    ) -> tuple[list[EventSpec], list[int]]:
        """:meth:`append_history`'s batch (turn and step events around the messages, then
        ``trailer``) and the seq each message will have, written after the log as it is now."""
        with self._lock:
            batch: list[EventSpec] = []
            seqs: list[int] = []
            start = len(self.events)
            turn, turn_open, step_open = self.turn, self.turn_open, self.step_open
            waiting = set(self.surface.pending_calls)
            last = self.surface.nodes[-1] if self.surface.nodes else None
            replied = last is not None and last.role == "assistant" and not last.message.tool_calls
            for message in messages:
                if message.role == "user" and turn_open and replied and not waiting:
                    batch.append(EventSpec(ev.TURN_END, {"turn": turn, "reason": "completed"}))
                    turn_open = step_open = False
                if not turn_open:
                    turn += 1
                    turn_open = True
                    batch.append(EventSpec(ev.TURN_START, {"turn": turn}))
                if message.role == "tool":
                    call_id = message.content[0].call_id  # type: ignore[union-attr]
                    seqs.append(start + len(batch))
                    batch.append(EventSpec(ev.TOOL_RESULT, {"message": message.to_dict()}, ev.append_op()))
                    waiting.discard(call_id)
                    if not waiting and step_open:
                        batch.append(EventSpec(ev.STEP_END, {"turn": turn, "step": self.step}))
                        step_open = False
                    replied = False
                    continue
                event_type = ev.USER_MESSAGE if message.role == "user" else ev.ASSISTANT_MESSAGE
                if event_type == ev.ASSISTANT_MESSAGE and step_open and not waiting:
                    batch.append(EventSpec(ev.STEP_END, {"turn": turn, "step": self.step, "reason": "abandoned"}))
                    step_open = False
                seqs.append(start + len(batch))
                batch.append(EventSpec(event_type, {"message": message.to_dict()}, ev.append_op()))
                if message.role == "assistant":
                    waiting = {c.id for c in message.tool_calls}
                    replied = not waiting
                else:
                    replied = False
            batch.extend(trailer)
            return batch, seqs

    @property
    def pending_calls(self) -> list[ToolCallBlock]:
        """Tool calls of the last reply still waiting for a result, in the model's order."""
        pending = self.surface.pending_calls
        if not pending:
            return []
        node = self.surface.node(next(iter(pending.values())))
        return [c for c in node.message.tool_calls if c.id in pending] if node else []

    @property
    def wants_another_step(self) -> bool:
        """True when the last step ended with tool results the model has not seen yet."""
        if not self.turn_open or self.conclude_turn or self.surface.pending_calls:
            return False
        last = self.surface.nodes[-1] if self.surface.nodes else None
        return last is not None and last.role == "tool"

    # -- tools ---------------------------------------------------------------------------------------
    def _sync_tools(self) -> None:
        generation = self.strategies_generation
        if generation == self._tools_generation:
            return
        registry = ToolRegistry()
        manager = self.kernel.plugins

        def register(tool: Tool) -> None:
            if not isinstance(tool, Tool):
                msg = f"register_tools must register ctxkernel.Tool objects, got {type(tool).__name__}"
                raise ToolError(msg)
            spec = manager.specs.get(tool.strategy)
            if spec is not None and not tool.distribution:
                tool.distribution = spec.distribution
            registry.add(tool)

        self.kernel.hooks.register_tools(self, register)
        self.tools = registry
        self._tools_generation = generation
        self._system_cache = None

    def owns_tool(self, name: str) -> bool:
        self._sync_tools()
        return name in self.tools

    def run_tool(self, call: ToolCallBlock | dict[str, Any]) -> ToolOutcome:
        """Run a kernel tool. Bad arguments give an error outcome; nothing is written for them."""
        self._sync_tools()
        if isinstance(call, dict):
            call_id, name = call.get("id"), call.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                return ToolOutcome(
                    f"a tool call needs a string 'id' and 'name', got keys {preview(sorted(map(str, call))[:10], 200)}",
                    is_error=True,
                )
            call = ToolCallBlock(call_id, name, call.get("arguments") or {})
        # a tool that compacted (decay's compress) leaves its snapshot to the step's end, which the
        # call's result closes: as for every commit, the snapshot is not the compaction's cost
        return self.tools.run(self, call)

    def _snapshot_if_due(self) -> None:
        with self._lock:
            if self._snapshot_due:
                self.write_snapshot()

    def tool_result(self, call_id: str, result: str | ToolOutcome, *, is_error: bool = False) -> int:
        """Commit the result of one pending call (in the model's order). Returns its seq."""
        outcome = result if isinstance(result, ToolOutcome) else ToolOutcome(str(result), is_error=is_error)
        pending = self.surface.pending_calls
        if call_id not in pending:
            msg = f"no pending tool call {call_id!r}; pending: {list(pending)}"
            raise EventError(msg)
        name = next((c.name for c in self.pending_calls if c.id == call_id), None)
        message = Message.tool(call_id, outcome.content, is_error=outcome.is_error, name=name)
        batch = [EventSpec(ev.TOOL_RESULT, {"message": message.to_dict()}, ev.append_op())]
        if len(pending) == 1 and self.step_open:
            batch.append(EventSpec(ev.STEP_END, {"turn": self.turn, "step": self.step}))
        seq = self.append(batch)
        if outcome.conclude_turn:
            self.conclude_turn = True
        if outcome.defer_message:
            owner = self.tools.get(name or "")
            self._deferred.append((owner.strategy if owner else "kernel", outcome.defer_message))
        return seq

    # -- requests ------------------------------------------------------------------------------------
    def _system_and_tools(self) -> tuple[str, list[dict[str, Any]], str, int]:
        """The composed system prompt, tool schemas, their hash and token count (cached)."""
        self._sync_tools()
        key = hash((self._tools_generation, len(self.harness_tools), id(self.harness_tools), self.harness_system))
        if self._system_cache is None or self._system_cache[0] != key:
            own = self.kernel.profile.profile.system_prompt if self.harness_system is None else self.harness_system
            sections = [own, *self.kernel.hooks.system_prompt(self)]
            system = "\n\n".join(s.strip() for s in sections if s and s.strip())
            tools = self.tools.schemas() + list(self.harness_tools)
            digest = hashlib.sha256(orjson.dumps([system, tools], option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]
            self._system_cache = (key, system, tools, digest, self.meter.count_header(system, tools))
        _, system, tools, digest, tokens = self._system_cache
        return system, tools, digest, tokens

    def request_header(self) -> RequestHeader:
        """The system prompt and tool schemas every request carries, and their token count."""
        system, tools, _, tokens = self._system_and_tools()
        return RequestHeader(system, tools, tokens)

    def invalidate_header(self) -> None:
        """Call when a strategy's system prompt section changed."""
        self._system_cache = None

    def restore_harness_tools(self) -> None:
        """On resume, the harness's tools are those of the last recorded header that no
        strategy owns, so a reopened session composes the same request as before."""
        self._sync_tools()
        own = set(self.tools.names())
        self.harness_tools = [t for t in self._header_tools if t.get("function", {}).get("name") not in own]
        self._system_cache = None

    def set_harness_tools(self, schemas: list[dict[str, Any]]) -> None:
        """The harness's own tool schemas: sent with every request and counted by the meter."""
        self.harness_tools = storable(list(schemas))
        self._system_cache = None

    def set_harness_system(self, system: str | None) -> None:
        """The harness's own system prompt, used instead of the profile's ``system_prompt``
        (strategies still add their sections after it). None restores the profile's. A proxy
        sets the prompt its client sent, before each ``prepare_request``."""
        if system != self.harness_system:
            self.harness_system = system
            self._system_cache = None

    def pressure(self) -> Pressure:
        """How full the next request is, anchored on the provider's last usage figure when that
        figure is plausible (:func:`ctxkernel.meter.usage_in_band`), else the meter's own count."""
        model = self.model_settings()
        _, _, digest, header_tokens = self._system_and_tools()
        estimate = header_tokens + self.meter.surface_tokens() + self._last_decoration_delta
        # everything the answer reads (the effective window is context_window - reserved)
        key = (estimate, digest, self._anchor, model.context_window, model.reserved_output_tokens)
        memo = self._pressure_memo
        if memo is not None and memo[0] == key:
            return memo[1]
        anchored = False
        tokens = estimate
        if self._anchor is not None and self._anchor[2] == digest:
            reported, counted, _ = self._anchor
            if usage_in_band(reported, counted):
                tokens = max(0, reported + estimate - counted)
                anchored = True
            elif not self._implausible_usage_warned:
                self._implausible_usage_warned = True
                log.warning(
                    "provider usage outside the plausible band: pressure uses the meter's count",
                    session=self.id,
                    reported_tokens=reported,
                    counted_tokens=counted,
                    tolerance_factor=USAGE_TOLERANCE_FACTOR,
                    slack_tokens=USAGE_SLACK_TOKENS,
                )
        window, reserved = model.context_window, model.reserved_output_tokens
        pressure = Pressure(tokens, model.effective_window, window, reserved, anchored)
        self._pressure_memo = (key, pressure)
        return pressure

    def set_route(self, provider: str, model: str, context_window: int | None = None) -> None:
        """Route the next requests to another model (per-model policies apply from then on).

        ``context_window`` is the routed model's total window when the profile does not know it:
        pressure, every strategy threshold and the instruction budget follow it from the next
        request on (the output reservation shrinks to an eighth of a window it would take half
        of). It is recorded in the log, so a reopened session keeps it."""
        settings = self.kernel.profile.model_for(provider, model)
        if context_window is not None:
            try:
                settings = settings.with_window(context_window)
            except ConfigError as exc:
                msg = f"set_route({provider!r}, {model!r}): {exc}; nothing was recorded"
                raise ConfigError(msg) from None
        self._write_route(settings, pinned=context_window is not None)

    def _write_route(self, settings: ModelSettings, *, pinned: bool = False) -> None:
        data: dict[str, Any] = {
            "provider": settings.provider,
            "model": settings.name,
            "context_window": settings.context_window,
            "reserved_output_tokens": settings.reserved_output_tokens,
        }
        if pinned:  # the window came with the route, not from the profile: it outlives profile edits
            data[ROUTE_WINDOW_KEY] = settings.context_window
        if self.route != data:
            self.append_one(ev.REQUEST_CONTEXT, data)

    def prepare_request(
        self,
        *,
        attempt: int = 0,
        allow_overflow: bool = False,
        history: Sequence[Message] = (),
        trailer: Sequence[EventSpec] = (),
        defer_write: bool = False,
    ) -> Request:
        """Run the strategies and compose the next request from the surface.

        With ``[profile] guard_request``, a composed request over the effective window is
        compacted once through the profile's overflow path; if it still does not fit,
        :class:`ctxkernel.RequestTooLargeError` is raised and the guard has written nothing
        (guard.py). ``allow_overflow`` returns it
        instead: ``ctxkernel simulate``'s open loop, which counts it as an overflow.

        ``history`` (and ``trailer``) are :meth:`append_history`'s arguments: messages the harness
        holds that the log does not (a proxy's client's new messages). They are checked and put
        on the surface first, so the strategies see them, and written in the same store write as
        the request's ``step/start`` (or as the first event a strategy appends before it): one
        write, not two. A history that does not pair up is refused with nothing written; a
        request stopped by an error after them still writes them, as :meth:`append_history`
        would have.

        ``step/start`` is not synced on its own: the reply's commit (or the ``step/end`` of
        :meth:`request_failed` or :meth:`abandon_step`) syncs it with everything before it, and a
        power cut before that loses only a request nobody was answered for.

        ``defer_write`` goes one step further: the request's events (``history``, ``trailer``,
        ``step/start``) are checked and folded but not written; the next write carries them
        first, in the same store write: the reply's :meth:`commit_reply`, or the ``step/end`` of
        :meth:`request_failed` or :meth:`abandon_step` (and :meth:`refresh` writes them before it
        looks at the log). A request is then one store write, not two (``ctxkernel serve``: the
        request's whole cost is the point, ``bench_serve.py``). A crash before that write loses
        the same as without it, a request nobody was answered for; the difference is that
        readers in other processes see the request only once its reply is committed. Events a
        strategy writes in ``pre_step`` (a compaction) still write the held ones before them."""
        with self._lock:
            self.refresh()
            self.kernel.refresh_profile()  # edited settings apply from this step on
            if history or trailer:
                batch, _ = self._history_batch(history, trailer)
                if batch:
                    self._hold(batch)
            self._preparing += 1
            try:
                request = self._prepare_step(attempt, allow_overflow, defer_write)
            except BaseException:
                if self._held and not self.stale:  # stopped before its step/start
                    self.append([], durable=False)
                raise
            finally:
                self._preparing -= 1
                if not self._preparing:
                    self._settings_memo = None
            return request

    def _prepare_step(self, attempt: int, allow_overflow: bool, defer_write: bool = False) -> Request:
        with self._lock:  # re-entrant: prepare_request holds it already
            if not self.turn_open:
                msg = "no open turn: call session.user(...) before prepare_request()"
                raise EventError(msg)
            if self.surface.pending_calls:
                msg = f"tool calls {list(self.surface.pending_calls)} wait for results: commit them before the next request"
                raise EventError(msg)
            if self.step_open:  # a request that failed without request_failed(): close its step
                self.append_one(ev.STEP_END, {"turn": self.turn, "step": self.step, "reason": "abandoned"})
            self._flush_deferred()
            if not self._inheritance_checked:
                self._write_inheritance()
            step = StepContext(self.turn, self.step + 1, self.step == 0, attempt)
            self.kernel.hooks.pre_step(self, step)
            for strategy, text in step.reminders:
                self._deferred.append((strategy, text))
            self._flush_deferred()
            excerpt_oversized(self)  # the kernel's bound: no message over half the window (guard.py)
            request, header_tokens, digest = self._compose(step.step)
            tokens = header_tokens + self.meter.surface_tokens() + self._last_decoration_delta
            window = self.model_settings().effective_window
            if tokens > window and self.kernel.profile.profile.guard_request and self.enabled_strategies():
                # the composed request (reminders, anchors, tools included) would overflow: the
                # profile's overflow path compacts once, then it is composed again (guard.py);
                # also when what it committed did not shrink the surface (a longer summary):
                # the request must show the surface as it is now
                logged = len(self.events)
                if fit_composed(self, tokens, window) or len(self.events) != logged:
                    request, header_tokens, digest = self._compose(step.step)
                    tokens = header_tokens + self.meter.surface_tokens() + self._last_decoration_delta
                if tokens > window and not allow_overflow:
                    msg = (
                        f"the composed request has {tokens} tokens, over the effective window of {window} "
                        f"(context_window - reserved_output_tokens) even after compaction; nothing was sent. "
                        "Shorten the system prompt or tool schemas, or use a model with a larger window"
                    )
                    raise RequestTooLargeError(msg, prompt_tokens=tokens, limit=window)
            batch = []
            if digest != self.header_hash:
                header = {"system": request.system, "tools": request.tools, "hash": digest}
                batch.append(EventSpec(ev.REQUEST_HEADER, header))
            if self.route is None:
                self._write_route(self.model_settings())
            batch.append(EventSpec(ev.STEP_START, {"turn": self.turn, "step": step.step}))
            if defer_write:
                self._hold(batch)  # written first by the next append (prepare_request's docstring)
            else:
                self.append(batch, durable=False)
            request.provider = self.route["provider"] if self.route else ""
            request.model = self.route["model"] if self.route else ""
            request.pressure = self.pressure()
            self._request_estimate = tokens
            return request

    def _compose(self, step: int) -> tuple[Request, int, str]:
        """The request the surface gives now, decorated by the strategies (nothing written), and
        its header's token count and hash."""
        system, tools, digest, header_tokens = self._system_and_tools()
        nodes = self.surface.nodes
        request = Request(
            # copies of lists the surface keeps between requests (Surface._views)
            messages=self.surface.messages(),
            seqs=self.surface.seqs(),
            system=system,
            tools=tools,
            turn=self.turn,
            step=step,
            pressure=self.pressure(),  # replaced once decorations are known
            provider=self.route["provider"] if self.route else "",
            model=self.route["model"] if self.route else "",
        )
        self.kernel.hooks.decorate_request(self, request)
        delta = 0
        for index in request.decorated:
            node = nodes[index]
            delta += self.meter.decorated_tokens(node.seq, request.messages[index]) - self.meter.node_tokens(node)
        self._last_decoration_delta = delta
        return request, header_tokens, digest

    def _write_inheritance(self) -> None:
        """A continuation's first request: record the instructions it inherited (kept in the
        store by ``open_session(..., instructions_from=...)``), after its seed and before any
        strategy acts. Checked once per Session object."""
        self._inheritance_checked = True
        raw = self.store.kv_get(PENDING_NAMESPACE, self.id)
        if raw is None:
            return
        pending = pending_of(raw)
        if pending:
            self.append(inheritance_batch(self, pending))
        # after the append: a crash in between writes it again, and the ledger keeps the last
        self.store.kv_delete(PENDING_NAMESPACE, self.id)

    def _flush_deferred(self) -> None:
        if not self._deferred:
            return
        batch = [
            EventSpec(
                ev.USER_MESSAGE,
                {"message": Message.user(text, Source.plugin_form(strategy, "notice")).to_dict()},
                ev.append_op(),
            )
            for strategy, text in self._deferred
        ]
        self._deferred = []
        self.append(batch)

    def commit_reply(
        self, reply: Message | dict[str, Any] | Any, usage: Any = None, *, trailer: Sequence[EventSpec] = ()
    ) -> Message:
        """Commit the model's reply (after ``sanitize_reply``). Returns the committed message.

        ``trailer`` events (a front door's bookkeeping) end the same durable batch."""
        from .convert import reply_to_message

        with self._lock:
            # untrusted text: lone surrogates become U+FFFD before hooks, the meter or the log see it
            message, stored = _storable_message(reply_to_message(reply))
            if usage is None:
                usage = getattr(reply, "usage", None)
            if message.role != "assistant":
                msg = f"commit_reply takes an assistant message, got role {message.role!r}"
                raise EventError(msg)
            if not self.step_open:
                msg = "no open step: call prepare_request() before commit_reply()"
                raise EventError(msg)
            draft = ReplyDraft(message, normalize_usage(usage))
            self.kernel.hooks.sanitize_reply(self, draft)
            if [c.id for c in draft.message.tool_calls] != [c.id for c in message.tool_calls]:
                msg = "a sanitize_reply hook changed the reply's tool calls; only text may be cleaned"
                raise EventError(msg)
            # the dict _storable_message built, unless a hook replaced the message
            data: dict[str, Any] = {"message": stored if draft.message is message else draft.message.to_dict()}
            if draft.usage:
                data["usage"] = draft.usage
                data["estimate"] = getattr(self, "_request_estimate", 0) + self.count_message(draft.message)
                data["tokenizer"] = self.meter.tokenizer.name
            if self._last_decoration_delta:
                # recorded so that a reopened session prices decorations like the live one
                data["decoration_tokens"] = self._last_decoration_delta
            batch = [EventSpec(ev.ASSISTANT_MESSAGE, data, ev.append_op())]
            if not draft.message.tool_calls:
                batch.append(EventSpec(ev.STEP_END, {"turn": self.turn, "step": self.step}))
            batch.extend(trailer)
            self.append(batch)
            return draft.message

    def request_failed(self, error: ModelError) -> bool:
        """Report a provider error for the prepared request; True means "retry now".

        Runs the ``request_error`` hooks (e.g. compact on context overflow). The step is closed;
        the next ``prepare_request`` starts a new one.
        """
        with self._lock:
            if self.step_open:
                # the log is permanent: a provider error that echoes a key must not reach it
                text = redact(f"{type(error).__name__}: {error}"[:4000])[:2000]
                self.append_one(ev.STEP_END, {"turn": self.turn, "step": self.step, "error": text})
            decision = self.kernel.hooks.request_error(self, error)
            if not decision and isinstance(error, ContextOverflowError) and self.enabled_strategies():
                # no strategy could shrink the surface: the kernel's fallback excerpts the largest
                # messages (guard.py); a retry is worth it only when that saved something
                decision = self._shrink_after_overflow(error)
            self._snapshot_if_due()  # the step is closed: the boundary an overflow's compaction waits for
            return bool(decision)

    def _shrink_after_overflow(self, error: ContextOverflowError) -> bool:
        pressure = self.pressure()
        limit = error.limit if error.limit and error.limit > 0 else None
        excess = pressure.tokens - min(pressure.effective_window, limit or pressure.effective_window)
        if error.prompt_tokens and limit:
            excess = max(excess, error.prompt_tokens - limit)  # the provider's own count of the excess
        return shrink_to_fit(self, max(excess, 1), limit=limit) is not None

    # -- task state (task.py) --------------------------------------------------------------------------
    def set_task(self, goal: str | None = None, todos: Sequence[Any] | None = None, *, by: str = "api") -> int:
        """Set the session's goal and/or todo list (``None`` leaves a part as it is, ``""`` and
        ``[]`` clear it). Handoff, rollover and chapters carry them across a context switch.
        Each todo is a string or ``{"text": ..., "status": "pending"|"in_progress"|"completed"}``.
        Returns the seq of the ``session/task`` event."""
        from .task import task_data

        return self.append_one(ev.SESSION_TASK, task_data(goal, todos, by))

    # -- manual controls (controls.py) -----------------------------------------------------------------
    @property
    def strategies_generation(self) -> int:
        """Changes whenever the strategies running in this session change: the kernel's switch
        (``Kernel.set_strategy_enabled``) or this session's ``session/strategy`` events."""
        return self.kernel.plugins.generation + self.strategy_toggles

    def enabled_strategies(self) -> list[str]:
        """The strategies whose hooks run for this session, in profile order."""
        return [n for n in self.kernel.plugins.enabled_names() if n not in self.disabled_strategies]

    def strategy_enabled(self, name: str) -> bool:
        return self.kernel.plugins.is_enabled(name) and name not in self.disabled_strategies

    def set_strategy_enabled(self, name: str, enabled: bool, *, by: str = "api") -> bool:
        """Enable or disable a strategy of the profile for this session only, from the next step
        on, in every process that runs it (written to the log). True when that changed anything.

        Raises :class:`ctxkernel.ControlError` for a strategy not in the profile and
        :class:`ctxkernel.SessionBusyError` mid-step (nothing written)."""
        from .controls import set_strategy_enabled

        return set_strategy_enabled(self, name, enabled, by=by)

    def compact_now(self, action: str = "compact", *, by: str = "api") -> ManualOutcome:
        """Compact now, by hand: the first enabled strategy that handles ``action`` acts in its own
        terms (see :mod:`ctxkernel.controls`). Raises :class:`ctxkernel.ControlError` when none
        does and :class:`ctxkernel.SessionBusyError` mid-step (nothing written)."""
        from .controls import compact_now

        return compact_now(self, action, by=by)

    # -- compaction ------------------------------------------------------------------------------------
    def compact(
        self, spans: Span | Sequence[Span], *, strategy: str, kind: str = "summary", **kwargs: Any
    ) -> CommitResult:
        """Run one compaction transaction (see :mod:`ctxkernel.compaction`)."""
        with self._lock:
            return run_transaction(
                self, [spans] if isinstance(spans, Span) else list(spans), strategy=strategy, kind=kind, **kwargs
            )

    def replace_tool_result(self, seq: int, content: str, *, strategy: str, reason: str = "prune") -> int:
        """Model-free shrink of one tool result (``compaction/prune`` + a one-node replacement)."""
        node = self.surface.node(seq)
        if node is None or node.role != "tool":
            msg = f"seq {seq} is not a visible tool result"
            raise SurfaceError(msg)
        old = node.message.content[0]
        if not isinstance(old, ToolResultBlock):
            msg = f"seq {seq} holds no tool result block"
            raise SurfaceError(msg)
        message = Message.tool(old.call_id, content, is_error=old.is_error, name=old.name)
        return (
            self.append(
                [
                    EventSpec(
                        ev.COMPACTION_PRUNE,
                        {
                            "target": seq,
                            "strategy": strategy,
                            "reason": reason,
                            "chars_before": len(old.content),
                            "chars_after": len(content),
                        },
                    ),
                    EventSpec(
                        ev.TOOL_RESULT,
                        {"message": message.to_dict(), "prune": True},
                        {"op": "replace", "start": seq, "end": seq, "cites": [seq]},
                    ),
                ]
            )
            + 1
        )

    # -- recovery --------------------------------------------------------------------------------------
    def repair_after_crash(self, *, keep_waiting_calls: bool = False) -> list[int]:
        """Close what a crashed writer left open: pending calls get error results, the step and
        turn get ``interrupted`` closers, an abandoned compaction gets its error end.

        A turn that waits between steps (no step open, no call pending) is left open: it is a
        consistent state the harness can continue with ``prepare_request`` or close with
        ``end_turn``, and closing it would break a worker that is still using it.
        ``keep_waiting_calls`` also leaves open a step whose tool calls wait for results: for a
        harness whose tools run elsewhere (a proxy's client), that is a normal state to resume."""
        with self._lock:
            lease = None
            if self.open_compaction is not None:
                # an open compaction is abandoned when nobody live holds its lease (lease.py)
                lease = CompactionLease(self)
                if not lease.try_acquire().acquired:
                    lease = None
            try:
                return self._repair(lease, keep_waiting_calls)
            finally:
                if lease is not None:
                    lease.release()

    def _repair(self, lease: CompactionLease | None, keep_waiting_calls: bool) -> list[int]:
        batch: list[EventSpec] = []
        if lease is not None:
            self.refresh()  # the holder may have ended it just before we took the lease
            if self.open_compaction is not None:
                batch.append(lease.takeover_end(self.open_compaction))
        waiting = keep_waiting_calls and bool(self.surface.pending_calls)
        if self.turn_open and not waiting and (self.surface.pending_calls or self.step_open):
            batch += self._closers(
                "interrupted", "outcome unknown: the session was interrupted before this call's result was recorded"
            )
            batch.append(EventSpec(ev.TURN_END, {"turn": self.turn, "reason": "interrupted"}))
        if not batch:
            return []
        first = self.append(batch)
        return list(range(first, first + len(batch)))

    def project(self) -> dict[str, Any]:
        """Status for ``ctxkernel inspect``: pressure, surface, compactions, strategy panels."""
        roles: dict[str, int] = {}
        for node in self.surface.nodes:
            roles[node.role] = roles.get(node.role, 0) + 1
        return {
            "session": self.id,
            "events": len(self.events),
            "turn": self.turn,
            "pressure": self.pressure().to_dict(),
            "surface": {"nodes": len(self.surface.nodes), "roles": roles, "tokens": self.meter.surface_tokens()},
            "compactions": [dict(row) for row in self.compaction_summaries],
            "strategies": self.kernel.hooks.project(self),
        }


def _storable_message(message: Message) -> tuple[Message, dict[str, Any]]:
    """``message`` with lone surrogates in any of its text replaced (the same object when clean),
    and its ``to_dict()``."""
    data = message.to_dict()
    try:
        # orjson refuses a lone surrogate in any string, keys included: when it encodes the
        # dict, storable() would return it unchanged (one C pass instead of walking it in Python)
        orjson.dumps(data)
    except TypeError:
        cleaned = storable(data)
        if cleaned is not data:
            message = Message.from_dict(cleaned)
            return message, message.to_dict()
    return message, data


def _syncs_as_index(value: Any) -> bool:
    """Whether ``value``'s class is a :class:`SnapshotIndex` with a ``sync()`` method (an object
    that has them only as instance attributes is not synced here: the snapshot folds it when written)."""
    cls = type(value)
    decision = _INDEX_CLASSES.get(cls)
    if decision is None:
        decision = issubclass(cls, SnapshotIndex) and callable(getattr(cls, "sync", None))
        if len(_INDEX_CLASSES) >= _INDEX_CLASSES_MAX:
            _INDEX_CLASSES.clear()  # bounded: a program that makes classes at run time
        _INDEX_CLASSES[cls] = decision
    return decision


def _clone_surface(surface: Surface) -> Surface:
    clone = Surface()
    clone.nodes = list(surface.nodes)
    clone.applied = surface.applied
    clone.turn, clone.step = surface.turn, surface.step
    clone.version = surface.version
    clone._pos = None
    clone.pending_calls = dict(surface.pending_calls)
    clone.call_owner = dict(surface.call_owner)
    clone.result_of = dict(surface.result_of)
    return clone


__all__ = ["EventSpec", "ReplyDraft", "Request", "Session", "StepContext", "normalize_usage", "ConflictError"]

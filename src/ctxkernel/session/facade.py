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

The Session is a facade over its parts, each owning its state and its memos: the log and its one
write path (:mod:`.log`), what the log's kernel events say (:mod:`.track`), the tools and the
composed header (:mod:`.header`), the route (:mod:`.route`), the pressure (:mod:`.pressure`),
turns and steps (:mod:`.turns`), the request's composition (:mod:`.compose`), replies and tool
results (:mod:`.reply`) and snapshots (:mod:`.snapshots`). Strategies never see it: their hooks
receive its :attr:`context`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..compaction import CommitResult, Span, cache_gate, run_transaction
from ..context import Context, Request, RequestHeader
from ..errors import SurfaceError
from ..events import Event, EventSpec
from ..guard import OversizedMarks
from ..instructions import Instruction, Ledger
from ..lease import host_id
from ..ledger import WorkLedger
from ..messages import Message, ToolCallBlock, ToolResultBlock
from ..meter import Meter, Pressure
from ..surface import Surface
from ..tools import ToolOutcome, ToolRegistry
from .compose import Composer
from .log import CountsAhead, SessionLog
from .prefix import PrefixTracker
from .pressure import Gauge
from .reply import Replies
from .route import Routing
from .snapshots import Snapshots
from .tooling import Tooling
from .track import Tracker
from .turns import Turns

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..controls import ManualOutcome
    from ..profile import ModelSettings
    from ..snapshot import LazyEvents
    from ..store.base import EventStore, SessionHeader


class Session:
    """One agent session: its log, surface, meter and tools. Create it with ``Kernel.open_session``."""

    def __init__(self, kernel: Any, header: SessionHeader) -> None:
        self.kernel = kernel
        self.store: EventStore = kernel.store
        self.header = header
        self.id = header.id
        self.surface = Surface()
        self.meter = Meter(kernel.tokenizer)
        self.surface.listeners.append(self.meter)
        #: per-strategy state, keyed by strategy name (a strategy's handle's ``state``), and the
        #: session-wide indexes (history, notes, timeline) by their keys; rebuilt from the log
        self.state: dict[str, Any] = {}
        # who runs a compaction (written in its start event): host id, pid and this Session object;
        # whether that holder is alive is the compaction lease's business (lease.py)
        self.holder: dict[str, Any] = {
            "host": host_id(kernel.profile.store),
            "pid": os.getpid(),
            "token": uuid.uuid4().hex,
        }
        #: the request bound's marks of passes that found nothing (guard.py)
        self.oversized = OversizedMarks()
        self._tracker = Tracker(self.meter)
        self._counts = CountsAhead(self.meter)
        self._log = SessionLog(self.store, self.id, self.surface, self._tracker, self._counts)
        self._snapshots = Snapshots(self, self._log, self._tracker, self.surface)
        self._log.after_append = self._snapshots.after_append  # every batch, once durable and folded
        #: the whole log in order (the log's own list, read on every step by the kernel and the
        #: strategies: an attribute, not a property); opened from a snapshot, a :class:`LazyEvents`
        #: that reads the events before the snapshot from the store on first use
        self.events: list[Event] | LazyEvents = self._log.events
        self._tooling = Tooling(self, self.meter, self._tracker)
        self._routing = Routing(self, self._tracker)
        self._gauge = Gauge(self.id, self.meter, self._tracker, self._tooling, self._routing)
        self._turns = Turns(self, self._log, self._tracker, self.surface)
        self._composer = Composer(
            self,
            self._log,
            self._tracker,
            self.surface,
            self.meter,
            self._tooling,
            self._routing,
            self._gauge,
            self._turns,
        )
        self._replies = Replies(
            self,
            self._log,
            self._tracker,
            self.surface,
            self.meter,
            self._counts,
            self._tooling,
            self._composer,
            self._turns,
            self._snapshots,
        )
        #: what the strategies see of this session: the ``ctx`` of every hook and tool handler
        self.context = Context(self)

    # -- the log --------------------------------------------------------------------------------------
    @property
    def next_seq(self) -> int:
        return len(self._log.events)

    @property
    def lock(self) -> threading.RLock:
        """The session's re-entrant lock: hold it to make several calls one atomic unit within
        this process (every mutating call takes it too)."""
        return self._log.lock

    @property
    def stale(self) -> bool:
        """True after a write of held events failed: this object is ahead of its log and must be
        reopened (every later append refuses)."""
        return self._log.stale

    def refresh(self) -> int:
        """Fold events other writers appended since we last looked; returns how many.

        Events a deferred :meth:`prepare_request` folded and did not write yet (its request
        ended without a commit, a failure or an abandoned step that would write them) are
        written first: the log is compared with what it holds, never with what this object
        only holds in memory."""
        return self._log.refresh()

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
        return self._log.append(batch, durable=durable, parsed=_parsed)

    def append_one(self, type: str, data: dict[str, Any], surface: dict[str, Any] | None = None) -> int:
        return self.append([EventSpec(type, data, surface)])

    def emit(self, strategy: str, kind: str, data: dict[str, Any]) -> int:
        """Append an ignorable plugin event ``<strategy>/<kind>``."""
        return self.append([EventSpec(f"{strategy}/{kind}", data, ignorable=True)])

    def add_message(self, message: Message, *, event_type: str = ev.USER_MESSAGE) -> int:
        """Append a surface message (e.g. a plugin notice) and return its seq."""
        return self.append_one(event_type, {"message": message.to_dict()}, ev.append_op())

    def count_message(self, message: Message) -> int:
        """Tokens of ``message`` (as ``session.meter.count_message`` counts them), kept until a
        message with the same text lands on the surface, whose node then takes the count: a
        message counted before it is appended (a reply's estimate, a front door's ledger) is
        tokenised once. Kept per session, as a count holds for its exact text only."""
        return self._counts.count(message)

    # -- what the log says ----------------------------------------------------------------------------
    @property
    def turn(self) -> int:
        return self._tracker.turn

    @property
    def turn_open(self) -> bool:
        return self._tracker.turn_open

    @property
    def step(self) -> int:
        return self._tracker.step

    @property
    def step_open(self) -> bool:
        return self._tracker.step_open

    @property
    def open_compaction(self) -> dict[str, Any] | None:
        """The unmatched ``compaction/start`` data (with its seq), or None."""
        return self._tracker.open_compaction

    @property
    def compaction_summaries(self) -> list[dict[str, Any]]:
        """One row per committed compaction: strategy, kind, tokens before and after, cites."""
        return self._tracker.compaction_summaries

    @property
    def header_hash(self) -> str | None:
        return self._tracker.header_hash

    @property
    def route(self) -> dict[str, Any] | None:
        """The last ``request/context`` data: the model requests go to, or None before the first."""
        return self._tracker.route

    @property
    def disabled_strategies(self) -> frozenset[str]:
        """Strategies a person disabled for this session (``session/strategy`` events)."""
        return self._tracker.disabled_strategies

    @property
    def strategy_toggles(self) -> int:
        return self._tracker.strategy_toggles

    @property
    def task(self) -> dict[str, Any]:
        """The task state the harness set (``session/task``): ``goal`` and ``todos`` when set."""
        return self._tracker.task

    @property
    def conclude_turn(self) -> bool:
        """A tool outcome asked to end the turn after its batch (this process's pending work)."""
        return self._tracker.conclude_turn

    @conclude_turn.setter
    def conclude_turn(self, value: bool) -> None:
        self._tracker.conclude_turn = value

    @property
    def instructions(self) -> list[Instruction]:
        """The user's instructions, oldest first: those inherited from the session this one
        continues, then its own (the ledger ``[instructions]`` protects, :mod:`ctxkernel.instructions`)."""
        return self._tracker.instructions.sync(self.id, self._log.events)

    @property
    def instruction_ledger(self) -> Ledger:
        """The ledger behind :attr:`instructions` (its counts and the last search answers)."""
        return self._tracker.instructions

    @property
    def work_ledger(self) -> WorkLedger:
        """The work ledger (:mod:`ctxkernel.ledger`), up to date with the log."""
        return self._tracker.work.sync(self._log.events)

    @property
    def instruction_costs(self) -> dict[tuple[str, int], int]:
        """Tokens of each instruction, by (session, seq), counted once per process."""
        return self._tracker.instructions.costs

    @property
    def instruction_texts(self) -> dict[int, tuple[Message, str]]:
        """Normalised texts of surface messages, by seq, for the search for lost instructions."""
        return self._tracker.instructions.normalized_texts

    # -- snapshots ------------------------------------------------------------------------------------
    @property
    def snapshot_states(self) -> dict[str, dict[str, Any]]:
        """Opened from a snapshot: the state each strategy put into it, until the strategy takes it
        (``StrategyHandle.restored``)."""
        return self._snapshots.strategy_states

    @property
    def snapshot_indexes(self) -> dict[str, Any]:
        """Opened from a snapshot: the session-wide indexes' parts, until each is first built."""
        return self._snapshots.indexes

    def write_snapshot(self) -> None:
        """Write a snapshot of the folded state now (the session does so at each compaction
        commit and every ``[store] snapshot_every`` events, after the batch is durable). A failed
        write is logged and only makes the next open replay more."""
        self._snapshots.write()

    def open_from_snapshot(self, covers: int, payload: bytes) -> bool:
        """Install a stored snapshot of the first ``covers`` events into this fresh session
        (see :mod:`ctxkernel.snapshot`); False, with a warning naming the reason, when it cannot
        be trusted, and the session is untouched for a full replay."""
        opened = self._snapshots.open_from(covers, payload)
        self.events = self._log.events  # the snapshot's LazyEvents when it was taken
        return opened

    # -- the route and the settings -------------------------------------------------------------------
    def settings(self, strategy: str) -> BaseModel:
        """The validated settings of ``strategy`` for the currently routed model."""
        return self._routing.settings(strategy)

    def model_settings(self) -> ModelSettings:
        """The routed model's settings: the profile's ``[model]`` with the matching per-model
        policy applied, and the window a route gave explicitly (``set_route(...,
        context_window=...)``, folded from the log, so a reopened session keeps it)."""
        return self._routing.model_settings()

    def set_route(self, provider: str, model: str, context_window: int | None = None) -> None:
        """Route the next requests to another model (per-model policies apply from then on).

        ``context_window`` is the routed model's total window when the profile does not know it:
        pressure, every strategy threshold and the instruction budget follow it from the next
        request on (the output reservation shrinks to an eighth of a window it would take half
        of). It is recorded in the log, so a reopened session keeps it."""
        self._routing.set_route(provider, model, context_window)

    def pressure(self) -> Pressure:
        """How full the next request is, anchored on the provider's last usage figure when that
        figure is plausible (:func:`ctxkernel.meter.usage_in_band`), else the meter's own count."""
        return self._gauge.pressure()

    # -- turns ----------------------------------------------------------------------------------------
    def user(self, text: str | Message) -> int:
        """Append the user's message, opening a turn if none is open. Returns its seq."""
        return self._turns.user(text)

    def end_turn(self, reason: str = "completed") -> None:
        """Close the turn. Calls still waiting get error results first, so pairing holds."""
        self._turns.end_turn(reason)

    def abandon_step(self, reason: str = "interrupted") -> None:
        """Close the open step without ending the turn: calls still waiting get error results,
        then ``step/end {reason}``. For a harness whose step was cut short (a client that went
        away mid-reply): the turn stays open, so the next ``prepare_request`` continues it."""
        self._turns.abandon_step(reason)

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
        return self._turns.append_history(messages, trailer=trailer)

    @property
    def pending_calls(self) -> list[ToolCallBlock]:
        """Tool calls of the last reply still waiting for a result, in the model's order."""
        return self._turns.pending_calls

    @property
    def wants_another_step(self) -> bool:
        """True when the last step ended with tool results the model has not seen yet."""
        return self._turns.wants_another_step

    # -- tools ----------------------------------------------------------------------------------------
    @property
    def tools(self) -> ToolRegistry:
        """The tools the session's strategies offer: those they registered, but one whose name
        a harness tool has (:meth:`set_harness_tools`)."""
        return self._tooling.tools

    @property
    def offerable_tools(self) -> ToolRegistry:
        """Every tool the session's strategies may offer: ``tools``, and those a strategy offers
        only once it has something to do."""
        self._tooling.sync_tools()
        return self._tooling.offerable

    @property
    def harness_tools(self) -> list[dict[str, Any]]:
        """The harness's own tool schemas (:meth:`set_harness_tools`)."""
        return self._tooling.harness_tools

    @property
    def harness_system(self) -> str | None:
        """The harness's own system prompt; None means the profile's ``system_prompt``."""
        return self._tooling.harness_system

    @property
    def header_in_full(self) -> bool:
        """True while the kernel asks for the header at its fullest (``ctx.header_in_full``)."""
        return self._tooling.in_full

    @property
    def weighing_header(self) -> bool:
        """True while the kernel composes the header at its fullest only to weigh or list it (the
        header guard, ``validate``), not to send it."""
        return self._tooling.weighing

    def offer_every_tool(self) -> None:
        """Offer every tool the strategies may offer from the next request on, also those they
        offer only once they have something to do, with their prompt sections: for a framework
        that binds its tools before any session exists and sends them all with every call
        (Pydantic AI, the OpenAI Agents SDK), so the meter counts and the kernel runs what the
        model is sent. Process state: call it whenever the session is opened."""
        if not self._tooling.every_tool:
            self._tooling.every_tool = True
            self._tooling.invalidate()

    def offering_everything(self) -> contextlib.AbstractContextManager[None]:
        """Within the block the strategies register every tool they may offer, also those they
        offer only once they have something to do (``validate`` lists and checks them all)."""
        return self._tooling.offering_everything()

    def full_header(self) -> tuple[int, int]:
        """The request header's tokens and tool count with every tool and section the strategies
        may offer later: what the header guard and ``validate`` weigh against the window."""
        return self._tooling.full_header()

    def owns_tool(self, name: str) -> bool:
        """Whether a call of ``name`` is a strategy's to run (:meth:`run_tool`); False for the
        harness's tools, also one with a strategy tool's name (the harness's tool wins)."""
        return self._tooling.owns(name)

    def may_offer_tool(self, name: str) -> bool:
        """Whether a strategy offers this tool now, or once it has something to do (``history``'s
        and ``mask``'s recall tools come once something is hidden)."""
        return self._tooling.may_offer(name)

    def run_tool(self, call: ToolCallBlock | dict[str, Any]) -> ToolOutcome:
        """Run a kernel tool. Bad arguments give an error outcome; nothing is written for them."""
        return self._tooling.run(call)

    def tool_result(self, call_id: str, result: str | ToolOutcome, *, is_error: bool = False) -> int:
        """Commit the result of one pending call (in the model's order). Returns its seq."""
        return self._replies.tool_result(call_id, result, is_error=is_error)

    # -- requests -------------------------------------------------------------------------------------
    def request_header(self) -> RequestHeader:
        """The system prompt and tool schemas every request carries, and their token count."""
        return self._tooling.request_header()

    def invalidate_header(self) -> None:
        """Call when a strategy's system prompt section or the tools it offers changed: the
        next request registers the tools (``register_tools``) and composes the header again."""
        self._tooling.invalidate()

    def restore_harness_tools(self) -> None:
        """On resume, the harness's tools are those of the last recorded header that no
        strategy owns (one that took a strategy tool's name included), so a reopened session
        composes the same request as before."""
        self._tooling.restore_harness_tools()

    def set_harness_tools(self, schemas: list[dict[str, Any]]) -> None:
        """The harness's own tool schemas: sent with every request and counted by the meter. A
        harness tool with a strategy tool's name wins: the strategy's is left out of the
        requests (a provider refuses a name twice), :meth:`owns_tool` is False for it and
        :meth:`run_tool` refuses it, so its calls go to the harness (as in ``serve``)."""
        self._tooling.set_harness_tools(schemas)

    def set_harness_system(self, system: str | None) -> None:
        """The harness's own system prompt, used instead of the profile's ``system_prompt``
        (strategies still add their sections after it). None restores the profile's. A proxy
        sets the prompt its client sent, before each ``prepare_request``."""
        self._tooling.set_harness_system(system)

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
        return self._composer.prepare_request(
            attempt=attempt, allow_overflow=allow_overflow, history=history, trailer=trailer, defer_write=defer_write
        )

    def commit_reply(
        self, reply: Message | dict[str, Any] | Any, usage: Any = None, *, trailer: Sequence[EventSpec] = ()
    ) -> Message:
        """Commit the model's reply (after ``sanitize_reply``). Returns the committed message.

        ``trailer`` events (a front door's bookkeeping) end the same durable batch."""
        return self._replies.commit_reply(reply, usage, trailer)

    def request_failed(self, error: Any) -> bool:
        """Report a provider error for the prepared request; True means "retry now".

        Runs the ``request_error`` hooks (e.g. compact on context overflow). The step is closed;
        the next ``prepare_request`` starts a new one.
        """
        return self._replies.request_failed(error)

    # -- task state (task.py) -------------------------------------------------------------------------
    def set_task(self, goal: str | None = None, todos: Sequence[Any] | None = None, *, by: str = "api") -> int:
        """Set the session's goal and/or todo list (``None`` leaves a part as it is, ``""`` and
        ``[]`` clear it). Handoff, rollover and chapters carry them across a context switch.
        Each todo is a string or ``{"text": ..., "status": "pending"|"in_progress"|"completed"}``.
        Returns the seq of the ``session/task`` event."""
        from ..task import task_data

        return self.append_one(ev.SESSION_TASK, task_data(goal, todos, by))

    # -- manual controls (controls.py) ----------------------------------------------------------------
    @property
    def strategies_generation(self) -> int:
        """Changes whenever the strategies running in this session change: the kernel's switch
        (``Kernel.set_strategy_enabled``) or this session's ``session/strategy`` events."""
        return self._tooling.generation

    def enabled_strategies(self) -> list[str]:
        """The strategies whose hooks run for this session, in profile order."""
        off = self._tracker.disabled_strategies
        return [n for n in self.kernel.plugins.enabled_names() if n not in off]

    def strategy_enabled(self, name: str) -> bool:
        return bool(self.kernel.plugins.is_enabled(name)) and name not in self._tracker.disabled_strategies

    def set_strategy_enabled(self, name: str, enabled: bool, *, by: str = "api") -> bool:
        """Enable or disable a strategy of the profile for this session only, from the next step
        on, in every process that runs it (written to the log). True when that changed anything.

        Raises :class:`ctxkernel.ControlError` for a strategy not in the profile and
        :class:`ctxkernel.SessionBusyError` mid-step (nothing written)."""
        from ..controls import set_strategy_enabled

        return set_strategy_enabled(self, name, enabled, by=by)

    def compact_now(self, action: str = "compact", *, by: str = "api") -> ManualOutcome:
        """Compact now, by hand: the first enabled strategy that handles ``action`` acts in its own
        terms (see :mod:`ctxkernel.controls`). Raises :class:`ctxkernel.ControlError` when none
        does and :class:`ctxkernel.SessionBusyError` mid-step (nothing written)."""
        from ..controls import compact_now

        return compact_now(self, action, by=by)

    # -- compaction -----------------------------------------------------------------------------------
    def compact(
        self, spans: Span | Sequence[Span], *, strategy: str, kind: str = "summary", **kwargs: Any
    ) -> CommitResult:
        """Run one compaction transaction (see :mod:`ctxkernel.compaction`)."""
        with self._log.lock:
            return run_transaction(
                self, [spans] if isinstance(spans, Span) else list(spans), strategy=strategy, kind=kind, **kwargs
            )

    def replace_tool_result(self, seq: int, content: str, *, strategy: str, reason: str = "prune") -> int:
        """Model-free shrink of one tool result (``compaction/prune`` + a one-node replacement);
        between steps, only when it pays for the cached prefix it rewrites (``cache_gate``)."""
        node = self.surface.node(seq)
        if node is None or node.role != "tool":
            msg = f"seq {seq} is not a visible tool result"
            raise SurfaceError(msg)
        old = node.message.content[0]
        if not isinstance(old, ToolResultBlock):
            msg = f"seq {seq} holds no tool result block"
            raise SurfaceError(msg)
        message = Message.tool(old.call_id, content, is_error=old.is_error, name=old.name)
        if self.editing_automatically:
            position = self.surface.position(seq)
            saved = self.meter.node_tokens(node) - self.meter.count_message(message)
            cache_gate(self, position or 0, saved, strategy=strategy, clears=True)
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

    # -- the prompt cache -------------------------------------------------------------------------------
    @property
    def sent_prefix(self) -> PrefixTracker:
        """The request sent last, as the provider's prompt cache sees it (``session/prefix.py``)."""
        return self._composer.prefix

    @property
    def editing_automatically(self) -> bool:
        """True while the strategies' ``pre_step`` runs: the edits they commit are judged by the
        prompt cache's break-even rule (``cache_rule.py``)."""
        return self._composer.automatic

    # -- recovery -------------------------------------------------------------------------------------
    def repair_after_crash(self, *, keep_waiting_calls: bool = False) -> list[int]:
        """Close what a crashed writer left open: pending calls get error results, the step and
        turn get ``interrupted`` closers, an abandoned compaction gets its error end.

        A turn that waits between steps (no step open, no call pending) is left open: it is a
        consistent state the harness can continue with ``prepare_request`` or close with
        ``end_turn``, and closing it would break a worker that is still using it.
        ``keep_waiting_calls`` also leaves open a step whose tool calls wait for results: for a
        harness whose tools run elsewhere (a proxy's client), that is a normal state to resume."""
        return self._turns.repair_after_crash(keep_waiting_calls=keep_waiting_calls)

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
            "cache": self._cache_view(),
            "strategies": self.kernel.hooks.project(self),
        }

    def _cache_view(self) -> dict[str, Any]:
        """The last request's ``cache_prefix_tokens`` (recorded with its ``step/start``), or None
        before the first request (or in a log written before it was recorded)."""
        events = self.events
        for i in range(len(events) - 1, -1, -1):
            event = events[i]
            if event.type == ev.STEP_START:
                value = event.data.get("cache_prefix_tokens")
                return {
                    "prefix_tokens": value if type(value) is int else None,
                    "turn": event.data["turn"],
                    "step": event.data["step"],
                }
        return {"prefix_tokens": None, "turn": None, "step": None}


__all__ = ["Session"]

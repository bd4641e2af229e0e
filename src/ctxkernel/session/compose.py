"""Composing a request: the strategies act between steps (``pre_step``), the kernel bounds what a
request may carry, the request is built from the surface and the header and decorated, and its
``step/start`` (with a new header or route when they changed) is written, or held for the reply's
write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import events as ev
from .. import ledger
from ..context import Request, StepContext
from ..errors import EventError, HeaderTooLargeError, RequestTooLargeError
from ..events import EventSpec
from ..guard import excerpt_oversized, fit_composed, header_refusal, smallest_window
from ..instructions import PENDING_NAMESPACE, inheritance_batch, pending_of
from ..messages import Message, Source
from .prefix import PrefixTracker

if TYPE_CHECKING:
    from ..meter import Meter
    from ..ports import SessionPort
    from ..surface import Surface
    from .log import SessionLog
    from .pressure import Gauge
    from .route import Routing
    from .tooling import Tooling
    from .track import Tracker
    from .turns import Turns


class Composer:
    """One session's request composition, and the notices queued for the next request."""

    def __init__(
        self,
        session: SessionPort,
        log: SessionLog,
        tracker: Tracker,
        surface: Surface,
        meter: Meter,
        tooling: Tooling,
        routing: Routing,
        gauge: Gauge,
        turns: Turns,
    ) -> None:
        self.session = session
        self.log = log
        self.tracker = tracker
        self.surface = surface
        self.meter = meter
        self.tooling = tooling
        self.routing = routing
        self.gauge = gauge
        self.turns = turns
        #: notices for the model at the next request, (strategy, text): the strategies' reminders
        #: and tools' deferred messages (this process's pending work: it lives within one step)
        self.deferred: list[tuple[str, str]] = []
        #: the meter's count of the last request composed (a reply's usage anchors against it)
        self.request_estimate = 0
        self._inheritance_checked = False  # a continuation's pending inheritance (instructions.py)
        #: the request sent last, for the prompt cache (cache_prefix_tokens, the break-even rule)
        self.prefix = PrefixTracker(log, tracker, surface, meter, tooling)
        #: True while the strategies' pre_step runs: the edits they commit then are automatic,
        #: and the break-even rule judges them (compaction.py)
        self.automatic = False
        #: the (header digest, window, reservation) last found to leave room (_check_header_room)
        self._header_checked: tuple[str, int, int] | None = None

    def prepare_request(
        self,
        *,
        attempt: int = 0,
        allow_overflow: bool = False,
        history: Sequence[Message] = (),
        trailer: Sequence[EventSpec] = (),
        defer_write: bool = False,
    ) -> Request:
        """See :meth:`ctxkernel.Session.prepare_request`."""
        session, log = self.session, self.log
        with log.lock:
            session.refresh()
            session.kernel.refresh_profile()  # edited settings apply from this step on
            self._check_header_room()  # before anything is held or written
            if history or trailer:
                batch, _, offered = self.turns.history_batch(history, trailer)
                if batch:
                    log.hold(batch, offered)
            routing = self.routing
            routing.preparing_request()
            try:
                return self._prepare_step(attempt, allow_overflow, defer_write)
            except BaseException:
                if log.held and not log.stale:  # stopped before its step/start
                    session.append([], durable=False)
                raise
            finally:
                routing.prepared()

    def _check_header_room(self) -> None:
        """Refuse a request header that leaves no room to manage the conversation (guard.py's
        :func:`~ctxkernel.guard.header_refusal`), up front: never by clipping the newest result.
        A session with no strategy enabled manages nothing and is not refused."""
        _, tools, digest, _ = self.tooling.compose()
        model = self.routing.model_settings()
        key = (digest, model.context_window, model.reserved_output_tokens)
        if key == self._header_checked or not self.session.enabled_strategies():
            return
        # counted with the tools a strategy offers only later: a session is refused before its
        # first request or not at all
        full_tokens, full_tools = self.tooling.full_header()
        later = full_tools - len(tools)
        reason = header_refusal(full_tokens, model.context_window, model.reserved_output_tokens, full_tools, later)
        if reason is not None:
            smallest = smallest_window(full_tokens, model.reserved_output_tokens)
            raise HeaderTooLargeError(reason, header_tokens=full_tokens, smallest_window=smallest)
        self._header_checked = key

    def _prepare_step(self, attempt: int, allow_overflow: bool, defer_write: bool = False) -> Request:
        session, tracker, surface = self.session, self.tracker, self.surface
        if not tracker.turn_open:
            msg = "no open turn: call session.user(...) before prepare_request()"
            raise EventError(msg)
        if surface.pending_calls:
            msg = f"tool calls {list(surface.pending_calls)} wait for results: commit them before the next request"
            raise EventError(msg)
        if tracker.step_open:  # a request that failed without request_failed(): close its step
            self.session.append(
                [EventSpec(ev.STEP_END, {"turn": tracker.turn, "step": tracker.step, "reason": "abandoned"})]
            )
        self.flush_deferred()
        if not self._inheritance_checked:
            self._write_inheritance()
        step = StepContext(tracker.turn, tracker.step + 1, tracker.step == 0, attempt)
        self.automatic = True
        try:
            session.kernel.hooks.pre_step(session, step)
        finally:
            self.automatic = False
        for strategy, text in step.reminders:
            self.deferred.append((strategy, text))
        self.flush_deferred()
        excerpt_oversized(session)  # the kernel's bound: no message over half the window (guard.py)
        request, header_tokens, digest = self._compose(step.step)
        tokens = header_tokens + self.meter.surface_tokens() + tracker.decoration_delta
        window = self.routing.model_settings().effective_window
        if tokens > window and session.kernel.profile.profile.guard_request and session.enabled_strategies():
            # the composed request (reminders, anchors, tools included) would overflow: the
            # profile's overflow path compacts once, then it is composed again (guard.py);
            # also when what it committed did not shrink the surface (a longer summary):
            # the request must show the surface as it is now
            logged = len(self.log.events)
            if fit_composed(session, tokens, window) or len(self.log.events) != logged:
                request, header_tokens, digest = self._compose(step.step)
                tokens = header_tokens + self.meter.surface_tokens() + tracker.decoration_delta
            if tokens > window and not allow_overflow:
                msg = (
                    f"the composed request has {tokens} tokens, over the effective window of {window} "
                    f"(context_window - reserved_output_tokens) even after compaction; nothing was sent. "
                    "Shorten the system prompt or tool schemas, or use a model with a larger window"
                )
                raise RequestTooLargeError(msg, prompt_tokens=tokens, limit=window)
        prefix_tokens, prefix_messages = self.prefix.sent(request, header_tokens, digest)
        request.cache_prefix_tokens, request.cache_prefix_messages = prefix_tokens, prefix_messages
        batch = []
        if digest != tracker.header_hash:
            header = {"system": request.system, "tools": request.tools, "hash": digest}
            batch.append(EventSpec(ev.REQUEST_HEADER, header))
        if tracker.route is None:
            self.routing.write(self.routing.model_settings())
        batch.append(
            EventSpec(ev.STEP_START, {"turn": tracker.turn, "step": step.step, "cache_prefix_tokens": prefix_tokens})
        )
        if defer_write:
            self.log.hold(batch)  # written first by the next append (prepare_request's docstring)
        else:
            self.session.append(batch, durable=False)
        route = tracker.route
        request.provider = route["provider"] if route else ""
        request.model = route["model"] if route else ""
        request.pressure = self.gauge.pressure()
        self.request_estimate = tokens
        return request

    def _compose(self, step: int) -> tuple[Request, int, str]:
        """The request the surface gives now, decorated by the strategies (nothing written), and
        its header's token count and hash."""
        system, tools, digest, header_tokens = self.tooling.compose()
        surface, route = self.surface, self.tracker.route
        nodes = surface.nodes
        request = Request(
            # copies of lists the surface keeps between requests (Surface._views)
            messages=surface.messages(),
            seqs=surface.seqs(),
            system=system,
            tools=tools,
            turn=self.tracker.turn,
            step=step,
            pressure=self.gauge.pressure(),  # replaced once decorations are known
            provider=route["provider"] if route else "",
            model=route["model"] if route else "",
            session_id=self.log.id,
            cache_hints=self.session.kernel.profile.cache.hints,
        )
        self.session.kernel.hooks.decorate_request(self.session, request)
        meter = self.meter
        delta = 0
        for index in request.decorated:
            node = nodes[index]
            delta += meter.decorated_tokens(node.seq, request.messages[index]) - meter.node_tokens(node)
        self.tracker.decorated(delta)
        return request, header_tokens, digest

    def _write_inheritance(self) -> None:
        """A continuation's first request: record the instructions it inherited (kept in the
        store by ``open_session(..., instructions_from=...)``), after its seed and before any
        strategy acts. Checked once per Session object."""
        self._inheritance_checked = True
        store, session_id = self.log.store, self.log.id
        raw = store.kv_get(PENDING_NAMESPACE, session_id)
        if raw is not None:
            pending = pending_of(raw)
            if pending:
                self.session.append(inheritance_batch(self.session, pending))
            # after the append: a crash in between writes it again, and the ledger keeps the last
            store.kv_delete(PENDING_NAMESPACE, session_id)
        work = ledger.pending_of(store.kv_get(ledger.PENDING_NAMESPACE, session_id))
        if work is not None:  # the work ledger it inherited, after the instructions (ledger.py)
            self.session.append(ledger.inheritance_batch(self.session, work))
            store.kv_delete(ledger.PENDING_NAMESPACE, session_id)

    def flush_deferred(self) -> None:
        """Write the queued notices, as plugin messages, before the request."""
        if not self.deferred:
            return
        batch = [
            EventSpec(
                ev.USER_MESSAGE,
                {"message": Message.user(text, Source.plugin_form(strategy, "notice")).to_dict()},
                ev.append_op(),
            )
            for strategy, text in self.deferred
        ]
        self.deferred = []
        self.session.append(batch)


__all__ = ["Composer"]

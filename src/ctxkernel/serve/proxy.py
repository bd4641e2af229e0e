"""The proxy: the state of one ``serve`` process and the turn API its HTTP routes call.

One client request is one *turn* of its session (docs/serve.md has the long form)::

    lease, turn = await proxy.open_turn(wire, identity, client)
                                           the session's turn: an asyncio lock per key; on postgres
                                           also an advisory lock, so that several processes order
                                           one session's requests; bounded (--lock-wait), then 409.
                                           The key is the tenant's (another tenant's name gets a
                                           key of its own); reconcile the client's history
                                           (reconcile.py), count its tokens, prepare the first round
    loop (bounded):
        request = await proxy.request_for(turn)
                                           the managed request (Overflow when it cannot fit)
        ... the routes call the upstream ...
        retry = await proxy.upstream_failed(turn, status, body, url)
                                           a provider error for the session; True: call again
        await proxy.commit(turn, reply, usage, view, last)
                                           the reply, its strategy calls run, the ledger; the turn
                                           moves on to the next round or ends (``turn.done``)
    proxy.finish(turn)                     count what the turn compacted
    await lease.release()

Every context decision is the Session API's. Session calls are synchronous (fsync,
tokenising): the turn API runs them in worker threads (``workers.run_sync``), one at a time per
session because of the lease. The ``*_sync`` methods are what those threads run.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from ..errors import ConflictError, ContextOverflowError, CtxKernelError, EventError, ModelError
from ..events import ASSISTANT_MESSAGE, COMPACTION_START, COMPACTION_SUMMARY, TURN_START
from ..kernel import Kernel
from ..logging import get_logger
from ..messages import MediaBlock, Message, Source
from ..meter import Meter
from ..models.openai_http import classify_http_error
from ..pairing import CallIds
from ..redact import Scrubber
from ..session import Request, Session
from . import anthropic_wire, openai_wire, responses_wire
from .config import DEFAULT_ANTHROPIC_VERSION, ServeConfig, upstream_bases
from .identity import Identity, tenant_key
from .kept_responses import Conversation, KeptResponses
from .metrics import Metrics
from .reconcile import (
    Reconciled,
    check_history,
    inherit,
    kept,
    ledger_for,
    message_hash,
    reconcile,
    record_follow,
    reply_record,
)
from .tenants import credential_of, same_tenant, tenant_of, tenant_secret
from .upstream import Upstream, UpstreamError, join_url
from .wire import ClientRequest, MessageMemo, WireError, add_usage, load_json_object
from .workers import run_sync

log = get_logger("ctxkernel.serve")

#: bound of the process's small per-key caches (turn semaphores, owners, routes): the open
#: sessions themselves are bounded by ``--max-sessions`` (``ServeConfig.max_sessions``)
SESSION_CACHE = 256
#: sessions one key keeps as branches (conversations that began alike and went apart)
MAX_BRANCHES = 8


class Foreign(Exception):  # not an error: the request moves to the tenant's own key
    """The key belongs to another tenant: the request goes to ``key``, its tenant's own."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class Overflow(Exception):
    """The request cannot fit the effective window, even after the strategies' overflow path."""

    def __init__(self, tokens: int, window: int) -> None:
        super().__init__(f"{tokens} tokens > {window}")
        self.tokens = tokens
        self.window = window


@dataclass
class Round:
    """What one committed upstream reply means for the client request."""

    session: Session
    done: bool
    first_seq: int | None


@dataclass
class Turn:
    """One client request's progress across upstream rounds."""

    wire: Any
    client: ClientRequest
    key: str
    session: Session
    started_len: dict[str, int]
    strategy_tools: set[str] = field(default_factory=set)
    strategy_schemas: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    overflow_retried: bool = False
    first_seq: int | None = None
    usage: dict[str, Any] | None = None
    #: the first round's request, prepared in the same worker-thread call that opened the turn
    #: (or what preparing it raised, raised again where the round asks for it)
    ready: Request | BaseException | None = None
    client_tokens: int = 0
    #: the client's new messages, checked by reconcile and written by the first round's
    #: ``prepare_request`` together with its step/start (one store write)
    pending: Reconciled | None = None
    #: the Responses API's id of this client request's response
    response_id: str = ""
    #: the last committed round ended the client request
    done: bool = False
    #: the tenant the turn is for (None: not checked, as in tests that drive the proxy directly)
    tenant: str | None = None
    #: the request's credentials (the client's headers, the server key): kept out of errors
    secrets: tuple[str | None, ...] = ()
    _scrubber: Scrubber | None = None

    @property
    def scrubber(self) -> Scrubber:
        """What removes the request's exact credentials from a text (made on first use)."""
        if self._scrubber is None:
            self._scrubber = Scrubber(self.secrets)
        return self._scrubber

    def call_ids(self) -> CallIds:
        """The ids a reply's tool calls may not take: those of the session's surface and of the
        client's history (wire.CallIds)."""
        return CallIds(self.session.surface.call_owner, _ClientCallIds(self.client))

    @property
    def wire_cache(self) -> dict[Any, Any]:
        """The session's cache of surface nodes in the turn's wire format."""
        return kept(self.session).wire.setdefault(self.wire.API, {})


class _ClientCallIds:
    """The tool-call ids of a client's history, collected on the first question (most replies
    call no tool and never ask)."""

    def __init__(self, client: ClientRequest) -> None:
        self.client = client
        self._ids: set[str] | None = None

    def __contains__(self, call_id: object) -> bool:
        if self._ids is None:
            self._ids = {c.id for m in self.client.messages for c in m.tool_calls}
            self._ids |= {m.tool_result.call_id for m in self.client.messages if m.tool_result is not None}
        return call_id in self._ids


def busy(key: str, wait: float) -> WireError:
    """The 409 for a session whose turn did not come within ``wait`` seconds."""
    return WireError(
        409,
        f"session {key} is busy with another request (waited {wait:g} s); requests of one session are "
        "served one at a time: retry when the other one has finished",
        kind="conflict_error",
        code="session_busy",
    )


class Lease:
    """A held session turn: the in-process lock and, on postgres, the advisory lock;
    ``done`` runs when it is given back (the key is no longer in flight)."""

    def __init__(self, lock: anyio.Semaphore, advisory: Any, done: Callable[[], None] | None = None) -> None:
        self._lock: anyio.Semaphore | None = lock
        self._advisory = advisory
        self._done = done

    async def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            if self._advisory is not None:
                with anyio.CancelScope(shield=True):
                    await run_sync(self._advisory.release)
        finally:
            if self._done is not None:
                self._done()
            lock.release()


class TurnLocks:
    """Each session key's turn: one semaphore of one per key (not a Lock: a streamed reply
    releases it from the response's task).

    A semaphore is in the weak map while anyone holds it or waits on it (their references keep
    it alive), so they all get the same one; the :data:`SESSION_CACHE` most recently used keys
    keep theirs alive when free too, so that a session's next request finds it instead of making
    one: making an ``anyio.Semaphore`` (its backend lookup) costs about 31k instructions, ten
    times taking and releasing it (``bench_serve.py``). A free semaphore past that bound is
    dropped, as every free one was before: a later request makes a new one, and nobody holds or
    waits on the old one."""

    def __init__(self, recent: int = SESSION_CACHE) -> None:
        self.recent = recent
        self._live: weakref.WeakValueDictionary[str, anyio.Semaphore] = weakref.WeakValueDictionary()
        self._kept: OrderedDict[str, anyio.Semaphore] = OrderedDict()

    def get(self, key: str) -> anyio.Semaphore:
        """The semaphore of ``key``'s turn."""
        lock = self._live.get(key)
        if lock is None:
            lock = anyio.Semaphore(1)
            self._live[key] = lock
        kept = self._kept
        kept[key] = lock
        kept.move_to_end(key)
        if len(kept) > self.recent:
            kept.popitem(last=False)
        return lock


class Proxy:
    """The state of one ``serve`` process: kernel, upstream client, sessions, locks, metrics."""

    def __init__(self, config: ServeConfig, kernel: Kernel, upstream: Upstream) -> None:
        self.config = config
        self.kernel = kernel
        self.upstream = upstream
        self.metrics = Metrics()
        profile_serve = kernel.profile.serve
        self.openai_base, self.anthropic_base = upstream_bases(config, kernel)
        #: a Responses API upstream; without one, Responses clients are translated to Chat Completions
        self.responses_base = config.responses_upstream or profile_serve.responses_upstream
        self.inject_tools = profile_serve.inject_tools
        self._stored_media: OrderedDict[str, None] = OrderedDict()
        self._media_cache: OrderedDict[str, bytes] = OrderedDict()
        self._media_cache_bytes = 0
        self._media_lock = threading.Lock()
        self.kept = KeptResponses(kernel.store, self.blob_bytes)
        self.server_key: str | None = None
        key_env = config.api_key_env or profile_serve.api_key_env
        if key_env:
            self.server_key = os.environ.get(key_env)
            if not self.server_key:
                msg = f"--api-key-env {key_env}: the variable is not set or empty"
                raise CtxKernelError(msg)
        #: the key of the tenants' tags (tenants.py)
        self.secret = tenant_secret(kernel.store, config.tenant_secret_env)
        #: the open sessions, least recently used first, at most ``config.max_sessions`` of them
        #: besides those with a request in flight (:meth:`_cache`); an evicted one is opened
        #: again from the store (its snapshot and the events after it) by its next request
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self._sessions_lock = threading.Lock()  # worker threads open sessions concurrently
        self._keys_of: dict[str, set[str]] = {}  # open session id -> the keys it was opened for
        self._in_flight: set[str] = set()  # keys whose turn is held (a request in flight)
        self._owners: OrderedDict[str, str] = OrderedDict()  # key -> its tenant (never changes once written)
        self._turns = TurnLocks()
        self._header_tokens: OrderedDict[bytes, int] = OrderedDict()
        #: the client bodies it remembers (to parse only what the next one appends) are as many
        #: as the sessions kept open
        self.memo = MessageMemo(histories=config.max_sessions)
        # routes read from the store on every request when other processes may move them (a
        # store that orders requests across processes); else this process is their only writer
        self._routes: dict[str, dict[str, Any]] | None = None if hasattr(kernel.store, "hold_lock") else {}

    # -- the turn API (the HTTP routes call these) ----------------------------------------------------
    async def acquire(self, key: str) -> Lease:
        """This session's turn, waiting at most ``lock_wait_seconds``; else a 409."""
        lock = self._turns.get(key)
        started = time.monotonic()
        wait = self.config.lock_wait_seconds
        try:
            lock.acquire_nowait()  # the usual case: a free turn, no timer to arm (about 0.1 ms)
        except anyio.WouldBlock:
            with anyio.move_on_after(wait) as scope:
                await lock.acquire()
            if scope.cancelled_caught:
                raise busy(key, wait) from None
        hold = getattr(self.kernel.store, "hold_lock", None)
        advisory = None
        if hold is not None:
            remaining = max(0.001, wait - (time.monotonic() - started))
            try:
                advisory = await run_sync(hold, f"serve/{key}", remaining)
            except BaseException:
                lock.release()
                raise
            if advisory is None:
                lock.release()
                raise busy(key, wait)
        self._in_flight.add(key)
        return Lease(lock, advisory, lambda: self._in_flight.discard(key))

    def tenant(self, headers: Mapping[str, str]) -> str:
        """The tenant a request's headers stand for: its credential's tag (``tenants.py``)."""
        return tenant_of(self.secret, credential_of(headers))

    async def open_turn(
        self, wire: Any, identity: Identity, client: ClientRequest, secrets: tuple[str | None, ...] = ()
    ) -> tuple[Lease, Turn]:
        """Take the session's turn (:meth:`acquire`) and open it: its new messages taken in,
        its first round prepared. A key another tenant holds moves the request to this
        tenant's own key first. A history the session refuses is a 400 with nothing written.
        The caller releases the lease when the request is answered."""
        key = identity.key
        for _ in range(2):
            lease = await self.acquire(key)
            try:
                turn = await run_sync(self.start_turn, wire, key, client, identity.tenant)
            except Foreign as moved:
                await lease.release()
                key = moved.key
                continue
            except EventError as exc:
                await lease.release()
                field = "input" if wire is responses_wire else "messages"  # the history's field in the API
                raise WireError(400, f"{field}: {exc}", param=field) from None
            except BaseException:
                await lease.release()
                raise
            turn.secrets = secrets
            self.metrics.child(self.metrics.client_tokens, wire.API).inc(turn.client_tokens)
            return lease, turn
        msg = f"session {identity.key}: this credential cannot use that name; choose another X-Ctxkernel-Session"
        raise WireError(409, msg, param="X-Ctxkernel-Session", kind="conflict_error", code="session_taken")

    async def request_for(self, turn: Turn) -> Request:
        """The round's request: the one prepared with the turn, or a new one (later rounds).
        :class:`Overflow` when it cannot fit the effective window."""
        ready, turn.ready = turn.ready, None
        if ready is None:
            return await run_sync(self.prepare_sync, turn)
        if isinstance(ready, BaseException):
            raise ready
        return ready

    async def commit(self, turn: Turn, message: Message, usage: dict[str, Any] | None, view: Any) -> None:
        """Commit the round's reply (``view``: the reply as the client holds it, or a callable
        giving it) and move the turn on: ``turn.done`` when the client request ends here (the
        reply has a client call or none, a strategy ended the turn, or the inner rounds are
        used up); else the next round calls the upstream again."""
        last = turn.rounds >= self.config.max_inner_rounds
        round_ = await run_sync(self.commit_sync, turn, message, usage, view, last)
        if round_.session is not turn.session:
            turn.session = round_.session
            turn.started_len.setdefault(round_.session.id, 0)
        turn.first_seq = round_.first_seq
        turn.done = round_.done
        if not round_.done:
            turn.rounds += 1
            self.metrics.child(self.metrics.inner_rounds, turn.wire.API).inc()

    async def failed(self, turn: Turn, reason: str) -> bool:
        """Report a failed upstream call to the session (its step closes with ``reason``,
        the request's credentials taken out); True when a strategy shrank the surface and asks
        for the call again."""
        return await run_sync(self.failed_sync, turn.session, ModelError(turn.scrubber.text(reason)))

    async def upstream_failed(self, turn: Turn, status: int, body: bytes, url: str) -> bool:
        """Report an upstream error status to the session; True when the call should be retried
        (a context overflow the strategies shrank, once per client request). The error body
        goes in without the request's credentials (a provider may echo a key)."""
        error = classify_http_error(status, turn.scrubber.bytes(body), url=url)
        retry = await run_sync(self.failed_sync, turn.session, error)
        if isinstance(error, ContextOverflowError):
            self.metrics.child(self.metrics.errors, "upstream_overflow").inc()
            if retry and not turn.overflow_retried:
                turn.overflow_retried = True
                return True
        else:
            self.metrics.child(self.metrics.errors, "upstream_status").inc()
        return False

    async def abandon(self, turn: Turn) -> None:
        """The client went away mid-reply: the uncommitted reply is dropped and its step closed
        (``interrupted``), so the log holds no half reply and no split pair; the turn stays
        open for the client's retry. Shielded: it runs to the end even when cancelled."""
        with anyio.CancelScope(shield=True):
            await run_sync(self.abandon_sync, turn.session)

    def count_usage(self, turn: Turn, usage: dict[str, Any] | None) -> None:
        """Add one upstream call's usage to the turn's sum and the metrics."""
        turn.usage = add_usage(turn.usage, usage)
        if usage:
            prompt = usage.get("prompt_tokens")
            if prompt is None:
                prompt = sum(
                    usage.get(k) or 0
                    for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
                )
            if isinstance(prompt, int):
                self.metrics.child(self.metrics.upstream_tokens, turn.wire.API).inc(prompt)

    def finish(self, turn: Turn) -> None:
        """A turn answered: count the compactions it committed."""
        for strategy, kind in self.compactions(turn):
            self.metrics.child(self.metrics.compactions, strategy, kind).inc()

    def compactions(self, turn: Turn) -> list[tuple[str, str]]:
        """``(strategy, kind)`` of each compaction committed in the turn's current session."""
        found = []
        session = turn.session
        since = turn.started_len.get(session.id, 0)
        kinds: dict[str, str] = {}
        for event in session.events[since:]:
            if event.type == COMPACTION_START:
                kinds[event.data["compaction_id"]] = str(event.data.get("kind", ""))
            elif event.type == COMPACTION_SUMMARY:
                found.append((str(event.data.get("strategy", "")), kinds.get(event.data["compaction_id"], "")))
        return found

    # -- the upstream ---------------------------------------------------------------------------------
    def upstream_url(self, wire: Any) -> str:
        if wire is responses_wire:
            if self.responses_base:
                return join_url(self.responses_base, responses_wire.RESPONSES_PATH)
            return join_url(self.openai_base, responses_wire.CHAT_PATH)
        base = self.openai_base if wire is openai_wire else self.anthropic_base
        return join_url(base, wire.UPSTREAM_PATH)

    @property
    def responses_upstream_kind(self) -> str:
        return responses_wire.RESPONSES if self.responses_base else responses_wire.CHAT

    def upstream_headers(self, wire: Any, headers: Any, *, stream: bool) -> dict[str, str]:
        out = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
        for name in wire.FORWARD_HEADERS:
            if name in headers:
                out[name] = headers[name]
        if wire is anthropic_wire:
            out.setdefault("anthropic-version", DEFAULT_ANTHROPIC_VERSION)
            if self.server_key:
                out["x-api-key"] = self.server_key
            else:
                for name in ("x-api-key", "authorization"):
                    if name in headers:
                        out[name] = headers[name]
        elif self.server_key:
            out["authorization"] = f"Bearer {self.server_key}"
        elif "authorization" in headers:
            out["authorization"] = headers["authorization"]
        return out

    # -- what the worker threads run --------------------------------------------------------------------
    def start_turn(self, wire: Any, key: str, client: ClientRequest, tenant: str | None = None) -> Turn:
        """Open the turn: reconcile, count the client's tokens and prepare the first round, in
        one worker-thread call (each hop to a worker thread costs about 0.1 ms of CPU).
        :class:`Foreign` (nothing done) when ``key`` is another tenant's."""
        unclaimed = tenant is not None and self._unclaimed(key, tenant)
        session, pending = self._begin(key, client, tenant)
        turn = Turn(wire, client, key, session, {session.id: len(session.events)}, pending=pending, tenant=tenant)
        try:
            turn.ready = self.prepare_sync(turn)
        except Exception as exc:  # raised again by the round that asks for it
            if isinstance(exc, EventError) and turn.pending is not None:
                raise  # the session refused the client's messages, nothing written: a 400
            turn.ready = exc
        if unclaimed and tenant is not None:  # a request the session took: the key is its tenant's now
            self._claim(key, tenant)
        turn.client_tokens = self._client_tokens(session, client)
        return turn

    def prepare_sync(self, turn: Turn) -> Request:
        """The round's request from the session (the strategies run); :class:`Overflow` when
        it exceeds the effective window after the overflow path had its chance."""
        session, client = turn.session, turn.client
        session.set_harness_system(client.system)
        if session.harness_tools != client.tools:
            session.set_harness_tools(client.tools)
        route = session.route
        if route is None or route.get("model") != client.model:
            session.set_route(self.kernel.profile.model.provider, client.model)
        if turn.pending is None and not session.turn_open:
            # the client sent nothing new and no turn is open: its last request never got its
            # reply (serve stopped mid-request, and reopening closed that turn as interrupted);
            # what it sent is on the surface, and a new turn answers it
            session.append_one(TURN_START, {"turn": session.turn + 1})
        for attempt in range(2):
            pending = turn.pending
            # defer_write: the request's events go in the reply's commit (or the step/end of a
            # failure or a disconnect): one store write per request, not two
            if pending is None:
                request = session.prepare_request(attempt=attempt, defer_write=True)
            else:
                # the client's new messages go in with the step/start: one write. A refusal
                # writes nothing and leaves turn.pending set; any later error writes them alone
                before = len(session.events)
                try:
                    trailer = [pending.record] if pending.record else []
                    request = session.prepare_request(
                        attempt=attempt, history=pending.new, trailer=trailer, defer_write=True
                    )
                finally:
                    if len(session.events) != before:
                        turn.pending = None
            pressure = request.pressure
            if pressure.tokens <= pressure.effective_window:
                break
            # the upstream never receives more than the effective window: the strategies'
            # overflow path gets one chance to shrink the surface first
            error = ContextOverflowError(
                f"ctxkernel serve: a prompt of {pressure.tokens} tokens exceeds the effective window of {pressure.effective_window}",
                prompt_tokens=pressure.tokens,
                limit=pressure.effective_window,
            )
            if not session.request_failed(error) or attempt == 1:
                raise Overflow(pressure.tokens, pressure.effective_window)
        # a client tool that shares a strategy tool's name is the client's: the strategy's is not
        # offered with it (the provider would get the name twice) and a call of it goes to the client
        own = set(session.tools.names())
        clash = own & client.tool_names if client.tools else set()
        turn.strategy_tools = own - clash if clash else own
        turn.strategy_schemas = [t for t in request.tools if t.get("function", {}).get("name") in turn.strategy_tools]
        if not client.tools and self.inject_tools == "when_client_has_tools":
            # a request that carried no tools (a title call, a plain chat) gets none of the strategies'
            turn.strategy_tools, turn.strategy_schemas = set(), []
        return request

    # -- media (worker threads) -----------------------------------------------------------------------
    def _store_media(self, messages: list[Message]) -> None:
        """Put the bytes of every medium the client sent into the store's blob table before any
        event citing them is written (content-addressed: a blob already stored is not written again)."""
        store = self.kernel.store
        for block in _media_blocks(messages):
            if block.blob is None or block.data is None or block.blob in self._stored_media:
                continue
            if store.blob_stat(block.blob) is None:
                store.blob_put(block.blob, block.data)
            self._stored_media[block.blob] = None
            while len(self._stored_media) > 4096:
                self._stored_media.popitem(last=False)

    def media_bytes(self, block: MediaBlock) -> bytes | None:
        """A medium's bytes for the upstream body: held in memory, or read back from the store;
        None when the store no longer has them."""
        if block.data is not None:
            return block.data
        if block.blob is None:
            return None
        return self.blob_bytes(block.blob)

    def blob_bytes(self, key: str) -> bytes | None:
        """A medium's bytes from the store's blob table (the last 64 MB read are kept in memory)."""
        with self._media_lock:
            data = self._media_cache.get(key)
            if data is not None:
                self._media_cache.move_to_end(key)
                return data
        data = self.kernel.store.blob_get(key)
        if data is None:
            log.warning("serve: a medium's bytes are gone from the store", blob=key)
            return None
        with self._media_lock:
            if key not in self._media_cache:
                self._media_cache[key] = data
                self._media_cache_bytes += len(data)
            while self._media_cache and self._media_cache_bytes > 64 << 20:
                _, dropped = self._media_cache.popitem(last=False)
                self._media_cache_bytes -= len(dropped)
        return data

    # -- the Responses API's kept responses (worker threads) ------------------------------------------------
    def earlier_items(self, response_id: str, owner: str) -> tuple[Conversation, list[Any]]:
        """The conversation up to and including response ``response_id`` (``kept_responses.py``)
        for the credential tagged ``owner``, and its items with their media put back."""
        conversation = self.kept.conversation(response_id, owner)
        return conversation, self.kept.items(conversation, response_id)

    def remember_response(self, turn: Turn, output: list[dict[str, Any]]) -> None:
        """Keep a Responses API response (its new input items and its output) so that a later
        request naming it as ``previous_response_id`` is answered from it; not with ``store: false``."""
        client = turn.client
        if client.body.get("store") is False:
            return
        extra, owner = client.extra, client.extra["owner"]
        previous = client.body.get("previous_response_id")
        previous_id = previous if isinstance(previous, str) else None
        items = [*extra["new_items"], *output]
        kept = False
        if extra["repeats"] and extra["after"] is not None:  # the memo proved what the input repeats
            after = (extra["after"], extra["repeats"])
            kept = self.kept.keep(turn.response_id, owner, turn.key, None, None, items, after=after)
        if not kept:
            if extra["repeats"]:  # parsed from its new items: the whole input is read for once
                try:
                    items = [*load_json_object(extra["raw"], lean=True)["input"], *output]
                except WireError as exc:
                    # the reply is the client's already: a body too dense to read whole is not
                    # kept (a later previous_response_id naming it is told there is none)
                    log.warning("serve: a response is not kept", response=turn.response_id, error=exc.message[:200])
                    return
            self.kept.keep(turn.response_id, owner, turn.key, extra.get("kept"), previous_id, items)
        if extra["remembered"] is not None:  # the next body that continues this one continues it
            extra["remembered"].tag = turn.response_id

    def commit_sync(
        self, turn: Turn, message: Message, usage: dict[str, Any] | None, view: Any, last_round: bool
    ) -> Round:
        """Commit a reply, run its strategy calls, and (when the client request ends here) put
        the client's view of the reply into the ledger: all in one worker-thread call, so a
        client that disconnects meanwhile leaves no half-done round."""
        session = turn.session
        at = len(turn.client.messages)
        names = [c.name for c in message.tool_calls]
        # known before committing: a reply with a client call, or with no call, ends the request;
        # its ledger record then goes in the same durable batch as the reply
        final = last_round or not names or any(n not in turn.strategy_tools for n in names)
        trailer = [reply_record(session, at, view() if callable(view) else view, turn.first_seq)] if final else []
        committed = session.commit_reply(message, usage=usage, trailer=trailer)
        first_seq = turn.first_seq
        if first_seq is None:
            first_seq = next(e.seq for e in reversed(session.events[-4:]) if e.type == ASSISTANT_MESSAGE)
        client_calls = [c for c in committed.tool_calls if c.name not in turn.strategy_tools]
        child = None
        for call in session.pending_calls:
            if call.name in turn.strategy_tools:
                outcome = session.run_tool(call)
                session.tool_result(call.id, outcome)
                child = outcome.continue_in or child
        ledger_for(session)
        if final:
            if child and client_calls:
                record_follow(session, child)
            elif child:
                return Round(self._follow(turn.key, session, child, turn.tenant), True, first_seq)
            return Round(session, True, first_seq)
        if session.conclude_turn:  # a strategy tool ended the turn: answer with what there is
            session.end_turn()
            session.append([reply_record(session, at, view() if callable(view) else view, first_seq)])
            ledger_for(session)
            return Round(session, True, first_seq)
        if child:
            return Round(self._follow(turn.key, session, child, turn.tenant), False, None)
        return Round(session, False, first_seq)

    def count_tokens(self, identity: Identity, client: ClientRequest) -> int:
        """What a request of ``client`` would send upstream, without taking a turn or writing:
        the session's surface and header as the last request left them plus the messages it has
        not seen (a session not started yet: the request's own count), at most the effective
        window (the strategies compact anything beyond it before the upstream is called). A
        key another tenant holds is read as the request would be served: this tenant's own."""
        self._store_media(client.messages)
        store = self.kernel.store
        key = identity.key
        owner = self._owner(key)
        if owner is not None and not same_tenant(owner, identity.tenant):
            key = tenant_key(self.secret, key, identity.tenant)
        session_id = self._route(key)["session"]
        session = self.sessions.get(session_id)
        if session is None and store.exists(session_id):
            session = self.kernel.open_session(session_id, keep_waiting_calls=True)
            self._cache(session, key)
        if session is None:
            meter = Meter(self.kernel.tokenizer)
            header = meter.count_header(client.system, client.tools)
            tokens = header + sum(meter.count_message(m) for m in client.messages)
            return min(tokens, self.kernel.profile.model.effective_window)
        ledger = ledger_for(session)
        new = client.messages[ledger.matched(client.messages, client.hashes or []) :]
        pressure = session.pressure()
        tokens = pressure.tokens + sum(session.count_message(m) for m in new)
        return min(tokens, pressure.effective_window)

    def failed_sync(self, session: Session, error: ModelError) -> bool:
        return session.request_failed(error)

    def abandon_sync(self, session: Session) -> None:
        """A client went away mid-reply: close the open step (the turn stays open)."""
        if session.step_open and not session.surface.pending_calls:
            session.abandon_step("interrupted")

    # -- tenants (in worker threads, under the key's turn) -------------------------------------------------
    def _unclaimed(self, key: str, tenant: str) -> bool:
        """True when nobody holds ``key`` yet (the request's success makes it ``tenant``'s:
        :meth:`_claim`); :class:`Foreign` when another tenant does.

        The owner is written once (``serve`` key-value ``tenant/<key>``: the keyed hash, never
        the credential) and never changes, so it is cached; the key's turn is held, so two
        requests never both find it free. A session made before keys had owners goes to the
        first tenant that names it."""
        owner = self._owner(key)
        if owner is None:
            return True
        if not same_tenant(owner, tenant):
            raise Foreign(tenant_key(self.secret, key, tenant))
        return False

    def _owner(self, key: str) -> str | None:
        """The tenant that holds ``key``, or None when nobody does yet."""
        owner = self._owners.get(key)
        if owner is None:
            found = self.kernel.store.kv_get("serve", f"tenant/{key}")
            owner = found.get("tenant") if isinstance(found, dict) else None
            if not isinstance(owner, str):
                return None
            self._remember_owner(key, owner)
        return owner

    def _claim(self, key: str, tenant: str) -> None:
        self.kernel.store.kv_put("serve", f"tenant/{key}", {"tenant": tenant})
        self._remember_owner(key, tenant)

    def _remember_owner(self, key: str, tenant: str) -> None:
        self._owners[key] = tenant
        while len(self._owners) > 16 * SESSION_CACHE:
            self._owners.popitem(last=False)

    # -- sessions (in worker threads) -------------------------------------------------------------------
    def _route_key(self, key: str) -> str:
        return f"route/{key}"

    def _route(self, key: str) -> dict[str, Any]:
        """``{"session": id, "branches": [ids]}``: the session ``key`` continues now and the
        sessions its conversations went on in (the first session of a key has the key as id)."""
        route = self._routes.get(key) if self._routes is not None else None
        if route is None:
            found = self.kernel.store.kv_get("serve", self._route_key(key))
            if isinstance(found, dict) and isinstance(found.get("session"), str):
                branches = found.get("branches")
                if not (isinstance(branches, list) and all(isinstance(b, str) for b in branches)):
                    branches = [found["session"]]
                route = {"session": found["session"], "branches": branches}
            else:
                route = {"session": key, "branches": [key]}
            if self._routes is not None:
                self._routes[key] = route
                while len(self._routes) > 16 * SESSION_CACHE:
                    del self._routes[next(iter(self._routes))]
        return route

    def _open(self, key: str, client: ClientRequest) -> Session:
        return self._session(key, self._route(key)["session"], client)

    def _session(self, key: str, session_id: str, client: ClientRequest | None = None) -> Session:
        """The session ``session_id`` (of ``key``), brought up to date; created when the store
        has none and ``client``'s history passes the pairing check (a refused request creates
        nothing)."""
        store = self.kernel.store
        session = self.sessions.get(session_id)
        if session is not None and not session.stale:
            with self._sessions_lock:
                if session_id in self.sessions:
                    self.sessions.move_to_end(session_id)
            try:
                session.refresh()  # what other workers appended (after what this object held)
            except ConflictError:
                # a request that ended without a reply left its events held here, and another
                # writer came first: they are dropped with this object, as a crash drops them
                log.info("serve: held events of an unanswered request dropped", session=session_id)
        if session is None or session.stale:  # stale: a failed write left it ahead of its log
            if store.exists(session_id):
                session = self.kernel.open_session(session_id, keep_waiting_calls=True)
            else:
                if client is not None:
                    check_history(client.messages)
                session = self.kernel.open_session(session_id, create=True, origin="serve")
            self._cache(session, key)
        return session

    def _cache(self, session: Session, key: str) -> None:
        """Keep ``session`` open as the most recently used, and close the least recently used
        beyond ``max_sessions``: never one whose key has a request in flight (the turn holds
        it; the bound is exceeded by those for as long as they last)."""
        bound = self.config.max_sessions
        with self._sessions_lock:
            sessions = self.sessions
            sessions[session.id] = session
            sessions.move_to_end(session.id)
            self._keys_of.setdefault(session.id, set()).add(key)
            if len(sessions) <= bound:
                return
            busy = self._in_flight
            for old in list(sessions)[:-1]:
                if len(sessions) <= bound:
                    break
                if busy.isdisjoint(self._keys_of.get(old, ())):
                    del sessions[old]
                    self._keys_of.pop(old, None)

    def _point(self, key: str, session: Session, tenant: str | None, *, replaces: str | None = None) -> None:
        """Point ``key`` at ``session``: a new branch (a fork keeps the one it left), or the
        session that ``replaces`` one (a strategy's continuation), or a branch it had."""
        route = self._route(key)
        branches = [b for b in route["branches"] if b not in (session.id, replaces)]
        route = {"session": session.id, "branches": [session.id, *branches][:MAX_BRANCHES]}
        self.kernel.store.kv_put("serve", self._route_key(key), route)
        if tenant is not None and session.id != key:  # the session's own id names it for its tenant only
            self._claim(session.id, tenant)
        if self._routes is not None:
            self._routes[key] = route
        self._cache(session, key)

    def _branch_for(self, key: str, session: Session, client: ClientRequest) -> Session:
        """The session of ``key`` whose client view the history continues: ``session`` (the
        current one) when it does, else another branch that does, else ``session``.

        Two clients that begin alike (one credential, system prompt and first message: two CI
        jobs running one prompt) share a key; once their histories part, the first rewrite forks
        one of them into a branch (reconcile.py), and from then on each finds its own branch
        here instead of rewriting the other's again on every request."""
        branches = self._route(key)["branches"]
        if len(branches) < 2:
            return session
        hashes = client.hashes if client.hashes is not None else [message_hash(m) for m in client.messages]
        ledger = ledger_for(session)
        if ledger.matched(client.messages, hashes) == len(ledger.hashes):
            return session
        for other in branches:
            if other == session.id or not self.kernel.store.exists(other):
                continue
            candidate = self._session(key, other)
            seen = ledger_for(candidate).hashes
            if seen and ledger_for(candidate).matched(client.messages, hashes) == len(seen):
                return candidate  # the route stays: twins take turns, and a write per turn buys nothing
        return session

    def _begin(self, key: str, client: ClientRequest, tenant: str | None) -> tuple[Session, Reconciled | None]:
        """The session this request continues, and the client's new messages when they are
        left for the first ``prepare_request`` to write (the usual case: nothing rewritten)."""
        self._store_media(client.messages)
        session = self._branch_for(key, self._open(key, client), client)
        result = reconcile(session, client.messages, client.hashes, defer=True)
        if result.rewrite == "fork":
            session.end_turn("aborted")
            child = self.kernel.open_session(create=True, parent=session.id, origin="serve:rewrite")
            log.info("client history rewritten: forked", session=session.id, child=child.id, at=result.at)
            self._point(key, child, tenant)
            session = child
            result = reconcile(session, client.messages, client.hashes, defer=True)
        ledger = ledger_for(session)
        if ledger.follow:  # the client's results decide whether to move on: write them first
            result.write(session)
            if not session.surface.pending_calls:
                session = self._follow(key, session, ledger.follow, tenant)
        return session, (result if result.record is not None else None)

    def _follow(self, key: str, session: Session, child_id: str, tenant: str | None) -> Session:
        """Continue in the child session a strategy tool switched to (ToolOutcome.continue_in)."""
        ledger = ledger_for(session)
        session.end_turn()
        child = self.kernel.open_session(child_id, keep_waiting_calls=True)
        inherit(child, ledger)
        if not child.turn_open:
            child.user(Message.user("(continuing in a new session)", Source.plugin_form("serve", "notice")))
        self._point(key, child, tenant, replaces=session.id)
        return child

    def _client_tokens(self, session: Session, client: ClientRequest) -> int:
        key = orjson.dumps([client.system, client.tools])
        tokens = self._header_tokens.get(key)
        if tokens is None:
            tokens = session.meter.count_header(client.system, client.tools)
            self._header_tokens[key] = tokens
            while len(self._header_tokens) > 64:
                self._header_tokens.popitem(last=False)
        return tokens + ledger_for(session).client_tokens


def _media_blocks(messages: list[Message]) -> list[MediaBlock]:
    found: list[MediaBlock] = []
    for message in messages:
        for block in message.content:
            if block.type == "media":
                found.append(block)
            elif block.type == "tool_result" and block.parts:
                found += [p for p in block.parts if p.type == "media"]
    return found


class StreamedError(UpstreamError):
    """An error the upstream reported inside its stream; ``error`` is its error object (bounded),
    passed on to the client with its type."""

    def __init__(self, error: dict[str, Any], scrubber: Scrubber | None = None) -> None:
        self.error = bounded_error(error, scrubber)
        super().__init__(f"the upstream stream reported an error: {orjson.dumps(self.error).decode()[:500]}")


def bounded_error(error: Any, scrubber: Scrubber | None = None) -> dict[str, Any]:
    """An upstream error object cut to the fields a client reads, each bounded; ``scrubber``
    takes the request's credentials out first (a key cut in two is no longer found whole)."""
    error = error if isinstance(error, dict) else {"message": str(error)}
    scrub = scrubber.text if scrubber is not None else str
    out: dict[str, Any] = {}
    for key in ("type", "code", "param"):
        value = error.get(key)
        if isinstance(value, str) and value:
            out[key] = scrub(value)[:200]
    message = error.get("message")
    out["message"] = scrub(message)[:2000] if isinstance(message, str) else "upstream error"
    out.setdefault("type", "api_error")
    return out


def stream_error(wire: Any, translator: Any, data: dict[str, Any]) -> dict[str, Any] | None:
    """The error object an upstream stream event reports, or None."""
    if wire is responses_wire:
        error: dict[str, Any] | None = translator.upstream_error(data)
        return error
    if wire is openai_wire:
        return data.get("error")
    if data.get("type") == "error":
        error = data.get("error")
        return error if isinstance(error, dict) else {"message": str(error)}
    return None

"""The ``ctxkernel serve`` ASGI app: an OpenAI Chat Completions and Anthropic Messages proxy.

One client request, in order (docs/serve.md has the long form)::

    parse + check the body (400 in the API's own error shape, naming the field)
    session key: X-Ctxkernel-Session, else a fingerprint (identity.py)
    take the session's turn: an asyncio lock per key; on postgres also an advisory lock, so that
        several processes order one session's requests; waiting is bounded (--lock-wait), then 409
    reconcile: find the client's new messages (reconcile.py)
    loop (bounded):
        prepare_request()  → the new messages and the step/start are folded, not written: the
                             reply's commit (or a failure's or a disconnect's step/end) writes
                             them with it, one store write per request; the upstream body:
                             managed messages, client + strategy tools
            refused before sending when it exceeds the effective window and the strategies
            cannot shrink it
        upstream call      → provider error: request_failed(); on context overflow the
                             strategy's overflow path runs and the call is retried once
        commit_reply()     → strategy-owned tool calls run here (run_tool + tool_result)
        only strategy calls → call the upstream again; otherwise answer the client with its
                             own calls only
    the reply as the client holds it goes into the ledger

The front door is thin (STYLE.md #15): every context decision is the Session API's. Session
calls are synchronous (fsync, tokenising): they run in worker threads (``workers.run_sync``,
``anyio.to_thread.run_sync``'s contract at half its cost), one at a time per session because of
the lock above.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import weakref
from collections import OrderedDict
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route

from ..errors import ConflictError, ContextOverflowError, CtxKernelError, EventError, ModelError
from ..events import ASSISTANT_MESSAGE, COMPACTION_START, COMPACTION_SUMMARY, TURN_START
from ..kernel import Kernel
from ..logging import get_logger
from ..messages import MediaBlock, Message, Source
from ..meter import Meter
from ..models.openai_http import classify_http_error
from ..profile import load_profile, override_window
from ..session import Request, Session
from . import anthropic_wire, openai_wire, responses_wire
from .identity import SESSION_HEADER, session_key
from .metrics import Metrics
from .reconcile import Reconciled, inherit, kept, ledger_for, reconcile, record_follow, reply_record
from .upstream import Limits, Upstream, UpstreamError, join_url
from .wire import MAX_BODY_BYTES, ClientRequest, MessageMemo, WireError, add_usage, iter_sse
from .workers import run_sync

log = get_logger("ctxkernel.serve")

DEFAULT_OPENAI_UPSTREAM = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_UPSTREAM = "https://api.anthropic.com"
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
#: sessions kept open in memory; others are reopened from the store (snapshot + tail)
SESSION_CACHE = 256


@dataclass
class ServeConfig:
    """What ``ctxkernel serve`` was started with (the CLI flags)."""

    profile: str = "basic"
    window: int | None = None
    upstream: str | None = None
    anthropic_upstream: str | None = None
    responses_upstream: str | None = None
    api_key_env: str | None = None
    lock_wait_seconds: float = 30.0
    max_inner_rounds: int = 8
    limits: Limits = field(default_factory=Limits)

    def to_json(self) -> str:
        data = {
            k: getattr(self, k)
            for k in (
                "profile",
                "window",
                "upstream",
                "anthropic_upstream",
                "responses_upstream",
                "api_key_env",
                "lock_wait_seconds",
                "max_inner_rounds",
            )
        }
        data["limits"] = self.limits.__dict__
        return orjson.dumps(data).decode()

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        data = orjson.loads(text)
        limits = Limits(**data.pop("limits", {}))
        return cls(**data, limits=limits)


class Overflow(Exception):
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
    """A held session turn: the in-process lock and, on postgres, the advisory lock."""

    def __init__(self, lock: anyio.Semaphore, advisory: Any) -> None:
        self._lock: anyio.Semaphore | None = lock
        self._advisory = advisory

    async def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            if self._advisory is not None:
                with anyio.CancelScope(shield=True):
                    await run_sync(self._advisory.release)
        finally:
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
        self.openai_base = config.upstream or profile_serve.upstream or DEFAULT_OPENAI_UPSTREAM
        self.anthropic_base = (
            config.anthropic_upstream or profile_serve.anthropic_upstream or DEFAULT_ANTHROPIC_UPSTREAM
        )
        #: a Responses API upstream; without one, Responses clients are translated to Chat Completions
        self.responses_base = config.responses_upstream or profile_serve.responses_upstream
        self.inject_tools = profile_serve.inject_tools
        self._stored_media: OrderedDict[str, None] = OrderedDict()
        self._media_cache: OrderedDict[str, bytes] = OrderedDict()
        self._media_cache_bytes = 0
        self._responses: OrderedDict[str, tuple[str, list[Any]]] = OrderedDict()
        self.server_key: str | None = None
        key_env = config.api_key_env or profile_serve.api_key_env
        if key_env:
            self.server_key = os.environ.get(key_env)
            if not self.server_key:
                msg = f"--api-key-env {key_env}: the variable is not set or empty"
                raise CtxKernelError(msg)
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self._turns = TurnLocks()
        self._header_tokens: OrderedDict[bytes, int] = OrderedDict()
        self.memo = MessageMemo()
        # routes read from the store on every request when other processes may move them (a
        # store that orders requests across processes); else this process is their only writer
        self._routes: dict[str, str] | None = None if hasattr(kernel.store, "hold_lock") else {}

    # -- locks ---------------------------------------------------------------------------------------
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
        return Lease(lock, advisory)

    # -- sessions (these run in worker threads) -------------------------------------------------------
    def _route_key(self, key: str) -> str:
        return f"route/{key}"

    def _open(self, key: str) -> Session:
        store = self.kernel.store
        session_id = self._routes.get(key) if self._routes is not None else None
        if session_id is None:
            route = store.kv_get("serve", self._route_key(key))
            session_id = route["session"] if isinstance(route, dict) and isinstance(route.get("session"), str) else key
            if self._routes is not None:
                self._routes[key] = session_id
                while len(self._routes) > 16 * SESSION_CACHE:
                    del self._routes[next(iter(self._routes))]
        session = self.sessions.get(session_id)
        if session is not None and not session.stale:
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
                session = self.kernel.open_session(session_id, create=True, origin="serve")
            self._cache(session)
        return session

    def _cache(self, session: Session) -> None:
        self.sessions[session.id] = session
        self.sessions.move_to_end(session.id)
        while len(self.sessions) > SESSION_CACHE:
            self.sessions.popitem(last=False)

    def _point(self, key: str, session: Session) -> None:
        self.kernel.store.kv_put("serve", self._route_key(key), {"session": session.id})
        if self._routes is not None:
            self._routes[key] = session.id
        self._cache(session)

    def _start(self, wire: Any, key: str, client: ClientRequest) -> Turn:
        """Open the turn: reconcile, count the client's tokens and prepare the first round, in
        one worker-thread call (each hop to a worker thread costs about 0.1 ms of CPU)."""
        session, pending = self._begin(key, client)
        turn = Turn(wire, client, key, session, {session.id: len(session.events)}, pending=pending)
        try:
            turn.ready = self._prepare(turn)
        except Exception as exc:  # noqa: BLE001 - raised again by the round that asks for it
            if isinstance(exc, EventError) and turn.pending is not None:
                raise  # the session refused the client's messages, nothing written: a 400
            turn.ready = exc
        turn.client_tokens = self._client_tokens(session, client)
        return turn

    async def prepared(self, turn: Turn) -> Request:
        """The round's request: the one prepared with the turn, or a new one (later rounds)."""
        ready, turn.ready = turn.ready, None
        if ready is None:
            return await run_sync(self._prepare, turn)
        if isinstance(ready, BaseException):
            raise ready
        return ready

    def _begin(self, key: str, client: ClientRequest) -> tuple[Session, Reconciled | None]:
        """The session this request continues, and the client's new messages when they are
        left for the first ``prepare_request`` to write (the usual case: nothing rewritten)."""
        self._store_media(client.messages)
        session = self._open(key)
        result = reconcile(session, client.messages, client.hashes, defer=True)
        if result.rewrite == "fork":
            session.end_turn("aborted")
            child = self.kernel.open_session(create=True, parent=session.id, origin="serve:rewrite")
            log.info("client history rewritten: forked", session=session.id, child=child.id, at=result.at)
            self._point(key, child)
            session = child
            result = reconcile(session, client.messages, client.hashes, defer=True)
        ledger = ledger_for(session)
        if ledger.follow:  # the client's results decide whether to move on: write them first
            result.write(session)
            if not session.surface.pending_calls:
                session = self._follow(key, session, ledger.follow)
        return session, (result if result.record is not None else None)

    def _follow(self, key: str, session: Session, child_id: str) -> Session:
        """Continue in the child session a strategy tool switched to (ToolOutcome.continue_in)."""
        ledger = ledger_for(session)
        session.end_turn()
        child = self.kernel.open_session(child_id, keep_waiting_calls=True)
        inherit(child, ledger)
        if not child.turn_open:
            child.user(Message.user("(continuing in a new session)", Source.plugin_form("serve", "notice")))
        self._point(key, child)
        return child

    def _prepare(self, turn: Turn) -> Request:
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
        turn.strategy_tools = set(session.tools.names())
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
        """A medium's bytes for the upstream body: held in memory, or read back from the store
        (the last 64 MB read are kept); None when the store no longer has them."""
        if block.data is not None:
            return block.data
        if block.blob is None:
            return None
        data = self._media_cache.get(block.blob)
        if data is not None:
            self._media_cache.move_to_end(block.blob)
            return data
        data = self.kernel.store.blob_get(block.blob)
        if data is None:
            log.warning("serve: a medium's bytes are gone from the store", blob=block.blob)
            return None
        self._media_cache[block.blob] = data
        self._media_cache_bytes += len(data)
        while self._media_cache and self._media_cache_bytes > 64 << 20:
            _, dropped = self._media_cache.popitem(last=False)
            self._media_cache_bytes -= len(dropped)
        return data

    # -- the Responses API's stored responses (worker threads) ----------------------------------------------
    def earlier_items(self, response_id: str) -> tuple[str, list[Any]]:
        """The session key and the items (inputs and outputs) of the conversation up to and
        including response ``response_id``, from what :meth:`remember_response` kept."""
        cached = self._responses.get(response_id)
        if cached is not None:
            return cached
        chain: list[dict[str, Any]] = []
        key: str | None = None
        current: str | None = response_id
        while current is not None:
            hit = self._responses.get(current)
            if hit is not None:
                key = key or hit[0]
                break
            if not responses_wire.RESPONSE_ID.fullmatch(current) or len(chain) >= MAX_RESPONSE_CHAIN:
                raise responses_wire.unknown_response(response_id)
            record = self.kernel.store.kv_get("serve", f"response/{current}")
            if not isinstance(record, dict):
                raise responses_wire.unknown_response(response_id)
            key = key or record.get("key")
            chain.append(record)
            current = record.get("previous")
        items: list[Any] = list(hit[1]) if current is not None and hit is not None else []
        for record in reversed(chain):
            items += list(record.get("input") or []) + list(record.get("output") or [])
        if not isinstance(key, str):
            raise responses_wire.unknown_response(response_id)
        self._remember_items(response_id, key, items)
        return key, items

    def _remember_items(self, response_id: str, key: str, items: list[Any]) -> None:
        self._responses[response_id] = (key, items)
        while len(self._responses) > 64:
            self._responses.popitem(last=False)

    def remember_response(self, turn: Turn, output: list[dict[str, Any]]) -> None:
        """Keep a Responses API response (its new input items and its output) so that a later
        request naming it as ``previous_response_id`` is answered from it; not with ``store: false``."""
        client = turn.client
        if client.body.get("store") is False:
            return
        previous = client.body.get("previous_response_id")
        record = {
            "key": turn.key,
            "previous": previous if isinstance(previous, str) else None,
            "input": client.extra.get("new_items") or [],
            "output": output,
        }
        self.kernel.store.kv_put("serve", f"response/{turn.response_id}", record)
        self._remember_items(turn.response_id, turn.key, [*(client.extra.get("items") or []), *output])

    def _commit(self, turn: Turn, message: Message, usage: dict[str, Any] | None, view: Any, last_round: bool) -> Round:
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
            if session.owns_tool(call.name):
                outcome = session.run_tool(call)
                session.tool_result(call.id, outcome)
                child = outcome.continue_in or child
        ledger_for(session)
        if final:
            if child and client_calls:
                record_follow(session, child)
            elif child:
                return Round(self._follow(turn.key, session, child), True, first_seq)
            return Round(session, True, first_seq)
        if session.conclude_turn:  # a strategy tool ended the turn: answer with what there is
            session.end_turn()
            session.append([reply_record(session, at, view() if callable(view) else view, first_seq)])
            ledger_for(session)
            return Round(session, True, first_seq)
        if child:
            return Round(self._follow(turn.key, session, child), False, None)
        return Round(session, False, first_seq)

    def count_tokens(self, key: str, client: ClientRequest) -> int:
        """What a request of ``client`` would send upstream, without taking a turn or writing:
        the session's surface and header as the last request left them plus the messages it has
        not seen (a session not started yet: the request's own count), at most the effective
        window (the strategies compact anything beyond it before the upstream is called)."""
        self._store_media(client.messages)
        store = self.kernel.store
        route = store.kv_get("serve", self._route_key(key))
        session_id = route["session"] if isinstance(route, dict) and isinstance(route.get("session"), str) else key
        session = self.sessions.get(session_id)
        if session is None and store.exists(session_id):
            session = self.kernel.open_session(session_id, keep_waiting_calls=True)
            self._cache(session)
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

    def _failed(self, session: Session, error: ModelError) -> bool:
        return session.request_failed(error)

    def _abandon(self, session: Session) -> None:
        """A client went away mid-reply: close the open step (the turn stays open)."""
        if session.step_open and not session.surface.pending_calls:
            session.abandon_step("interrupted")

    def _client_tokens(self, session: Session, client: ClientRequest) -> int:
        key = orjson.dumps([client.system, client.tools])
        tokens = self._header_tokens.get(key)
        if tokens is None:
            tokens = session.meter.count_header(client.system, client.tools)
            self._header_tokens[key] = tokens
            while len(self._header_tokens) > 64:
                self._header_tokens.popitem(last=False)
        return tokens + ledger_for(session).client_tokens

    def _count_compactions(self, turn: Turn) -> list[tuple[str, str]]:
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

    # -- the upstream -----------------------------------------------------------------------------------
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


#: how many stored responses a ``previous_response_id`` chain may walk back
MAX_RESPONSE_CHAIN = 100_000


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

    def __init__(self, error: dict[str, Any]) -> None:
        self.error = bounded_error(error)
        super().__init__(f"the upstream stream reported an error: {orjson.dumps(self.error).decode()[:500]}")


def bounded_error(error: Any) -> dict[str, Any]:
    """An upstream error object cut to the fields a client reads, each bounded."""
    error = error if isinstance(error, dict) else {"message": str(error)}
    out: dict[str, Any] = {}
    for key in ("type", "code", "param"):
        value = error.get(key)
        if isinstance(value, str) and value:
            out[key] = value[:200]
    message = error.get("message")
    out["message"] = message[:2000] if isinstance(message, str) else "upstream error"
    out.setdefault("type", "api_error")
    return out


def stream_error(wire: Any, translator: Any, data: dict[str, Any]) -> dict[str, Any] | None:
    """The error object an upstream stream event reports, or None."""
    if wire is responses_wire:
        return translator.upstream_error(data)
    if wire is openai_wire:
        return data["error"] if "error" in data else None
    if data.get("type") == "error":
        error = data.get("error")
        return error if isinstance(error, dict) else {"message": str(error)}
    return None


def wire_cache(turn: Turn) -> dict[Any, Any]:
    """The session's cache of surface nodes in the turn's wire format."""
    return kept(turn.session).wire.setdefault(turn.wire.API, {})


# -- responses -------------------------------------------------------------------------------------------
class JSONBody(Response):
    """A JSON response encoded by orjson, straight to bytes (Starlette's ``JSONResponse`` goes
    through the standard library's encoder and a ``str``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(wire: Any, error: WireError) -> JSONBody:
    return JSONBody(
        wire.error_body(error.message, kind=error.kind, param=error.param, code=error.code), status_code=error.status
    )


#: an upstream error's headers that tell a client whether and when to retry, passed on as they came
RETRY_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry")


def passthrough_error(wire: Any, status: int, body: bytes, headers: Any = None) -> Response:
    """An upstream error for the client: its status, its body when that is JSON, else our shape;
    its retry headers (:data:`RETRY_HEADERS`) as they came."""
    extra = {}
    for name in RETRY_HEADERS:
        if headers is not None and name in headers:
            extra[name] = headers[name][:200]
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
        return JSONBody(wire.error_body(f"upstream error: {text}", kind="api_error"), status_code=status, headers=extra)
    return Response(body, status_code=status, media_type="application/json", headers=extra)


async def read_body(request: HTTPRequest) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise WireError(
            413, f"the request body has {length} bytes; the limit is {MAX_BODY_BYTES}", kind="request_too_large"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise WireError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", kind="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


class Handler:
    """The HTTP side: one method per route, each in the API's own shapes."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def chat_completions(self, request: HTTPRequest) -> Response:
        return await self._handle(openai_wire, "/v1/chat/completions", request)

    async def messages(self, request: HTTPRequest) -> Response:
        return await self._handle(anthropic_wire, "/v1/messages", request)

    async def responses(self, request: HTTPRequest) -> Response:
        return await self._handle(responses_wire, "/v1/responses", request)

    async def count_tokens(self, request: HTTPRequest) -> Response:
        """``POST /v1/messages/count_tokens``: the tokens serve would send for this request: the
        session's managed surface (its strategies' header included) plus the messages it has not
        seen; at most the effective window, which serve never exceeds upstream."""
        metrics = self.proxy.metrics
        wire = anthropic_wire
        try:
            client = anthropic_wire.parse_request(await read_body(request), self.proxy.memo, count_only=True)
            key = session_key(request.headers, wire.API, client.system, client.messages)
            tokens = await run_sync(self.proxy.count_tokens, key, client)
            response: Response = JSONBody({"input_tokens": tokens})
        except WireError as error:
            metrics.child(metrics.errors, "bad_request").inc()
            response = error_response(wire, error)
        except Exception as exc:  # reported to the client in its API's shape, and logged
            log.exception("serve: count_tokens failed", error=f"{type(exc).__name__}: {exc}"[:500])
            metrics.child(metrics.errors, "internal").inc()
            response = JSONBody(
                wire.error_body(f"ctxkernel serve: internal error: {type(exc).__name__}"[:1000], kind="api_error"),
                status_code=500,
            )
        metrics.child(metrics.requests, "/v1/messages/count_tokens", str(response.status_code)).inc()
        return response

    async def _handle(self, wire: Any, route: str, request: HTTPRequest) -> Response:
        metrics = self.proxy.metrics
        try:
            response = await self._serve(wire, request)
        except WireError as error:
            metrics.child(metrics.errors, "busy" if error.status == 409 else "bad_request").inc()
            response = error_response(wire, error)
        except Exception as exc:  # reported to the client in its API's shape, and logged
            log.exception("serve: request failed", route=route, error=f"{type(exc).__name__}: {exc}"[:500])
            metrics.child(metrics.errors, "internal").inc()
            response = JSONBody(
                wire.error_body(
                    f"ctxkernel serve: internal error: {type(exc).__name__}: {exc}"[:1000], kind="api_error"
                ),
                status_code=500,
            )
        metrics.child(metrics.requests, route, str(response.status_code)).inc()
        return response

    async def _serve(self, wire: Any, request: HTTPRequest) -> Response:
        proxy = self.proxy
        raw = await read_body(request)
        known_key = None
        if wire is responses_wire:
            body = responses_wire.load_body(raw)
            previous = body.get("previous_response_id")
            earlier = None
            if previous is not None:
                if not isinstance(previous, str):
                    raise WireError(400, "previous_response_id: expected a string", param="previous_response_id")
                known_key, earlier = await run_sync(proxy.earlier_items, previous)
            client = responses_wire.parse_request(
                body, proxy.memo, earlier=earlier, upstream=proxy.responses_upstream_kind
            )
        else:
            client = wire.parse_request(raw, proxy.memo)
        client.extra["media"] = proxy.media_bytes
        if known_key is not None and SESSION_HEADER not in request.headers:
            key = known_key
        else:
            key = session_key(request.headers, wire.API, client.system, client.messages)
        lease = await proxy.acquire(key)
        handed_over = False
        try:
            try:
                turn = await run_sync(proxy._start, wire, key, client)
            except (EventError, CtxKernelError) as exc:
                if isinstance(exc, EventError):
                    raise WireError(400, f"messages: {exc}", param="messages") from None
                raise
            proxy.metrics.child(proxy.metrics.client_tokens, wire.API).inc(turn.client_tokens)
            if wire is responses_wire:
                turn.response_id = responses_wire.new_id("resp")
            if client.stream:
                response = await self._stream(turn, request, lease)
                handed_over = isinstance(response, StreamingResponse)
                return response
            return await self._complete(turn, request)
        finally:
            if not handed_over:
                await lease.release()

    # -- non-streaming -------------------------------------------------------------------------------------
    async def _complete(self, turn: Turn, request: HTTPRequest) -> Response:
        proxy, wire = self.proxy, turn.wire
        url = proxy.upstream_url(wire)
        headers = proxy.upstream_headers(wire, request.headers, stream=False)
        text_parts: list[str] = []
        blocks: list[dict[str, Any]] = []
        client_calls: list[dict[str, Any]] = []
        output: list[dict[str, Any]] = []  # the Responses API's client items
        created = time.time()
        while True:
            try:
                prepared = await proxy.prepared(turn)
            except Overflow as over:
                proxy.metrics.child(proxy.metrics.errors, "window_refused").inc()
                return JSONBody(wire.overflow_error(over.tokens, over.window), status_code=400)
            body = wire.upstream_payload(
                turn.client, prepared, turn.strategy_schemas, stream=False, cache=wire_cache(turn)
            )
            try:
                answer = await proxy.upstream.request("POST", url, headers, body)
            except UpstreamError as exc:
                await run_sync(proxy._failed, turn.session, ModelError(str(exc)))
                proxy.metrics.child(proxy.metrics.errors, "upstream_unreachable").inc()
                return JSONBody(wire.error_body(str(exc), kind="api_error"), status_code=exc.status)
            proxy.metrics.child(proxy.metrics.upstream_latency, wire.API).observe(answer.seconds)
            if answer.status >= 400:
                if await self._upstream_failed(turn, answer.status, answer.body, url):
                    continue
                return passthrough_error(wire, answer.status, answer.body, answer.headers)
            try:
                payload = answer.json()
                if wire is responses_wire:
                    message, usage, raw = responses_wire.read_reply(payload, turn.client.extra["upstream"])
                else:
                    message, usage, raw = wire.read_reply(payload)
            except ValueError as exc:
                await run_sync(proxy._failed, turn.session, ModelError(f"unreadable upstream reply: {exc}"))
                proxy.metrics.child(proxy.metrics.errors, "upstream_unreadable").inc()
                return JSONBody(
                    wire.error_body(f"the upstream sent an unreadable reply: {exc}"[:1000], kind="api_error"),
                    status_code=502,
                )
            self._count_usage(turn, usage)
            names = turn.strategy_tools
            if wire is openai_wire:
                content = raw.get("content")
                if isinstance(content, str) and content:
                    text_parts.append(content)
                client_calls += [c for c in openai_wire.raw_calls(raw) if openai_wire.call_name(c) not in names]
                view = openai_wire.client_view("\n\n".join(text_parts), client_calls)
            elif wire is responses_wire:
                if turn.client.extra["upstream"] == responses_wire.CHAT:
                    output += responses_wire.chat_output_items(raw, names, turn.client.extra["custom"])
                else:
                    output += responses_wire.visible_items(raw.get("output") or [], names)
                view = responses_wire.client_view(output)
            else:
                blocks += anthropic_wire.visible_blocks(raw, names)
                view = anthropic_wire.client_view(blocks)
            last = turn.rounds >= proxy.config.max_inner_rounds
            round_ = await run_sync(proxy._commit, turn, message, usage, view, last)
            self._advance(turn, round_)
            if round_.done:
                break
        self._finish_metrics(turn)
        if wire is openai_wire:
            out = openai_wire.client_reply(payload, "\n\n".join(text_parts), client_calls, turn.usage)
        elif wire is responses_wire:
            base = None
            if turn.client.extra["upstream"] == responses_wire.RESPONSES:
                base = {k: v for k, v in payload.items() if k not in ("output", "usage", "previous_response_id")}
            out = responses_wire.response_object(
                turn.client, output, turn.usage, response_id=turn.response_id, created=created, base=base
            )
            await run_sync(proxy.remember_response, turn, output)
        else:
            out = anthropic_wire.client_reply(payload, blocks, turn.usage)
        return JSONBody(
            out, headers={"x-ctxkernel-session": turn.session.id, "x-ctxkernel-upstream-calls": str(turn.rounds + 1)}
        )

    def _advance(self, turn: Turn, round_: Round) -> None:
        if round_.session is not turn.session:
            turn.session = round_.session
            turn.started_len.setdefault(round_.session.id, 0)
        turn.first_seq = round_.first_seq
        if not round_.done:
            turn.rounds += 1
            self.proxy.metrics.child(self.proxy.metrics.inner_rounds, turn.wire.API).inc()

    def _count_usage(self, turn: Turn, usage: dict[str, Any] | None) -> None:
        turn.usage = add_usage(turn.usage, usage)
        if usage:
            prompt = usage.get("prompt_tokens")
            if prompt is None:
                prompt = sum(
                    usage.get(k) or 0
                    for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
                )
            if isinstance(prompt, int):
                self.proxy.metrics.child(self.proxy.metrics.upstream_tokens, turn.wire.API).inc(prompt)

    def _finish_metrics(self, turn: Turn) -> None:
        for strategy, kind in self.proxy._count_compactions(turn):
            self.proxy.metrics.child(self.proxy.metrics.compactions, strategy, kind).inc()

    async def _upstream_failed(self, turn: Turn, status: int, body: bytes, url: str) -> bool:
        """Report an upstream error to the session; True when the call should be retried (a
        context overflow the strategies shrank, once per client request)."""
        error = classify_http_error(status, body, url=url)
        retry = await run_sync(self.proxy._failed, turn.session, error)
        if isinstance(error, ContextOverflowError):
            self.proxy.metrics.child(self.proxy.metrics.errors, "upstream_overflow").inc()
            if retry and not turn.overflow_retried:
                turn.overflow_retried = True
                return True
        else:
            self.proxy.metrics.child(self.proxy.metrics.errors, "upstream_status").inc()
        return False

    # -- streaming ------------------------------------------------------------------------------------------
    async def _open_round(self, turn: Turn, request: HTTPRequest, stack: AsyncExitStack) -> Any:
        """Prepare and open one streamed upstream call; returns the stream handle, or a
        :class:`WireError`/(status, body, headers) describing why there is none."""
        proxy, wire = self.proxy, turn.wire
        url = proxy.upstream_url(wire)
        headers = proxy.upstream_headers(wire, request.headers, stream=True)
        while True:
            try:
                prepared = await proxy.prepared(turn)
            except Overflow as over:
                proxy.metrics.child(proxy.metrics.errors, "window_refused").inc()
                return (400, orjson.dumps(wire.overflow_error(over.tokens, over.window)), None)
            body = wire.upstream_payload(
                turn.client, prepared, turn.strategy_schemas, stream=True, cache=wire_cache(turn)
            )
            try:
                handle = await stack.enter_async_context(proxy.upstream.stream(url, headers, body))
            except UpstreamError as exc:
                await run_sync(proxy._failed, turn.session, ModelError(str(exc)))
                proxy.metrics.child(proxy.metrics.errors, "upstream_unreachable").inc()
                return (exc.status, orjson.dumps(wire.error_body(str(exc), kind="api_error")), None)
            if handle.status < 400:
                return handle
            status, error_body, error_headers = handle.status, handle.body, handle.headers
            await stack.aclose()
            if await self._upstream_failed(turn, status, error_body, url):
                continue
            return (status, error_body, error_headers)

    async def _stream(self, turn: Turn, request: HTTPRequest, lease: Lease) -> Response:
        proxy, wire = self.proxy, turn.wire
        stack = AsyncExitStack()
        opened = await self._open_round(turn, request, stack)
        if isinstance(opened, tuple):
            await stack.aclose()
            return passthrough_error(wire, *opened)
        if wire is responses_wire:
            translator = responses_wire.StreamTranslator(turn.client, turn.strategy_tools, response_id=turn.response_id)
        else:
            translator = wire.StreamTranslator(turn.client.include_usage, turn.strategy_tools)

        async def pump() -> Any:
            handle = opened
            committed = True
            try:
                while True:
                    translator.strategy_tools = turn.strategy_tools
                    translator.begin_round()
                    committed = False
                    async for event in iter_sse(handle.lines()):
                        if event.data == "[DONE]":
                            break
                        try:
                            data = orjson.loads(event.data)
                        except orjson.JSONDecodeError:
                            raise UpstreamError("the upstream stream sent an event that is not JSON") from None
                        if not isinstance(data, dict):
                            continue
                        error = stream_error(wire, translator, data)
                        if error is not None:
                            raise StreamedError(error)
                        chunks = (
                            translator.feed(data) if wire is openai_wire else translator.feed_event(event.event, data)
                        )
                        for chunk in chunks:
                            yield chunk
                    if not translator.round_complete:  # a cut connection is not a reply
                        raise UpstreamError("the upstream stream ended before the reply was complete")
                    proxy.metrics.child(proxy.metrics.upstream_latency, wire.API).observe(handle.seconds)
                    await stack.aclose()
                    out, message, usage, _ = translator.end_round()
                    for chunk in out:
                        yield chunk
                    self._count_usage(turn, usage)
                    last = turn.rounds >= proxy.config.max_inner_rounds
                    round_ = await run_sync(proxy._commit, turn, message, usage, translator.client_view, last)
                    committed = True
                    self._advance(turn, round_)
                    if round_.done:
                        break
                    opened_next = await self._open_round(turn, request, stack)
                    if isinstance(opened_next, tuple):
                        status, body, _ = opened_next
                        for chunk in translator.error_event(
                            f"upstream error (HTTP {status}): {body.decode('utf-8', 'replace')[:500]}"
                        ):
                            yield chunk
                        return
                    handle = opened_next
                if wire is responses_wire:
                    await run_sync(proxy.remember_response, turn, translator.output)
                for chunk in translator.finish_stream():
                    yield chunk
                self._finish_metrics(turn)
            except UpstreamError as exc:
                proxy.metrics.child(proxy.metrics.errors, "upstream_stream").inc()
                if not committed:
                    with anyio.CancelScope(shield=True):
                        await run_sync(proxy._failed, turn.session, ModelError(str(exc)))
                    committed = True
                # an error the upstream reported keeps its type (an overloaded_error stays one)
                chunks = (
                    translator.passthrough_error(exc.error)
                    if isinstance(exc, StreamedError)
                    else translator.error_event(str(exc))
                )
                for chunk in chunks:
                    yield chunk
            finally:
                # a client that went away mid-stream: the uncommitted reply is dropped and its
                # step closed, so the log holds no half reply and no split pair
                with anyio.CancelScope(shield=True):
                    if not committed:
                        proxy.metrics.child(proxy.metrics.errors, "client_disconnected").inc()
                        await run_sync(proxy._abandon, turn.session)
                    await stack.aclose()
                    await lease.release()

        return StreamingResponse(
            pump(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-ctxkernel-session": turn.session.id},
        )

    # -- the rest ---------------------------------------------------------------------------------------------
    async def models(self, request: HTTPRequest) -> Response:
        proxy = self.proxy
        anthropic = "x-api-key" in request.headers or "anthropic-version" in request.headers
        wire = anthropic_wire if anthropic else openai_wire
        base = proxy.anthropic_base if anthropic else proxy.openai_base
        url = join_url(base, "/v1/models" if anthropic else "/models")
        headers = proxy.upstream_headers(wire, request.headers, stream=False)
        headers.pop("content-type", None)
        try:
            answer = await proxy.upstream.request("GET", url, headers)
        except UpstreamError as exc:
            response: Response = JSONBody(wire.error_body(str(exc), kind="api_error"), status_code=exc.status)
        else:
            response = Response(answer.body, status_code=answer.status, media_type="application/json")
        proxy.metrics.child(proxy.metrics.requests, "/v1/models", str(response.status_code)).inc()
        return response

    async def healthz(self, request: HTTPRequest) -> Response:
        kernel = self.proxy.kernel
        return JSONBody({"status": "ok", "profile": kernel.profile.name, "store": kernel.store.backend})

    async def metrics(self, request: HTTPRequest) -> Response:
        body, content_type = self.proxy.metrics.render()
        return Response(body, media_type=content_type)


def ui_mount(kernel: Kernel) -> list[Mount]:
    """The web inspector at ``/ui`` when the ``ui`` extra (Jinja2) is installed, else nothing."""
    # imported here, not at the top: the inspector's dependencies are an extra of their own
    try:
        from ..ui import create_app as create_ui_app
    except ImportError as exc:
        log.info("serve.ui_not_mounted", reason=str(exc))
        return []
    return [Mount("/ui", app=create_ui_app(kernel=kernel))]


def build_kernel(config: ServeConfig) -> Kernel:
    profile = load_profile(config.profile)
    if config.window is not None:
        override_window(profile, config.window)
    return Kernel(profile)


def create_app(config: ServeConfig | None = None, *, kernel: Kernel | None = None) -> Starlette:
    """The Starlette app of ``ctxkernel serve``."""
    config = config or ServeConfig()
    kernel = kernel or build_kernel(config)
    upstream = Upstream(config.limits)
    proxy = Proxy(config, kernel, upstream)
    handler = Handler(proxy)
    chat = {
        "/v1/chat/completions": handler.chat_completions,
        "/chat/completions": handler.chat_completions,
        "/v1/messages": handler.messages,
        "/v1/responses": handler.responses,
        "/responses": handler.responses,
    }
    routes = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in chat.items()),
        Route("/v1/messages/count_tokens", handler.count_tokens, methods=["POST"]),
        Route("/v1/models", handler.models, methods=["GET"]),
        Route("/healthz", handler.healthz, methods=["GET"]),
        Route("/metrics", handler.metrics, methods=["GET"]),
        *ui_mount(kernel),
    ]

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        try:
            yield
        finally:
            await upstream.aclose()
            kernel.store.close()

    app = ServeApp(chat, routes=routes, lifespan=lifespan)
    app.state.proxy = proxy
    return app


class ServeApp(Starlette):
    """The Starlette app, with the chat routes' POSTs handed to their handler directly.

    A chat request is most of what ``serve`` answers, and its handler already answers every
    error in the API's own shape, so Starlette's error and exception middleware and its route
    matching have nothing to add to it (about 0.1 ms a request: ``bench_serve.py``); every other
    request, and a chat path under a ``root_path``, goes through Starlette as routed above."""

    def __init__(self, chat: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat = chat

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handle = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handle = self.chat.get(scope["path"])
        if handle is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        response = await handle(HTTPRequest(scope, receive))
        await response(scope, receive, send)


def settle_heap() -> None:
    """Move what the process holds once started (modules, classes, the profile, the tokenizer)
    out of the cyclic collector's reach, as a server that owns its process does before serving.

    A request allocates thousands of containers (the parsed body) that are alive when the
    collector runs mid-request; they reach the oldest generation, and every few requests a full
    collection walks everything the process holds: about 40 ms each at 100k tokens, a fourth of
    ``serve``'s CPU per request (``bench_serve.py``). Frozen objects are still freed by reference
    counting; only a reference cycle among them would never be collected, and what is frozen here
    lives as long as the process anyway. Called by ``ctxkernel serve`` (each worker), not by
    :func:`create_app`: a host that embeds the app owns its process and its collector.

    It also keeps the C heap's freed memory for reuse (:func:`keep_freed_memory`)."""
    gc.collect()
    gc.freeze()
    keep_freed_memory()


#: glibc ``mallopt`` parameters (malloc.h) and the values :func:`keep_freed_memory` sets
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (64-bit): blocks up to 32 MB come from the heap
TRIM_THRESHOLD_BYTES = 128 << 20  # free memory above the heap's top is returned past 128 MB


def keep_freed_memory() -> bool:
    """Let glibc's allocator reuse freed memory instead of mapping fresh pages for each request.

    Every request allocates blocks the size of its body (the body, its upstream form, the memo's
    JSON: 0.6 MB each at 100k tokens). glibc maps a block that large on its own and unmaps it when
    freed, so the next request takes a page fault for each 4 KB it touches: about 180 faults and
    1 ms of system CPU per request at 100k tokens (``bench_serve.py``). With a fixed mmap
    threshold of 32 MB and a trim threshold of 128 MB the blocks come from the heap and stay
    there for the next request; the cost is that the process keeps its peak heap (bounded by
    the body limit times the concurrent requests). False (and logged) where the C library is
    not glibc or refuses a value."""
    import ctypes
    import platform

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        log.info("serve.malloc_untuned", reason="the C library is not glibc")
        return False
    libc = ctypes.CDLL(None)
    ok = True
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        if libc.mallopt(param, value) != 1:
            log.warning("serve.malloc_untuned", reason=f"mallopt({param}, {value}) refused")
            ok = False
    return ok


CONFIG_ENV = "CTXKERNEL_SERVE_CONFIG"


def app_from_env() -> Starlette:
    """The app factory uvicorn's worker processes call (``--workers N``): the config comes from
    ``$CTXKERNEL_SERVE_CONFIG`` (JSON, written by the CLI; it never holds a key, only the name
    of the variable that does)."""
    app = create_app(ServeConfig.from_json(os.environ[CONFIG_ENV]))
    settle_heap()
    return app

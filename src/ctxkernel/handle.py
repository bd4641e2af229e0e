"""The strategy handle: everything one strategy may do in one session, with its name given once.

A strategy declares itself once, at module level::

    STRATEGY = ctxkernel.Strategy("observation-mask", MaskSettings, capabilities={"observation"})

``register_strategy`` registers ``STRATEGY.spec``; each hook asks for its handle with
``STRATEGY.on(session)``. The handle carries the strategy's name into every operation that records
who acted (``emit``, ``compact``, ``replace_tool_result``, ``remind``, notes), keys the strategy's
state and storage by it, and types its settings, so a plugin never passes its own name by hand and
never reaches the plugin manager, the store or the kernel home (datasette's rule: plugins get a
handle, not the house).

This module sits above the core and ``recall``: the core never imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic import BaseModel

from .compaction import CommitResult, Span
from .errors import ConfigError
from .plugins import NoSettings, StrategySpec
from .profile import strategy_settings_from
from .recall.history import History
from .recall.notes import STATE_KEY as NOTES_STATE_KEY
from .recall.notes import Note, Notes, NotesLimits
from .tools import Tool

if TYPE_CHECKING:
    from .meter import Pressure
    from .profile import ModelSettings, Profile
    from .session import RequestHeader, Session, StepContext

S = TypeVar("S", bound=BaseModel)


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

    def tool(
        self, name: str, description: str, parameters: type[BaseModel], handler: Any, *, cls: type[Tool] = Tool
    ) -> Tool:
        """A model-callable tool owned by this strategy (for ``register_tools``); ``cls`` may be
        a :class:`Tool` subclass such as :class:`ctxkernel.CompactTool`."""
        return cls(name, description, parameters, handler, strategy=self.name)

    def on(self, session: Session) -> StrategyHandle[S]:
        """This strategy's handle for ``session``."""
        return StrategyHandle(session, self.name, self.settings)

    def settings_for(self, profile: Profile, provider: str | None = None, model: str | None = None) -> S:
        """The strategy's settings in ``profile`` for one model (the profile's own model by
        default), per-model policies applied, validated by the settings model: what
        ``validate_profile`` reads, where no session exists yet. A bad table raises
        :class:`ctxkernel.ProfileError` naming the file, the key and what is accepted."""
        raw = profile.strategy_settings(self.name, provider, model)
        return cast(S, strategy_settings_from(self.settings, raw, profile.where, f"strategies.{self.name}"))

    def __repr__(self) -> str:
        return f"Strategy({self.name!r}, {self.settings.__name__})"


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


class StrategyHandle(Generic[S]):
    """What one strategy may do in one session. Get it with :meth:`Strategy.on`."""

    def __init__(self, session: Session, name: str, settings_model: type[S]) -> None:
        self.session = session
        self.name = name
        self._settings_model = settings_model

    # -- configuration ------------------------------------------------------------------------------
    @property
    def settings(self) -> S:
        """The strategy's validated settings for the currently routed model (policies applied)."""
        settings = self.session.settings(self.name)
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
        return self.name in self.session.kernel.strategies

    @property
    def enabled(self) -> bool:
        """False while the strategy is switched off at run time (its hooks do not run then, but
        its tools' handlers or an integrator's call may still reach it)."""
        return self.session.strategy_enabled(self.name)

    def runs(self, strategy: str) -> bool:
        """True when ``strategy`` (another strategy's name) runs in this session's profile."""
        return strategy in self.session.kernel.strategies

    def peer_settings(self, strategy: str) -> BaseModel | None:
        """Another running strategy's settings for the routed model (None when it does not run),
        for a strategy that must agree with its neighbour's thresholds."""
        return self.session.settings(strategy) if self.runs(strategy) else None

    @property
    def strategies_generation(self) -> int:
        """A counter that changes whenever the set of enabled strategies changes (to rebuild
        what depends on it, e.g. tool sets)."""
        return self.session.strategies_generation

    @property
    def model(self) -> ModelSettings:
        """The routed model's settings (window, reserve, tokenizer), per-model policies applied."""
        return self.session.model_settings()

    @property
    def base_system_prompt(self) -> str:
        """The integrator's own system prompt (``[profile] system_prompt``), without the
        sections strategies add."""
        return self.session.kernel.profile.profile.system_prompt

    @property
    def summarizer(self) -> Any:
        """The profile's summarizer model (``[summarizer]``), or None for extractive summaries."""
        return self.session.kernel.summarizer

    @property
    def state(self) -> dict[str, Any]:
        """This process's state for the strategy in this session (rebuild it from the log: it is
        not persisted)."""
        holder = self.session.state.get(self.name)
        if holder is None:
            holder = self.session.state[self.name] = {}
        return holder

    # -- acting on the session ----------------------------------------------------------------------
    def emit(self, kind: str, data: dict[str, Any]) -> int:
        """Append an ignorable ``<strategy>/<kind>`` event; returns its seq."""
        return self.session.emit(self.name, kind, data)

    def compact(self, spans: Span | Sequence[Span], *, kind: str = "summary", **kwargs: Any) -> CommitResult:
        """Run one compaction transaction (see :mod:`ctxkernel.compaction`) in the strategy's name."""
        return self.session.compact(spans, strategy=self.name, kind=kind, **kwargs)

    def replace_tool_result(self, seq: int, content: str, *, reason: str = "prune") -> int:
        """Model-free shrink of one visible tool result; returns the replacement's seq."""
        return self.session.replace_tool_result(seq, content, strategy=self.name, reason=reason)

    def remind(self, step: StepContext, text: str) -> None:
        """Queue a notice for the model before the request ``step`` is about to make."""
        step.remind(text, strategy=self.name)

    # -- storage --------------------------------------------------------------------------------------
    def kv_get(self, key: str) -> Any | None:
        """A value from the store's key-value table, in the strategy's own namespace."""
        return self.session.store.kv_get(self.name, key)

    def kv_put(self, key: str, value: Any) -> None:
        self.session.store.kv_put(self.name, key, value)

    def kv_delete(self, key: str) -> None:
        self.session.store.kv_delete(self.name, key)

    def kv_list(self, prefix: str = "") -> dict[str, Any]:
        return self.session.store.kv_list(self.name, prefix)

    @property
    def files(self) -> Path:
        """The strategy's folder for human-readable files (audits, exports): ``<home>/<name>``.
        Not created until written to."""
        return Path(self.session.kernel.home) / self.name

    @property
    def home(self) -> Path:
        """The kernel home (the store's folder for file-based backends), for settings that are
        paths relative to it."""
        return Path(self.session.kernel.home)

    # -- recall ---------------------------------------------------------------------------------------
    def notes(self, limits: NotesLimits | None = None) -> StrategyNotes:
        """The session's notes (shared by every strategy), writes signed with this strategy."""
        return StrategyNotes(Notes.for_session(self.session, limits), self.name)

    def forget_notes(self) -> None:
        """Drop this process's notes index; the next :meth:`notes` rebuilds it from the log (after
        a run-time change of the strategy set, say)."""
        self.session.state.pop(NOTES_STATE_KEY, None)

    def history(self) -> History:
        """The session's history index, up to date with its log."""
        return History.for_session(self.session)

    # -- pressure and the route -----------------------------------------------------------------------
    def pressure(self) -> Pressure:
        """How full the next request is (see :class:`ctxkernel.Pressure`)."""
        return self.session.pressure()

    @property
    def route(self) -> dict[str, Any] | None:
        """The model the next request goes to (``provider``, ``model``, ``context_window``...), or
        None before the first request."""
        return self.session.route

    def set_route(self, provider: str, model: str, context_window: int | None = None) -> None:
        """Route the next requests to another model (per-model policies apply from then on)."""
        self.session.set_route(provider, model, context_window)

    def request_header(self) -> RequestHeader:
        """The system prompt and tool schemas every request carries, and their token count."""
        return self.session.request_header()

    def invalidate_header(self) -> None:
        """Call when the strategy's system prompt section or tools changed."""
        self.session.invalidate_header()

    def __repr__(self) -> str:
        return f"StrategyHandle({self.name!r}, session={self.session.id!r})"


__all__ = ["Strategy", "StrategyHandle", "StrategyNotes"]

"""The kernel: a profile, its strategies, a store and a tokenizer; it opens sessions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from . import instructions
from . import ledger as work_ledger
from .errors import CorruptionError, CtxKernelError, ProfileError, SessionNotFoundError
from .events import random_hex, utc_now
from .logging import get_logger
from .meter import Tokenizer, get_tokenizer
from .plugins import StrategyManager, StrategySpec
from .profile import ModelSettings, Profile, deep_merge, load_profile, profile_stamp
from .session import Session
from .settings_check import format_validation_error, strategy_settings_from
from .store import EventStore, SessionHeader, default_home, store_from_settings

log = get_logger("ctxkernel.kernel")


#: validated strategy settings kept per (strategy, provider, model): ``serve``'s clients choose
#: the model name of each request, so the table is bounded (cleared when full, then refilled)
SETTINGS_CACHE_ENTRIES = 256


class Kernel:
    """Build one per profile (``Kernel.from_profile("decay")``) and open sessions from it."""

    def __init__(
        self,
        profile: Profile | None = None,
        *,
        store: EventStore | None = None,
        home: str | os.PathLike[str] | None = None,
        entry_points: bool = True,
        plugins: list[tuple[str, Any]] | None = None,
        load: bool = True,
    ) -> None:
        self.profile = profile or load_profile()
        self.home = Path(home) if home else Path(self.profile.store.path or default_home())
        self.store = store or store_from_settings(self.profile.store, self.home)
        self.tokenizer: Tokenizer = get_tokenizer(self.profile.model.tokenizer)
        self.plugins = StrategyManager(entry_points=entry_points)
        self.hooks = self.plugins.hooks
        self._settings_cache: dict[tuple[str, str, str], BaseModel] = {}  # at most SETTINGS_CACHE_ENTRIES
        self._profile_stamp = profile_stamp(self.profile)
        self._summarizer: Any = None
        for name, plugin in plugins or []:
            self.plugins.register(plugin, name, distribution="(registered in code)")
        if load:
            names = [n for n in self.profile.profile.strategies if n not in self.plugins.specs]
            self.plugins.load(names)
            for name in self.profile.profile.strategies:
                self.strategy_settings(name)  # fail fast on bad settings
            self._check_unknown_strategy_tables()
            self._check_policies(self.profile)

    @classmethod
    def from_profile(cls, name_or_path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Kernel:
        return cls(load_profile(name_or_path), **kwargs)

    @property
    def summarizer(self) -> Any:
        """The model that writes summaries (``[summarizer]`` in the profile), or None for
        extractive summaries. Tests and the simulator may assign a scripted model."""
        if self._summarizer is None and self.profile.summarizer.kind == "openai":
            from .models.openai_http import OpenAIChatModel

            self._summarizer = OpenAIChatModel.from_settings(self.profile.summarizer)
        return self._summarizer

    @summarizer.setter
    def summarizer(self, model: Any) -> None:
        self._summarizer = model

    # -- strategies ------------------------------------------------------------------------------
    @property
    def strategies(self) -> dict[str, StrategySpec]:
        return self.plugins.specs

    def strategy_settings(self, strategy: str, provider: str | None = None, model: str | None = None) -> BaseModel:
        """Validated settings of a strategy, with the matching model policy applied (cached)."""
        provider = provider or self.profile.model.provider
        model = model or self.profile.model.name
        key = (strategy, provider, model)
        cached = self._settings_cache.get(key)
        if cached is not None:
            return cached
        spec = self.plugins.specs.get(strategy)
        if spec is None:
            msg = f"strategy {strategy!r} is not loaded by {self.profile.where}; loaded: {list(self.plugins.specs)}"
            raise ProfileError(msg)
        raw = self.profile.strategy_settings(strategy, provider, model)
        settings = strategy_settings_from(spec.settings, raw, self.profile.where, f"strategies.{strategy}")
        if len(self._settings_cache) >= SETTINGS_CACHE_ENTRIES:
            self._settings_cache.clear()  # rare: a profile names few models, a flood is hostile
        self._settings_cache[key] = settings
        return settings

    def _check_unknown_strategy_tables(self) -> None:
        named = set(self.profile.profile.strategies)
        stray = sorted(set(self.profile.strategies) - named)
        for policy in self.profile.model_policies:
            stray += sorted(set(policy.strategies) - named)
        if stray:
            msg = (
                f"{self.profile.where}: settings for {sorted(set(stray))} but the profile's strategies are "
                f"{self.profile.profile.strategies}; add them to [profile] strategies or remove the tables"
            )
            raise ProfileError(msg)

    def _check_policies(self, profile: Profile) -> None:
        """Every model policy's ``model`` and strategy tables validate now, not when a session is
        first routed to its model (a serve client choosing it): ProfileError naming the key."""
        for index, policy in enumerate(profile.model_policies):
            label = f"model_policies[{index}]"
            if policy.model:
                try:
                    ModelSettings(**(profile.model.model_dump() | policy.model))
                except ValidationError as exc:
                    raise ProfileError(
                        format_validation_error(exc, profile.where, ModelSettings, f"{label}.model")
                    ) from None
            for name, table in policy.strategies.items():
                spec = self.plugins.specs.get(name)
                if spec is not None:
                    raw = deep_merge(profile.strategies.get(name, {}), table)
                    strategy_settings_from(spec.settings, raw, profile.where, f"{label}.strategies.{name}")

    def refresh_profile(self) -> bool:
        """Reload the profile file when it changed on disk, so edited settings (thresholds, model
        policies, every strategy's table) apply from the next step without a new Kernel. Called
        before every request. An edit that does not validate, or that changes the strategy set
        (which needs a restart), is logged and the running settings stay; True when reloaded."""
        stamp = profile_stamp(self.profile)
        if stamp is None or stamp == self._profile_stamp:
            return False
        self._profile_stamp = stamp
        path = self.profile.path
        try:
            fresh = load_profile(path)
            if fresh.profile.strategies != self.profile.profile.strategies:
                msg = (
                    f"{fresh.where}: [profile] strategies changed from {self.profile.profile.strategies} to "
                    f"{fresh.profile.strategies}; the strategy set changes only with a new Kernel (a restart)"
                )
                raise ProfileError(msg)
            for name in fresh.profile.strategies:
                spec = self.plugins.specs.get(name)
                if spec is not None:
                    strategy_settings_from(
                        spec.settings, fresh.strategy_settings(name), fresh.where, f"strategies.{name}"
                    )
            self._check_policies(fresh)
        except CtxKernelError as exc:
            log.error("profile edit not applied; the running settings stay", profile=str(path), error=str(exc))
            return False
        self.profile = fresh
        self._settings_cache.clear()
        log.info("profile reloaded", profile=str(path))
        return True

    def set_strategy_enabled(self, name: str, enabled: bool) -> None:
        """Enable or disable a loaded strategy for every session, without a restart."""
        self.plugins.set_enabled(name, enabled)
        log.info("strategy toggled", strategy=name, enabled=enabled)

    # -- sessions ---------------------------------------------------------------------------------
    def open_session(
        self,
        session_id: str | None = None,
        *,
        create: bool | None = None,
        parent: str | None = None,
        origin: str | None = None,
        repair: bool = True,
        keep_waiting_calls: bool = False,
        instructions_from: str | None = None,
    ) -> Session:
        """Open a session: a new one (no id, or ``create=True``) or an existing one by id.

        Resuming replays the log; with ``repair`` (default) a torn tail is cut and whatever a
        crashed writer left open is closed with synthetic events (docs/design/host-model.md §7);
        ``keep_waiting_calls`` leaves tool calls that wait for the harness's results open
        (see :meth:`Session.repair_after_crash`).

        A new session that continues another one (``instructions_from``, else ``parent``) opens
        with that session's newest user instructions within its budget (``[instructions]``), so
        a continuation cannot leave them behind.
        """
        if session_id is None or create:
            header = SessionHeader(
                id=session_id or new_session_id(),
                created=utc_now(),
                parent=parent,
                origin=origin,
                profile=self.profile.name,
            )
            self.store.create(header)
            session = Session(self, header)
            log.debug("session created", session=header.id)
            source = instructions_from or parent
            if source is not None:
                self._inherit_instructions(session, source)
        else:
            if not self.store.exists(session_id):
                msg = f"no session {session_id!r} in the {self.store.backend} store"
                raise SessionNotFoundError(msg)
            session = self._resume(session_id, repair, keep_waiting_calls)
        self.hooks.session_opened(session)
        if session.events:
            session.restore_harness_tools()
        return session

    def _inherit_instructions(self, session: Session, source: str) -> None:
        """A session that continues ``source`` inherits its newest instructions within its own
        budget: read now and kept in the store, then recorded in its log (and pinned where its
        seed does not show them) before its first request, after the strategy that created it
        has written its seed, by whichever process makes that request."""
        if not self.store.exists(source):
            msg = f"instructions_from={source!r}: no such session in the {self.store.backend} store"
            raise SessionNotFoundError(msg)
        events = list(self.store.read(source, 0))
        ledger = instructions.ledger_of(source, events)
        kept = instructions.inherited(session, ledger)
        if kept:
            self.store.kv_put(instructions.PENDING_NAMESPACE, session.id, [i.to_dict() for i in kept])
        if self.profile.ledger.budget_ratio > 0:  # the work ledger goes on too (ledger.py)
            work = work_ledger.ledger_of(events)
            if work.entries():
                self.store.kv_put(work_ledger.PENDING_NAMESPACE, session.id, work.to_dict())

    def _resume(self, session_id: str, repair: bool, keep_waiting_calls: bool = False) -> Session:
        # the snapshot first: a store may start its reads (and the repair scan) where it ends
        snapshot = None
        if self.profile.store.snapshot_every:
            try:
                snapshot = self.store.snapshot_get(session_id)
            except CorruptionError as exc:
                log.warning("snapshot set aside; replaying the whole log", session=session_id, reason=str(exc))
        if repair:
            report = self.store.repair(session_id)
            if report.repaired:
                log.warning("torn tail cut", session=session_id, bytes=report.truncated_bytes, reason=report.reason)
        session = Session(self, self.store.header(session_id))
        if snapshot is not None:
            session.open_from_snapshot(*snapshot)
        session.refresh()
        if repair:
            session.repair_after_crash(keep_waiting_calls=keep_waiting_calls)
        return session

    def sessions(self) -> list[str]:
        return self.store.list_sessions()


def new_session_id() -> str:
    return random_hex(32)  # a replay draws it from its seed (events.replay_clock)

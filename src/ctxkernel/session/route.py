"""The model a session's requests go to: its settings (the profile's ``[model]`` with the matching
per-model policy applied, and a window the route gave), re-routing, and each strategy's settings
for the routed model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import events as ev
from ..errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..ports import SessionPort
    from ..profile import ModelSettings
    from .track import Tracker

#: the ``request/context`` key of a window given with the route (``set_route(..., context_window=)``)
ROUTE_WINDOW_KEY = "routed_window"


class Routing:
    """One session's route and the settings that follow it."""

    def __init__(self, session: SessionPort, tracker: Tracker) -> None:
        self.session = session
        self.kernel = session.kernel
        self.tracker = tracker
        #: while a request is prepared (between :meth:`preparing_request` and :meth:`prepared`): the
        #: route and profile of the last model_settings() answer, and that answer; a request asks
        #: for it up to seven times
        self._memo: tuple[dict[str, Any] | None, Any, ModelSettings] | None = None
        self.preparing = 0  # requests being prepared (re-entrant)

    def preparing_request(self) -> None:
        """A request is being prepared: :meth:`model_settings` answers once per route and profile."""
        self.preparing += 1

    def prepared(self) -> None:
        """A request is prepared (or stopped): the answer is dropped once no request is."""
        self.preparing -= 1
        if not self.preparing:
            self._memo = None

    def model_settings(self) -> ModelSettings:
        """The routed model's settings: the profile's ``[model]`` with the matching per-model
        policy applied, and the window a route gave explicitly (``set_route(...,
        context_window=...)``, folded from the log, so a reopened session keeps it).

        While a request is prepared the answer is read once per route and profile object: the
        profile is reloaded before the strategies run (``refresh_profile``) and a route changes
        by an event, which folds a new ``route``; an edit in place applies from the next request."""
        route, profile = self.tracker.route, self.kernel.profile
        memo = self._memo
        if memo is not None and memo[0] is route and memo[1] is profile:
            return memo[2]
        given = route or {}
        settings: ModelSettings = profile.model_for(given.get("provider"), given.get("model"))
        window = given.get(ROUTE_WINDOW_KEY)
        if isinstance(window, int) and window != settings.context_window:
            settings = settings.with_window(window)
        if self.preparing:
            self._memo = (route, profile, settings)
        return settings

    def settings(self, strategy: str) -> BaseModel:
        """The validated settings of ``strategy`` for the currently routed model."""
        model = self.model_settings()
        settings: BaseModel = self.kernel.strategy_settings(strategy, model.provider, model.name)
        return settings

    def set_route(self, provider: str, model: str, context_window: int | None = None) -> None:
        """Route the next requests to another model (see :meth:`Session.set_route`)."""
        settings = self.kernel.profile.model_for(provider, model)
        if context_window is not None:
            try:
                settings = settings.with_window(context_window)
            except ConfigError as exc:
                msg = f"set_route({provider!r}, {model!r}): {exc}; nothing was recorded"
                raise ConfigError(msg) from None
        self.write(settings, pinned=context_window is not None)

    def write(self, settings: ModelSettings, *, pinned: bool = False) -> None:
        """Record the route to ``settings``' model (``request/context``) when it is not the current one."""
        data: dict[str, Any] = {
            "provider": settings.provider,
            "model": settings.name,
            "context_window": settings.context_window,
            "reserved_output_tokens": settings.reserved_output_tokens,
        }
        if pinned:  # the window came with the route, not from the profile: it outlives profile edits
            data[ROUTE_WINDOW_KEY] = settings.context_window
        if self.tracker.route != data:
            self.session.append([ev.EventSpec(ev.REQUEST_CONTEXT, data)])


__all__ = ["ROUTE_WINDOW_KEY", "Routing"]

"""How full the next request is: the meter's count of the header, the surface and the last
request's decorations, anchored on the provider's usage figure for the last request when that
figure is plausible (:func:`ctxkernel.meter.usage_in_band`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..logging import get_logger
from ..meter import USAGE_TOLERANCE_FACTOR, Pressure, usage_in_band, usage_slack

if TYPE_CHECKING:
    from ..meter import Meter
    from .route import Routing
    from .tooling import Tooling
    from .track import Tracker

log = get_logger("ctxkernel.session")

#: what :meth:`Gauge.pressure` reads: its estimate, the header digest, the usage anchor, the window
#: and the output reservation
_PressureKey = tuple[int, str, tuple[int, int, str | None] | None, int, int]


class Gauge:
    """One session's pressure, kept while nothing it reads changed (a request asks three to five
    times with nothing changed between)."""

    def __init__(self, session_id: str, meter: Meter, tracker: Tracker, tooling: Tooling, routing: Routing) -> None:
        self.session_id = session_id
        self.meter = meter
        self.tracker = tracker
        self.tooling = tooling
        self.routing = routing
        #: the last answer and what it was computed from (:data:`_PressureKey`)
        self.memo: tuple[_PressureKey, Pressure] | None = None
        self._implausible_usage_warned = False  # the out-of-band warning is logged once per session

    def pressure(self) -> Pressure:
        model = self.routing.model_settings()
        _, _, digest, header_tokens = self.tooling.compose()
        tracker = self.tracker
        # the meter's count of the next request: its header, the surface, the last decorations
        estimate = header_tokens + self.meter.surface_tokens() + tracker.decoration_delta
        anchor = tracker.anchor
        # everything the answer reads (the effective window is context_window - reserved)
        key = (estimate, digest, anchor, model.context_window, model.reserved_output_tokens)
        memo = self.memo
        if memo is not None and memo[0] == key:
            return memo[1]
        anchored = False
        tokens = estimate
        if anchor is not None and anchor[2] == digest:
            reported, counted, _ = anchor
            if usage_in_band(reported, counted, model.context_window):
                tokens = max(0, reported + estimate - counted)
                anchored = True
            elif not self._implausible_usage_warned:
                self._implausible_usage_warned = True
                log.warning(
                    "provider usage outside the plausible band: pressure uses the meter's count",
                    session=self.session_id,
                    reported_tokens=reported,
                    counted_tokens=counted,
                    tolerance_factor=USAGE_TOLERANCE_FACTOR,
                    slack_tokens=usage_slack(model.context_window),
                )
        window, reserved = model.context_window, model.reserved_output_tokens
        pressure = Pressure(tokens, model.effective_window, window, reserved, anchored)
        self.memo = (key, pressure)
        return pressure


__all__ = ["Gauge"]

"""The ``decay`` strategy's declaration, settings and position state.

State (the handle's ``state["state"]``) is folded from the log with a cursor, so each request
costs O(new events); a snapshot in the strategy's key-value namespace only speeds up opening and
is rejected, then rebuilt from replay, when it is malformed or does not match the log. The hooks
(``plugin``), the tools and the steward all read it from here.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

import ctxkernel

from .state import NAME, DecayState, event_digest, replay

if TYPE_CHECKING:
    from ctxkernel import Session

log = ctxkernel.get_logger("ctxkernel.decay")
#: the snapshot is kept in the handle's key-value namespace, which is the strategy's name
SNAPSHOT_NAMESPACE = NAME
SNAPSHOT_VERSION = 1


#: the largest token count a setting may hold (no model window comes near it)
MAX_TOKENS = 100_000_000


class DecaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: a normal reminder after this much growth (tokens) since the last reminder or compression
    growth_tokens: int = Field(default=24_000, ge=1, le=MAX_TOKENS)
    #: warning levels as fractions of the effective window
    warn_ratios: list[float] = Field(default_factory=lambda: [0.70, 0.81, 0.95], max_length=16)
    #: steps before the same reminder level may fire again
    cooldown_steps: int = Field(default=4, ge=0, le=10_000)
    #: spans per compress call
    max_spans: int = Field(default=8, ge=1, le=64)
    #: characters per span summary (after anchors are stripped)
    # le: the compress schema's caps (tools.SUMMARY_CHARS_CAP, TOPIC_CHARS_CAP) bound what a profile may allow
    summary_max_chars: int = Field(default=6_000, ge=100, le=100_000)
    topic_max_chars: int = Field(default=80, ge=1, le=1_000)
    #: refuse compressions that do not pay back their prefix-cache miss (below the first warning)
    cost_guard: bool = False
    #: price of a cached input token relative to an uncached one
    cached_input_ratio: float = Field(default=0.1, gt=0, lt=1)
    payback_max_requests: int = Field(default=50, ge=1, le=1_000_000)
    min_saving_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS)
    #: the steward (simulation) compresses down to this share of the effective window
    steward_target_ratio: float = Field(default=0.45, gt=0, lt=1)
    #: one JSONL record per request and compression, in the store (ctxkernel export: decay/audit.jsonl)
    audit: bool = False
    #: keep a snapshot of the position state in the store (a cache: always rebuildable)
    snapshot: bool = True

    @field_validator("warn_ratios")
    @classmethod
    def _ratios(cls, value: list[float]) -> list[float]:
        if not value or any(not 0 < r <= 1 for r in value) or value != sorted(set(value)):
            msg = f"warn_ratios must be increasing fractions in (0, 1], e.g. [0.70, 0.81, 0.95]; got {value}"
            raise ValueError(msg)
        return value


STRATEGY = ctxkernel.Strategy(
    NAME,
    DecaySettings,
    capabilities={"pressure", "decoration", "tools"},
    description="position anchors; the model compresses old spans into summary blocks when reminded",
)


def settings_of(session: Session) -> DecaySettings:
    return STRATEGY.on(session).settings


# -- state -------------------------------------------------------------------------------------------
def current_state(session: Session) -> DecayState:
    """The position state, folded up to the session's last event."""
    holder = STRATEGY.on(session).state
    if "state" not in holder:
        load_state(session)
    state: DecayState = holder["state"]
    if state.cursor > len(session.events):  # our log view went backwards: never trust it
        holder.clear()
        holder.update(state=replay(session.events), source="replay (state ahead of log)")
        state = holder["state"]
    state.fold(session.events)
    return state


def load_state(session: Session) -> dict[str, Any]:
    """From the snapshot when it is valid and matches the log, else by replay."""
    source = "replay"
    state = None
    decay = STRATEGY.on(session)
    raw = decay.kv_get(session.id) if _snapshots_on(session) else None
    if raw is not None:
        try:
            state = _from_snapshot(raw, session.events)
            source = "snapshot"
        except Exception as exc:  # any defect: the log is the truth
            reason = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("decay snapshot rejected, rebuilt from replay", session=session.id, reason=reason)
            source = f"replay (snapshot rejected: {reason})"
            state = None
    if state is None:
        state = DecayState()
    holder = decay.state
    holder.clear()
    holder.update(state=state, source=source)
    return holder


def _snapshots_on(session: Session) -> bool:
    try:
        return settings_of(session).snapshot
    except ctxkernel.CtxKernelError:  # settings are reported where they are used; a snapshot is optional
        return False


def _digest(payload: Any) -> str:
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _from_snapshot(raw: Any, events: list[ctxkernel.Event]) -> DecayState:
    if not isinstance(raw, dict) or raw.get("version") != SNAPSHOT_VERSION:
        msg = f"snapshot version {raw.get('version') if isinstance(raw, dict) else raw!r} is not {SNAPSHOT_VERSION}"
        raise ValueError(msg)
    payload = raw["state"]
    if _digest(payload) != raw["digest"]:
        msg = "snapshot digest does not match its content"
        raise ValueError(msg)
    state = DecayState.from_dict(payload)
    if state.cursor > len(events) or state.cursor < 1:
        msg = f"snapshot cursor {state.cursor} is outside the log (length {len(events)})"
        raise ValueError(msg)
    if event_digest(events[state.cursor - 1]) != raw["last_event"]:
        msg = f"snapshot was taken on a different log (event {state.cursor - 1} differs)"
        raise ValueError(msg)
    return state


def save_snapshot(session: Session, state: DecayState) -> None:
    if not state.cursor or not _snapshots_on(session):
        return
    payload = state.to_dict()
    STRATEGY.on(session).kv_put(
        session.id,
        {
            "version": SNAPSHOT_VERSION,
            "state": payload,
            "digest": _digest(payload),
            "last_event": event_digest(session.events[state.cursor - 1]),
        },
    )

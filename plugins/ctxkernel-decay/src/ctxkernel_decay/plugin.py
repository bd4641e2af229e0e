"""The ``decay`` strategy's hooks: position anchors and model-authored compression.

State (``session.state["decay"]``) is folded from the log with a cursor, so each request costs
O(new events); a snapshot in the store's key-value table only speeds up opening and is
rejected, then rebuilt from replay, when it is malformed or does not match the log.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

import ctxkernel

from . import steward
from .anchors import decorate_message, fmt, sanitize_assistant
from .state import NAME, NOTICE_FORM, DecayState, event_digest, replay
from .tools import tools_for

if TYPE_CHECKING:
    from ctxkernel import CommitResult, ReplyDraft, Request, Session, StepContext

log = structlog.get_logger("ctxkernel.decay")
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
    summary_max_chars: int = Field(default=6_000, ge=100, le=1_000_000)
    topic_max_chars: int = Field(default=80, ge=1, le=10_000)
    #: refuse compressions that do not pay back their prefix-cache miss (below the first warning)
    cost_guard: bool = False
    #: price of a cached input token relative to an uncached one
    cached_input_ratio: float = Field(default=0.1, gt=0, lt=1)
    payback_max_requests: int = Field(default=50, ge=1, le=1_000_000)
    min_saving_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS)
    #: the steward (simulation) compresses down to this share of the effective window
    steward_target_ratio: float = Field(default=0.45, gt=0, lt=1)
    #: one JSONL record per request and compression under $CTXKERNEL_HOME/decay/audit.jsonl
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


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(
        ctxkernel.StrategySpec(
            NAME,
            settings=DecaySettings,
            capabilities={"pressure", "decoration", "tools"},
            description="position anchors; the model compresses old spans into summary blocks when reminded",
        )
    )


def settings_of(session: Session) -> DecaySettings:
    return session.settings(NAME)  # type: ignore[return-value]


# -- state -------------------------------------------------------------------------------------------
def current_state(session: Session) -> DecayState:
    """The position state, folded up to the session's last event."""
    holder = session.state.get(NAME)
    if holder is None or "state" not in holder:
        holder = load_state(session)
    state: DecayState = holder["state"]
    if state.cursor > len(session.events):  # our log view went backwards: never trust it
        holder = {"state": replay(session.events), "source": "replay (state ahead of log)"}
        session.state[NAME] = holder
        state = holder["state"]
    state.fold(session.events)
    return state


def load_state(session: Session) -> dict[str, Any]:
    """From the snapshot when it is valid and matches the log, else by replay."""
    source = "replay"
    state = None
    raw = session.store.kv_get(SNAPSHOT_NAMESPACE, session.id) if _snapshots_on(session) else None
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
    holder = {"state": state, "source": source}
    session.state[NAME] = holder
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
    session.store.kv_put(
        SNAPSHOT_NAMESPACE,
        session.id,
        {"version": SNAPSHOT_VERSION, "state": payload, "digest": _digest(payload), "last_event": event_digest(session.events[state.cursor - 1])},
    )


# -- hooks -------------------------------------------------------------------------------------------
def check_host_seam(session: Session) -> None:
    """Anchors need the kernel's presentation seam: decorations applied to the request and
    counted by the meter. Without it the model would see undecorated messages whose anchors it
    could never name, so activation fails loudly instead."""
    from ctxkernel import Request

    hooks = session.kernel.plugins.pm.hook
    missing = [name for name in ("decorate_request", "sanitize_reply") if not hasattr(hooks, name)]
    if not callable(getattr(Request, "decorate", None)):
        missing.append("Request.decorate")
    if missing:
        msg = (
            f"strategy 'decay' needs the kernel's decoration seam, but this ctxkernel lacks {missing}; "
            "upgrade ctxkernel or remove 'decay' from the profile's strategies"
        )
        raise ctxkernel.ConfigError(msg)


@ctxkernel.hookimpl
def session_opened(session: Session) -> None:
    check_host_seam(session)
    session.state.pop(NAME, None)
    current_state(session)


@ctxkernel.hookimpl
def register_tools(register: Any, session: Session) -> None:
    for tool in tools_for(session):
        register(tool)


@ctxkernel.hookimpl
def pre_step(session: Session, step: StepContext) -> None:
    if session.route is None:
        return  # the first request of a fresh session has no routed window to measure against
    settings = settings_of(session)
    state = current_state(session)
    pressure = session.pressure()
    if state.last_compaction_seq > state.baseline_seq and pressure.tokens < state.baseline:
        # a compression lowered pressure: growth is measured from here on
        rearm = [0] + [i + 1 for i, r in enumerate(settings.warn_ratios) if pressure.ratio < r]
        session.emit(NAME, "baseline", {"tokens": pressure.tokens, "ratio": round(pressure.ratio, 4), "rearm": rearm})
        state = current_state(session)
    level = sum(1 for r in settings.warn_ratios if pressure.ratio >= r)
    grew = pressure.tokens - state.baseline
    fire = None
    if level and _cooled(state, level, settings):
        fire = level
    elif grew >= settings.growth_tokens and _cooled(state, 0, settings):
        fire = 0
    if fire is None:
        return
    session.emit(NAME, "reminder", {"level": fire, "tokens": pressure.tokens, "ratio": round(pressure.ratio, 4), "grew": grew})
    step.remind(reminder_text(fire, pressure, grew, settings), strategy=NAME)


def _cooled(state: DecayState, level: int, settings: DecaySettings) -> bool:
    last = state.fired.get(level)
    return last is None or state.steps - last >= settings.cooldown_steps


def reminder_text(level: int, pressure: ctxkernel.Pressure, grew: int, settings: DecaySettings) -> str:
    pct = f"{pressure.ratio:.0%} of {pressure.effective_window} tokens"
    if level:
        return (
            f"[context decay] Warning {level}/{len(settings.warn_ratios)}: context at {pct}. Compress old spans you "
            "no longer need verbatim (compress), or drop stale blocks (drop)."
        )
    return f"[context decay] Context grew {grew} tokens since the last note ({pct}). Consider compressing old spans."


@ctxkernel.hookimpl
def decorate_request(session: Session, request: Request) -> None:
    state = current_state(session)
    # decorated copies are reused while a node keeps its anchors: a request costs O(surface)
    # lookups, and only new or re-anchored nodes are rebuilt
    cache: dict[int, tuple[int, int | None, ctxkernel.Message | None]] = session.state[NAME].setdefault("decorated", {})
    if len(cache) > 2 * len(request.seqs) + 64:
        visible = set(request.seqs)
        for seq in [s for s in cache if s not in visible]:
            del cache[seq]
    for index, seq in enumerate(request.seqs):
        left = state.anchor_of.get(seq)
        if left is None:
            continue
        right = state.right_of(seq)
        hit = cache.get(seq)
        if hit is None or hit[0] != left or hit[1] != right:
            hit = (left, right, decorate_message(request.messages[index], left, right))
            cache[seq] = hit
        if hit[2] is not None:
            request.decorate(index, hit[2])
    if settings_of(session).audit:
        audit(session, {"kind": "request", "turn": request.turn, "step": request.step, "messages": len(request.messages),
                        "anchors": sum(1 for s in request.seqs if s in state.anchor_of), "blocks": len(state.blocks),
                        "pressure": request.pressure.to_dict()})


@ctxkernel.hookimpl
def sanitize_reply(session: Session, reply: ReplyDraft) -> None:
    reply.message = sanitize_assistant(reply.message)


@ctxkernel.hookimpl
def commit(session: Session, result: CommitResult) -> None:
    state = current_state(session)
    if result.strategy != NAME:
        return
    save_snapshot(session, state)
    if settings_of(session).audit:
        blocks = [state.blocks[s.replacement_seq] for s in result.spans if s.replacement_seq in state.blocks]
        audit(session, {"kind": result.kind, "compaction_id": result.compaction_id, "tokens_before": result.tokens_before,
                        "tokens_after": result.tokens_after, "cites": result.cites,
                        "blocks": [{"left": b.left, "right": b.right, "tier": b.tier, "topic": b.topic} for b in blocks]})


def audit_path(session: Session) -> Path:
    return Path(session.kernel.home) / NAME / "audit.jsonl"


def audit(session: Session, record: dict[str, Any]) -> None:
    """Append one JSONL record under the kernel home; never part of the model's context."""
    path = audit_path(session)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = orjson.dumps({"time": _now(), "session": session.id, **record}) + b"\n"
    with open(path, "ab") as f:  # one write of one line: concurrent appenders do not interleave
        f.write(line)


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@ctxkernel.hookimpl
def project(session: Session) -> dict[str, Any]:
    state = current_state(session)
    pressure = session.pressure()
    meter = session.meter
    positions = []
    for node in reversed(session.surface.nodes):  # newest at the top
        left = state.anchor_of.get(node.seq)
        block = state.blocks.get(node.seq)
        positions.append({
            "anchor": (f"{fmt(left)}…{fmt(block.right)}" if block and block.right is not None else fmt(left)) if left else None,
            "seq": node.seq,
            "role": node.role,
            "kind": "block" if block else ("unanchored" if left is None else "node"),
            "tokens": meter.node_tokens(node),
        })
    blocks = []
    for seq, block in state.blocks.items():
        node = session.surface.node(seq)
        blocks.append({"left": block.left, "right": block.right, "tier": block.tier, "topic": block.topic,
                       "tokens": meter.node_tokens(node) if node else 0, "sources": len(block.sources),
                       "source_seqs": [block.sources[0], block.sources[-1]] if block.sources else [],
                       "summary": block.summary[:160]})
    return {
        "pressure": {"ratio": round(pressure.ratio, 4), "tokens": pressure.tokens, "effective_window": pressure.effective_window,
                     "context_window": pressure.context_window, "reserved_output_tokens": pressure.reserved_output_tokens,
                     "total_occupancy": round(pressure.total_occupancy, 4), "baseline": state.baseline},
        "blocks": blocks,
        "positions": positions,
        "ids": {"next": state.next_id, "free": sorted(state.free), "reused": state.reuse_count},
        "reminders": {"last_seq": state.last_reminder_seq, "fired": {str(k): v for k, v in state.fired.items()}},
    }


@ctxkernel.hookimpl
def steward_actions(session: Session, request: Request) -> list[dict[str, Any]] | None:
    return steward.actions(session, request)


@ctxkernel.hookimpl
def validate_profile(profile: ctxkernel.Profile, report: Any) -> None:
    strategies = profile.profile.strategies
    if NAME not in strategies:
        return
    if "basic" not in strategies:
        report.warn("fallback", NAME, "decay only reminds; add 'basic' after it as the emergency fallback for hard budget protection")
    else:
        report.ok("fallback", NAME, "basic is the emergency fallback")


def is_decay_notice(message: ctxkernel.Message) -> bool:
    return message.source.kind == "plugin" and message.source.plugin == NAME and message.source.form == NOTICE_FORM


__all__ = ["DecaySettings", "current_state", "is_decay_notice"]

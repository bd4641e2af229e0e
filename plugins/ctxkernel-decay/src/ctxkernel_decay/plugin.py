"""The ``decay`` strategy's hooks: position anchors and model-authored compression.

The declaration, the settings and the position state live in :mod:`ctxkernel_decay.strategy`,
which the tools and the steward share; this module holds only the hooks.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

import ctxkernel
from ctxkernel import CompactionError, Span, StoreError, balanced_cut_at_or_before, get_logger

from . import steward
from .anchors import decorate_message, fmt, sanitize_assistant
from .state import CHECKPOINT_KIND, NAME, NOTICE_FORM, DecayState
from .strategy import STATE_VERSION, STRATEGY, DecaySettings, current_state, settings_of
from .strategy import snapshot_state as position_snapshot
from .tools import compressible_range, describe_compressible, protected_start, tools_for

if TYPE_CHECKING:
    from ctxkernel import CommitResult, ManualCompaction, ReplyDraft, Request, Session, StepContext

log = get_logger("ctxkernel.decay")


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


# -- hooks -------------------------------------------------------------------------------------------
def check_host_seam(session: Session) -> None:
    """Anchors need the kernel's presentation seam: decorations applied to the request and
    counted by the meter. Without it the model would see undecorated messages whose anchors it
    could never name, so activation fails loudly instead."""
    from ctxkernel import Request

    # the hooks come with the pinned kernel range (ctxkernel>=0.3,<0.4); the seam's method is
    # what an older or patched kernel could lack
    missing = [] if callable(getattr(Request, "decorate", None)) else ["Request.decorate"]
    if missing:
        msg = (
            f"strategy 'decay' needs the kernel's decoration seam, but this ctxkernel lacks {missing}; "
            "upgrade ctxkernel or remove 'decay' from the profile's strategies"
        )
        raise ctxkernel.ConfigError(msg)


@ctxkernel.hookimpl
def session_opened(session: Session) -> None:
    check_host_seam(session)
    STRATEGY.on(session).state.clear()
    current_state(session)


@ctxkernel.hookimpl
def snapshot_state(session: Session) -> ctxkernel.StrategySnapshot | None:
    return position_snapshot(session)


@ctxkernel.hookimpl
def register_tools(register: Any, session: Session) -> None:
    for tool in tools_for(session):
        register(tool)


@ctxkernel.hookimpl
def pre_step(session: Session, step: StepContext) -> None:
    decay = STRATEGY.on(session)
    if decay.route is None:
        return  # the first request of a fresh session has no routed window to measure against
    settings = decay.settings
    state = current_state(session)
    pressure = decay.pressure()
    if state.last_compaction_seq > state.baseline_seq and pressure.tokens < state.baseline:
        # a compression lowered pressure: growth is measured from here on
        rearm = [0] + [i + 1 for i, r in enumerate(settings.warn_ratios) if pressure.ratio < r]
        decay.emit("baseline", {"tokens": pressure.tokens, "ratio": round(pressure.ratio, 4), "rearm": rearm})
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
    protect = protected_start(session, planning=True)
    if compressible_range(state, session, protect) is None:
        # everything on the surface is the current turn, which is never compressed: a reminder
        # would ask for a call that can only be refused (the request guard protects the window)
        return
    decay.emit("reminder", {"level": fire, "tokens": pressure.tokens, "ratio": round(pressure.ratio, 4), "grew": grew})
    where = describe_compressible(state, session, protect)
    decay.remind(step, reminder_text(fire, pressure, grew, settings, where))


def _cooled(state: DecayState, level: int, settings: DecaySettings) -> bool:
    last = state.fired.get(level)
    return last is None or state.steps - last >= settings.cooldown_steps


def reminder_text(level: int, pressure: ctxkernel.Pressure, grew: int, settings: DecaySettings, where: str) -> str:
    """The reminder; ``where`` names the range a span may cover, so no call is wasted on the
    current turn."""
    pct = f"{pressure.ratio:.0%} of {pressure.effective_window} tokens"
    if level:
        return (
            f"[context decay] Warning {level}/{len(settings.warn_ratios)}: context at {pct}. Compress old spans you "
            f"no longer need verbatim (compress), or drop stale blocks (drop); {where}."
        )
    return (
        f"[context decay] Context grew {grew} tokens since the last note ({pct}). Consider compressing old spans; "
        f"{where}."
    )


@ctxkernel.hookimpl
def decorate_request(session: Session, request: Request) -> None:
    state = current_state(session)
    # decorated copies are reused while a node keeps its anchors: a request costs O(surface)
    # lookups, and only new or re-anchored nodes are rebuilt
    cache: dict[int, tuple[int, int | None, ctxkernel.Message | None]] = STRATEGY.on(session).state.setdefault(
        "decorated", {}
    )
    if len(cache) > 2 * len(request.seqs) + 64:
        visible = set(request.seqs)
        for seq in [s for s in cache if s not in visible]:
            del cache[seq]
    for index, seq in enumerate(request.seqs):
        left = state.anchor_of.get(seq)
        if left is None:
            message = request.messages[index]
            if message.role == "assistant":  # no anchor of its own, but maybe a copied run (seed §3)
                cleaned = sanitize_assistant(message)
                if cleaned is not message:
                    request.decorate(index, cleaned)
            continue
        right = state.right_of(seq)
        hit = cache.get(seq)
        if hit is None or hit[0] != left or hit[1] != right:
            hit = (left, right, decorate_message(request.messages[index], left, right))
            cache[seq] = hit
        if hit[2] is not None:
            request.decorate(index, hit[2])
    if settings_of(session).audit:
        audit(
            session,
            {
                "kind": "request",
                "turn": request.turn,
                "step": request.step,
                "messages": len(request.messages),
                "anchors": sum(1 for s in request.seqs if s in state.anchor_of),
                "blocks": len(state.blocks),
                "pressure": request.pressure.to_dict(),
            },
        )


@ctxkernel.hookimpl
def compact_now(session: Session, request: ManualCompaction) -> ctxkernel.ManualOutcome | None:
    """The seed's manual ``/compact``: a checkpoint summary of everything before the current turn.
    Replay treats it as ordinary history, not as a decay block (seed §5: an emergency fallback)."""
    if request.action != "compact":
        return None
    nodes = session.surface.nodes
    cut = balanced_cut_at_or_before(session.surface, protected_start(session))
    if cut < 2:
        return ctxkernel.ManualOutcome(False, "nothing before the current turn to compact")
    try:
        result = STRATEGY.on(session).compact(
            Span(nodes[0].seq, nodes[cut - 1].seq), kind=CHECKPOINT_KIND, data={"reason": "manual"}
        )
    except CompactionError as exc:
        return ctxkernel.ManualOutcome(False, f"{type(exc).__name__}: {exc}")
    return ctxkernel.ManualOutcome(True, f"checkpoint of the {cut} messages before the current turn", result)


@ctxkernel.hookimpl
def sanitize_reply(session: Session, reply: ReplyDraft) -> None:
    reply.message = sanitize_assistant(reply.message)


@ctxkernel.hookimpl
def commit(session: Session, result: CommitResult) -> None:
    state = current_state(session)
    if result.strategy != NAME:
        return
    if settings_of(session).audit:
        blocks = [state.blocks[s.replacement_seq] for s in result.spans if s.replacement_seq in state.blocks]
        audit(
            session,
            {
                "kind": result.kind,
                "compaction_id": result.compaction_id,
                "tokens_before": result.tokens_before,
                "tokens_after": result.tokens_after,
                "cites": result.cites,
                "blocks": [{"left": b.left, "right": b.right, "tier": b.tier, "topic": b.topic} for b in blocks],
            },
        )


#: audit records live in the strategy's blobs, one per record: ``audit/<session>/<time>-<id>.json``
AUDIT_PREFIX = "audit"


def audit(session: Session, record: dict[str, Any]) -> None:
    """Store one audit record in the strategy's blobs (one small blob each, so a record costs one
    write whatever the audit's length); never part of the model's context. ``ctxkernel export``
    writes a session's records as ``decay/audit.jsonl``. A failed write is logged, never raised
    into the harness: the audit is optional."""
    line = orjson.dumps({"time": _now(), "session": session.id, **record}) + b"\n"
    key = f"{AUDIT_PREFIX}/{session.id}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    try:
        STRATEGY.on(session).blobs.put(key, line)
    except StoreError as exc:
        log.warning("decay audit record not written", session=session.id, error=str(exc))


def audit_jsonl(session: Session) -> bytes:
    """The session's audit records in order, one JSON line each (empty when there are none)."""
    blobs = STRATEGY.on(session).blobs
    return b"".join(blobs.get(info.key) or b"" for info in blobs.list(f"{AUDIT_PREFIX}/{session.id}/"))


@ctxkernel.hookimpl
def export_files(session: Session) -> dict[str, bytes] | None:
    """``decay/audit.jsonl``: the session's audit records, as the seed lays the audit out."""
    data = audit_jsonl(session)
    return {f"{NAME}/audit.jsonl": data} if data else None


def _now() -> str:
    from ctxkernel.events import utc_now  # the replay clock in a simulation

    return utc_now()


@ctxkernel.hookimpl
def project(session: Session) -> dict[str, Any]:
    state = current_state(session)
    pressure = session.pressure()
    meter = session.meter
    positions = []
    for node in reversed(session.surface.nodes):  # newest at the top
        left = state.anchor_of.get(node.seq)
        block = state.blocks.get(node.seq)
        positions.append(
            {
                "anchor": (f"{fmt(left)}…{fmt(block.right)}" if block and block.right is not None else fmt(left))
                if left
                else None,
                "seq": node.seq,
                "role": node.role,
                "kind": "block" if block else ("unanchored" if left is None else "node"),
                "tokens": meter.node_tokens(node),
            }
        )
    blocks = []
    for seq, block in state.blocks.items():
        block_node = session.surface.node(seq)
        blocks.append(
            {
                "seq": seq,
                "left": block.left,
                "right": block.right,
                "tier": block.tier,
                "topic": block.topic,
                "tokens": meter.node_tokens(block_node) if block_node else 0,
                "sources": len(block.sources),
                "source_seqs": [block.sources[0], block.sources[-1]] if block.sources else [],
                "summary": block.summary[:160],
            }
        )
    return {
        "pressure": {
            "ratio": round(pressure.ratio, 4),
            "tokens": pressure.tokens,
            "effective_window": pressure.effective_window,
            "context_window": pressure.context_window,
            "reserved_output_tokens": pressure.reserved_output_tokens,
            "total_occupancy": round(pressure.total_occupancy, 4),
            "baseline": state.baseline,
        },
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
    checks = STRATEGY.validating(profile, report)
    if checks is None:
        return
    strategies = profile.profile.strategies
    if "basic" not in strategies:
        checks.warn(
            "fallback",
            "decay only reminds; add 'basic' after it as the emergency fallback for hard budget protection",
        )
    else:
        checks.ok("fallback", "basic is the emergency fallback")


def is_decay_notice(message: ctxkernel.Message) -> bool:
    return STRATEGY.owns(message.source, NOTICE_FORM)


__all__ = ["STATE_VERSION", "STRATEGY", "DecaySettings", "current_state", "is_decay_notice"]

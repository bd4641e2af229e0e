"""Manual controls: the actions a person triggers by hand, one API under every front door.

Two controls, reached through :class:`ctxkernel.Session` (``ctxkernel compact``, ``ctxkernel
strategy`` and the inspector's ``--allow-actions`` buttons all call these functions):

* **compact now** (:meth:`Session.compact_now`): the ``compact_now`` hook asks the session's
  enabled strategies in profile order; the first that handles the action acts in its own terms
  (basic: summarise the head; decay: the seed's ``/compact`` checkpoint; handoff and rollover:
  switch windows now; chapters: continue in a new session, or ``archive`` in place).
* **enable or disable a strategy for one session** (:meth:`Session.set_strategy_enabled`): a
  ``session/strategy`` event in the log. Every process folds it (``Session.refresh`` runs before
  each request), so the change takes effect at the next step of a running harness without a new
  Kernel, and survives a restart. A disabled strategy's hooks do not run for that session (the
  facade leaves them out, see :class:`ctxkernel.plugins.HookFacade`) and its tools leave the
  request. ``Kernel.set_strategy_enabled`` stays the per-process switch for every session.

Both refuse, with nothing written, while the session is mid-step (a request at the model, tool
calls waiting for results, a compaction open): the log says so, whichever process asks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import events as ev
from .errors import ControlError, SessionBusyError
from .logging import get_logger

# the request and its outcome are values the hook specifications name: they live with the spans
from .spans import MANUAL_ACTIONS, ManualCompaction, ManualOutcome

if TYPE_CHECKING:
    from .ports import SessionPort

log = get_logger("ctxkernel.controls")

#: who may be recorded as having asked (``by`` in the log and the outcome)
REQUESTERS = ("api", "cli", "ui")


def check_idle(session: SessionPort, what: str) -> None:
    """Refuse ``what`` while the log shows a step, tool calls or a compaction in flight."""
    if session.open_compaction is not None:
        msg = f"cannot {what}: compaction {session.open_compaction['compaction_id']} is still open; try again after it ends"
        raise SessionBusyError(msg)
    if session.surface.pending_calls:
        msg = (
            f"cannot {what}: tool calls {list(session.surface.pending_calls)[:5]} wait for results; "
            "try again between steps"
        )
        raise SessionBusyError(msg)
    if session.step_open:
        msg = f"cannot {what}: step {session.step} of turn {session.turn} is at the model; try again between steps"
        raise SessionBusyError(msg)


def _check_requester(by: str) -> None:
    if by not in REQUESTERS:
        msg = f"by must be one of {list(REQUESTERS)}, got {by!r}"
        raise ControlError(msg)


def check_strategy(session: SessionPort, name: str) -> None:
    """``name`` must be a strategy of the session's profile (installed is not enough)."""
    kernel = session.kernel
    if name in kernel.strategies:
        return
    profile = kernel.profile
    if name in kernel.plugins.available:
        msg = (
            f"strategy {name!r} is installed but not in profile {profile.name!r} ({profile.where}); "
            f"its strategies: {list(kernel.strategies)}. Add it to [profile] strategies to run it"
        )
    else:
        msg = f"no installed strategy named {name!r}; profile {profile.name!r} runs {list(kernel.strategies)}"
    raise ControlError(msg)


def set_strategy_enabled(session: SessionPort, name: str, enabled: bool, *, by: str = "api") -> bool:
    """Enable or disable ``name`` for this session from its next step on; True when that changed
    anything (asking for the current state writes nothing)."""
    _check_requester(by)
    with session.lock:
        session.refresh()
        check_strategy(session, name)
        if (name not in session.disabled_strategies) == enabled:
            return False
        check_idle(session, f"{'enable' if enabled else 'disable'} strategy {name!r}")
        session.append_one(ev.SESSION_STRATEGY, {"strategy": name, "enabled": enabled, "by": by})
        log.info("strategy toggled for the session", session=session.id, strategy=name, enabled=enabled, by=by)
        return True


def compact_now(session: SessionPort, action: str = "compact", *, by: str = "api") -> ManualOutcome:
    """Ask the session's enabled strategies to compact now; the first that handles ``action``
    acts. Raises :class:`ControlError` when none does, :class:`SessionBusyError` mid-step."""
    if action not in MANUAL_ACTIONS:
        msg = f"unknown manual action {action!r}; accepted: {list(MANUAL_ACTIONS)}"
        raise ControlError(msg)
    _check_requester(by)
    with session.lock:
        session.refresh()
        check_idle(session, f"{action} now")
        before = session.pressure().tokens
        answered: tuple[str, ManualOutcome] | None = session.kernel.hooks.compact_now(
            session, ManualCompaction(action, by)
        )
        if answered is None:
            msg = (
                f"no enabled strategy of session {session.id} handles manual {action!r}; "
                f"enabled: {session.enabled_strategies()}"
            )
            raise ControlError(msg)
        strategy, outcome = answered
        log.info("manual compaction", session=session.id, action=action, by=by, strategy=strategy, ok=outcome.committed)
        return replace(outcome, strategy=strategy, tokens_before=before, tokens_after=session.pressure().tokens)


__all__ = [
    "MANUAL_ACTIONS",
    "ManualCompaction",
    "ManualOutcome",
    "check_idle",
    "check_strategy",
    "compact_now",
    "set_strategy_enabled",
]

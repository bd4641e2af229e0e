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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from . import events as ev
from .errors import ControlError, SessionBusyError
from .logging import get_logger

if TYPE_CHECKING:
    from .compaction import CommitResult
    from .session import Session

log = get_logger("ctxkernel.controls")

#: what ``compact_now`` may be asked to do; a strategy answers only the actions it supports
MANUAL_ACTIONS: dict[str, str] = {
    "compact": "compact now, in the strategy's own terms (summarise, switch windows, continue)",
    "archive": "archive the head in place (chapters)",
}
#: who may be recorded as having asked (``by`` in the log and the outcome)
REQUESTERS = ("api", "cli", "ui")


@dataclass(frozen=True)
class ManualCompaction:
    """A person's request to compact now, handed to the ``compact_now`` hook."""

    action: str = "compact"
    by: str = "api"


@dataclass(frozen=True)
class ManualOutcome:
    """What a strategy did for a :class:`ManualCompaction`.

    ``committed`` is False when there was nothing to do or the strategy could not (``detail``
    says which); ``continued_in`` names the session the work goes on in when the strategy started
    a new one (chapters). The kernel fills in ``strategy`` (the one that answered) and the
    session's prompt tokens before and after.
    """

    committed: bool
    detail: str
    result: CommitResult | None = None
    continued_in: str | None = None
    strategy: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.committed,
            "strategy": self.strategy,
            "detail": self.detail,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }
        if self.continued_in:
            out["continued_in"] = self.continued_in
        return out


def check_idle(session: Session, what: str) -> None:
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


def check_strategy(session: Session, name: str) -> None:
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


def set_strategy_enabled(session: Session, name: str, enabled: bool, *, by: str = "api") -> bool:
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


def compact_now(session: Session, action: str = "compact", *, by: str = "api") -> ManualOutcome:
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
        answered = session.kernel.hooks.compact_now(session, ManualCompaction(action, by))
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

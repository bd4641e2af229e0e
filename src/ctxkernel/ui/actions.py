"""The manual controls the inspector offers with ``--allow-actions``, and their protection.

The page calls the kernel's one API for manual controls (:mod:`ctxkernel.controls`), as
``ctxkernel compact`` and ``ctxkernel strategy`` do:

* ``compact`` / ``archive``: :meth:`Session.compact_now`, which the session's enabled strategies
  answer in their own terms (basic summarises, decay writes a checkpoint, handoff and rollover
  switch windows, chapters continues in a new session or archives in place);
* enable or disable one of the profile's strategies for this session:
  :meth:`Session.set_strategy_enabled`, written to the session's log, so the process that runs the
  session picks it up at its next step.

Every action is a POST carrying the per-process token twice: in a ``SameSite=Strict`` cookie and
in the ``X-CSRF-Token`` header (or a ``csrf`` form field); a request whose ``Origin`` (or, without
one, ``Sec-Fetch-Site``) is not this server is refused before the token is looked at.
"""

from __future__ import annotations

import hmac
import re
import secrets
from typing import Any

from starlette.requests import Request

from ..controls import MANUAL_ACTIONS
from ..errors import ControlError, CtxKernelError, SessionBusyError
from ..session import Session

STRATEGY_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
CSRF_COOKIE = "ctxkernel_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"


class ActionRefused(Exception):
    """An action request that is not allowed, with the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def new_token() -> str:
    return secrets.token_urlsafe(32)


def same_origin(request: Request) -> bool:
    """No ``Origin`` (a non-browser client: it still needs the token) or this server's own."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site") in (None, "same-origin", "none")
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def check_post(request: Request, token: str, form: dict[str, Any] | None = None) -> None:
    """Refuse a state-changing request that could come from another site."""
    if request.method != "POST":
        raise ActionRefused(405, "actions are POST requests")
    if not same_origin(request):
        raise ActionRefused(403, f"cross-site request refused (Origin {request.headers.get('origin')!r})")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = request.headers.get(CSRF_HEADER) or (str(form.get(CSRF_FIELD, "")) if form else "")
    # compared as bytes: compare_digest refuses str with non-ASCII characters (TypeError, a 500)
    expected = token.encode()
    if not (
        hmac.compare_digest(cookie.encode("utf-8", "surrogatepass"), expected)
        and hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected)
    ):
        raise ActionRefused(403, "missing or wrong CSRF token: reload the page and try again")


def available(session: Session) -> dict[str, Any]:
    """The manual actions and the profile's strategies with their state in this session."""
    answering = session.kernel.hooks.compact_now_strategies(session)
    why = "" if answering else f"no enabled strategy offers manual compaction (enabled: {session.enabled_strategies()})"
    offered = {
        name: {"available": bool(answering), "strategies": answering, **({"why": why} if why else {})}
        for name in MANUAL_ACTIONS
    }
    strategies = [{"name": name, "enabled": session.strategy_enabled(name)} for name in session.kernel.strategies]
    return {"actions": offered, "strategies": strategies}


def _refusal(exc: CtxKernelError) -> ActionRefused:
    if isinstance(exc, SessionBusyError):
        return ActionRefused(409, f"busy: {exc}")
    if isinstance(exc, ControlError):
        return ActionRefused(400, str(exc))
    return ActionRefused(409, f"{type(exc).__name__}: {exc}")


def run(action: str, session: Session) -> dict[str, Any]:
    """Compact now (``compact`` or ``archive``); the outcome as JSON."""
    if action not in MANUAL_ACTIONS:
        raise ActionRefused(404, f"unknown action {action!r}; accepted: {list(MANUAL_ACTIONS)}")
    before = len(session.events)
    try:
        outcome = session.compact_now(action, by="ui")
    except CtxKernelError as exc:
        raise _refusal(exc) from None
    return outcome.to_dict() | {"events_written": len(session.events) - before}


def toggle(session: Session, name: str, toggle: str) -> dict[str, Any]:
    """Enable or disable ``name`` for this session; the new state as JSON."""
    if not STRATEGY_NAME.fullmatch(name):
        raise ActionRefused(400, f"strategy names are 1-64 lowercase letters, digits, '-' or '_'; got {name[:80]!r}")
    if toggle not in ("enable", "disable"):
        raise ActionRefused(404, f"unknown toggle {toggle!r}; accepted: ['enable', 'disable']")
    before = len(session.events)
    try:
        changed = session.set_strategy_enabled(name, toggle == "enable", by="ui")
    except CtxKernelError as exc:
        raise _refusal(exc) from None
    return {
        "ok": True,
        "strategy": name,
        "enabled": toggle == "enable",
        "changed": changed,
        "detail": f"{name} {toggle}d for this session" + ("" if changed else " (already)"),
        "events_written": len(session.events) - before,
    }

"""The manual controls the inspector offers with ``--allow-actions``, and their protection.

Only what the Session API can really do today is wired:

* ``compact``: a manual compaction through the strategy that owns it: ``handoff``'s
  :func:`ctxkernel_handoff.compact_now` (the seed's ``/compact``: a window switch, or a native
  summary), else ``basic``'s head summary keeping its ``retain_ratio`` tail. Other strategies have
  no manual entry point yet (issue #15).

Enabling or disabling a strategy for one session is not offered: the kernel's toggle
(:meth:`Kernel.set_strategy_enabled`) is per process and per kernel, not per session, and does not
reach the process that runs the session (issue #15).

Every action is a POST carrying the per-process token twice: in a ``SameSite=Strict`` cookie and
in the ``X-CSRF-Token`` header (or a ``csrf`` form field); a request whose ``Origin`` is not this
server is refused before the token is looked at.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from starlette.requests import Request

from ..errors import CompactionError, CtxKernelError
from ..session import Session

CSRF_COOKIE = "ctxkernel_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"

#: actions this inspector can perform, and those that wait for the kernel API of issue #15
WIRED = ("compact",)
WAITING = {"strategy-toggle": "enable/disable a strategy for one session needs the per-session toggle of issue #15"}


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
    if not (hmac.compare_digest(cookie, token) and hmac.compare_digest(sent, token)):
        raise ActionRefused(403, "missing or wrong CSRF token: reload the page and try again")


def available(session: Session) -> dict[str, Any]:
    """Which actions this session offers, and why not when it does not."""
    plugins = session.kernel.plugins
    if plugins.is_enabled("handoff"):
        compact: dict[str, Any] = {"available": True, "by": "handoff"}
    elif plugins.is_enabled("basic"):
        compact = {"available": True, "by": "basic"}
    else:
        compact = {"available": False, "why": f"no manual compaction in {plugins.enabled_names()} yet (issue #15)"}
    return {"compact": compact, **{name: {"available": False, "why": why} for name, why in WAITING.items()}}


def compact_now(session: Session) -> dict[str, Any]:
    """Run a manual compaction now; the outcome as JSON (``ok`` False with the reason)."""
    if session.step_open or session.surface.pending_calls:
        raise ActionRefused(409, "a model request or its tool calls are in flight: compact between steps")
    if session.open_compaction is not None:
        raise ActionRefused(409, f"compaction {session.open_compaction['compaction_id']} is still open")
    before = len(session.events)
    plugins = session.kernel.plugins
    if plugins.is_enabled("handoff"):
        import ctxkernel_handoff

        outcome = ctxkernel_handoff.compact_now(session)
        detail = outcome.detail or (f"switched to window {outcome.window}" if outcome.window else outcome.reason)
        result = {"ok": outcome.committed, "by": "handoff", "detail": detail}
    elif plugins.is_enabled("basic"):
        from ..default_plugins import basic

        settings = session.settings("basic")
        keep = int(settings.retain_ratio * session.pressure().effective_window)  # type: ignore[attr-defined]
        try:
            ok = basic.compact(session, keep, reason="manual")
        except CompactionError as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        else:
            detail = "summarised the head" if ok else "nothing to compact, or the summary did not shrink the surface"
        result = {"ok": ok, "by": "basic", "detail": detail}
    else:
        raise ActionRefused(501, available(session)["compact"]["why"])
    result["events_written"] = len(session.events) - before
    return result


def run(action: str, session: Session) -> dict[str, Any]:
    if action == "compact":
        try:
            return compact_now(session)
        except CtxKernelError as exc:
            raise ActionRefused(409, f"{type(exc).__name__}: {exc}") from None
    if action in WAITING:
        raise ActionRefused(501, WAITING[action])
    raise ActionRefused(404, f"unknown action {action!r}; wired: {list(WIRED)}, waiting for issue #15: {list(WAITING)}")

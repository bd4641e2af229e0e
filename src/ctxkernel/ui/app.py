"""The inspector's ASGI application (Starlette): pages at its root, JSON under ``/api``.

``ctxkernel ui`` mounts it at ``/ui``; ``ctxkernel serve`` can ``Mount("/ui", create_app(...))``.
Links are built from the mount point (``root_path``), so it works wherever it is mounted.

Escaping: pages are Jinja2 templates with autoescape on, and the script builds every element with
``textContent`` (never ``innerHTML``) from the JSON API, so session content is shown as text. The
Content-Security-Policy allows only this app's own script and style as a second line of defence.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import CtxKernelError, SessionNotFoundError, StoreError
from ..kernel import Kernel
from ..session import Session
from ..store.base import check_session_id
from . import actions
from .compare import CompareError, Replays, load_report
from .data import MAX_PAGE, Inspector

STATIC = Path(__file__).parent / "static"
#: hosts the app answers for unless told otherwise (a DNS-rebinding page cannot reach it)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class SecurityHeaders:
    """Adds the Content-Security-Policy and friends to every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"),
                    (b"x-frame-options", b"DENY"),
                    (b"cache-control", b"no-store"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class JSONBody(Response):
    """A response whose JSON is already bytes (see :func:`json_bytes`)."""

    media_type = "application/json"


def json_bytes(value: Any) -> bytes:
    """``value`` as compact JSON, encoded by orjson straight to bytes (about ten times the
    standard library's encoder on the surface and the timeline). A value orjson refuses (an
    integer past 64 bits in a strategy's panel) goes through the standard library instead,
    which writes it exactly; what neither can encode raises."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


@functools.cache
def page_templates() -> Jinja2Templates:
    """The page templates, compiled once per process and shared by every app (they are files of
    this package: nothing to reload while it runs)."""
    env = Environment(
        loader=PackageLoader("ctxkernel.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        auto_reload=False,
    )
    return Jinja2Templates(env=env)


def _error(status: int, message: str) -> JSONBody:
    return JSONBody(json_bytes({"error": message}), status_code=status)


def _int(request: Request, name: str, default: int | None, *, low: int = 0, high: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        msg = f"query parameter {name}={raw!r} must be a whole number"
        raise ValueError(msg) from None
    if value < low or (high is not None and value > high):
        msg = f"query parameter {name}={value} must be between {low} and {high if high is not None else 'any'}"
        raise ValueError(msg)
    return value


@dataclass
class UIState:
    """What the views of one inspector app share (``request.app.state.ui``)."""

    kernel: Kernel
    inspector: Inspector
    roots: list[Path]
    replays: Replays
    token: str
    allow_actions: bool
    poll_seconds: float


def state_of(request: Request) -> UIState:
    """The inspector app's state; ``request.app`` is the inspector, wherever it is mounted."""
    state: UIState = request.app.state.ui
    return state


def page(request: Request, name: str, **context: Any) -> Response:
    """A page from its template, with the CSRF token set as a cookie beside it."""
    ui = state_of(request)
    base = request.scope.get("root_path", "").rstrip("/")
    context |= {
        "base": base,
        "csrf": ui.token,
        "allow_actions": ui.allow_actions,
        "poll_ms": int(ui.poll_seconds * 1000),
        "profile": ui.kernel.profile.name,
        "store": ui.kernel.store.backend,
    }
    status = context.pop("status", 200)
    response = page_templates().TemplateResponse(request, name, context, status_code=status)
    # the token twice (cookie and page): a cross-site form cannot read the page to copy it
    response.set_cookie(actions.CSRF_COOKIE, ui.token, httponly=True, samesite="strict", path=base or "/")
    return response


# -- pages ----------------------------------------------------------------------------------------
async def sessions_page(request: Request) -> Response:
    return page(request, "sessions.html")


async def session_page(request: Request) -> Response:
    kernel = state_of(request).kernel
    session_id = request.path_params["session_id"]
    try:
        check_session_id(session_id)
    except StoreError as exc:
        return page(request, "error.html", message=str(exc), status=400)
    if not await run_in_threadpool(kernel.store.exists, session_id):
        return page(
            request,
            "error.html",
            message=f"no session {session_id!r} in the {kernel.store.backend} store",
            status=404,
        )
    return page(request, "session.html", session_id=session_id)


def compare_context(ui: UIState) -> dict[str, Any]:
    """What every Compare page shows besides a report."""
    from ..simulate.report import REPLAY_NOTE
    from ..simulate.workloads import WORKLOADS

    return {"workloads": sorted(WORKLOADS), "note": REPLAY_NOTE, "roots": [str(r) for r in ui.roots]}


async def simulate_page(request: Request) -> Response:
    from ..simulate.report import describe_source, render_chart, table_rows

    ui = state_of(request)
    report, error, where = None, None, ""
    try:
        if path := request.query_params.get("report"):
            report, where = await run_in_threadpool(load_report, path, ui.roots), path
        elif job := request.query_params.get("job"):
            report, where = ui.replays.get(job), f"replay {job}"
    except CompareError as exc:
        error = str(exc)
    context: dict[str, Any] = {"error": error, "where": where, **compare_context(ui)}
    if report is not None:
        try:
            # the chart is the simulate report's own SVG (it escapes every name it prints)
            context |= {
                "chart": Markup(render_chart(report)),
                "rows": table_rows(report),
                "source": describe_source(report["source"]),
            }
        except (KeyError, TypeError, ValueError) as exc:
            context["error"] = f"{where}: the report could not be drawn ({type(exc).__name__}: {exc})"
    return page(request, "simulate.html", **context)


async def simulate_run(request: Request) -> Response:
    ui = state_of(request)
    form = dict(await request.form())
    try:
        actions.check_post(request, ui.token, form)
    except actions.ActionRefused as exc:
        return _error(exc.status, str(exc))
    base = request.scope.get("root_path", "").rstrip("/")
    try:
        job = await run_in_threadpool(
            ui.replays.run,
            transcript=str(form.get("transcript", "")).strip(),
            workload=str(form.get("workload", "")).strip(),
            profiles=str(form.get("profiles", "")).strip() or ui.kernel.profile.name,
            window=str(form.get("window", "")),
        )
    except CompareError as exc:
        return page(request, "simulate.html", error=str(exc), where="", status=exc.status, **compare_context(ui))
    return RedirectResponse(f"{base}/simulate?job={job}", status_code=303)


# -- JSON API ---------------------------------------------------------------------------------------
async def call(fn: Any, *args: Any, **kwargs: Any) -> Response:
    """``fn(*args, **kwargs)`` in a worker thread, answered as JSON (store errors as their status)."""
    try:
        # encoded in the worker thread too: the event loop only sends bytes
        return JSONBody(await run_in_threadpool(lambda: json_bytes(fn(*args, **kwargs))))
    except SessionNotFoundError as exc:
        return _error(404, str(exc))
    except StoreError as exc:
        return _error(400 if "invalid" in str(exc) else 500, str(exc))
    except CtxKernelError as exc:
        return _error(500, f"{type(exc).__name__}: {exc}")


async def api_sessions(request: Request) -> Response:
    ui = state_of(request)

    def row(session_id: str) -> dict[str, Any]:
        try:
            return ui.inspector.row(session_id)
        except CtxKernelError as exc:  # one unreadable session is listed with why, not hiding the rest
            return {"id": session_id, "error": f"{type(exc).__name__}: {exc}"}

    def rows() -> dict[str, Any]:
        return {
            "profile": ui.kernel.profile.name,
            "store": ui.kernel.store.backend,
            "sessions": [row(i) for i in ui.inspector.session_ids()],
        }

    return await call(rows)


SessionView = Callable[[Request, UIState, str], Awaitable[Response]]


def session_route(view: SessionView) -> Callable[[Request], Awaitable[Response]]:
    """A view of one session: its id checked (400 naming the rule), a ValueError a 400."""

    async def endpoint(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            check_session_id(session_id)
        except StoreError as exc:
            return _error(400, str(exc))
        try:
            return await view(request, state_of(request), session_id)
        except ValueError as exc:
            return _error(400, str(exc))

    endpoint.__name__ = view.__name__
    return endpoint


@session_route
async def api_view(request: Request, ui: UIState, session_id: str) -> Response:
    return await call(ui.inspector.view, session_id)


@session_route
async def api_summary(request: Request, ui: UIState, session_id: str) -> Response:
    return await call(ui.inspector.summary, session_id)


@session_route
async def api_head(request: Request, ui: UIState, session_id: str) -> Response:
    # what the live page polls: one cheap store call, no replay
    return await call(lambda: {"events": ui.kernel.store.next_seq(session_id)})


@session_route
async def api_timeline(request: Request, ui: UIState, session_id: str) -> Response:
    return await call(ui.inspector.timeline, session_id)


@session_route
async def api_surface(request: Request, ui: UIState, session_id: str) -> Response:
    return await call(ui.inspector.surface, session_id)


@session_route
async def api_transactions(request: Request, ui: UIState, session_id: str) -> Response:
    return await call(lambda: {"transactions": ui.inspector.transactions(session_id)})


@session_route
async def api_log(request: Request, ui: UIState, session_id: str) -> Response:
    start = _int(request, "start", None)
    limit = _int(request, "limit", 100, low=1, high=MAX_PAGE)
    raw_types = request.query_params.get("type", "")
    types = [t.strip() for t in raw_types.split(",") if t.strip()][:20]
    if any(len(t) > 100 for t in types):
        return _error(400, "an event type filter is at most 100 characters")
    return await call(ui.inspector.log_page, session_id, start=start, limit=limit or 100, types=types or None)


@session_route
async def api_event(request: Request, ui: UIState, session_id: str) -> Response:
    try:
        seq = int(request.path_params["seq"])
    except ValueError:
        return _error(400, f"event seq {request.path_params['seq']!r} must be a whole number")
    return await call(ui.inspector.event, session_id, seq)


@session_route
async def api_actions(request: Request, ui: UIState, session_id: str) -> Response:
    def listing() -> dict[str, Any]:
        return {"allowed": ui.allow_actions, **actions.available(ui.inspector.open(session_id).session)}

    return await call(listing)


async def act(request: Request, ui: UIState, session_id: str, action: Callable[[Session], Any]) -> Response:
    """A manual control on one session: refused unless actions are on and the POST passes the
    CSRF checks; run under the open session's lock."""
    if not ui.allow_actions:
        return _error(403, "actions are off: start the inspector with --allow-actions")
    try:
        actions.check_post(request, ui.token)
    except actions.ActionRefused as exc:
        return _error(exc.status, str(exc))

    def perform() -> dict[str, Any]:
        opened = ui.inspector.open(session_id)
        with opened.lock:
            result: dict[str, Any] = action(opened.session)
            return result

    try:
        return await call(perform)
    except actions.ActionRefused as exc:
        return _error(exc.status, str(exc))


@session_route
async def api_action(request: Request, ui: UIState, session_id: str) -> Response:
    name = request.path_params["action"]
    return await act(request, ui, session_id, lambda session: actions.run(name, session))


@session_route
async def api_strategy_toggle(request: Request, ui: UIState, session_id: str) -> Response:
    name, toggle = request.path_params["name"], request.path_params["toggle"]
    return await act(request, ui, session_id, lambda session: actions.toggle(session, name, toggle))


ROUTES = [
    Route("/", sessions_page),
    Route("/sessions/{session_id}", session_page),
    Route("/simulate", simulate_page, methods=["GET"]),
    Route("/simulate", simulate_run, methods=["POST"]),
    Route("/api/sessions", api_sessions),
    Route("/api/sessions/{session_id}", api_view),
    Route("/api/sessions/{session_id}/summary", api_summary),
    Route("/api/sessions/{session_id}/head", api_head),
    Route("/api/sessions/{session_id}/timeline", api_timeline),
    Route("/api/sessions/{session_id}/surface", api_surface),
    Route("/api/sessions/{session_id}/transactions", api_transactions),
    Route("/api/sessions/{session_id}/log", api_log),
    Route("/api/sessions/{session_id}/events/{seq}", api_event),
    Route("/api/sessions/{session_id}/actions", api_actions, methods=["GET"]),
    Route("/api/sessions/{session_id}/actions/{action}", api_action, methods=["POST"]),
    Route("/api/sessions/{session_id}/strategies/{name}/{toggle}", api_strategy_toggle, methods=["POST"]),
    Mount("/static", StaticFiles(directory=STATIC), name="static"),
]


def create_app(
    kernel_or_profile: Kernel | str | os.PathLike[str] | None = None,
    *,
    kernel: Kernel | None = None,
    allow_actions: bool = False,
    allowed_hosts: list[str] | None = None,
    read_roots: list[str | os.PathLike[str]] | None = None,
    poll_seconds: float = 2.0,
) -> Starlette:
    """The inspector over a kernel's store (or the store of the profile named or at a path).

    The kernel may be given by keyword (``create_app(kernel=k)``, as ``ctxkernel serve`` mounts it).
    ``allow_actions`` enables the manual controls (POST, CSRF-protected); ``allowed_hosts`` are the
    Host names answered (default loopback only); ``read_roots`` the directories the Compare page
    may read reports and transcripts from (default the working directory)."""
    source = kernel if kernel is not None else kernel_or_profile
    if source is None:
        msg = "create_app needs a Kernel, or a profile name or path"
        raise TypeError(msg)
    kernel = source if isinstance(source, Kernel) else Kernel.from_profile(source)
    roots = [Path(r).expanduser().resolve() for r in (read_roots or [Path.cwd()])]
    ui = UIState(kernel, Inspector(kernel), roots, Replays(roots), actions.new_token(), allow_actions, poll_seconds)
    hosts = list(allowed_hosts) if allowed_hosts is not None else list(LOCAL_HOSTS)
    app = Starlette(
        routes=ROUTES, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts), Middleware(SecurityHeaders)]
    )
    app.state.ui = ui
    app.state.inspector = ui.inspector
    app.state.csrf_token = ui.token
    return app

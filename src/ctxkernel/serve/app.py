"""The ``ctxkernel serve`` ASGI app: an OpenAI Chat Completions and Anthropic Messages proxy.

Three parts, each in its own module:

- ``proxy.py``: the state of one process (kernel, sessions, turn locks, upstream client,
  metrics) and the turn API a request goes through;
- ``routes.py``: the HTTP routes, in each API's own shapes;
- ``process.py``: what only a process ``serve`` owns does (heap tuning, worker start-up).

This module assembles the first two into a Starlette app (:func:`create_app`), behind the gate
every request passes first (``gate.py``: a foreign ``Host``, a cross-site request), with the
inspector at ``/ui`` only when asked for and only for the operator's token. A host may embed the
app in its own process, which :func:`create_app` leaves as it found it.

The front door is thin: every context decision is the Session API's, so a behaviour fixed in the
kernel is fixed behind every front door at once.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.routing import Mount, Route

from ..errors import CtxKernelError
from ..kernel import Kernel
from ..logging import get_logger
from . import anthropic_wire, openai_wire
from .config import ServeConfig, build_kernel
from .gate import LOCAL_HOSTS, Gate
from .proxy import Proxy
from .routes import Handler, JSONBody
from .upstream import Upstream

log = get_logger("ctxkernel.serve")

#: the realm a browser shows when it asks the operator for the inspector's token
UI_REALM = 'Basic realm="ctxkernel serve inspector (any user name, the operator token as password)", charset="UTF-8"'


class OperatorOnly:
    """An ASGI app answered only for a request carrying the operator token: ``Authorization:
    Bearer <token>``, or HTTP Basic with the token as password (what a browser sends once the
    operator has typed it); anything else is a 401 asking for it."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def allowed(self, scope: Any) -> bool:
        value = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, credential = value.partition(b" ")
        if scheme.lower() == b"basic":
            try:
                credential = base64.b64decode(credential.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        elif scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credential.strip(), self.token)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.allowed(scope):
            body = b"the inspector needs the operator token (HTTP Basic password, or Authorization: Bearer)\n"
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"www-authenticate", UI_REALM.encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def operator_token(config: ServeConfig) -> str:
    """The inspector's token: the value of ``$ui_token_env``, else a new random one."""
    if config.ui_token_env:
        token = os.environ.get(config.ui_token_env, "")
        if len(token) < 16:
            msg = f"--ui-token-env {config.ui_token_env}: the variable must hold a token of at least 16 characters"
            raise CtxKernelError(msg)
        return token
    return secrets.token_urlsafe(24)


def ui_mount(kernel: Kernel, token: str, hosts: list[str]) -> Mount:
    """The web inspector at ``/ui``, behind the operator token."""
    # imported here, not at the top: the inspector's dependencies are an extra of their own
    try:
        from ..ui import create_app as create_ui_app
    except ImportError as exc:
        msg = f"--ui: the inspector needs the ui extra (pip install 'ctxkernel[ui]'): {exc}"
        raise CtxKernelError(msg) from None
    return Mount("/ui", app=OperatorOnly(create_ui_app(kernel=kernel, allowed_hosts=hosts), token))


def create_app(config: ServeConfig | None = None, *, kernel: Kernel | None = None) -> Starlette:
    """The Starlette app of ``ctxkernel serve``."""
    config = config or ServeConfig()
    config.check()  # again: a field may have been changed since the config was made
    kernel = kernel or build_kernel(config)
    upstream = Upstream(config.limits)
    proxy = Proxy(config, kernel, upstream)
    handler = Handler(proxy)
    chat = {
        "/v1/chat/completions": handler.chat_completions,
        "/chat/completions": handler.chat_completions,
        "/v1/messages": handler.messages,
        "/v1/responses": handler.responses,
        "/responses": handler.responses,
    }
    hosts = [*LOCAL_HOSTS, *config.allowed_hosts]
    routes: list[Any] = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in chat.items()),
        Route("/v1/messages/count_tokens", handler.count_tokens, methods=["POST"]),
        Route("/v1/models", handler.models, methods=["GET"]),
        Route("/healthz", handler.healthz, methods=["GET"]),
        Route("/metrics", handler.metrics, methods=["GET"]),
    ]
    token = None
    if config.ui:
        token = operator_token(config)
        routes.append(ui_mount(kernel, token, ["*"] if "*" in hosts else hosts))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        try:
            yield
        finally:
            await upstream.aclose()
            kernel.store.close()

    app = ServeApp(chat, Gate(hosts), routes=routes, lifespan=lifespan)
    app.state.proxy = proxy
    app.state.ui_token = token
    return app


class ServeApp(Starlette):
    """The Starlette app, behind the gate (``gate.py``), with the chat routes' POSTs handed to
    their handler directly.

    A chat request is most of what ``serve`` answers, and its handler already answers every
    error in the API's own shape, so Starlette's error and exception middleware and its route
    matching have nothing to add to it (about 0.1 ms a request: ``bench_serve.py``); every other
    request, and a chat path under a ``root_path``, goes through Starlette as routed above."""

    def __init__(self, chat: dict[str, Any], gate: Gate, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat = chat
        self.gate = gate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handle = None
        if scope["type"] == "http":
            path = scope["path"]
            refusal = self.gate.refusal(scope, cross_site=not path.startswith("/ui"))
            if refusal is not None:
                status, why = refusal
                wire = anthropic_wire if path.startswith("/v1/messages") else openai_wire
                kind = "permission_error" if status == 403 else "invalid_request_error"
                response = JSONBody(wire.error_body(why, kind=kind), status_code=status)
                await response(scope, receive, send)
                return
            if scope["method"] == "POST" and not scope.get("root_path"):
                handle = self.chat.get(path)
        if handle is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        response = await handle(HTTPRequest(scope, receive))
        await response(scope, receive, send)

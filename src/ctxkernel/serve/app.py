"""The ``ctxkernel serve`` ASGI app: an OpenAI Chat Completions and Anthropic Messages proxy.

Three parts, each in its own module:

- ``proxy.py``: the state of one process (kernel, sessions, turn locks, upstream client,
  metrics) and the turn API a request goes through;
- ``routes.py``: the HTTP routes, in each API's own shapes;
- ``process.py``: what only a process ``serve`` owns does (heap tuning, worker start-up).

This module assembles the first two into a Starlette app (:func:`create_app`); a host may embed
that app in its own process, which :func:`create_app` leaves as it found it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.routing import Mount, Route

from ..kernel import Kernel
from ..logging import get_logger
from .config import ServeConfig, build_kernel
from .proxy import Proxy
from .routes import Handler
from .upstream import Upstream

log = get_logger("ctxkernel.serve")


def ui_mount(kernel: Kernel) -> list[Mount]:
    """The web inspector at ``/ui`` when the ``ui`` extra (Jinja2) is installed, else nothing."""
    # imported here, not at the top: the inspector's dependencies are an extra of their own
    try:
        from ..ui import create_app as create_ui_app
    except ImportError as exc:
        log.info("serve.ui_not_mounted", reason=str(exc))
        return []
    return [Mount("/ui", app=create_ui_app(kernel=kernel))]


def create_app(config: ServeConfig | None = None, *, kernel: Kernel | None = None) -> Starlette:
    """The Starlette app of ``ctxkernel serve``."""
    config = config or ServeConfig()
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
    routes = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in chat.items()),
        Route("/v1/messages/count_tokens", handler.count_tokens, methods=["POST"]),
        Route("/v1/models", handler.models, methods=["GET"]),
        Route("/healthz", handler.healthz, methods=["GET"]),
        Route("/metrics", handler.metrics, methods=["GET"]),
        *ui_mount(kernel),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        try:
            yield
        finally:
            await upstream.aclose()
            kernel.store.close()

    app = ServeApp(chat, routes=routes, lifespan=lifespan)
    app.state.proxy = proxy
    return app


class ServeApp(Starlette):
    """The Starlette app, with the chat routes' POSTs handed to their handler directly.

    A chat request is most of what ``serve`` answers, and its handler already answers every
    error in the API's own shape, so Starlette's error and exception middleware and its route
    matching have nothing to add to it (about 0.1 ms a request: ``bench_serve.py``); every other
    request, and a chat path under a ``root_path``, goes through Starlette as routed above."""

    def __init__(self, chat: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat = chat

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        handle = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handle = self.chat.get(scope["path"])
        if handle is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        response = await handle(HTTPRequest(scope, receive))
        await response(scope, receive, send)

"""``ctxkernel serve``: an HTTP proxy that puts a profile's context management between any agent
and its model provider (OpenAI Chat Completions and Anthropic Messages). See docs/serve.md.

Needs the ``serve`` extra (``pip install 'ctxkernel[serve]'``): Starlette, uvicorn, aiohttp
and prometheus-client. Importing this package does not import them; :func:`create_app` does.
"""

from __future__ import annotations

from typing import Any

#: sessions a serve process keeps open in memory (``--max-sessions``; ``ServeConfig.max_sessions``)
DEFAULT_MAX_SESSIONS = 64


def create_app(*args: Any, **kwargs: Any) -> Any:
    """The Starlette app (see :func:`ctxkernel.serve.app.create_app`)."""
    from .app import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["DEFAULT_MAX_SESSIONS", "create_app"]

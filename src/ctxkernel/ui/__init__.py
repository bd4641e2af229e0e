"""The web inspector: sessions, their pressure, surface, log and strategy panels, and the
simulate comparison, as pages in a browser (issue #17).

``ctxkernel ui --profile NAME`` serves it at ``/ui``; ``ctxkernel serve`` mounts the same app::

    from starlette.routing import Mount
    from ctxkernel.ui import create_app
    routes = [..., Mount("/ui", create_app(kernel))]

Needs the ``ui`` extra (Starlette, uvicorn, Jinja2): ``pip install 'ctxkernel[ui]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app


def __getattr__(name: str) -> Any:
    # Loaded on first use: the CLI imports this package to register `ctxkernel ui` on every
    # install, and only the app itself needs the `ui` extra (an ImportError here names it).
    if name == "create_app":
        from .app import create_app

        return create_app
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = ["create_app"]

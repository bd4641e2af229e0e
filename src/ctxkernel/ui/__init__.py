"""The web inspector: sessions, their pressure, surface, log and strategy panels, and the
simulate comparison, as pages in a browser (issue #17).

``ctxkernel ui --profile NAME`` serves it at ``/ui``; ``ctxkernel serve`` mounts the same app::

    from starlette.routing import Mount
    from ctxkernel.ui import create_app
    routes = [..., Mount("/ui", create_app(kernel))]

Needs the ``ui`` extra (Starlette, uvicorn, Jinja2): ``pip install 'ctxkernel[ui]'``.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]

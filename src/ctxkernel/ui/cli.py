"""The ``ctxkernel ui`` subcommand: the inspector served by uvicorn at ``/ui``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def register(sub: Any) -> None:
    p = sub.add_parser(
        "ui",
        help="serve the web inspector over a profile's store",
        description=(
            "Serve the inspector at http://HOST:PORT/ui/: every session in the profile's store, each one's pressure "
            "timeline, surface, log, strategy panels and compactions, updated live; and the simulate comparison. "
            "Read-only unless --allow-actions."
        ),
    )
    p.add_argument("--profile", required=True, metavar="NAME_OR_PATH", help="the profile whose store is inspected")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8788, help="port (default 8788)")
    p.add_argument(
        "--allow-actions", action="store_true", help="offer the manual controls (compact now), CSRF-protected"
    )
    p.add_argument(
        "--read-root",
        action="append",
        metavar="DIR",
        help="a directory the Compare page may read reports and transcripts from (repeatable; default the working directory)",
    )
    p.set_defaults(func=cmd_ui)


def build_app(args: argparse.Namespace) -> Any:
    """The inspector mounted at ``/ui`` (``/`` redirects there)."""
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Mount, Route

    from . import create_app
    from .app import LOCAL_HOSTS

    hosts = list(LOCAL_HOSTS)
    if args.host not in hosts:
        hosts.append(args.host)
    inspector = create_app(
        args.profile, allow_actions=args.allow_actions, allowed_hosts=hosts, read_roots=args.read_root
    )

    async def to_ui(request: Any) -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    return Starlette(routes=[Route("/", to_ui), Mount("/ui", inspector)])


def cmd_ui(args: argparse.Namespace) -> int:
    from ..errors import CtxKernelError, ProfileError

    if not 0 < args.port < 65536:
        sys.stderr.write(f"ctxkernel ui: error: --port {args.port} must be between 1 and 65535\n")
        return EXIT_USAGE
    try:
        import uvicorn
    except ImportError:
        sys.stderr.write("ctxkernel ui: error: the inspector needs the 'ui' extra: pip install 'ctxkernel[ui]'\n")
        return EXIT_USAGE
    try:
        app = build_app(args)
    except ProfileError as exc:
        sys.stderr.write(f"ctxkernel ui: error: {exc}\n")
        return EXIT_USAGE
    except CtxKernelError as exc:
        sys.stderr.write(f"ctxkernel ui: {exc}\n")
        return EXIT_INVALID
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.stderr.write(
            f"ctxkernel ui: warning: serving on {args.host}: anyone who can reach it can read every session\n"
        )
    sys.stderr.write(
        f"ctxkernel ui: http://{args.host}:{args.port}/ui/ ({'actions on' if args.allow_actions else 'read-only'})\n"
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK

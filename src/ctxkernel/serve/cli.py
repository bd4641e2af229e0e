"""The ``ctxkernel serve`` subcommand."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any

from ..cli import bounded_int
from ..profile import MAX_TOKENS
from ..redact import redact_url
from ..settings_check import http_url_problem
from . import DEFAULT_MAX_SESSIONS

MISSING_EXTRA = "ctxkernel serve needs the serve extra: pip install 'ctxkernel[serve]'"


def bounded_float(low: float, high: float) -> Any:
    """An argparse type: a finite number in ``low..high``, refused naming the range otherwise."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            msg = f"{text!r} is not a number; accepted: a number from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(msg) from None
        if not low <= value <= high:  # also refuses nan
            msg = f"{text} is out of range; accepted: a number from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(msg)
        return value

    parse.__name__ = "number"
    return parse


def http_url(text: str) -> str:
    """An argparse type: an upstream's base URL (:func:`ctxkernel.settings_check.http_url_problem`)."""
    problem = http_url_problem(text)
    if problem:
        msg = f"{redact_url(text)!r} {problem}"
        raise argparse.ArgumentTypeError(msg)
    return text


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the OpenAI / Anthropic proxy that manages every session's context with a profile",
        description=(
            "Point an agent's base URL at this server (OPENAI_BASE_URL=http://HOST:PORT/v1, "
            "ANTHROPIC_BASE_URL=http://HOST:PORT) and every request is managed by the profile's strategies. "
            "See docs/serve.md."
        ),
    )
    p.add_argument("--profile", required=True, metavar="NAME_OR_PATH", help="profile name or path")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=bounded_int(0, 65535), default=8787)
    p.add_argument(
        "--upstream",
        type=http_url,
        metavar="URL",
        help="OpenAI-compatible base URL (default: profile [serve], else https://api.openai.com/v1)",
    )
    p.add_argument(
        "--anthropic-upstream",
        type=http_url,
        metavar="URL",
        help="Anthropic base URL (default: profile [serve], else https://api.anthropic.com)",
    )
    p.add_argument(
        "--responses-upstream",
        type=http_url,
        metavar="URL",
        help="OpenAI Responses base URL behind /v1/responses (default: profile [serve]; without one, "
        "Responses clients are translated to Chat Completions at --upstream)",
    )
    p.add_argument(
        "--window", type=bounded_int(256, MAX_TOKENS), metavar="TOKENS", help="override the profile's context window"
    )
    p.add_argument(
        "--workers",
        type=bounded_int(1, 64),
        default=1,
        metavar="N",
        help="worker processes (N > 1 needs the postgres store)",
    )
    p.add_argument(
        "--api-key-env", metavar="VAR", help="send the key in $VAR upstream instead of the clients' credentials"
    )
    p.add_argument(
        "--lock-wait",
        type=bounded_float(0.001, 3600.0),
        default=30.0,
        metavar="SECONDS",
        help="how long a request waits for its session's previous one before a 409 (default 30)",
    )
    p.add_argument(
        "--max-inner-rounds",
        type=bounded_int(0, 64),
        default=8,
        metavar="N",
        help="upstream calls for strategy tools per client request (default 8)",
    )
    p.add_argument(
        "--max-sessions",
        type=bounded_int(1, 1_000_000),
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help=f"sessions kept open in memory; the least recently used is closed and reopened from the store by "
        f"its next request (default {DEFAULT_MAX_SESSIONS})",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name clients reach serve by, besides the loopback names (repeatable; '*' turns the check off)",
    )
    p.add_argument(
        "--body-timeout",
        type=bounded_float(0.1, 3600.0),
        default=60.0,
        metavar="SECONDS",
        help="how long a client may take to send its request body before a 408 (default 60)",
    )
    p.add_argument(
        "--tenant-secret-env",
        metavar="VAR",
        help=(
            "the variable holding the key (at least 32 characters) of the credential hashes that keep tenants "
            "apart (default: one made and kept in the store)"
        ),
    )
    p.add_argument("--ui", action="store_true", help="mount the inspector at /ui, behind an operator token")
    p.add_argument(
        "--ui-token-env",
        metavar="VAR",
        help="the variable holding the inspector's operator token (default: a new one, printed at start)",
    )
    p.add_argument(
        "--tune-heap",
        action="store_true",
        help=(
            "settle the process's heap before serving: freeze start-up objects out of the garbage collector's "
            "reach and keep freed memory for reuse (glibc); faster per request, the process keeps its peak heap"
        ),
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..cli import EXIT_USAGE
    from ..errors import CtxKernelError

    try:
        from .app import create_app
        from .config import ServeConfig, build_kernel
        from .gate import LOCAL_HOSTS
        from .process import UI_TOKEN_ENV, run, startup_lines
        from .tenants import secret_from_env
    except ImportError:
        sys.stderr.write(MISSING_EXTRA + "\n")
        return EXIT_USAGE
    config = ServeConfig(
        profile=args.profile,
        window=args.window,
        upstream=args.upstream,
        anthropic_upstream=args.anthropic_upstream,
        responses_upstream=args.responses_upstream,
        api_key_env=args.api_key_env,
        lock_wait_seconds=args.lock_wait,
        max_inner_rounds=args.max_inner_rounds,
        max_sessions=args.max_sessions,
        tune_heap=args.tune_heap,
        body_seconds=args.body_timeout,
        allowed_hosts=[*([args.host] if args.host not in (*LOCAL_HOSTS, "0.0.0.0", "::") else []), *args.allowed_host],
        tenant_secret_env=args.tenant_secret_env,
        ui=args.ui,
        ui_token_env=args.ui_token_env,
    )
    made_token = None
    if args.ui and not args.ui_token_env:  # made here, so that every worker process has the same
        made_token = secrets.token_urlsafe(24)
        os.environ[UI_TOKEN_ENV] = made_token
        config.ui_token_env = UI_TOKEN_ENV
    try:
        if args.tenant_secret_env:  # checked here too: with --workers, only the workers read it
            secret_from_env(args.tenant_secret_env)
        kernel = build_kernel(config)  # fail fast on a bad profile, store or window
        if args.workers > 1 and kernel.store.backend != "postgres":
            sys.stderr.write(
                f"ctxkernel serve: error: --workers {args.workers} needs the postgres store (its advisory locks order one "
                f"session's requests across processes); the profile uses {kernel.store.backend!r}\n"
            )
            return EXIT_USAGE
        app = create_app(config, kernel=kernel) if args.workers == 1 else None
    except CtxKernelError as exc:
        sys.stderr.write(f"ctxkernel serve: error: {exc}\n")
        return EXIT_USAGE
    lines = startup_lines(config, kernel, host=args.host, port=args.port, workers=args.workers, ui_token=made_token)
    sys.stderr.write("\n".join(lines) + "\n")
    if app is None:
        kernel.store.close()  # each worker process opens its own
    run(config, app, host=args.host, port=args.port, workers=args.workers)
    return 0

"""``chapters`` subcommands: ``manifest`` (the lineage view) and ``segment`` (proposed chapters).

The plugin's ``register_commands`` hook adds them to ``ctxkernel`` (``ctxkernel chapters ...``);
the same commands also run as ``ctxkernel-chapters manifest|segment``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import orjson


def _dump(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def register(sub: Any) -> None:
    p = sub.add_parser("chapters", help="chapter archive: lineage manifest and proposed segmentation")
    inner = p.add_subparsers(dest="chapters_command", metavar="ACTION")
    m = inner.add_parser("manifest", help="the chain from the root session to SESSION, with every chapter (JSON)")
    m.add_argument("session")
    m.add_argument("--profile", default=None, help="profile name or path (default $CTXKERNEL_PROFILE, else chapters)")
    m.set_defaults(func=cmd_manifest)
    s = inner.add_parser("segment", help="proposed chapter ranges and titles for what SESSION could archive now (JSON)")
    s.add_argument("session")
    s.add_argument("--profile", default=None)
    s.add_argument(
        "--target",
        type=_target_tokens,
        default=None,
        help="tokens per chapter (default: the profile's chapter_token_target)",
    )
    s.add_argument(
        "--model-titles",
        action="store_true",
        help="ask the profile's [summarizer] model for titles and summaries (the session's prompt is the cached prefix)",
    )
    s.set_defaults(func=cmd_segment)


def _target_tokens(text: str) -> int:
    from .settings import MAX_TOKENS

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 200 <= value <= MAX_TOKENS:
        msg = f"{text!r}: accepted: an integer from 200 to {MAX_TOKENS} (tokens per chapter)"
        raise argparse.ArgumentTypeError(msg)
    return value


def _kernel(profile: str | None) -> Any:
    import os

    from ctxkernel import Kernel

    return Kernel.from_profile(profile or os.environ.get("CTXKERNEL_PROFILE") or "chapters")


def _usage_error(args: argparse.Namespace) -> tuple[Any, int | None]:
    """The kernel for ``--profile``, or exit 2 with one line when the arguments are bad."""
    from ctxkernel import ConfigError, StoreError, check_session_id

    try:
        check_session_id(args.session)
        return _kernel(args.profile), None
    except (ConfigError, StoreError) as exc:
        text = "; ".join(line for line in str(exc).splitlines() if line.strip())
        sys.stderr.write(f"ctxkernel chapters {args.chapters_command}: error: {text}\n")
        return None, 2


def _open(kernel: Any, session_id: str) -> Any:
    """The session, or None after saying on stderr that the store has no such session."""
    from ctxkernel import SessionNotFoundError

    try:
        return kernel.open_session(session_id, repair=False)
    except SessionNotFoundError as exc:
        sys.stderr.write(f"{exc}\n")
        return None


def cmd_manifest(args: argparse.Namespace) -> int:
    from .registry import manifest
    from .strategy import registry_of

    kernel, status = _usage_error(args)
    if status is not None:
        return status
    session = _open(kernel, args.session)
    if session is None:
        return 1
    _dump(manifest(registry_of(session.context).kv, session.id))
    return 0


def cmd_segment(args: argparse.Namespace) -> int:
    from . import strategy as plugin
    from .segment import propose_for

    kernel, status = _usage_error(args)
    if status is not None:
        return status
    session = _open(kernel, args.session)
    if session is None:
        return 1
    ctx = session.context  # the strategy's code reads the session as its hooks do
    settings = plugin.settings_of(ctx)
    floor = plugin.archived_through(ctx) + 1
    ceiling = plugin.archive_ceiling(ctx)
    top = -1 if ceiling is None else ceiling
    plans = propose_for(ctx, settings, floor, top, target_tokens=args.target or settings.chapter_token_target)
    usage = None
    if args.model_titles and plans:
        model = kernel.summarizer
        if model is None:
            sys.stderr.write('--model-titles needs a [summarizer] model in the profile (kind = "openai")\n')
            return 1
        plans, usage = _titles(ctx, settings, plans, model)
    _dump(
        {
            "session": session.id,
            "usage": usage,
            "floor": floor,
            "ceiling": ceiling,
            "chapters": [
                {
                    "start_seq": p.start_seq,
                    "end_seq": p.end_seq,
                    "title": p.title,
                    "summary": p.summary,
                    "tokens": p.tokens,
                }
                for p in plans
            ],
        }
    )
    return 0


def _titles(ctx: Any, settings: Any, plans: list[Any], model: Any) -> tuple[list[Any], Any]:
    from .archive import prepare
    from .segment import model_titles

    header = next((e for e in reversed(ctx.events) if e.type == "request/header"), None)
    system, tools = (header.data["system"], header.data["tools"]) if header else ("", [])
    # rendered in memory with placeholder numbers: nothing is written
    bodies = [
        p.text.split("\n---\n", 1)[1]
        for p in prepare(ctx, settings, plans, list(range(1, len(plans) + 1)), root="preview", status="preview")
    ]
    return model_titles(plans, bodies, model, system=system, tools=tools)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctxkernel-chapters")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(sub)
    args = parser.parse_args(["chapters", *(argv if argv is not None else sys.argv[1:])])
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

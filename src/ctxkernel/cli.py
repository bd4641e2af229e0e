"""The ``ctxkernel`` command.

Each subcommand lives in a module with ``register(subparsers)`` that adds its parser and sets
``func``; :data:`COMMAND_MODULES` lists the kernel's own, so that features (simulate, store) keep
their command next to their code. Installed distributions add theirs through entry points of
group ``ctxkernel.commands`` naming such a module (``ctxkernel chapters manifest`` comes from the
chapters strategy this way).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

import orjson

from .errors import CtxKernelError
from .logging import configure_logging
from .redact import redact

#: modules that add subcommands (each defines ``register(subparsers)``)
COMMAND_MODULES: tuple[str, ...] = (
    "ctxkernel.cli_commands",
    "ctxkernel.store.cli",
    "ctxkernel.simulate.cli",
)

#: entry-point group through which installed distributions add subcommands
COMMAND_ENTRY_POINTS = "ctxkernel.commands"

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def dump_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctxkernel", description="Context management for LLM agent harnesses")
    parser.add_argument("--log-level", default="warning", help="debug, info, warning (default) or error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    for ep in sorted(importlib.metadata.entry_points(group=COMMAND_ENTRY_POINTS), key=lambda e: e.name):
        try:
            ep.load().register(sub)
        except Exception as exc:  # a broken plugin must not take the whole CLI down: say which one
            print(f"ctxkernel: command plugin {ep.name!r} ({ep.value}) failed to load: {redact(str(exc))}", file=sys.stderr)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage (0 for --help): return it, so main() is callable
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    configure_logging(args.log_level)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except CtxKernelError as exc:
        # a kernel error a command did not handle is still reported as a message, not a traceback
        sys.stderr.write(f"ctxkernel {args.command}: error: {redact(str(exc))}\n")
        return EXIT_INVALID


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

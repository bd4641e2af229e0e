"""The ``ctxkernel`` command.

Each subcommand lives in a module with ``register(subparsers)`` that adds its parser and sets
``func``; :data:`COMMAND_MODULES` lists them so that features (simulate, store) keep their
command next to their code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import orjson

from .logging import configure_logging

#: modules that add subcommands (each defines ``register(subparsers)``)
COMMAND_MODULES: tuple[str, ...] = (
    "ctxkernel.cli_commands",
    "ctxkernel.store.cli",
)

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``ctxkernel`` command.

Each subcommand lives in a module with ``register(subparsers)`` that adds its parser and sets
``func``; :data:`COMMAND_MODULES` lists the kernel's own, so that features (simulate, store) keep
their command next to their code. Installed strategies add theirs through the
``register_commands`` hook (``ctxkernel chapters manifest`` comes from the chapters strategy this
way), called on every installed strategy through the typed hook facade.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from ..errors import CtxKernelError, ProfileError
from ..exits import EXIT_INVALID, EXIT_OK, EXIT_USAGE, dump_json, one_line
from ..logging import configure_logging
from ..plugins import StrategyManager
from ..redact import redact

#: modules that add subcommands (each defines ``register(subparsers)``)
COMMAND_MODULES: tuple[str, ...] = (
    "ctxkernel.cli.commands",
    "ctxkernel.cli.scaffold",
    "ctxkernel.store.cli",
    "ctxkernel.simulate.cli",
    "ctxkernel.ui.cli",
    "ctxkernel.serve.cli",
)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage block is one ``--help`` away); subcommand
    parsers inherit it, including those that installed distributions add."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def file_in_the_way(folder: Path) -> Path | None:
    """The file (anything but a folder) at ``folder`` or at its nearest existing ancestor: what
    stops ``folder`` being made or used as a folder; None when nothing does."""
    for path in (folder, *folder.parents):
        try:
            if path.is_dir():
                return None
            if path.exists():  # a dangling link is no file: making the folder reports it
                return path
        except OSError:  # unreadable: making the folder reports it
            return None
    return None


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``low..high``, refused naming the range otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            msg = f"{text!r} is not an integer; accepted: an integer from {low} to {high}"
            raise argparse.ArgumentTypeError(msg) from None
        if not low <= value <= high:
            msg = f"{value} is out of range; accepted: an integer from {low} to {high}"
            raise argparse.ArgumentTypeError(msg)
        return value

    parse.__name__ = "integer"
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ctxkernel", description="Context management for LLM agent harnesses")
    parser.add_argument(
        "--log-level",
        default=None,
        choices=("debug", "info", "warning", "error"),
        help="log lines on stderr at this level and above (debug, info, warning or error), as text; default: none",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    register_strategy_commands(sub)
    return parser


def register_strategy_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    """Every installed strategy's ``register_commands`` hook, in name order."""
    manager = StrategyManager()
    for name in sorted(manager.available):
        available = manager.available[name]
        try:
            manager.register(available.load(), name, distribution=available.distribution, version=available.version)
        except Exception as exc:  # a broken plugin must not take the whole CLI down: say which one
            print(
                f"ctxkernel: strategy {name!r} ({available.distribution}) failed to load: {redact(str(exc))}",
                file=sys.stderr,
            )
    manager.hooks.register_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage (0 for --help): return it, so main() is callable
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    configure_logging(args.log_level)
    if not getattr(args, "func", None):
        if args.command:  # a command group (store, chapters) without its subcommand
            sys.stderr.write(
                f"ctxkernel {args.command}: error: choose a subcommand (see ctxkernel {args.command} --help)\n"
            )
        else:
            parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        # the CTXKERNEL_* environment overrides every profile: a bad value is a usage error of
        # whatever command runs, told once, before the command does any work
        from ..profile import builtin_profile

        builtin_profile()
    except ProfileError as exc:
        message = redact(one_line(exc))
        if "environment variable" not in message:  # the defaults are valid: the overrides are not
            from ..profile import ENV_PREFIX

            overrides = sorted(k for k in os.environ if k.upper().startswith(ENV_PREFIX))
            message = f"{message} (from the environment overrides {overrides})"
        sys.stderr.write(f"ctxkernel {args.command}: error: {message}\n")
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except CtxKernelError as exc:
        # a kernel error a command did not handle is still reported as a message, not a traceback
        sys.stderr.write(f"ctxkernel {args.command}: error: {redact(str(exc))}\n")
        return EXIT_INVALID
    except BrokenPipeError:
        # the reader went away (`ctxkernel inspect ID | head`): stop quietly, and point stdout at
        # /dev/null so the interpreter's last flush does not fail on the closed pipe either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_OK


__all__ = [
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_USAGE",
    "Parser",
    "bounded_int",
    "build_parser",
    "dump_json",
    "main",
    "one_line",
]

"""The ``ctxkernel`` command: the parser and its entry point (:mod:`.main`), the kernel's own
subcommands (:mod:`.commands`) and ``new-strategy`` (:mod:`.scaffold`)."""

from __future__ import annotations

from .main import (
    COMMAND_MODULES,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    bounded_int,
    build_parser,
    dump_json,
    main,
    one_line,
)

__all__ = [
    "COMMAND_MODULES",
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

"""The command line's exit statuses and output helpers, in a leaf module so that every
subcommand module (``cli.commands``, ``store/cli``, ``simulate/cli``) can use them without
importing the ``ctxkernel`` command itself (which would put ``store`` in an import cycle)."""

from __future__ import annotations

import sys
import unicodedata

import orjson

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def dump_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n")


def one_line(text: object) -> str:
    """A multi-line error (several profile problems) as one line of a usage error."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def printable(text: object) -> str:
    """``text`` safe to write to a terminal: control characters (an escape sequence from a profile
    file retitles the window or clears the screen) and lone surrogates written as ``\\x1b``,
    ``\\n``, ``\\udcff``, the way ``repr`` writes them."""
    return "".join(repr(char)[1:-1] if unicodedata.category(char) in ("Cc", "Cs") else char for char in str(text))


__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "dump_json", "one_line", "printable"]

"""``ctxkernel new-strategy NAME``: write a complete strategy distribution to start from.

The files come from ``templates/strategy/`` (shipped in the kernel's wheel): a pyproject with the
``ctxkernel.strategies`` and ``ctxkernel.profiles`` entry points and a pin on this kernel's minor
series, a package using the strategy handle with typed settings, a shipped profile, a README and
tests that run the conformance suite. The generated distribution installs, validates and passes
its own tests unchanged (``tests/packaging/test_fresh_venvs.py`` proves it in a fresh venv).

The name is validated before anything is written, and an existing folder is never touched.
"""

from __future__ import annotations

import argparse
import re
import string
import sys
import unicodedata
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..events import KERNEL_TYPES
from ..exits import EXIT_OK, EXIT_USAGE, one_line
from ..plugins import _kernel_version, discover
from .main import file_in_the_way

#: lower-case words joined by single hyphens: an entry-point name, a ``<name>/<kind>`` event
#: namespace and, with underscores, a Python package and an environment-variable segment
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
MAX_NAME_LENGTH = 40
#: the kernel's own event namespaces (turn, step, tool...): a strategy's events are ``<name>/<kind>``
RESERVED = frozenset(t.split("/")[0] for t in KERNEL_TYPES)
#: what ``simulate --profile`` reads as keywords, not as profile names
PROFILE_KEYWORDS = frozenset({"all", "none"})


def check_name(name: str) -> None:
    """Refuse a strategy name that could not work, saying what is accepted (ConfigError)."""
    if len(name) > MAX_NAME_LENGTH or not NAME_PATTERN.fullmatch(name):
        msg = (
            f"strategy name {name[:60]!r} is not accepted: use {MAX_NAME_LENGTH} characters at most, lower-case "
            "letters and digits in words joined by single hyphens, starting with a letter (e.g. pin-and-trim)"
        )
        raise ConfigError(msg)
    if name in PROFILE_KEYWORDS:
        msg = (
            f"strategy name {name!r} is a keyword of `simulate --profile` ({sorted(PROFILE_KEYWORDS)}); choose another"
        )
        raise ConfigError(msg)
    if name in RESERVED:
        msg = f"strategy name {name!r} is a kernel event namespace ({sorted(RESERVED)}); choose another"
        raise ConfigError(msg)
    available, _ = discover()
    if name in available:
        owner = available[name].distribution
        msg = f"strategy name {name!r} is already taken by the installed distribution {owner!r}; choose another"
        raise ConfigError(msg)


def kernel_pin() -> str:
    """``ctxkernel>=X.Y,<X.Y+1``: the minor series whose strategy contract this kernel has."""
    version = _kernel_version()
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        msg = f"cannot tell this kernel's version ({version!r}) to pin it; install ctxkernel as a distribution"
        raise ConfigError(msg)
    major, minor = int(found[1]), int(found[2])
    return f"ctxkernel>={major}.{minor},<{major}.{minor + 1}"


def check_description(description: str) -> None:
    """Refuse a description holding a control character (ConfigError naming it): TOML's strings
    cannot hold one, and a terminal would act on it. A lone surrogate (what a byte that is not
    UTF-8 in the argument becomes) is no text at all: no file could be written with it."""
    for char in description:
        if unicodedata.category(char) == "Cs":
            msg = (
                f"--description: {description[:60]!r} holds U+{ord(char):04X}, which is not a character "
                "(a byte that is not UTF-8?); accepted: UTF-8 text"
            )
            raise ConfigError(msg)
        if unicodedata.category(char) == "Cc" and char not in " \t\n\r":
            msg = (
                f"--description: {description[:60]!r} holds the control character U+{ord(char):04X}; "
                "accepted: printable text (line breaks and tabs become spaces)"
            )
            raise ConfigError(msg)


def new_strategy(name: str, parent: Path, description: str = "") -> Path:
    """Write distribution ``ctxkernel-<name>`` into ``parent``; returns its folder. Raises
    :class:`ConfigError` for a bad name or description, or when the folder already exists
    (nothing is written)."""
    check_name(name)
    check_description(description)
    target = parent / f"ctxkernel-{name}"
    blocker = file_in_the_way(parent)
    if blocker is not None:
        msg = (
            f"--to {parent}: {blocker} is a file, not a folder; accepted: a folder, or a path where one can be "
            "created (under folders only)"
        )
        raise ConfigError(msg)
    if target.exists() or target.is_symlink():
        msg = f"{target} already exists; new-strategy never writes into an existing folder. Fix: pass another --to"
        raise ConfigError(msg)
    package = "ctxkernel_" + name.replace("-", "_")
    # the description lands in TOML and Python strings: one line, no quotes or backslashes
    description = one_line(description)[:200].replace('"', "'").replace("\\", "/")
    values = {
        "name": name,
        "dist": f"ctxkernel-{name}",
        "package": package,
        "env_name": name.replace("-", "_").upper(),
        "tool": f"{name.replace('-', '_')}_status",
        "kernel_pin": kernel_pin(),
        "description": description or "compacts the oldest messages into a summary under pressure",
    }
    renames = {"package": package, "name.toml": f"{name}.toml", "test_package.py": f"test_{package}.py"}
    files: dict[Path, str] = {}
    _collect(resources.files("ctxkernel") / "templates" / "strategy", Path(), values, renames, files)
    target.mkdir(parents=True)  # fails if another process created it meanwhile: never overwrite
    for relative, text in sorted(files.items()):
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


def _collect(
    folder: Traversable, relative: Path, values: dict[str, str], renames: dict[str, str], out: dict[Path, str]
) -> None:
    for item in folder.iterdir():
        name = item.name.removesuffix(".tmpl")
        if name == "__pycache__":
            continue
        path = relative / renames.get(name, name)
        if item.is_dir():
            _collect(item, path, values, renames, out)
        elif item.name.endswith(".tmpl"):
            out[path] = string.Template(item.read_text(encoding="utf-8")).substitute(values)
        else:
            out[path] = item.read_text(encoding="utf-8")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "new-strategy",
        help="write a new strategy distribution (package, settings, profile, README, tests) to start from",
        description="Write ctxkernel-NAME/ in DIR (default: the current folder); never overwrites a folder.",
    )
    p.add_argument("name", metavar="NAME", help="the strategy's name, e.g. pin-and-trim")
    p.add_argument("--to", type=Path, default=Path(), metavar="DIR", help="the folder to write ctxkernel-NAME/ in")
    p.add_argument("--description", default="", help="a one-line description for the package metadata")
    p.set_defaults(func=cmd_new_strategy)


def cmd_new_strategy(args: argparse.Namespace) -> int:
    try:
        target = new_strategy(args.name, args.to, args.description)
    except (ConfigError, OSError) as exc:
        sys.stderr.write(f"ctxkernel new-strategy: error: {one_line(str(exc))}\n")
        return EXIT_USAGE
    sys.stdout.write(
        f"wrote {target}\nnext: pip install -e '{target}[test]' && ctxkernel validate {args.name} "
        f"&& (cd '{target}' && pytest)\n"
    )
    return EXIT_OK

"""Core subcommands: plugins, profiles, validate, inspect, run."""

from __future__ import annotations

import argparse
from typing import Any

from .cli import EXIT_OK, dump_json
from .plugins import StrategyManager


def register(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list installed strategies as JSON")
    p.set_defaults(func=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    manager = StrategyManager()
    rows = []
    for name, available in sorted(manager.available.items()):
        spec = manager.register(available.load(), name, distribution=available.distribution, version=available.version)
        rows.append(
            {
                "name": name,
                "distribution": available.distribution,
                "version": available.version,
                "hooks": manager.hook_names(name),
                "capabilities": sorted(spec.capabilities),
                "tools": [],
            }
        )
    dump_json(rows)
    return EXIT_OK

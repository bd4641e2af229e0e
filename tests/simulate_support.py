"""Replays that several simulate tests share, run once per test process (per xdist worker).

A built-in workload is built once, so what every replay derives from a recording (the cued-recall
candidates, the retention probes; kept in ``Recording.derived``) is derived once. A replay asked
for twice with the same profile and options is run once; each caller gets its own copy of the
row, so no test sees another's edits. A test that patches the kernel or the simulator while it
replays must call ``run_profile`` itself: a kept row would not have run under its patch.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from ctxkernel.simulate import Options, Recording, build_workload, run_profile


@functools.cache
def workload(name: str, seed: int = 7) -> Recording:
    """The built-in workload ``name`` (do not change its items: other tests replay it too)."""
    return build_workload(name, seed)


def replayed(profile: str, name: str, **options: Any) -> dict[str, Any]:
    """``run_profile(profile, workload(name), Options(**options))``, run once per process."""
    return copy.deepcopy(_replayed(profile, name, tuple(sorted(options.items()))))


@functools.cache
def _replayed(profile: str, name: str, options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return run_profile(profile, workload(name), Options(**dict(options)))

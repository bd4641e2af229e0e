"""``ctxkernel simulate``: strategies compared on recorded sessions and synthetic workloads.

::

    from ctxkernel.simulate import Options, compare, load_recording
    report = compare(["basic", "decay"], load_recording("session.jsonl"), Options(window=60_000))
    report["profiles"][0]["peak_prompt_tokens"]

Pieces: :mod:`.importers` (six recording formats, sniffed; SWE-agent and OpenHands in :mod:`.agent_logs`), :mod:`.workloads` (synthetic,
seeded), :mod:`.steward` (the replaceable context-management policy), :mod:`.replay` (open-loop
replay and metrics), :mod:`.checks` (independent invariant checks), :mod:`.report` (table, JSON,
HTML). The assistant turns are replayed, not regenerated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..profile import list_profiles
from .importers import FORMATS, load_recording, sniff
from .recording import AssistantItem, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem
from .replay import METRIC_KEYS, Options, run_profile
from .report import REPLAY_NOTE, render_html, render_table
from .steward import default_steward, load_steward, no_steward
from .workloads import WORKLOADS, build_workload

#: top-level keys of the JSON report
REPORT_KEYS: tuple[str, ...] = ("source", "settings", "profiles", "note")


def profile_names(spec: str) -> list[str]:
    """A comma-separated list of profile names or paths; ``all`` in it stands for every profile
    found (plus the built-in ``basic``), ``none`` for the unmanaged baseline."""
    names: list[str] = []
    for part in (n.strip() for n in spec.split(",")):
        if part == "all":
            found = sorted(list_profiles())
            names += found if "basic" in found else ["basic", *found]
        elif part:
            names.append(part)
    if not names:
        msg = f"--profile {spec!r}: give 'all' or a comma-separated list of profile names or paths"
        raise RecordingError(msg)
    return list(dict.fromkeys(names))


def compare(profiles: Sequence[str], recording: Recording, options: Options | None = None) -> dict[str, Any]:
    """Replay ``recording`` through every profile; the JSON report as a dict."""
    options = options or Options()
    results = [run_profile(name, recording, options) for name in profiles]
    steward = options.steward
    return {
        "source": recording.describe(),
        "settings": {
            "window": options.window,
            "summarizer": options.summarizer,
            "steward": f"{steward.__module__}:{steward.__qualname__}",
            "prices": options.prices.model_dump() if options.prices else None,
        },
        "profiles": results,
        "note": REPLAY_NOTE,
    }


__all__ = [
    "FORMATS",
    "METRIC_KEYS",
    "REPLAY_NOTE",
    "REPORT_KEYS",
    "WORKLOADS",
    "AssistantItem",
    "MarkerItem",
    "Options",
    "Recording",
    "RecordingError",
    "ToolResultItem",
    "UserItem",
    "build_workload",
    "compare",
    "default_steward",
    "load_recording",
    "load_steward",
    "no_steward",
    "profile_names",
    "render_html",
    "render_table",
    "run_profile",
    "sniff",
]

"""``ctxkernel simulate``: strategies compared on recorded sessions and synthetic workloads.

::

    from ctxkernel.simulate import Options, compare, load_recording
    report = compare(["basic", "decay"], load_recording("session.jsonl"), Options(window=60_000))
    report["profiles"][0]["peak_prompt_tokens"]

Pieces: :mod:`.importers` (six recording formats, sniffed; Claude Code in :mod:`.claude_code`,
SWE-agent and OpenHands in :mod:`.agent_logs`; shared checks in :mod:`.reading`; what was left out
in :mod:`.accounting`), :mod:`.workloads` (synthetic, seeded), :mod:`.steward` (the replaceable
context-management policy), :mod:`.replay` (open-loop replay and metrics, priced with
:mod:`ctxkernel.pricing`), :mod:`.cues` and :mod:`.recall` (cued recall and reachable history),
:mod:`.probes` (retention probes, instructions), :mod:`.checks` (independent invariant checks),
:mod:`.report` (table, JSON, HTML). The assistant turns are replayed, not regenerated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..pricing import PRICE_TABLE_VERSION
from ..profile import MAX_TOKENS, list_profiles
from .importers import FORMATS, load_recording, sniff
from .recording import AssistantItem, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem
from .replay import METRIC_KEYS, MIN_WINDOW, UNMANAGED, Options, empty_metrics, model_for, price_of, run_profile
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


class WindowShareError(Exception):
    """``--window <share>x`` has no window: the unmanaged replay it is measured from did not run."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def window_for(recording: Recording, options: Options) -> int | None:
    """The window to replay with: ``--window`` as given, or for ``--window <share>x`` that share of
    the recording's own unmanaged peak (one extra replay through ``none``), at least ``MIN_WINDOW``.
    Raises :class:`WindowShareError` when that replay did not run: its peak is unknown, and a
    window made up for it would report every profile as refused for a window nobody chose."""
    if options.window_share is None:
        return options.window
    baseline = run_profile(UNMANAGED, recording, replace(options, window=None, window_share=None, keep_sessions=None))
    if baseline["status"] != "ok":
        msg = (
            f"--window {options.window_share:g}x: the window is that share of the unmanaged replay's peak, and "
            f"that replay {baseline['status']}: {baseline['error']}"
        )
        raise WindowShareError(baseline["status"], msg)
    peak = baseline["peak_prompt_tokens"] or 0
    return min(MAX_TOKENS, max(MIN_WINDOW, math.ceil(peak * options.window_share)))


def settings_of(options: Options) -> dict[str, Any]:
    """The ``settings`` object of a report."""
    steward = options.steward
    return {
        "window": options.window,
        "window_share": options.window_share,
        "summarizer": options.summarizer,
        "steward": f"{steward.__module__}:{steward.__qualname__}",
        "model": options.model,
        "prices": price_of(options).to_dict() if options.model else None,
        "prices_given": options.prices.model_dump() if options.prices else None,
        "price_table": PRICE_TABLE_VERSION,
    }


def compare(profiles: Sequence[str], recording: Recording, options: Options | None = None) -> dict[str, Any]:
    """Replay ``recording`` through every profile; the JSON report as a dict."""
    options = options or Options()
    options = replace(options, model=model_for(recording, options))
    try:
        options = replace(options, window=window_for(recording, options))
    except WindowShareError as exc:  # no window to replay at: every row says why
        results = [empty_metrics(name, exc.status, str(exc)) for name in profiles]
    else:
        results = [run_profile(name, recording, options) for name in profiles]
    return {
        "source": recording.describe(),
        "settings": settings_of(options),
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

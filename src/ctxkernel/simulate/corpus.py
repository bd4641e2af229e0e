"""Corpus mode: many recorded sessions replayed in parallel worker processes, then aggregated.

``ctxkernel simulate --transcripts DIR_OR_GLOB [--jobs N]``: every ``*.jsonl``, ``*.json`` and
``*.traj`` file under a folder (recursively), or every file a glob matches, is one or more sessions
(each run of an OpenAI chat file of runs, each instance of an OpenHands benchmark run). Each
session is replayed through every profile (:func:`.compare`) in a worker process; the report has
one entry per session and an aggregate per profile: sum, median and p90 of each figure over the
sessions the profile replayed, compactions and retention probes pooled.

A session that cannot be read is an entry with its ``error`` (and no profiles); it does not stop
the others.
"""

from __future__ import annotations

import glob
import math
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import CtxKernelError
from ..redact import redact
from .importers import MULTI_RUN_FORMATS, load_recording, sniff
from .probes import KINDS
from .recording import RecordingError
from .replay import Options
from .report import COST_RATIOS

#: file name endings a folder is searched for
SUFFIXES = (".jsonl", ".json", ".traj")
#: most sessions one corpus run replays
MAX_SESSIONS = 100_000
#: figures aggregated with sum, median and p90 (the numeric metrics of one profile)
FIGURES: tuple[str, ...] = (
    "requests",
    "peak_prompt_tokens",
    "mean_prompt_tokens",
    "effective_window",
    "header_tokens",
    "overflows",
    "overflow_retries",
    "compaction_failures",
    "summary_calls",
    "summary_input_tokens",
    "summary_output_tokens",
    "billed_input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "cost_usd",
    "recall_cost_usd",
    "cost_with_recall_usd",
    "invariant_violations",
    "instructions_visible",
    "instructions_visible_min",
    "instructions_visible_mean",
    "recall_needs",
    "recall_found",
    "recall_cued",
    "recall_calls",
    "recall_tokens",
    "history_reachable",
    "history_reachable_declared",
    "history_reachable_calls",
    "steward_requests",
    "sessions",
    "wall_seconds",
)


@dataclass(frozen=True)
class Task:
    """One session of the corpus: a file and, for a file of several, which run."""

    index: int
    path: str
    run: int | None = None
    error: str | None = None


def find_files(spec: str) -> list[Path]:
    """The files of a corpus: a folder's ``*.jsonl``/``*.json``/``*.traj`` (recursively), or a glob's matches."""
    root = Path(spec).expanduser()
    if root.is_dir():
        files = sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith(".")
        )
    else:
        files = sorted(Path(p) for p in glob.glob(str(root), recursive=True) if Path(p).is_file())
    # a Claude Code subagent's transcript belongs to its session (counted there), not a session of its own
    files = [p for p in files if not _subagent_of_listed_session(p)]
    if not files:
        what = (
            f"the folder has no {', '.join('*' + s for s in SUFFIXES)} file" if root.is_dir() else "it matches no file"
        )
        msg = f"--transcripts {spec}: {what}; accepted: a folder of recordings or a glob such as 'runs/**/*.jsonl'"
        raise RecordingError(msg)
    return files


def _subagent_of_listed_session(path: Path) -> bool:
    """``<session>/subagents/agent-*.jsonl`` beside ``<session>.jsonl``."""
    folder = path.parent
    return folder.name == "subagents" and folder.parent.with_suffix(".jsonl").is_file()


def plan(files: list[Path], lenient: bool = False) -> list[Task]:
    """One task per session: every run of a file of runs, else one per file; unreadable files
    are tasks with their error."""
    tasks: list[Task] = []
    for path in files:
        try:
            runs = 1
            if sniff(path) in MULTI_RUN_FORMATS:
                runs = load_recording(path, lenient=lenient).source.get("runs") or 1
            for run in range(runs):
                tasks.append(Task(len(tasks), str(path), run if runs > 1 else None))
        except CtxKernelError as exc:
            tasks.append(Task(len(tasks), str(path), error=redact(str(exc))))
        if len(tasks) > MAX_SESSIONS:
            msg = f"--transcripts: more than {MAX_SESSIONS:,} sessions; narrow the folder or the glob"
            raise RecordingError(msg)
    return tasks


def replay_task(task: Task, profiles: list[str], options: Options, lenient: bool) -> dict[str, Any]:
    """Replay one session through every profile (runs in a worker process)."""
    from . import compare

    entry: dict[str, Any] = {"file": Path(task.path).name, "path": task.path, "run": task.run, "error": task.error}
    if task.error is None:
        try:
            recording = load_recording(task.path, run=task.run, lenient=lenient)
            if options.keep_sessions is not None:  # one store per session: workers never share a file
                folder = options.keep_sessions / f"session-{task.index:05d}"
                folder.mkdir(exist_ok=True)
                options = replace(options, keep_sessions=folder)
            report = compare(profiles, recording, options)
        except CtxKernelError as exc:
            entry["error"] = redact(str(exc))
        else:
            entry.update(source=report["source"], window=report["settings"]["window"], profiles=report["profiles"])
            if options.keep_sessions is not None:
                entry["kept_in"] = str(options.keep_sessions)
            return entry
    entry.update(source=None, window=None, profiles=[])
    return entry


def run_corpus(
    tasks: list[Task],
    profiles: list[str],
    options: Options,
    *,
    jobs: int = 1,
    lenient: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every task replayed, in task order; ``jobs`` worker processes (1: in this process)."""
    worker_options = replace(options, progress=None)  # a per-request bar per worker would interleave
    results: list[dict[str, Any]] = []
    if jobs <= 1:
        for task in tasks:
            results.append(replay_task(task, profiles, worker_options, lenient))
            if progress:
                progress("sessions", len(results), len(tasks))
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(replay_task, t, profiles, worker_options, lenient) for t in tasks]
        for done, future in enumerate(futures, 1):
            results.append(future.result())
            if progress:
                progress("sessions", done, len(tasks))
    return results


def _rank(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` 0.1 for p10, 0.9 for p90)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def _round(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 6)


def _pooled(ratios: list[tuple[float, float]]) -> float | None:
    """The costs summed over the basic costs summed (None without a basic cost)."""
    basic = sum(b for _, b in ratios)
    return round(sum(c for c, _ in ratios) / basic, 4) if basic else None


def aggregate_by_format(sessions: list[dict[str, Any]], profiles: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`aggregate` over the readable sessions of each recording format (``source.format``),
    formats in the order they first appear: what a profile does on each kind of agent, since a
    corpus that mixes them is priced mostly by whichever runs the most requests."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for session in sessions:
        source = session.get("source") or {}
        if not session.get("error") and source.get("format"):
            groups.setdefault(source["format"], []).append(session)
    return {name: {"sessions": len(group), "aggregate": aggregate(group, profiles)} for name, group in groups.items()}


def aggregate_managed(sessions: list[dict[str, Any]], profiles: list[str]) -> dict[str, Any] | None:
    """:func:`aggregate` over the sessions ``basic`` compacted: those that needed managing at this
    window. A session that never reaches a threshold costs the same managed or not, and a corpus
    of many such sessions dilutes the pooled figures. None when ``basic`` is not replayed."""
    if "basic" not in profiles:
        return None
    group = [s for s in sessions if not s.get("error") and _basic_compacted(s)]
    return {"sessions": len(group), "aggregate": aggregate(group, profiles)}


def _basic_compacted(session: dict[str, Any]) -> bool:
    basic = next((p for p in session.get("profiles") or () if p.get("profile") == "basic"), None)
    return basic is not None and basic.get("status") == "ok" and bool(basic.get("compactions"))


def aggregate(sessions: list[dict[str, Any]], profiles: list[str]) -> dict[str, Any]:
    """Per profile: how many sessions it replayed (``ok``), failed or could not run, and for each
    figure its ``sum``, ``median``, ``p10`` and ``p90`` over the ``ok`` sessions that have a value, and
    how many those are (``sessions``; ``cost_vs_basic``:
    each session's cost over its own ``basic`` row's); ``cost_vs_basic_pooled``, the profile's cost
    over ``basic``'s summed over the sessions where both have one; the same two for the cost with
    the recall calls priced (``cost_with_recall_vs_basic``, over ``basic``'s with its own recall
    calls priced); ``overflows`` and ``invariant_violations`` summed; ``compactions`` summed per
    kind; ``probes`` pooled per kind (shares over all the probes of all sessions)."""
    out: dict[str, Any] = {}
    basic_cost: dict[str, dict[int, float]] = {key: {} for key in COST_RATIOS}
    for s in sessions:
        basic: dict[str, Any] = next((p for p in s["profiles"] if p["profile"] == "basic"), {})
        for key in COST_RATIOS:
            if basic.get(key):
                basic_cost[key][id(s)] = basic[key]
    for name in profiles:
        pairs = [(s, p) for s in sessions for p in s["profiles"] if p["profile"] == name]
        rows = [p for _, p in pairs]
        ok = [r for r in rows if r["status"] == "ok"]
        ratios = {
            ratio: [
                (float(p[key]), basic_cost[key][id(s)])
                for s, p in pairs
                if p["status"] == "ok" and p.get(key) is not None and id(s) in basic_cost[key]
            ]
            for key, ratio in COST_RATIOS.items()
        }
        figures: dict[str, dict[str, float | int] | None] = {}
        for key in (*FIGURES, *ratios):
            if key in ratios:
                values = [cost / basic for cost, basic in ratios[key]]
            else:
                values = [
                    r[key] for r in ok if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
                ]
            figures[key] = (
                {
                    "sum": _round(sum(values)),
                    "median": _round(statistics.median(values)),
                    "p10": _round(_rank(values, 0.1)),
                    "p90": _round(_rank(values, 0.9)),
                    # the sessions with a value: fewer than ``ok`` where it is null (a cost where
                    # a request overflowed, cued recall with no need)
                    "sessions": len(values),
                }
                if values
                else None
            )
        compactions: dict[str, int] = {}
        for r in ok:
            for kind, n in (r.get("compactions") or {}).items():
                compactions[kind] = compactions.get(kind, 0) + n
        probes: dict[str, dict[str, float | int | None]] = {}
        for kind in KINDS:
            count = visible = recoverable = 0.0
            for r in ok:
                figures_of = (r.get("probes") or {}).get(kind) or {}
                n = figures_of.get("count") or 0
                if n:
                    count += n
                    visible += figures_of["visible"] * n
                    recoverable += figures_of["recoverable"] * n
            probes[kind] = {
                "count": int(count),
                "visible": round(visible / count, 4) if count else None,
                "recoverable": round(recoverable / count, 4) if count else None,
            }
        out[name] = {
            "ok": len(ok),
            "failed": sum(1 for r in rows if r["status"] == "failed"),
            "unavailable": sum(1 for r in rows if r["status"] == "unavailable"),
            "refused": sum(1 for r in rows if r["status"] == "refused"),
            "overflows": sum(r["overflows"] or 0 for r in ok),
            "invariant_violations": sum(r["invariant_violations"] or 0 for r in rows),
            "compactions": dict(sorted(compactions.items())),
            "probes": probes,
            "figures": figures,
            **{f"{ratio}_pooled": _pooled(pairs_of) for ratio, pairs_of in ratios.items()},
        }
    return out

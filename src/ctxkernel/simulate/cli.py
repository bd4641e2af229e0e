"""The ``ctxkernel simulate`` subcommand."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..cli import bounded_int
from ..errors import CtxKernelError, ProfileError
from ..pricing import UnknownModelError, price_for
from ..profile import MAX_TOKENS, Prices, load_profile
from ..redact import redact
from . import compare, profile_names, settings_of
from .corpus import aggregate, aggregate_by_format, aggregate_managed, find_files, plan, run_corpus
from .importers import load_recording
from .recording import RecordingError
from .replay import MIN_WINDOW, STAND_IN, UNMANAGED, Options
from .report import (
    REPLAY_NOTE,
    describe_accounting,
    render_corpus_html,
    render_corpus_table,
    render_html,
    render_table,
)
from .steward import load_steward
from .workloads import WORKLOADS, build_workload

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: the largest ``--window <share>x``
MAX_WINDOW_SHARE = 16.0
#: the most worker processes ``--jobs`` starts
MAX_JOBS = 64


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare strategies on a recorded session or a synthetic workload",
        description=(
            "Replay a recorded session (or a built-in synthetic workload) through one or more profiles "
            "and compare what each strategy would have sent. The recorded assistant turns are replayed, "
            "not regenerated. Exit status 1 when a profile fails or breaks an invariant."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--transcript",
        metavar="PATH",
        help="a recorded session: kernel log, OpenAI chat JSON, Claude Code or Codex JSONL, SWE-agent .traj, OpenHands events",
    )
    src.add_argument(
        "--transcripts",
        metavar="DIR_OR_GLOB",
        help="corpus mode: every recording in a folder (*.jsonl, *.json, *.traj, recursively) or matched by a glob",
    )
    src.add_argument("--workload", choices=sorted(WORKLOADS), help="a built-in synthetic workload")
    p.add_argument(
        "--jobs",
        type=bounded_int(1, MAX_JOBS),
        default=1,
        metavar="N",
        help="corpus mode: worker processes replaying sessions in parallel (default 1)",
    )
    p.add_argument(
        "--run",
        type=bounded_int(0, 10**9),
        metavar="N",
        help="which run of an OpenAI chat file holding several (default 0)",
    )
    p.add_argument(
        "--seed", type=bounded_int(0, 2**63 - 1), default=7, help="seed of the synthetic workload (default 7)"
    )
    p.add_argument("--profile", default="all", help="comma-separated profile names or paths, or 'all' (default)")
    p.add_argument(
        "--window",
        type=window_arg,
        metavar="TOKENS|SHAREx",
        help="override every profile's context window: tokens, or e.g. 0.5x for half of each session's unmanaged peak",
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="output on stdout (default table)")
    p.add_argument("--report", metavar="HTML", help="also write a self-contained HTML report with a chart")
    p.add_argument(
        "--summarizer",
        default=STAND_IN,
        help="stand-in (default: an offline model writing model-length summaries, priced), extractive (free, "
        "unpriced) or openai:<model>[@<base_url>]",
    )
    p.add_argument(
        "--steward", default="default", help="default (the strategies' steward_actions), none, or module:function"
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="price the requests as this model of the price table, with its prompt cache (default: by the "
        "recording's format; see docs/simulate.md)",
    )
    p.add_argument(
        "--prices",
        metavar="IN,CACHED,OUT",
        help="other prices per million input, cached input and output tokens, with the model's cache rules",
    )
    p.add_argument(
        "--keep-sessions",
        metavar="DIR",
        help="keep the replayed sessions in a jsonl store at DIR (open them with CTXKERNEL_HOME=DIR ctxkernel inspect ID)",
    )
    p.add_argument("--lenient", action="store_true", help="skip malformed transcript lines and count them")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse (exit 2) a recording that holds anything the replay would leave out (source.accounting)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_simulate)


def window_arg(text: str) -> tuple[int | None, float | None]:
    """``--window``: ``TOKENS`` (MIN_WINDOW..MAX_TOKENS) or ``<share>x`` (0 < share <= MAX_WINDOW_SHARE)."""
    if text.strip().lower().endswith("x"):
        try:
            share = float(text.strip()[:-1])
        except ValueError:
            share = math.nan
        if not 0 < share <= MAX_WINDOW_SHARE:  # also refuses nan and inf
            msg = f"expected a share of the unmanaged peak such as 0.5x (more than 0, at most {MAX_WINDOW_SHARE:g}x), got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return None, share
    return bounded_int(MIN_WINDOW, MAX_TOKENS)(text), None


def parse_prices(text: str) -> Prices:
    parts = text.split(",")
    try:
        values = [float(x) for x in parts]
        if len(values) != 3:
            raise ValueError
        return Prices(input=values[0], cached_input=values[1], output=values[2])
    except (ValueError, ValidationError):
        msg = f"--prices {text!r}: expected three non-negative numbers 'input,cached,output' per million tokens, e.g. 2.5,1.25,10"
        raise RecordingError(msg) from None


def check_model(name: str) -> str:
    try:
        return price_for(name, releases_only=True).model
    except UnknownModelError as exc:
        msg = f"--model: {exc}"
        raise RecordingError(msg) from None


def check_named_profiles(spec: str) -> None:
    """A profile named on ``--profile`` whose file cannot be read or parsed is bad input (exit 2);
    one that parses but needs a strategy that is not installed is still an ``unavailable`` row."""
    for name in (n.strip() for n in spec.split(",")):
        if name and name not in ("all", UNMANAGED):
            try:
                load_profile(name)
            except ProfileError as exc:
                msg = f"--profile {name}: " + "; ".join(line for line in str(exc).splitlines() if line.strip())
                raise RecordingError(msg) from None


def check_report_path(text: str) -> None:
    """Refuse a ``--report`` path that cannot be written, naming why."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        problem = "it is a directory"
    elif not folder.is_dir():
        problem = f"the folder {folder} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        problem = "it is not writable"
    else:
        return
    msg = f"--report {text}: cannot write the HTML report there ({problem}); accepted: a file path in a writable folder"
    raise RecordingError(msg)


def keep_sessions_dir(text: str) -> Path:
    """The ``--keep-sessions`` folder, created when missing; refused when it cannot be a store."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        problem = "it is a file"
    elif not path.exists() and not path.parent.is_dir():
        problem = f"the folder {path.parent} does not exist"
    elif not os.access(path if path.exists() else path.parent, os.W_OK | os.X_OK):
        problem = "it is not writable"
    else:
        path.mkdir(exist_ok=True)
        return path
    msg = f"--keep-sessions {text}: cannot keep the sessions there ({problem}); accepted: a writable folder, new or existing"
    raise RecordingError(msg)


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self._last = 0.0

    def __call__(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        filled = int(width * done / total) if total else width
        self.stream.write(f"\r{label[:16]:<16} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            self.stream.write("\r" + " " * (width + 40) + "\r")
        self.stream.flush()


def check_complete(where: str, accounting: dict[str, Any] | None) -> None:
    """``--strict``: a recording the replay would leave part of is bad input."""
    missing = describe_accounting(accounting)
    if missing:
        msg = f"{where}: {missing.split(' (see ')[0]}; --strict refuses a recording that is not replayed whole"
        raise RecordingError(msg)


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..cli import dump_json

    window, share = args.window or (None, None)
    try:
        if args.run is not None and not args.transcript:
            what = "--workload" if args.workload else "--transcripts (every run of a file is replayed)"
            raise RecordingError(f"--run selects a run of a transcript; it does not apply to {what}")
        options = Options(
            window=window,
            window_share=share,
            summarizer=args.summarizer,
            steward=load_steward(args.steward),
            prices=parse_prices(args.prices) if args.prices else None,
            model=check_model(args.model) if args.model else None,
            progress=ProgressBar() if sys.stderr.isatty() and not args.no_progress else None,
        )
        if args.report:
            check_report_path(args.report)  # before the simulation, not after it has run
        if args.keep_sessions:
            options.keep_sessions = keep_sessions_dir(args.keep_sessions)
        names = profile_names(args.profile)
        check_named_profiles(args.profile)
        if args.transcripts:
            report = corpus_report(args, names, options)
        else:
            if args.workload:
                recording = build_workload(args.workload, args.seed)
            else:
                recording = load_recording(args.transcript, run=args.run, lenient=args.lenient)
                if args.strict:
                    check_complete(args.transcript, recording.accounting)
            report = compare(names, recording, options)
    except CtxKernelError as exc:
        sys.stderr.write(f"ctxkernel simulate: {redact(str(exc))}\n")
        return EXIT_USAGE
    corpus = args.transcripts is not None
    if args.format == "json":
        dump_json(report)
    else:
        sys.stdout.write((render_corpus_table(report) if corpus else render_table(report)) + "\n")
    if args.report:
        try:
            page = render_corpus_html(report) if corpus else render_html(report)
            Path(args.report).write_text(page, encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(
                f"ctxkernel simulate: --report {args.report}: cannot write the report ({exc.strerror or exc})\n"
            )
            return EXIT_FAILED
    if corpus and args.strict:
        partial = [s for s in report["sessions"] if describe_accounting((s.get("source") or {}).get("accounting"))]
        for session in partial:
            sys.stderr.write(
                f"ctxkernel simulate: {session['path']}: {describe_accounting(session['source']['accounting'])}\n"
            )
        if partial:
            sys.stderr.write(f"ctxkernel simulate: --strict: {len(partial)} session(s) not replayed whole\n")
            return EXIT_USAGE
    rows = [p for s in report["sessions"] for p in s["profiles"]] if corpus else report["profiles"]
    broken = [p for p in rows if p["status"] == "failed" or (p["invariant_violations"] or 0) > 0]
    unreadable = [s for s in report["sessions"] if s["error"]] if corpus else []
    return EXIT_FAILED if broken or unreadable else EXIT_OK


def corpus_report(args: argparse.Namespace, names: list[str], options: Options) -> dict[str, Any]:
    """Corpus mode (``--transcripts``): every session replayed, per-session entries and an aggregate."""
    files = find_files(args.transcripts)
    tasks = plan(files, lenient=args.lenient)
    progress = options.progress
    sessions = run_corpus(tasks, names, options, jobs=args.jobs, lenient=args.lenient, progress=progress)
    return {
        "corpus": {
            "transcripts": args.transcripts,
            "files": len(files),
            "sessions": len(sessions),
            "unreadable": sum(1 for s in sessions if s["error"]),
            "jobs": args.jobs,
        },
        "settings": settings_of(options),
        "sessions": sessions,
        "aggregate": aggregate(sessions, names),
        "by_format": aggregate_by_format(sessions, names),
        "managed": aggregate_managed(sessions, names),
        "note": REPLAY_NOTE,
    }

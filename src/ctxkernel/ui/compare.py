"""The Compare page's data: a ``simulate --format json`` report file, or a replay run here.

Paths come from the page (a report, a transcript, a profile file), so they are confined to the
directories the server was started with (``read_roots``, default the working directory): a path
outside them (whether it exists or not), a directory, a missing or an oversized file is refused
with a message naming what is accepted. A replay runs one at a time
(they are CPU-bound) on the embedded defaults, offline: extractive summaries, the default steward.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

from ..errors import CtxKernelError

#: the largest report file the page loads
MAX_REPORT_BYTES = 64 * 1024 * 1024
#: replay results kept for the page (oldest dropped first)
KEEP_RESULTS = 8


class CompareError(Exception):
    """A report or replay request that cannot be served; the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def confine(path_text: str, roots: list[Path]) -> Path:
    """The resolved file ``path_text`` names, when it lies inside one of ``roots``."""
    if not path_text or "\x00" in path_text:
        raise CompareError("give the path of a file")
    path = Path(os.path.expanduser(path_text))
    resolved = path.resolve() if path.is_absolute() else (roots[0] / path).resolve()
    if not any(resolved.is_relative_to(root) for root in roots):
        raise CompareError(
            f"{path_text!r} is outside the directories this server reads: {[str(r) for r in roots]} (start it with --read-root)"
        )
    try:
        is_file = resolved.is_file()
    except OSError as exc:  # a name too long, a folder it may not enter: not ignored by is_file
        raise CompareError(f"{path_text!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not is_file:
        raise CompareError(f"{path_text!r} is not a file")
    return resolved


#: a profile given by name (searched in the profile path, never read as a path)
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def confine_profiles(spec: str, roots: list[Path]) -> str:
    """The page's comma-separated profiles with every path confined to ``roots`` (:func:`confine`:
    a path outside them is refused the same way whether it exists or not); names (and ``all``,
    ``none``) are found in the profile search path, as ``simulate --profile`` finds them."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if PROFILE_NAME.fullmatch(part) and not Path(part).exists():
            out.append(part)
        else:
            out.append(str(confine(part, roots)))
    return ",".join(out)


#: the largest token figure a report may hold (a larger one, up to 1e308, overflowed the chart)
MAX_TOKENS = 10**15


def _token_count(value: Any) -> bool:
    """Whether ``value`` is a token figure the chart can draw: a number from 0 to MAX_TOKENS."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS


def check_report(report: Any, where: str) -> dict[str, Any]:
    """A ``simulate --format json`` report: its profiles and source, each of the right shape."""
    if (
        not isinstance(report, dict)
        or not isinstance(report.get("profiles"), list)
        or not isinstance(report.get("source"), dict)
    ):
        raise CompareError(
            f"{where} is not a simulate report: expected the JSON of `ctxkernel simulate --format json` (keys source, profiles)"
        )
    for i, p in enumerate(report["profiles"]):
        if not isinstance(p, dict) or not isinstance(p.get("profile"), str):
            raise CompareError(f"{where}: profiles[{i}] must be an object with a 'profile' name")
        tokens = p.get("prompt_tokens", [])
        if not isinstance(tokens, list) or not all(_token_count(t) for t in tokens):
            raise CompareError(
                f"{where}: profiles[{i}].prompt_tokens must be a list of numbers from 0 to {MAX_TOKENS:,}"
            )
        window = p.get("effective_window")
        if window is not None and not _token_count(window):
            raise CompareError(f"{where}: profiles[{i}].effective_window must be a number from 0 to {MAX_TOKENS:,}")
    return report


def load_report(path_text: str, roots: list[Path]) -> dict[str, Any]:
    path = confine(path_text, roots)
    try:
        if path.stat().st_size > MAX_REPORT_BYTES:
            raise CompareError(f"{path_text!r} is larger than {MAX_REPORT_BYTES // (1024 * 1024)} MB")
        report = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise CompareError(f"{path_text!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    except orjson.JSONDecodeError as exc:
        raise CompareError(
            f"{path_text!r} is not JSON ({exc}); save a report with `ctxkernel simulate --format json > report.json`"
        ) from None
    return check_report(report, repr(path_text))


class Replays:
    """Replays started from the page, one at a time, their reports kept by id."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self._busy = threading.Lock()
        self._results: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, job: str) -> dict[str, Any]:
        try:
            return self._results[job]
        except KeyError:
            raise CompareError(
                f"no replay {job!r} here (results are kept in memory for the last {KEEP_RESULTS})", 404
            ) from None

    def run(self, *, transcript: str = "", workload: str = "", profiles: str, window: str = "") -> str:
        from ..simulate import Options, build_workload, compare, load_recording, profile_names
        from ..simulate.workloads import WORKLOADS

        if bool(transcript) == bool(workload):
            raise CompareError("give either a transcript path or a built-in workload")
        size = None
        if window.strip():
            try:
                size = int(window)
            except ValueError:
                raise CompareError(f"window {window!r} must be a whole number of tokens") from None
            if size < 256:
                raise CompareError(f"window {size}: a context window needs at least 256 tokens")
        if not self._busy.acquire(blocking=False):
            raise CompareError("a replay is already running; try again when it is done", 409)
        try:
            if workload:
                if workload not in WORKLOADS:
                    raise CompareError(f"unknown workload {workload!r}; accepted: {sorted(WORKLOADS)}")
                recording = build_workload(workload, 7)
            else:
                recording = load_recording(str(confine(transcript, self.roots)))
            report = compare(profile_names(confine_profiles(profiles, self.roots)), recording, Options(window=size))
        except CtxKernelError as exc:
            raise CompareError(str(exc)) from None
        finally:
            self._busy.release()
        job = uuid.uuid4().hex[:12]
        self._results[job] = report
        while len(self._results) > KEEP_RESULTS:
            self._results.popitem(last=False)
        return job

"""Sessions of every shipped profile at 1,000, 10,000 and 100,000 events, built once per run.

The mix is a coding agent's: many small turns (an instruction, one tool call with a short result,
a reply) and, every tenth turn, a larger step with three file reads of about 8 KB each. The
profile's strategies run as they would in a host (thresholds, switches, in-place compactions);
nothing answers the model-side reminders (the simulate steward does that, in bench_simulate).

One session per profile is built to the largest size; the kernel home is copied as it passes
each smaller size, so the three sizes share one build. Sessions stay on disk under the run's
scratch folder (``bench.scratch``); benchmark modules open them with :func:`open_kernel`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _workload import text, usage_for

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

REPO = Path(__file__).resolve().parents[1]
PROFILES = ("basic", "decay", "handoff", "rollover", "chapters")
FULL_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (500, 2_000, 5_000)
LARGE_RESULT = "\n".join(f"{i:4d}  " + text(12, i) for i in range(110))  # about 8 KB


@dataclass(frozen=True)
class Built:
    profile: str
    size: int  # the size asked for
    home: Path
    session_id: str
    events: int  # events actually in the log (a turn is not cut in half)
    log_bytes: int


_CACHE: dict[tuple[str, str, bool], dict[int, Built]] = {}


def sizes(bench: Any) -> tuple[int, ...]:
    return QUICK_SIZES if bench.quick else FULL_SIZES


def open_kernel(profile: str, home: Path, *, fsync: bool = False, store: Any = None) -> Kernel:
    """A kernel for ``profiles/<profile>.toml`` on ``home`` (jsonl unless ``store`` is given)."""
    loaded = make_profile(REPO / "profiles" / f"{profile}.toml")
    loaded.store = loaded.store.model_copy(update={"path": str(home), "backend": "jsonl", "dsn": None})
    return Kernel(loaded, store=store or JsonlStore(home, fsync=fsync), home=home)


def turn(session: Any, n: int) -> None:
    """One turn of the mix (see the module doc)."""
    session.user(f"step {n}: " + text(12, n))
    large = n % 10 == 0
    for k in range(3 if large else 1):
        request = session.prepare_request()
        call_id = f"c{n}_{k}"
        call = ToolCallBlock(call_id, "read_file", {"path": f"src/m{(n + k) % 50}.py"})
        reply = Message.assistant(text(6, n + k), [call])
        session.commit_reply(reply, usage=usage_for(session, request, reply))
        session.tool_result(call_id, LARGE_RESULT[(n * 7) % 400 :] if large else text(30, n + k))
    request = session.prepare_request()
    reply = Message.assistant(text(15, n + 3))
    session.commit_reply(reply, usage=usage_for(session, request, reply))
    session.end_turn()


def log_bytes(session: Any) -> int:
    """The size of ``session``'s log file (the benchmark's kernels use the jsonl store)."""
    store = session.store
    assert isinstance(store, JsonlStore), type(store).__name__
    return store.path(session.id).stat().st_size


def built(bench: Any, profile: str) -> dict[int, Built]:
    """``{size: Built}`` for ``profile`` at every size of the preset (built on first use)."""
    key = (str(bench.scratch), profile, bench.quick)
    if key in _CACHE:
        return _CACHE[key]
    wanted = sorted(sizes(bench))
    root = Path(bench.scratch) / f"profile-{profile}"
    home = root / f"{wanted[-1]}"
    kernel = open_kernel(profile, home)
    session = kernel.open_session()
    out: dict[int, Built] = {}
    n = 0
    for size in wanted:
        while len(session.events) < size:
            turn(session, n)
            n += 1
        if size != wanted[-1]:
            copy = root / f"{size}"
            shutil.copytree(home, copy)
            out[size] = Built(profile, size, copy, session.id, len(session.events), log_bytes(session))
    out[wanted[-1]] = Built(profile, wanted[-1], home, session.id, len(session.events), log_bytes(session))
    close = getattr(kernel.store, "close", None)
    if close:
        close()
    _CACHE[key] = out
    return out

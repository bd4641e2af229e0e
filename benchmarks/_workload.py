"""Realistic sessions for the benchmarks, written through the Session API.

Each turn is a coding step: a user instruction, a reply with two tool calls, their results, a
final reply, with provider usage on every reply. The built-in ``basic`` strategy compacts when
the surface reaches its threshold, so long logs hold replacements, as real ones do. fsync is off
while generating (the benchmarks measure CPU work, not the disk).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

WORDS = (
    "parser token module function error test fixture config request header surface event replay "
    "compaction summary window pressure anchor store lock batch offset line file path value index"
).split()


def usage_for(session: Any, request: Any, reply: Any) -> dict[str, int]:
    """Provider usage as a real provider would report it: the prompt as sent and the reply's
    own size. (Echoing the anchored pressure back with a made-up completion count fed each
    reply's error into the next anchor, and the drift grew with the session.)"""
    return {"prompt_tokens": request.pressure.tokens, "completion_tokens": session.meter.count_message(reply)}


def text(n_words: int, seed: int) -> str:
    return " ".join(
        WORDS[(seed * 7 + i * 13) % len(WORDS)] + (str(seed % 97) if i % 5 == 0 else "") for i in range(n_words)
    )


def kernel_for(
    home: Path, *, context_window: int = 128_000, auto: bool = True, fsync: bool = False, snapshot_every: int = 1000
) -> Kernel:
    """``snapshot_every=0``: no snapshots written or read (every open replays the whole log)."""
    profile = make_profile(
        model={"context_window": context_window, "reserved_output_tokens": 8192},
        strategies={"basic": {"auto": auto}},
        store={"snapshot_every": snapshot_every},
    )
    return Kernel(profile, store=JsonlStore(home, fsync=fsync), home=home, entry_points=False)


def one_turn(session: Any, n: int) -> None:
    session.user(f"step {n}: " + text(40, n))
    request = session.prepare_request()
    calls = [
        ToolCallBlock(f"c{n}a", "read_file", {"path": f"src/mod{n % 50}.py"}),
        ToolCallBlock(f"c{n}b", "run", {"command": f"pytest -k t{n}"}),
    ]
    reply = Message.assistant(text(20, n + 1), calls)
    session.commit_reply(reply, usage=usage_for(session, request, reply))
    session.tool_result(f"c{n}a", "\n".join(text(12, n + k) for k in range(8)))
    session.tool_result(f"c{n}b", "\n".join(text(10, n + 2 * k) for k in range(5)))
    request = session.prepare_request()
    reply = Message.assistant(text(30, n + 3))
    session.commit_reply(reply, usage=usage_for(session, request, reply))
    session.end_turn()


def build_session(home: Path, events: int, **kernel_args: Any) -> tuple[Kernel, str, int]:
    """A session of at least ``events`` events under ``home``; returns (kernel, id, turns)."""
    kernel = kernel_for(home, **kernel_args)
    session = kernel.open_session()
    n = 0
    while len(session.events) < events:
        one_turn(session, n)
        n += 1
    return kernel, session.id, n

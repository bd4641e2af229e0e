"""Per-request overhead of every shipped profile against history length, beside two peers.

    python benchmarks/run.py -k request

For each profile in ``profiles/`` a session of the realistic mix (``_profiles.py``) at 1,000,
10,000 and 100,000 events; one request is ``prepare_request`` + ``commit_reply`` (the user
message before it and ``end_turn`` after it are not timed). Rounds alternate the three sizes, so
the flatness ratio compares like with like. CPU time, collector paused (see ``_bench.py``).

Peers, over the same conversation (every user, assistant and tool message of the session's log,
as a harness without ctxkernel would hold it and send it on every request):

* ``trim_messages`` (langchain-core) with its approximate token counter, keeping the newest
  messages that fit the effective window: what a user would otherwise run before each request;
* a full recount of the whole message list with tiktoken (the kernel's cl100k tokenizer).

Lines:

* ``request_<profile>_<N>k_vs_recount``: ``ratio`` = recount time / our request time (how many
  times cheaper), target >= 50 at 100k (the issue's); at the smaller sizes >= 1 (context only).
  ``trim_messages_ratio`` beside it is trim_messages time / our request time.
* ``request_<profile>_flat_100k_vs_1k``: our request at 100k / at 1k, target <= 2
  (``ratio_middle_vs_smallest``: 10k / 1k, beside it).

The peers run without langchain-core when it is not installed (that line says why it is missing).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from typing import Any

from _bench import Bench
from _bench import cpu_seconds as cpu
from _profiles import PROFILES, built, open_kernel, sizes
from _workload import text, usage_for

from ctxkernel import Message
from ctxkernel.meter import message_text_for_count

CONVERSATION_TYPES = ("user/message", "assistant/message", "tool/result")


def conversation(session: Any) -> list[Message]:
    return [Message.from_dict(e.data["message"]) for e in session.events if e.type in CONVERSATION_TYPES]


def to_langchain(messages: list[Message]) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for m in messages:
        if m.role == "user":
            out.append(HumanMessage(m.text))
        elif m.role == "assistant":
            calls = [{"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"} for c in m.tool_calls]
            out.append(AIMessage(m.text, tool_calls=calls))
        else:
            result = m.tool_result
            out.append(
                ToolMessage(result.content if result else m.text, tool_call_id=result.call_id if result else "x")
            )
    return out


def request_round(session: Any, steps: int, counter: list[int]) -> float:
    """CPU seconds per request, mean over ``steps`` requests."""
    total = 0.0
    for _ in range(steps):
        n = counter[0] = counter[0] + 1
        session.user(f"quick question {n}: " + text(15, n))
        reply = Message.assistant(text(25, n))
        gc.disable()
        start = time.process_time()
        request = session.prepare_request()
        session.commit_reply(reply, usage=usage_for(session, request, reply))
        total += time.process_time() - start
        gc.enable()
        session.end_turn()
    return total / steps


def run(bench: Bench) -> None:
    preset = sizes(bench)
    rounds = 3 if bench.quick else 7
    steps = 10 if bench.quick else 20
    peer_rounds = 2 if bench.quick else 3

    # the peers, once per size, over the conversation of the basic profile's session
    peers: dict[int, dict[str, list[float]]] = {}
    skipped = None
    try:
        from langchain_core.messages import trim_messages
        from langchain_core.messages.utils import count_tokens_approximately
    except ImportError as exc:
        skipped = f"langchain-core not installed ({exc}); pip install -r benchmarks/requirements.txt"
        print(json.dumps({"name": "request_peer_trim_messages", "skipped": skipped}), flush=True)
    for size, b in built(bench, "basic").items():
        kernel = open_kernel("basic", b.home)
        session = kernel.open_session(b.session_id)
        messages = conversation(session)
        tokenizer = session.meter.tokenizer
        window = session.pressure().effective_window
        lc = to_langchain(messages) if skipped is None else None

        def recount(messages: list[Message] = messages, tokenizer: Any = tokenizer) -> int:
            return sum(tokenizer.count(message_text_for_count(m)) for m in messages)

        def trim(lc: Any = lc, window: int = window) -> Any:
            return trim_messages(
                lc,
                max_tokens=window,
                token_counter=count_tokens_approximately,
                strategy="last",
                start_on="human",
                allow_partial=False,
            )

        times: dict[str, list[float]] = {"recount": [], "trim": [], "messages": [len(messages)]}
        recount()  # warm: imports, the tokenizer's caches
        if lc is not None:
            trim()
        for _ in range(peer_rounds):
            times["recount"].append(cpu(recount))
            if lc is not None:
                times["trim"].append(cpu(trim))
        peers[size] = times
        del session, kernel, messages, lc

    for profile in PROFILES:
        builds = built(bench, profile)
        sessions = {size: open_kernel(profile, b.home).open_session(b.session_id) for size, b in builds.items()}
        counter = [0]
        for session in sessions.values():
            request_round(session, 2, counter)  # warm: first-request caches, tokenizer
        per_size: dict[int, list[float]] = {size: [] for size in preset}
        for _ in range(rounds):
            for size in preset:
                per_size[size].append(request_round(sessions[size], steps, counter))
        small, large = preset[0], preset[-1]
        for size in preset:
            ours = per_size[size]
            recount_median = statistics.median(peers[size]["recount"])
            ratios = [recount_median / t for t in ours]
            ratio = statistics.median(ratios)
            extra: dict[str, Any] = {
                "events": builds[size].events,
                "surface_nodes": len(sessions[size].surface),
                "peer_messages": peers[size]["messages"][0],
                "recount_median": round(recount_median, 6),
                "steps_per_round": steps,
                "repeat": rounds,
            }
            if peers[size]["trim"]:
                trim_median = statistics.median(peers[size]["trim"])
                extra["trim_messages_median"] = round(trim_median, 6)
                extra["trim_messages_ratio"] = round(trim_median / statistics.median(ours), 3)
            else:
                extra["trim_messages_skipped"] = skipped
            bench.report(
                f"request_{profile}_{_label(size)}_vs_recount",
                ratio,
                (">=", 50 if size == large else 1),
                "s per request",
                statistics.median(ours),
                (max(ratios) - min(ratios)) / ratio,
                **extra,
            )
        flat = [a / b for a, b in zip(per_size[large], per_size[small], strict=True)]
        mid = [a / b for a, b in zip(per_size[preset[1]], per_size[small], strict=True)]
        ratio = statistics.median(flat)
        bench.report(
            f"request_{profile}_flat_{_label(large)}_vs_{_label(small)}",
            ratio,
            ("<=", 2),
            "s per request",
            statistics.median(per_size[large]),
            (max(flat) - min(flat)) / ratio,
            baseline_median=round(statistics.median(per_size[small]), 6),
            ratio_middle_vs_smallest=round(statistics.median(mid), 3),
            repeat=rounds,
            steps_per_round=steps,
        )
        del sessions


def _label(size: int) -> str:
    return f"{size // 1000}k" if size >= 1000 and size % 1000 == 0 else str(size)


if __name__ == "__main__":
    import sys
    import tempfile
    from pathlib import Path

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))

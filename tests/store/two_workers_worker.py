"""A worker process for test_store_two_workers.py: one kernel on a shared store, driven by JSON
commands on stdin (one per line), answering one JSON line per command on stdout."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import traceback

import orjson

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.compaction import Span, checkpoint_message, whole_surface_but_last
from ctxkernel.errors import ConflictError, CtxKernelError
from ctxkernel.store.cli import open_store
from ctxkernel.testing import make_profile


def surface_view(session):
    session.refresh()
    return {
        "session": session.id,
        "events": len(session.events),
        "surface": [n.seq for n in session.surface],
        "messages": [n.message.to_dict() for n in session.surface],
        "pressure": session.pressure().to_dict(),
        "open_compaction": session.open_compaction,
    }


def main() -> int:
    spec = sys.argv[1]
    # answers get the real stdout; anything else printed (logs) goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if offset := float(os.environ.get("WORKER_CLOCK_OFFSET", "0")):  # a host whose clock is wrong
        real_time = time.time
        time.time = lambda: real_time() + offset
    store = open_store(spec)
    leases = {"lease_seconds": float(os.environ.get("WORKER_LEASE_SECONDS", "30"))}
    if host := os.environ.get("WORKER_HOST_ID"):  # two worker processes standing in for two hosts
        leases["host_id"] = host
    profile = make_profile(model={"context_window": 4000, "reserved_output_tokens": 500}, store=leases)
    scratch = tempfile.TemporaryDirectory()  # the kernel home; the sessions live in the shared store
    kernel = Kernel(profile, store=store, home=scratch.name, entry_points=False)
    session = None
    release = threading.Event()
    entered = threading.Event()
    holder: dict = {}
    turns = 0

    def reply(value):
        out.write(orjson.dumps(value).decode() + "\n")
        out.flush()

    for line in sys.stdin:
        cmd = orjson.loads(line)
        op = cmd["op"]
        try:
            if op == "open":
                session = kernel.open_session(cmd.get("session"))
                reply(surface_view(session))
            elif op == "turn":
                turns += 1
                session.refresh()
                session.user(f"{cmd['text']}: " + "please " * 20)
                session.prepare_request()
                call = ToolCallBlock(f"c{os.getpid()}-{turns}", "read", {"path": "x.py"})
                session.commit_reply(Message.assistant("reading", [call]))
                session.tool_result(call.id, "x = 1\n" * 80)
                session.prepare_request()
                session.commit_reply(Message.assistant(f"done {cmd['text']}"))
                session.end_turn()
                reply(surface_view(session))
            elif op == "hold_compaction":
                release.clear()
                entered.clear()
                start, end = whole_surface_but_last(session.surface)

                def render(summary, region):
                    entered.set()  # compaction/start is durable: the lock is held
                    release.wait(60)
                    return checkpoint_message(summary, "basic")

                def run(session=session, start=start, end=end):
                    try:
                        holder["result"] = session.compact(
                            Span(start, end, summary="held summary"), strategy="basic", render=render
                        )
                    except BaseException as exc:  # reported on release
                        holder["error"] = f"{type(exc).__name__}: {exc}"

                holder.clear()
                holder["thread"] = threading.Thread(target=run)
                holder["thread"].start()
                entered.wait(60)
                reply({"holding": True, "pid": os.getpid(), "open_compaction": session.open_compaction})
            elif op == "release":
                release.set()
                holder["thread"].join(60)
                reply({"error": holder.get("error"), "committed": "result" in holder, **surface_view(session)})
            elif op == "compact":
                session.refresh()
                region = whole_surface_but_last(session.surface)
                try:
                    result = session.compact(Span(*region, summary="worker summary"), strategy="basic")
                    reply({"ok": True, "compaction_id": result.compaction_id})
                except CtxKernelError as exc:
                    reply({"ok": False, "error_type": type(exc).__name__, "error": str(exc)})
            elif op == "race":
                acked, conflicts = [], 0
                time.sleep(max(0.0, cmd["at"] - time.time()))  # both workers start together
                for i in range(cmd["n"]):
                    while True:
                        try:
                            seq = session.emit("race", "tick", {"worker": os.getpid(), "i": i})
                            acked.append(seq)
                            break
                        except ConflictError:
                            conflicts += 1
                            session.refresh()
                reply({"acked": acked, "conflicts": conflicts, "pid": os.getpid()})
            else:
                reply({"fatal": f"unknown op {op}"})
        except BaseException:  # the test shows it
            reply({"fatal": traceback.format_exc()})
    store.close()
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

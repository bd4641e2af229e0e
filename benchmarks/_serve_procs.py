"""The two servers ``bench_serve.py`` starts, each a uvicorn process of its own on 127.0.0.1.

    python benchmarks/_serve_procs.py upstream           # the fake provider: one fixed reply
    python benchmarks/_serve_procs.py serve URL HOME     # ctxkernel serve in front of URL

Each binds a port the OS picks, prints it on one line of stdout, and serves until stdin closes
(so it never outlives the benchmark). ``serve`` is the app ``ctxkernel serve`` runs, with uvicorn's
defaults as the CLI uses them (and its ``--tune-heap``: :func:`~ctxkernel.serve.process.settle_heap`); the only additions are ``GET /__bench/cpu``, answered before
the app sees the request with this process's CPU time (``time.process_time_ns``: every thread,
user + system), which the benchmark reads around a batch of requests, and ``GET
/__bench/threads``: the CPU time of the event loop's thread and of the worker threads
(:func:`thread_cpu`), read around the same batches to show where serve's share goes.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _workload import text  # noqa: E402

REPLY = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done: " + text(30, 1)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040},
    }
)
CPU_PATH = "/__bench/cpu"
THREADS_PATH = "/__bench/threads"
#: the name of serve's worker threads (``ctxkernel/serve/workers.py``)
WORKER_THREAD = "ctxkernel serve worker"


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The fake provider: reads the request body whole, parses it as a provider must, and answers
    ``REPLY`` (plain ASGI, so its own cost stays small). It runs in its own process; its CPU per
    request is the denominator of ``serve_cpu_1k_vs_upstream_parse`` and counted nowhere else."""
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["method"] == "POST":
        orjson.loads(b"".join(chunks))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": REPLY})


def thread_cpu() -> dict[str, int]:
    """CPU nanoseconds so far of the event loop's thread (the main thread: uvicorn runs the loop
    there) and of the worker threads together (those living now: the pool never ends one)."""
    out = {"loop": 0, "workers": 0}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        if thread is threading.main_thread():
            kind = "loop"
        elif thread.name == WORKER_THREAD:
            kind = "workers"
        else:
            continue
        try:
            out[kind] += time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        except OSError:
            continue  # ended between the listing and the read
    return out


def with_cpu_probe(app: Any) -> Any:
    async def probed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in (CPU_PATH, THREADS_PATH):
            if scope["path"] == CPU_PATH:
                body, kind = str(time.process_time_ns()).encode(), b"text/plain"
            else:
                body, kind = orjson.dumps(thread_cpu()), b"application/json"
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return probed


def serve_app(upstream: str, home: Path) -> Any:
    from ctxkernel import Kernel
    from ctxkernel.logging import configure_logging
    from ctxkernel.serve.app import create_app
    from ctxkernel.serve.config import ServeConfig
    from ctxkernel.serve.process import settle_heap
    from ctxkernel.store.jsonl import JsonlStore
    from ctxkernel.testing import make_profile

    configure_logging("warning")
    # a window large enough that the whole history is forwarded (no compaction: the proxy's
    # worst case); fsync off: the benchmark measures CPU, not the disk
    profile = make_profile(model={"context_window": 1_000_000, "reserved_output_tokens": 8192})
    kernel = Kernel(profile, store=JsonlStore(home, fsync=False), home=home, entry_points=False)
    app = create_app(ServeConfig(upstream=upstream), kernel=kernel)
    settle_heap()  # as ``ctxkernel serve --tune-heap`` does before serving
    return with_cpu_probe(app)


def main(argv: list[str]) -> None:
    import uvicorn

    app = upstream_app if argv[0] == "upstream" else serve_app(argv[1], Path(argv[2]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue from now on, before uvicorn starts accepting them
    lifespan = "off" if argv[0] == "upstream" else "on"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=2))

    def stop_when_stdin_closes() -> None:
        sys.stdin.read()
        server.should_exit = True

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    print(sock.getsockname()[1], flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])

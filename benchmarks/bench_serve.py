"""The CPU ``ctxkernel serve`` adds per request, against the client's history length and the floor.

    python benchmarks/run.py -k serve

A client keeps its whole history (coding turns: an instruction, a reply with a tool call, a
large result, a final reply, as ``_workload.py`` writes them) and sends it with every request, as
agents do. One request = the client's next user message on top of a history of about 1,000 or
100,000 tokens, through the whole app in one process: the ASGI app (``httpx.ASGITransport``),
parsing, session key, reconcile, ``prepare_request``, the upstream body, the upstream call
(``httpx.MockTransport`` returning a fixed reply), ``commit_reply``, the ledger and the client's
reply. The client's own serialisation of its body is done before the clock starts. The session is
warmed first (it has seen the history), so every timed request is the steady state: two new
messages (the previous reply's echo and the new instruction). The profile is ``basic`` with a
window large enough that the history is forwarded whole (no compaction: the worst case for the
proxy, which must then re-send all of it). fsync is off: CPU, not the disk.

Lines:

* ``serve_overhead_flat_100k_vs_1k``: CPU per request at 100k / at 1k, target <= 2.
* ``serve_overhead_100k_vs_orjson_floor``: CPU per request at 100k / the floor any proxy pays for
  that body, ``orjson.loads`` + ``orjson.dumps`` of it, target <= 3.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import anyio
import httpx
import orjson
from _bench import Bench
from _workload import text

from ctxkernel import Kernel
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

REPLY = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "bench-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Done: " + text(30, 1)}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040},
}


def history(tokens: int) -> list[dict[str, Any]]:
    """An OpenAI-format coding history of about ``tokens`` tokens (about 600 per turn)."""
    out: list[dict[str, Any]] = []
    n = 0
    while n * 600 < tokens:
        out.append({"role": "user", "content": f"step {n}: " + text(40, n)})
        out.append(
            {
                "role": "assistant",
                "content": text(20, n + 1),
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": orjson.dumps({"path": f"src/m{n}.py"}).decode()},
                    }
                ],
            }
        )
        out.append({"role": "tool", "tool_call_id": f"c{n}", "content": "\n".join(text(12, n + k) for k in range(30))})
        out.append({"role": "assistant", "content": text(30, n + 3)})
        n += 1
    return out


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


class Client:
    """One client conversation against one app, stepping one request at a time."""

    def __init__(self, app: Any, session: str, tokens: int) -> None:
        self.app = app
        self.session = session
        self.messages = [{"role": "system", "content": "You are the bench agent."}, *history(tokens)]
        self.n = 0

    def body(self) -> bytes:
        self.n += 1
        self.messages.append({"role": "user", "content": f"next {self.n}: " + text(15, self.n)})
        return orjson.dumps({"model": "bench-model", "messages": self.messages, "tools": TOOLS})

    async def send(self, client: httpx.AsyncClient, body: bytes) -> None:
        response = await client.post(
            "/v1/chat/completions",
            content=body,
            headers={"X-Ctxkernel-Session": self.session, "content-type": "application/json"},
        )
        response.raise_for_status()
        self.messages.append(response.json()["choices"][0]["message"])


def build_app(home: Any) -> Any:
    from ctxkernel.serve.app import ServeConfig, create_app

    profile = make_profile(model={"context_window": 1_000_000, "reserved_output_tokens": 8192})
    kernel = Kernel(profile, store=JsonlStore(home, fsync=False), home=home, entry_points=False)
    upstream = httpx.MockTransport(lambda request: httpx.Response(200, json=REPLY))
    return create_app(ServeConfig(upstream="http://upstream.invalid/v1"), kernel=kernel, transport=upstream)


def run(bench: Bench) -> None:
    try:
        app = build_app(bench.scratch / "serve")
    except ImportError as exc:
        print(
            orjson.dumps(
                {"name": "serve_overhead_flat_100k_vs_1k", "skipped": f"the serve extra is not installed ({exc})"}
            ).decode(),
            flush=True,
        )
        return
    rounds = 5 if bench.quick else 9
    steps = 4 if bench.quick else 10
    sizes = (1_000, 100_000)
    clients = {size: Client(app, f"bench-{size}", size) for size in sizes}
    per_size: dict[int, list[float]] = {size: [] for size in sizes}
    floors: list[float] = []

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
            for client in clients.values():  # warm: the session takes in the whole history once
                for _ in range(2):
                    await client.send(http, client.body())
            for _ in range(rounds):
                for size, client in clients.items():
                    total = 0.0
                    for _ in range(steps):
                        body = client.body()
                        gc.collect()
                        gc.disable()
                        start = time.process_time()
                        await client.send(http, body)
                        total += time.process_time() - start
                        gc.enable()
                    per_size[size].append(total / steps)
                body = clients[sizes[-1]].body()
                clients[sizes[-1]].messages.pop()
                gc.disable()
                start = time.process_time()
                for _ in range(steps):
                    orjson.dumps(orjson.loads(body))
                floors.append((time.process_time() - start) / steps)
                gc.enable()

    async def with_lifespan() -> None:
        async with app.router.lifespan_context(app):
            await main()

    anyio.run(with_lifespan)
    small, large = per_size[sizes[0]], per_size[sizes[-1]]
    flat = [a / b for a, b in zip(large, small, strict=True)]
    ratio = statistics.median(flat)
    bench.report(
        "serve_overhead_flat_100k_vs_1k",
        ratio,
        ("<=", 2),
        "s per request",
        statistics.median(large),
        (max(flat) - min(flat)) / ratio,
        baseline_median=round(statistics.median(small), 6),
        repeat=rounds,
        steps_per_round=steps,
        history_messages=len(clients[sizes[-1]].messages),
    )
    floor = [a / b for a, b in zip(large, floors, strict=True)]
    ratio = statistics.median(floor)
    bench.report(
        "serve_overhead_100k_vs_orjson_floor",
        ratio,
        ("<=", 3),
        "s per request",
        statistics.median(large),
        (max(floor) - min(floor)) / ratio,
        baseline_median=round(statistics.median(floors), 6),
        repeat=rounds,
        steps_per_round=steps,
        body_bytes=len(clients[sizes[-1]].body()),
    )


if __name__ == "__main__":
    import sys
    import tempfile
    from pathlib import Path

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))

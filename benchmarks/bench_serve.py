"""The CPU ``ctxkernel serve`` adds per request, against the client's history length and the floor.

    python benchmarks/run.py -k serve

A client keeps its whole history (coding turns: an instruction, a reply with a tool call, a
large result, a final reply, as ``_workload.py`` writes them) and sends it with every request, as
agents do. One request = the client's next user message on top of a history of about 1,000 or
100,000 tokens.

Three processes, as deployed (``_serve_procs.py``): the benchmark (the client, an ``httpx.Client``
on one keep-alive connection), ``serve`` (the app ``ctxkernel serve`` runs, under uvicorn with the
CLI's defaults) and a fake provider (uvicorn, one fixed reply). What is counted is the CPU time of
the ``serve`` process alone (every thread, user + system, read by ``GET /__bench/cpu`` before and
after a batch of requests, less what one such read costs): receiving and parsing the HTTP request,
the body, session key, reconcile, ``prepare_request``, the upstream body and the upstream HTTP
call, ``commit_reply``, the ledger, the log appends and the client's reply. The client's own work
(serialising its history, reading the reply) and the provider's are in other processes and not
counted: they are not what the proxy adds. Checked (``perf`` on the ``serve`` process, 100k): the
kernel's share of serve's CPU is about 15%, mostly its own ``write``/``read`` syscalls and thread
switches; on loopback the sender's context also runs the receiving socket's TCP processing, so
serve's figure carries the provider's receive side of the 634 KB (``net_rx_action``: about 1% of
serve's samples, some 0.05 ms) while the client's process carries serve's own receive side of the
same bytes: a wash, and no part of the provider's own work is in the figure. The session is warmed first (it has seen the
history), so every counted request is the steady state: two new messages (the previous reply's
echo and the new instruction). The profile is ``basic`` with a window large enough that the
history is forwarded whole (no compaction: the worst case for the proxy, which must then re-send
all of it). fsync is off: CPU, not the disk. The collector runs as it does in production.

Lines:

* ``serve_overhead_flat_100k_vs_1k``: serve's CPU per request at 100k / at 1k, target <= 2.
* ``serve_overhead_100k_vs_orjson_floor``: serve's CPU per request at 100k / the floor any proxy
  pays for that body, ``orjson.loads`` + ``orjson.dumps`` of it (timed in the benchmark's process),
  target <= 3.
* ``serve_cpu_1k_vs_upstream_parse``: serve's CPU per request at 1k / the fake provider's CPU for
  the same requests (its process's CPU clock read from outside around the same batch: receiving
  the HTTP request, parsing the body, answering), target <= 4 (issue 40): serve's fixed cost per
  request, against what the provider itself pays to take a request in. Beside it,
  ``loop_thread_seconds`` and ``worker_threads_seconds``: the part of serve's CPU per request spent
  on its event loop's thread (HTTP in and out, the wire formats, the upstream call) and on its
  worker threads (the kernel: reconcile, ``prepare_request``, ``commit_reply`` and the log), each
  thread's own CPU clock read around the same batches (``_serve_procs.thread_cpu``).
* ``serve_rss_per_session_vs_body_100k``: in a fresh ``serve`` process, warmed by one session,
  the resident memory (``VmRSS``) each further session of 100k tokens adds (20 sessions of 10
  requests, read after each group of 5) / the bytes of one request's body, target <= 3 (issue 40).

* ``serve_parse_moved_cache_mark_vs_append_100k``: in this process, ``anthropic_wire``'s parse
  of an Anthropic history of 100k tokens, ten requests after three that warm the memo, when each
  body moves its ``cache_control`` mark to the new last message (Claude Code's rolling
  breakpoint) / when each body only appends, target <= 1.5: a client that rewrites its last
  message is parsed from that message on, not whole.
* ``serve_parse_responses_input_vs_chat_100k``: the same for a Responses API client that sends
  its whole ``input`` every time with items appended (Codex CLI, ``store: false``, and its
  metadata after the input written in another key order each time), parsed as
  ``serve`` does (``responses_wire.load_body`` then ``parse_request``) / the same history
  through ``openai_wire``, target <= 1.5: the new items only, as for Chat Completions.
* ``serve_parse_responses_stored_input_vs_chat_100k``: the same for a client that sends its whole
  ``input`` with ``store`` left true (``responses.create`` in a loop), whose every item is kept
  for ``previous_response_id``, target <= 1.5: parsed from its new items all the same.

``bench_serve_peer.py`` sets serve against LiteLLM's proxy in the same run.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from _bench import Bench
from _workload import text

HERE = Path(__file__).resolve().parent


def history(tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """An OpenAI-format coding history of about ``tokens`` tokens (about 600 per turn); another
    ``seed`` marks every message, so no cache of an earlier session's text can serve it."""
    tag = f"[{seed}] " if seed else ""
    out: list[dict[str, Any]] = []
    n = 0
    while n * 600 < tokens:
        out.append({"role": "user", "content": f"{tag}step {n}: " + text(40, n)})
        out.append(
            {
                "role": "assistant",
                "content": tag + text(20, n + 1),
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": orjson.dumps({"path": f"src/m{n}.py"}).decode()},
                    }
                ],
            }
        )
        out.append(
            {"role": "tool", "tool_call_id": f"c{n}", "content": tag + "\n".join(text(12, n + k) for k in range(30))}
        )
        out.append({"role": "assistant", "content": tag + text(30, n + 3)})
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
    """One client conversation, stepping one request at a time."""

    def __init__(self, session: str, tokens: int, seed: int = 0) -> None:
        self.session = session
        self.messages = [{"role": "system", "content": "You are the bench agent."}, *history(tokens, seed)]
        self.n = 0

    def body(self) -> bytes:
        self.n += 1
        self.messages.append({"role": "user", "content": f"next {self.n}: " + text(15, self.n)})
        return orjson.dumps({"model": "bench-model", "messages": self.messages, "tools": TOOLS})

    def send(self, http: Any, body: bytes) -> None:
        response = http.post(
            "/v1/chat/completions",
            content=body,
            headers={"X-Ctxkernel-Session": self.session, "content-type": "application/json"},
        )
        response.raise_for_status()
        self.messages.append(response.json()["choices"][0]["message"])


def anthropic_bodies(tokens: int, requests: int, *, marked: bool) -> list[bytes]:
    """The bodies of an Anthropic client's next ``requests`` requests over a history of about
    ``tokens`` tokens (``history``'s, in blocks), each adding a reply and an instruction; when
    ``marked``, each puts the rolling ``cache_control`` mark on its last message only."""
    messages: list[dict[str, Any]] = []
    for m in history(tokens):
        if m["role"] == "tool":
            blocks: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            ]
            role = "user"
        else:
            blocks = [{"type": "text", "text": m["content"]}]
            for call in m.get("tool_calls", []):
                arguments = orjson.loads(call["function"]["arguments"])
                blocks.append(
                    {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}
                )
            role = m["role"]
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += blocks
        else:
            messages.append({"role": role, "content": blocks})
    bodies = []
    for n in range(requests):
        if messages[-1]["role"] == "user":
            messages.append({"role": "assistant", "content": [{"type": "text", "text": text(20, n)}]})
        messages.append({"role": "user", "content": [{"type": "text", "text": f"next {n}: " + text(15, n)}]})
        sent = messages
        if marked:
            last = messages[-1]
            mark = {**last["content"][-1], "cache_control": {"type": "ephemeral"}}
            sent = [*messages[:-1], {**last, "content": [*last["content"][:-1], mark]}]
        bodies.append(
            orjson.dumps(
                {"model": "bench-model", "max_tokens": 100, "system": "You are the bench agent.", "messages": sent}
            )
        )
    return bodies


def chat_messages(tokens: int, requests: int) -> list[list[dict[str, Any]]]:
    """The histories of a Chat Completions client's next ``requests`` requests over ``history``'s
    ``tokens``, each adding a reply and an instruction."""
    messages = [{"role": "system", "content": "You are the bench agent."}, *history(tokens)]
    out = []
    for n in range(requests):
        messages = [*messages, {"role": "assistant", "content": text(20, n)}]
        messages.append({"role": "user", "content": f"next {n}: " + text(15, n)})
        out.append(messages)
    return out


def responses_input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Chat Completions history as a Responses API ``input``."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
            continue
        kind = "output_text" if m["role"] == "assistant" else "input_text"
        items.append({"type": "message", "role": m["role"], "content": [{"type": kind, "text": m["content"]}]})
        for call in m.get("tool_calls", []):
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


#: a client's bodies, and how serve parses one of them with its memo
ParseSide = tuple[list[bytes], Callable[[bytes, Any], Any]]


def compare_parses(bench: Bench, name: str, subject: ParseSide, baseline: ParseSide, warm: int = 3) -> None:
    """``bench.compare`` of the two sides' parses of their bodies after the first ``warm``, each
    side with a fresh memo that has parsed those first (what a session has seen)."""
    from ctxkernel.serve.wire import MessageMemo

    memos: list[Any] = [None, None]

    def setup() -> None:
        for side, (bodies, parse) in enumerate((subject, baseline)):
            memos[side] = MessageMemo()
            for raw in bodies[:warm]:
                parse(raw, memos[side])

    def run(side: int) -> None:
        bodies, parse = (subject, baseline)[side]
        for raw in bodies[warm:]:
            parse(raw, memos[side])

    bench.compare(
        name,
        lambda: run(0),
        lambda: run(1),
        target=("<=", 1.5),
        repeat=5 if bench.quick else 9,
        unit=f"s of CPU for {len(subject[0]) - warm} requests",
        setup=setup,
        body_bytes=len(subject[0][-1]),
    )


def parse_responses_input(bench: Bench) -> None:
    """``serve_parse_responses_input_vs_chat_100k``: see the module's docstring."""
    from ctxkernel.serve import openai_wire, responses_wire

    histories = chat_messages(100_000, 13)
    chat = [orjson.dumps({"model": "bench-model", "messages": m}) for m in histories]
    keys = ["session_id", "turn_id", "window_id"]
    responses = [  # Codex writes its metadata map in another key order every time, after the input
        orjson.dumps(
            {
                "model": "bench-model",
                "input": responses_input(m),
                "store": False,
                "client_metadata": {keys[(n + i) % 3]: f"{keys[(n + i) % 3]}-{n}" for i in range(3)},
            }
        )
        for n, m in enumerate(histories)
    ]

    def served_as_serve(raw: bytes, memo: Any) -> Any:
        return responses_wire.parse_request(responses_wire.load_body(raw, memo), memo)

    compare_parses(
        bench,
        "serve_parse_responses_input_vs_chat_100k",
        (responses, served_as_serve),
        (chat, openai_wire.parse_request),
    )
    # responses.create in a loop: the whole input, store left at its default (true)
    stored = [orjson.dumps({"model": "bench-model", "input": responses_input(m)}) for m in histories]
    compare_parses(
        bench,
        "serve_parse_responses_stored_input_vs_chat_100k",
        (stored, served_as_serve),
        (chat, openai_wire.parse_request),
    )


def parse_moved_mark(bench: Bench) -> None:
    """``serve_parse_moved_cache_mark_vs_append_100k``: see the module's docstring."""
    from ctxkernel.serve import anthropic_wire

    compare_parses(
        bench,
        "serve_parse_moved_cache_mark_vs_append_100k",
        (anthropic_bodies(100_000, 13, marked=True), anthropic_wire.parse_request),
        (anthropic_bodies(100_000, 13, marked=False), anthropic_wire.parse_request),
    )


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """One of ``_serve_procs.py``'s servers, and its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_serve_procs.py"), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        msg = f"_serve_procs.py {args[0]} did not start (exit status {proc.wait()})"
        raise RuntimeError(msg)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()  # the server exits when its stdin closes
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its living descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except OSError:
                continue
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s process tree so far: the per-process CPU clock of each
    (``((~pid) << 3) | CPUCLOCK_SCHED``, what ``clock_getcpuclockid`` returns on Linux)."""
    total = 0
    for member in tree_pids(pid):
        try:
            total += time.clock_gettime_ns(((~member) << 3) | 2)
        except OSError:
            continue  # ended between the listing and the read
    return total / 1e9


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid``'s process tree (``VmRSS`` of each)."""
    total = 0
    for member in tree_pids(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def server_cpu(http: Any) -> float:
    """The serve process's CPU seconds so far."""
    return int(http.get("/__bench/cpu").text) / 1e9


def server_threads(http: Any) -> dict[str, float]:
    """CPU seconds so far of serve's event loop thread and of its worker threads."""
    return {kind: ns / 1e9 for kind, ns in orjson.loads(http.get("/__bench/threads").content).items()}


def measure(http: Any, clients: dict[int, Client], rounds: int, steps: int, upstream_pid: int) -> dict[str, Any]:
    sizes = list(clients)
    per_size: dict[int, list[float]] = {size: [] for size in sizes}
    upstream: dict[int, list[float]] = {size: [] for size in sizes}
    threads: dict[int, dict[str, list[float]]] = {size: {"loop": [], "workers": []} for size in sizes}
    floors: list[float] = []
    for client in clients.values():  # warm: the session takes in the whole history once
        for _ in range(3):
            client.send(http, client.body())
    probes = []  # what one CPU read costs the server itself, taken out of every batch
    for _ in range(20):
        first = server_cpu(http)
        probes.append(server_cpu(http) - first)
    probe = statistics.median(probes)
    for _ in range(rounds):
        for size, client in clients.items():
            # the thread split is read outside the process's reads: it holds those two probes
            split_before = server_threads(http)
            before, upstream_before = server_cpu(http), tree_cpu(upstream_pid)
            for _ in range(steps):  # the client builds its body while serve is idle
                client.send(http, client.body())
            per_size[size].append((server_cpu(http) - before - probe) / steps)
            upstream[size].append((tree_cpu(upstream_pid) - upstream_before) / steps)
            split_after = server_threads(http)
            for kind, seconds in split_after.items():
                threads[size][kind].append((seconds - split_before[kind]) / steps)
        body = clients[sizes[-1]].body()
        clients[sizes[-1]].messages.pop()
        gc.collect()
        gc.disable()
        started = time.process_time()
        for _ in range(steps):
            orjson.dumps(orjson.loads(body))
        floors.append((time.process_time() - started) / steps)
        gc.enable()
    return {"per_size": per_size, "upstream": upstream, "floors": floors, "probe": probe, "threads": threads}


def run(bench: Bench) -> None:
    try:
        import aiohttp  # noqa: F401
        import httpx
        import uvicorn  # noqa: F401
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
    clients = {size: Client(f"bench-{size}", size) for size in (1_000, 100_000)}
    upstream, upstream_url = start("upstream")
    try:
        serve, serve_url = start("serve", f"{upstream_url}/v1", str(bench.scratch / "serve"))
        try:
            with httpx.Client(base_url=serve_url, timeout=120) as http:
                got = measure(http, clients, rounds, steps, upstream.pid)
        finally:
            stop(serve)
        memory = rss_per_session(bench, upstream_url)
    finally:
        stop(upstream)
    load = round(os.getloadavg()[0], 2)
    small, large, floors = got["per_size"][1_000], got["per_size"][100_000], got["floors"]
    flat = [a / b for a, b in zip(large, small, strict=True)]
    ratio = statistics.median(flat)
    bench.report(
        "serve_overhead_flat_100k_vs_1k",
        ratio,
        ("<=", 2),
        "s of serve CPU per request",
        statistics.median(large),
        (max(flat) - min(flat)) / ratio,
        baseline_median=round(statistics.median(small), 6),
        repeat=rounds,
        steps_per_round=steps,
        history_messages=len(clients[100_000].messages),
        probe_seconds=round(got["probe"], 6),
        load_average=load,
    )
    floor = [a / b for a, b in zip(large, floors, strict=True)]
    ratio = statistics.median(floor)
    bench.report(
        "serve_overhead_100k_vs_orjson_floor",
        ratio,
        ("<=", 3),
        "s of serve CPU per request",
        statistics.median(large),
        (max(floor) - min(floor)) / ratio,
        baseline_median=round(statistics.median(floors), 6),
        repeat=rounds,
        steps_per_round=steps,
        body_bytes=len(clients[100_000].body()),
        load_average=load,
    )

    parse = [a / b for a, b in zip(small, got["upstream"][1_000], strict=True)]
    ratio = statistics.median(parse)
    bench.report(
        "serve_cpu_1k_vs_upstream_parse",
        ratio,
        ("<=", 4),
        "s of serve CPU per request",
        statistics.median(small),
        (max(parse) - min(parse)) / ratio,
        baseline_median=round(statistics.median(got["upstream"][1_000]), 6),
        repeat=rounds,
        steps_per_round=steps,
        loop_thread_seconds=round(statistics.median(got["threads"][1_000]["loop"]), 6),
        worker_threads_seconds=round(statistics.median(got["threads"][1_000]["workers"]), 6),
        load_average=load,
    )
    growth = memory["per_session"]
    ratio = statistics.median(growth) / memory["body_bytes"]
    bench.report(
        "serve_rss_per_session_vs_body_100k",
        ratio,
        ("<=", 3),
        "bytes of serve RSS per session",
        statistics.median(growth),
        (max(growth) - min(growth)) / statistics.median(growth) if statistics.median(growth) else 0.0,
        baseline_median=memory["body_bytes"],
        sessions=memory["sessions"],
        requests_per_session=memory["requests"],
        rss_before=memory["rss_before"],
        rss_after=memory["rss_after"],
        load_average=load,
    )
    parse_moved_mark(bench)
    parse_responses_input(bench)


def rss_per_session(bench: Bench, upstream_url: str) -> dict[str, Any]:
    """RSS growth of a fresh ``serve`` process per 100k session, measured in groups of sessions."""
    import httpx

    groups, per_group, requests = (2, 2, 3) if bench.quick else (4, 5, 10)
    serve, serve_url = start("serve", f"{upstream_url}/v1", str(bench.scratch / "serve-rss"))
    try:
        with httpx.Client(base_url=serve_url, timeout=300) as http:
            warm = Client("rss-warm", 100_000, seed=9_000)
            for _ in range(requests):  # imports, tokenizer, pools: not a session's own
                warm.send(http, warm.body())
            body_bytes = len(warm.body())
            warm.messages.pop()
            before = tree_rss(serve.pid)
            marks, seed = [before], 9_001
            for _ in range(groups):
                for _ in range(per_group):
                    client = Client(f"rss-{seed}", 100_000, seed=seed)
                    seed += 1
                    for _ in range(requests):
                        client.send(http, client.body())
                marks.append(tree_rss(serve.pid))
    finally:
        stop(serve)
    return {
        "per_session": [(b - a) / per_group for a, b in zip(marks, marks[1:], strict=False)],
        "body_bytes": body_bytes,
        "sessions": groups * per_group,
        "requests": requests,
        "rss_before": before,
        "rss_after": marks[-1],
    }


if __name__ == "__main__":
    import tempfile

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))

"""``ctxkernel serve`` against the proxy users would otherwise pick, LiteLLM's, in the same run.

    python benchmarks/run.py -k serve_peer        # make bench installs the peer first

Four processes on loopback: the benchmark (the client: ``bench_serve.py``'s agent-shaped
conversations, an ``httpx.Client`` on one keep-alive connection per proxy), ``serve`` (as
``bench_serve.py`` starts it: ``basic``, a window that forwards the whole history, fsync off),
LiteLLM's proxy (the pinned release ``_peers.py`` installs into ``.cache/bench-peers/litellm``,
started by its own ``litellm`` command with a config naming one OpenAI-compatible model and a
master key, which it refuses to start without, and no database) and one fake provider both proxies forward to (``_serve_procs.py
upstream``: it parses each body and answers one fixed reply). Where LiteLLM cannot be installed
or started, its rows are skipped with the reason; nothing stands in for it.

What is counted is the CPU of each proxy's process tree (the process and its descendants, every
thread, user + system), read from outside through the kernel's per-process CPU clock
(``clock_gettime`` on the clock id of the pid: nanoseconds, and threads that ended are in it) before
and after a batch of requests, each read 0.1 s after the last answer, so the work a proxy does
after answering (LiteLLM's logging callbacks) is in its figure. The client's own work (building
each body, reading each answer) is in neither; what a proxy does in the background during a batch
(timers, its own housekeeping) is in its figure, as it would be on a user's machine.

Rows (rounds alternate which proxy goes first):

* ``serve_cpu_vs_litellm_1k`` / ``_100k``: serve's CPU per request / LiteLLM's, each on a
  conversation of about 1,000 or 100,000 tokens of history sent whole with every request. Each
  round opens a new conversation for each proxy (serve: a new session), warms it with three
  requests (serve takes in the history), then counts ``steps`` requests: the steady state, with
  a history that grows by ``steps + 3`` turns at most. Target <= 0.10 (issue 40).
* ``serve_cold_first_request_100k_vs_litellm``: the CPU of one request opening a conversation
  that arrives with 100,000 tokens of history no process has seen (serve: a new session taking
  in 300 messages; LiteLLM: a request like any other), serve / LiteLLM. Target <= 1.0.

``serve_rss_per_session_vs_body_100k`` and ``serve_cpu_1k_vs_upstream_parse`` are serve's own
(no peer needed): they are in ``bench_serve.py``.
"""

from __future__ import annotations

import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from _bench import Bench
from _peers import LITELLM_REQUIREMENT, litellm_executable, why_not_installed
from bench_serve import Client, start, stop, tree_cpu

ROWS = ("serve_cpu_vs_litellm_1k", "serve_cpu_vs_litellm_100k", "serve_cold_first_request_100k_vs_litellm")
SIZES = (1_000, 100_000)
SETTLE = 0.1  # seconds left to a proxy before each read, for what it does after it answered


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_litellm(upstream_url: str, folder: Path, master_key: str) -> tuple[subprocess.Popen[bytes], str]:
    """LiteLLM's proxy in front of the fake provider, by its own command; raises with its log's
    tail when it does not answer its liveness probe within five minutes."""
    import httpx

    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: bench-model\n"
        "    litellm_params:\n"
        "      model: openai/bench-model\n"
        f"      api_base: {upstream_url}/v1\n"
        "      api_key: bench-key\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "LITELLM_", "OPENAI_"))}
    # the model cost map shipped in the package, not fetched; no telemetry; errors only in its log
    env.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"})
    port = free_port()
    log = open(folder / "litellm.log", "wb")  # noqa: SIM115 - the process writes to it until stopped
    proc = subprocess.Popen(
        [str(litellm_executable()), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=folder,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_litellm(proc)
    tail = (folder / "litellm.log").read_bytes()[-1500:].decode(errors="replace")
    msg = f"LiteLLM's proxy did not come up (exit status {proc.returncode}): {tail}"
    raise RuntimeError(msg)


def stop_litellm(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def settled_cpu(pid: int) -> float:
    """``tree_cpu`` once the work a proxy does after answering (its logging callbacks) is done."""
    time.sleep(SETTLE)
    return tree_cpu(pid)


def batch(http: Any, pid: int, client: Client, steps: int) -> float:
    """CPU seconds of ``pid``'s tree per request over ``steps`` requests of ``client``."""
    before = settled_cpu(pid)
    for _ in range(steps):
        client.send(http, client.body())
    return (settled_cpu(pid) - before) / steps


def measure(proxies: dict[str, tuple[Any, int]], rounds: int, steps: int) -> dict[str, Any]:
    names = list(proxies)
    steady: dict[tuple[str, int], list[float]] = {(n, s): [] for n in names for s in SIZES}
    cold: dict[str, list[float]] = {n: [] for n in names}
    for name, (http, _) in proxies.items():  # warm: imports, pools, the first connection
        for size in SIZES:
            client = Client(f"warm-{name}-{size}", size, seed=1)
            for _ in range(3):
                client.send(http, client.body())
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            http, pid = proxies[name]
            for size in SIZES:
                client = Client(f"steady-{name}-{size}-{r}", size)
                for _ in range(3):
                    client.send(http, client.body())
                steady[(name, size)].append(batch(http, pid, client, steps))
        for name in order:
            http, pid = proxies[name]
            client = Client(f"cold-{name}-{r}", 100_000, seed=100 + r)  # text neither proxy has seen
            body = client.body()
            before = settled_cpu(pid)
            client.send(http, body)
            cold[name].append(settled_cpu(pid) - before)
    return {"steady": steady, "cold": cold}


def report_ratio(bench: Bench, name: str, subject: list[float], peer: list[float], **extra: Any) -> None:
    ratios = [a / b for a, b in zip(subject, peer, strict=True)]
    ratio = statistics.median(ratios)
    target = ("<=", 1.0) if name.startswith("serve_cold_") else ("<=", 0.10)
    bench.report(
        name,
        ratio,
        target,
        "s of CPU per request (process tree)",
        statistics.median(subject),
        (max(ratios) - min(ratios)) / ratio if ratio else 0.0,
        baseline_median=float(f"{statistics.median(peer):.6g}"),
        peer=LITELLM_REQUIREMENT,
        repeat=len(ratios),
        load_average=round(os.getloadavg()[0], 2),
        **extra,
    )


def skip(reason: str) -> None:
    for row in ROWS:
        print(orjson.dumps({"name": row, "skipped": reason}).decode(), flush=True)


def run(bench: Bench) -> None:
    try:
        import httpx
        import uvicorn  # noqa: F401
    except ImportError as exc:
        skip(f"the serve extra is not installed ({exc})")
        return
    if not Path("/proc/self/task").exists():
        skip("the process-tree CPU clock is read through Linux's /proc")
        return
    reason = why_not_installed()
    if reason:
        skip(reason)
        return
    rounds = 2 if bench.quick else 5
    steps = 3 if bench.quick else 10
    master_key = "sk-" + secrets.token_hex(32)  # it refuses to start without one, as deployed
    upstream, upstream_url = start("upstream")
    try:
        try:
            litellm, litellm_url = start_litellm(upstream_url, Path(bench.scratch) / "litellm", master_key)
        except RuntimeError as exc:
            skip(str(exc))
            return
        try:
            serve, serve_url = start("serve", f"{upstream_url}/v1", str(Path(bench.scratch) / "serve-peer"))
            try:
                with (
                    httpx.Client(base_url=serve_url, timeout=300) as to_serve,
                    httpx.Client(
                        base_url=litellm_url, timeout=300, headers={"Authorization": f"Bearer {master_key}"}
                    ) as to_litellm,
                ):
                    got = measure({"serve": (to_serve, serve.pid), "litellm": (to_litellm, litellm.pid)}, rounds, steps)
            finally:
                stop(serve)
        finally:
            stop_litellm(litellm)
    finally:
        stop(upstream)
    steady, cold = got["steady"], got["cold"]
    for size, row in zip(SIZES, ROWS[:2], strict=True):
        report_ratio(bench, row, steady[("serve", size)], steady[("litellm", size)], steps_per_round=steps)
    report_ratio(bench, ROWS[2], cold["serve"], cold["litellm"], history_messages=301)


if __name__ == "__main__":
    import tempfile

    from ctxkernel.logging import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory() as scratch:
        run(Bench(quick="--quick" in sys.argv, scratch=Path(scratch)))

"""What ``serve`` holds in memory: per request and per session, as a multiple of the client's
body (``tracemalloc``: a deterministic count of the bytes Python allocated, not a timing), and
the bound on the sessions it keeps open (``--max-sessions``; docs/serve.md, "Sessions in memory").

The memory is measured in a child process that runs the app alone (the fake provider stays in
this one, so none of its own parsing is counted)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from serve_clients import big_result
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile

from .conftest import write_profile

#: the child: one warm-up request in its own session, then the measured ones in a session of
#: their own; prints the body's size, the peak allocated during the measured requests and what
#: is still allocated once they are answered (both above what was allocated before them)
CHILD = """
import gc, sys, tracemalloc
import anyio, httpx, orjson
from ctxkernel.logging import configure_logging
from ctxkernel.serve.app import create_app
from ctxkernel.serve.config import ServeConfig

configure_logging("warning")
profile, upstream, bodies = sys.argv[1], sys.argv[2], orjson.loads(sys.stdin.buffer.read())
path = sys.argv[3] if len(sys.argv) > 3 else "/v1/chat/completions"
app = create_app(ServeConfig(profile=profile, upstream=upstream, anthropic_upstream=upstream.removesuffix("/v1")))
headers = {"content-type": "application/json", "authorization": "Bearer sk-test-client", "x-api-key": "sk-test-client"}

async def main():
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=120) as client:
            warm = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
            answer = await client.post("/v1/chat/completions", content=warm, headers={**headers, "X-Ctxkernel-Session": "warm"})
            assert answer.status_code == 200, answer.text
            raws = [orjson.dumps(body) for body in bodies]
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for raw in raws:
                answer = await client.post(path, content=raw, headers={**headers, "X-Ctxkernel-Session": "measured"})
                assert answer.status_code == 200, answer.text[:300]
                del answer
            peak = tracemalloc.get_traced_memory()[1] - base
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            print(orjson.dumps({"body": len(raws[-1]), "peak": peak, "kept": kept}).decode())

anyio.run(main)
"""


def measured(
    profile: Path, upstream_url: str, bodies: list[dict[str, Any]], path: str = "/v1/chat/completions"
) -> dict[str, int]:
    """What the child measured serving ``bodies`` one after the other in one session (to
    ``path``: Chat Completions, or ``/v1/messages``)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(profile), f"{upstream_url}/v1", path],
        input=orjson.dumps(bodies),
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return orjson.loads(done.stdout.splitlines()[-1])


# -- issue 39 item 6: an accepted history of many tiny messages ---------------------------------------
#: what serving it may allocate at its peak and keep afterwards, over the body's size. The
#: issue's target is 20 for the peak. What is held per message (its two log events and their
#: data as dicts, the turn events, its node and wire form: docs/performance.md, "Memory per
#: session, third round") keeps it at about 51 held and 63 at the peak (the commit, which writes
#: the history and a snapshot of it). Before snapshots were serialised when written, batches and
#: snapshots in pieces, the append operation and message sources shared, the client's parsed
#: messages let go after their conversion and a history's messages kept once, they were 80 and
#: 117; before the JSON the session keeps was sized to its bytes (ctxkernel/jsonbytes.py) and the
#: store's batch was written into one buffer, 205 and 380.
TINY_PEAK_BOUND = 75
TINY_KEPT_BOUND = 60


def test_an_accepted_history_of_tiny_messages_is_held_within_a_bound(patient_fake, tmp_path):
    _, server = patient_fake
    profile = write_profile(tmp_path, window=400_000, reserved=4_000)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(9_999)]
    got = measured(profile, server.url, [{"model": "fake-model", "messages": messages}])
    peak, kept = got["peak"] / got["body"], got["kept"] / got["body"]
    assert peak <= TINY_PEAK_BOUND, f"peak {peak:.0f}x the body of {got['body']} bytes"
    assert kept <= TINY_KEPT_BOUND, f"kept {kept:.0f}x the body of {got['body']} bytes"


# -- issue 40 item 3: what one session of a coding history holds ---------------------------------------
#: held per session over its last body (issue 40's bench row, ``serve_rss_per_session_vs_body_100k``,
#: targets 3 for the process's RSS): about 7.0 now; 8.1 while the memo kept the client's last
#: body, 10.7 while the snapshot writer kept every visible node serialised and each node a parsed
#: copy of its message, and 22 before its records and the memo's were sized to their bytes and
#: the memo stopped keeping each message's JSON
SESSION_KEPT_BOUND = 7.6
#: the peak of the same requests over the last body: issue 39's bound. About 14.9, orjson's
#: parse of the first body (its document peaks near 14 times a text body); 21.8 while the second
#: body, parsed whole once to prove where the first one's messages end, was parsed by orjson too
#: while the session already held 8 times the body
SESSION_PEAK_BOUND = 20


def coding_history(turns: int) -> list[dict[str, Any]]:
    """An agent's history: an instruction, a reply calling a tool, its large result, a reply."""
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out.append({"role": "user", "content": f"step {n}: change the parser so that case {n} passes"})
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "m{n}.py"}}'},
        }
        out.append({"role": "assistant", "content": f"Reading m{n}.py first.", "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"c{n}", "content": big_result(n, 30)})
        out.append({"role": "assistant", "content": f"Case {n} is handled by the new branch in parse_{n}."})
    return out


def test_a_session_holds_a_few_times_its_body(patient_fake, tmp_path):
    upstream, server = patient_fake
    upstream.script = lambda api, body: Reply("done")
    profile = write_profile(tmp_path, window=400_000, reserved=4_000)
    history = coding_history(60)
    bodies = []
    for n in range(4):  # the client's next requests: the history, the reply, a new instruction
        history = [*history, {"role": "user", "content": f"next {n}"}]
        bodies.append({"model": "fake-model", "messages": history})
        history = [*history, {"role": "assistant", "content": "done"}]
    got = measured(profile, server.url, bodies)
    kept, peak = got["kept"] / got["body"], got["peak"] / got["body"]
    assert kept <= SESSION_KEPT_BOUND, f"a session keeps {kept:.1f}x its body of {got['body']} bytes"
    assert peak <= SESSION_PEAK_BOUND, f"serving the session peaked at {peak:.1f}x its body of {got['body']} bytes"


def test_a_claude_code_session_holds_and_peaks_as_an_appending_one(patient_fake, tmp_path):
    # Claude Code moves its cache mark to the new last message each request: its bodies are
    # parsed from the rewritten message on, as an appending client's are from its new items,
    # not whole (orjson's document, near 14 times the body, on every request)
    upstream, server = patient_fake
    upstream.script = lambda api, body: Reply("done")
    profile = write_profile(tmp_path, window=400_000, reserved=4_000)
    history = []
    for message in coding_history(40):
        if message["role"] == "tool":
            blocks = [{"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]}]
            role = "user"
        else:
            blocks = [{"type": "text", "text": message["content"]}]
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": {}}
                for c in message.get("tool_calls", [])
            ]
            role = message["role"]
        if history and history[-1]["role"] == role:
            history[-1]["content"] += blocks
        else:
            history.append({"role": role, "content": blocks})
    bodies = []
    for n in range(6):
        history = [*history, {"role": "user", "content": [{"type": "text", "text": f"next {n}"}]}]
        last = history[-1]
        marked = {**last, "content": [{**last["content"][-1], "cache_control": {"type": "ephemeral"}}]}
        bodies.append({"model": "fake-model", "max_tokens": 100, "messages": [*history[:-1], marked]})
        history = [*history, {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    got = measured(profile, server.url, bodies, "/v1/messages")
    kept, peak = got["kept"] / got["body"], got["peak"] / got["body"]
    assert kept <= SESSION_KEPT_BOUND, f"a session keeps {kept:.1f}x its body of {got['body']} bytes"
    assert peak <= SESSION_PEAK_BOUND, f"serving the session peaked at {peak:.1f}x its body of {got['body']} bytes"


# -- issue 40 item 3: the open sessions are bounded --------------------------------------------------------
def converse(serve: Any, names: list[str], rounds: int) -> list[tuple[str, Any]]:
    """Each session's client takes ``rounds`` turns (a tool call and its large result, then the
    next instruction), the sessions in turn; what the upstream received for each request."""
    histories: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    sent = []
    for r in range(rounds):
        for name in names:
            history = histories[name]
            history.append({"role": "user", "content": f"{name}: task {r}"})
            client = serve.openai(session=name)
            reply = client.chat.completions.create(model="fake-model", messages=history).choices[0].message
            history.append(reply.model_dump(exclude_none=True))
            for call in reply.tool_calls or []:
                history.append({"role": "tool", "tool_call_id": call.id, "content": big_result(r, 40)})
                reply = client.chat.completions.create(model="fake-model", messages=history).choices[0].message
                history.append(reply.model_dump(exclude_none=True))
            assert len(serve.proxy.sessions) <= serve.proxy.config.max_sessions
            sent.append((name, reply.content))
    return sent


def scripted(api: str, body: dict[str, Any]) -> Reply:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"read {len(body['messages'])} messages")
    return Reply("reading", [("read_file", {"path": "a.py"})], ids=[f"call_{len(body['messages'])}"])


def test_sessions_beyond_the_bound_are_closed_and_reopen_to_the_same_state(fake, serve_factory, tmp_path):
    upstream, _ = fake
    upstream.script = scripted
    names = ["lru-a", "lru-b", "lru-c"]
    seen = {}
    for bound in (1, 64):  # one session open at a time, against all of them open
        home = tmp_path / f"bound-{bound}"
        home.mkdir()
        profile = write_profile(home, window=4_000, reserved=500)
        serve = serve_factory(profile, max_sessions=bound)
        upstream.received.clear()
        replies = converse(serve, names, rounds=6)
        # what the provider was sent, request by request (ids and all): the same with the bound
        seen[bound] = (replies, [orjson.dumps([r.body["messages"], r.tokens]) for r in upstream.received])
        if bound == 1:
            assert len(serve.proxy.sessions) == 1
        else:
            assert len(serve.proxy.sessions) == 3
        serve.stop()
        events = Kernel(load_profile(profile)).open_session("lru-a", repair=False).events
        assert any(e.type == "compaction/end" for e in events), "the sessions never compacted"
    assert seen[1] == seen[64]


def test_a_session_with_a_request_in_flight_is_not_closed(fake, serve_factory):
    upstream, _ = fake
    upstream.script = lambda api, body: Reply("ok")
    serve = serve_factory(max_sessions=1)
    upstream.reply_delay = 1.5
    answers: dict[str, Any] = {}

    def slow() -> None:
        answers["slow"] = httpx.post(
            f"{serve.url}/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "slow one"}]},
            headers={"X-Ctxkernel-Session": "in-flight", "authorization": "Bearer sk-test-client"},
            timeout=30,
        )

    thread = threading.Thread(target=slow)
    thread.start()
    deadline = time.monotonic() + 20
    while not upstream.received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert upstream.received, "the slow request never reached the upstream"
    upstream.reply_delay = 0
    in_flight = serve.proxy.sessions["in-flight"]
    for name in ("other-1", "other-2"):  # each would close the least recently used one
        client = serve.openai(session=name)
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": name}])
        assert serve.proxy.sessions.get("in-flight") is in_flight
    thread.join(30)
    assert answers["slow"].status_code == 200, answers["slow"].text
    # answered: the next session opened closes it (the bound holds again)
    serve.openai(session="other-3").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "other-3"}]
    )
    assert list(serve.proxy.sessions) == ["other-3"]


def test_max_sessions_below_one_is_a_usage_error(capsys):
    from ctxkernel.cli import main

    assert main(["serve", "--profile", "basic", "--max-sessions", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-sessions" in err and len(err.strip().splitlines()) == 1

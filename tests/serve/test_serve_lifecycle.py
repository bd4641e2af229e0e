"""Sessions across restarts, concurrent clients, overflow, rewrites, disconnects."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from serve_clients import Agent, big_result
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile

from .conftest import write_profile


def log_of(serve, session_id):
    """The session as stored, read without repair (a live serve may have calls waiting)."""
    return Kernel(load_profile(serve.profile)).open_session(session_id, repair=False)


def counting_script(final_every: int = 0):
    state = {"n": 0}

    def script(api, body):
        state["n"] += 1
        if final_every and state["n"] % final_every == 0:
            return Reply(f"answer {state['n']}")
        return Reply(f"step {state['n']}", [("read_file", {"path": f"f{state['n']}.py"})])

    return script


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_restart_mid_conversation_resumes_from_the_store(fake, serve_factory, api):
    upstream, _ = fake
    upstream.script = counting_script()
    serve = serve_factory()
    make = serve.openai if api == "openai" else serve.anthropic
    agent = Agent(api, make(session="resume-me"))
    agent.user("go")
    for i in range(4):
        _, calls = agent.step()
        agent.results([(calls[0][0], f"result {i}")])
    _, calls = agent.step()  # a client call is waiting for its result while serve restarts
    before = [e.type for e in log_of(serve, "resume-me").events]
    serve.restart()
    agent.client = make(session="resume-me")
    agent.results([(calls[0][0], "result after restart")])
    upstream.script = lambda api_name, body: Reply("finished")
    text, calls = agent.step()
    assert text == "finished" and not calls
    events = log_of(serve, "resume-me").events
    # the restarted server continued the same log: nothing closed as interrupted, nothing repeated
    assert [e.type for e in events[: len(before)]] == before
    assert not any(e.type == "turn/end" for e in events)
    assert [e.type for e in events].count("assistant/message") == 6
    assert [e.type for e in events].count("user/message") == 1
    results = [e.data["message"]["content"][0]["content"] for e in events if e.type == "tool/result"]
    assert results[-1] == "result after restart"
    # the upstream saw the whole resumed context
    assert len(upstream.received[-1].body["messages"]) >= 11


def test_two_concurrent_clients_keep_their_sessions_apart(fake, serve_factory):
    upstream, _ = fake

    def script(api, body):
        time.sleep(0.01)
        return Reply("ack: " + str(len(body["messages"])))

    upstream.script = script
    serve = serve_factory()
    errors: list[BaseException] = []
    agents = {}

    def run(name: str, key: str) -> None:
        try:
            # no session header: the fingerprint (credential, system, first message) separates them
            import openai

            client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key=key, max_retries=0)
            agent = Agent("openai", client, with_tools=False, system=f"agent {name}")
            agents[name] = agent
            for i in range(8):
                agent.user(f"{name} message {i}")
                agent.step()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n, f"sk-{n}")) for n in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    kernel = Kernel(load_profile(serve.profile))
    sessions = [s for s in kernel.sessions() if s.startswith("fp-")]
    assert len(sessions) == 2
    for sid in sessions:
        texts = [
            e.data["message"]["content"][0]["text"]
            for e in kernel.open_session(sid, repair=False).events
            if e.type == "user/message"
        ]
        owners = {t.split()[0] for t in texts}
        assert len(owners) == 1 and len(texts) == 8, texts


def test_same_prompt_different_credentials_never_share_a_session(serve_factory):
    serve = serve_factory()
    import openai

    for key in ("sk-tenant-one", "sk-tenant-two"):
        client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key=key, max_retries=0)
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "same words"}])
    sessions = [s for s in Kernel(load_profile(serve.profile)).sessions() if s.startswith("fp-")]
    assert len(sessions) == 2


def test_a_concurrent_request_for_a_busy_session_waits_then_gets_409(fake, serve_factory):
    upstream, _ = fake

    def slow(api, body):
        time.sleep(1.5)
        return Reply("slow")

    upstream.script = slow
    serve = serve_factory(lock_wait_seconds=0.3)
    url = f"{serve.url}/v1/chat/completions"
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Ctxkernel-Session": "busy", "Authorization": "Bearer sk-x"}
    first: dict = {}
    t = threading.Thread(target=lambda: first.update(r=httpx.post(url, json=body, headers=headers, timeout=30)))
    t.start()
    time.sleep(0.5)
    second = httpx.post(url, json=body, headers=headers, timeout=30)
    t.join(30)
    assert first["r"].status_code == 200
    assert second.status_code == 409
    error = second.json()["error"]
    assert error["code"] == "session_busy" and "busy" in error["message"]
    # waiting within the bound succeeds: the requests are served in turn
    upstream.script = lambda api, body: Reply("quick")
    serve.proxy.config.lock_wait_seconds = 10
    r = httpx.post(
        url,
        json={
            **body,
            "messages": [
                *body["messages"],
                {"role": "assistant", "content": "slow"},
                {"role": "user", "content": "next"},
            ],
        },
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 200


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_upstream_overflow_runs_the_strategy_and_retries_once_unseen(fake, serve_factory, api):
    upstream, _ = fake
    upstream.script = counting_script()
    serve = serve_factory()
    make = serve.openai if api == "openai" else serve.anthropic
    agent = Agent(api, make(session=f"overflow-{api}"))
    agent.user("go")
    for i in range(6):
        _, calls = agent.step()
        agent.results([(calls[0][0], big_result(i, lines=30))])
    # the provider's real window is smaller than the profile says: it refuses the next request
    upstream.limit = max(r.tokens for r in upstream.received) - 200
    _, calls = agent.step()
    assert calls, "the client got its reply as if nothing happened"
    assert len(upstream.refused) == 1
    assert upstream.received[-1].tokens <= upstream.limit
    events = log_of(serve, f"overflow-{api}").events
    assert any(e.type == "step/end" and "ContextOverflowError" in e.data.get("error", "") for e in events)
    assert any(e.type == "compaction/summary" for e in events)


def test_a_request_that_cannot_fit_is_refused_before_the_upstream(fake, serve_factory, tmp_path):
    # one reply of ten tool calls whose results (~120 tokens each, too small for the kernel's
    # excerpts) are together over the 800-token window: a call and its results are never split and
    # only "hi" is before them, so no strategy can shrink it. (A request header over half the
    # window is refused as such, naming the smallest window: test_serve_errors.py)
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, window=1000, reserved=200))
    import openai

    calls = [
        {"id": f"call_{k}", "type": "function", "function": {"name": "read", "arguments": f'{{"path": "{k}.py"}}'}}
        for k in range(10)
    ]
    results = [{"role": "tool", "tool_call_id": f"call_{k}", "content": big_result(k, lines=8)} for k in range(10)]
    client = serve.openai(session="too-big")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="fake-model",
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                *results,
            ],
        )
    assert info.value.body["code"] == "context_length_exceeded"
    assert not upstream.received and not upstream.refused


def test_one_oversized_message_is_excerpted_not_refused(fake, serve_factory, tmp_path):
    # the kernel's guard (security.md, "Oversized content") excerpts a single message over half
    # the window, so the upstream gets a request within the window instead of a refusal
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("read it")
    serve = serve_factory(write_profile(tmp_path, window=1000, reserved=200))
    client = serve.openai(session="one-big")
    reply = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": big_result(1, lines=200)}]
    )
    assert reply.choices[0].message.content == "read it"
    assert len(upstream.received) == 1
    assert upstream.received[0].tokens <= 800


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_retried_last_turn_drops_the_old_branch_from_the_surface(fake, serve_factory, api):
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("first answer")
    serve = serve_factory()
    make = serve.openai if api == "openai" else serve.anthropic
    agent = Agent(api, make(session=f"retry-{api}"), with_tools=False)
    agent.user("question one")
    agent.step()
    agent.user("question two (typo)")
    agent.step()
    # the client edits its last message and asks again
    agent.history = agent.history[:-2]
    agent.user("question two")
    upstream.script = lambda api_name, body: Reply("second answer")
    text, _ = agent.step()
    assert text == "second answer"
    sent = orjson.dumps(upstream.received[-1].body["messages"]).decode()
    assert "question two (typo)" not in sent and "question two" in sent
    session = log_of(serve, f"retry-{api}")
    assert session.id == f"retry-{api}"  # dropped in place, not forked
    visible = [n.message.text for n in session.surface.nodes]
    assert visible == ["question one", "first answer", "question two", "second answer"]
    # nothing already in the log was lost
    logged = [e.data["message"]["content"][0]["text"] for e in session.events if e.type == "user/message"]
    assert "question two (typo)" in logged


def test_client_compacting_its_own_history_forks_a_child_session(fake, serve_factory, tmp_path):
    upstream, _ = fake
    upstream.script = counting_script(final_every=0)
    serve = serve_factory()
    agent = Agent("openai", serve.openai(session="self-compactor"))
    agent.user("start")
    for i in range(30):
        _, calls = agent.step()
        agent.results([(calls[0][0], big_result(i, lines=20))])
    parent = log_of(serve, "self-compactor")
    assert any(e.type == "compaction/summary" for e in parent.events)  # its first messages are gone from the surface
    parent_events = len(parent.events)
    # the client replaces its history with its own summary
    agent.history = [
        {"role": "user", "content": "Summary of our work so far: read 30 files."},
        {"role": "user", "content": "continue"},
    ]
    upstream.script = lambda api, body: Reply("continuing")
    text, _ = agent.step()
    assert text == "continuing"
    sent = upstream.received[-1].body["messages"]
    assert "Summary of our work so far" in orjson.dumps(sent).decode()
    kernel = Kernel(load_profile(serve.profile))
    children = [s for s in kernel.sessions() if kernel.store.header(s).parent == "self-compactor"]
    assert len(children) == 1
    assert len(kernel.open_session("self-compactor", repair=False).events) >= parent_events  # the old log is intact
    # the next request of that client lands in the child
    agent.user("and more")
    agent.step()
    child = kernel.open_session(children[0], repair=False)
    texts = [e.data["message"]["content"][0]["text"] for e in child.events if e.type == "user/message"]
    assert texts[-1] == "and more"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_client_disconnect_mid_stream_leaves_the_log_consistent(fake, serve_factory, api):
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("word " * 3000)
    upstream.delay = 0.002
    serve = serve_factory()
    if api == "openai":
        url = f"{serve.url}/v1/chat/completions"
        body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "talk"}]}
    else:
        url = f"{serve.url}/v1/messages"
        body = {
            "model": "fake-model",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "talk"}],
        }
    sid = f"gone-{api}"
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", url, json=body, headers={"X-Ctxkernel-Session": sid}) as response,
    ):
        assert response.status_code == 200
        for _ in response.iter_bytes():
            break  # the client goes away after the first bytes
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        events = log_of(serve, sid).events
        if events and events[-1].type == "step/end":
            break
        time.sleep(0.1)
    types = [e.type for e in events]
    assert "assistant/message" not in types  # no half reply
    assert events[-1].type == "step/end" and events[-1].data.get("reason") == "interrupted"
    # the same client retries and gets its answer
    upstream.delay = 0
    upstream.script = lambda api_name, body: Reply("short")
    with httpx.Client(timeout=30) as http:
        r = http.post(url, json={**body, "stream": False}, headers={"X-Ctxkernel-Session": sid})
    assert r.status_code == 200
    session = log_of(serve, sid)
    assert [n.role for n in session.surface.nodes] == ["user", "assistant"]


def test_a_request_writes_its_log_once_and_waits_for_the_disk_once(fake, serve_factory, monkeypatch):
    # the client's new messages and the request's step/start are folded, not written
    # (prepare_request(defer_write=True)): the reply's commit writes them with the reply, in one
    # durable store write
    import os

    upstream, _ = fake
    upstream.script = lambda api, body: Reply("noted")
    serve = serve_factory()
    client = serve.openai(session="fsyncs")
    history = [{"role": "user", "content": "first"}]
    client.chat.completions.create(model="fake-model", messages=history)
    synced: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    store = serve.proxy.kernel.store
    writes: list[list[str]] = []
    real_append = store.append

    def counting_append(session_id, events, start):
        writes.append([e.type for e in events])
        return real_append(session_id, events, start)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(store, "append", counting_append)
    history += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "second"}]
    client.chat.completions.create(model="fake-model", messages=history)
    logs = [path for path in synced if path.endswith(".jsonl")]
    assert len(logs) == 1, synced
    assert writes == [
        [
            "turn/end",
            "turn/start",
            "user/message",
            "serve/ledger",
            "step/start",
            "assistant/message",
            "step/end",
            "serve/ledger",
        ],
    ]
    monkeypatch.undo()
    # and the history is in the log, before the step that answered it
    events = serve.proxy.kernel.open_session(serve.proxy.sessions["fsyncs"].id).events
    texts = [e.data["message"]["content"] for e in events if e.type == "user/message"]
    assert [t[0]["text"] if isinstance(t, list) else t for t in texts] == ["first", "second"]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_request_tokenises_each_new_message_once(fake, serve_factory, api):
    # the ledger's counts (the client's new messages, the reply's view) go through
    # Session.count_message, whose count the message's surface node then takes
    from ctxkernel.testing import CountingTokenizer

    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("the reply, counted once " * 4)
    serve = serve_factory()
    sid = f"tokenised-{api}"
    if api == "openai":
        client = serve.openai(session=sid)

        def ask(history):
            return client.chat.completions.create(model="fake-model", messages=history).choices[0].message.content
    else:
        client = serve.anthropic(session=sid)

        def ask(history):
            return client.messages.create(model="fake-model", max_tokens=100, messages=history).content[0].text

    history = [{"role": "user", "content": "the first instruction"}]
    history.append({"role": "assistant", "content": ask(history)})
    session = serve.proxy.sessions[sid]
    counting = CountingTokenizer(session.meter.tokenizer)
    session.meter.tokenizer = counting
    instruction = "the second instruction, with a few more words to count"
    history.append({"role": "user", "content": instruction})
    reply = ask(history)
    assert counting.texts.count(instruction) == 1, counting.texts
    assert counting.texts.count(reply) == 1, counting.texts
    fresh = Kernel(load_profile(serve.profile)).open_session(session.id, repair=False)
    assert session.meter.surface_tokens() == fresh.meter.surface_tokens()  # still exact


def started_second_request(fake: Any, serve_factory: Any, name: str) -> tuple[Any, Any, list[dict[str, str]], Any]:
    """A serve whose session ``name`` has one answered request and a second one started (its
    events folded by ``start_turn``, no reply yet): the serve, the upstream, the history sent and the
    started turn."""
    from ctxkernel.serve import openai_wire

    upstream, _ = fake
    upstream.script = lambda api, body: Reply("answer")
    serve = serve_factory()
    history = [{"role": "user", "content": "first"}]
    serve.openai(session=name).chat.completions.create(model="fake-model", messages=history)
    history += [{"role": "assistant", "content": "answer"}, {"role": "user", "content": "second"}]
    body = orjson.dumps({"model": "fake-model", "messages": history})
    turn = serve.proxy.start_turn(openai_wire, name, openai_wire.parse_request(body))
    return serve, upstream, history, turn


def test_events_held_by_an_unanswered_request_give_way_to_another_writer(fake, serve_factory):
    # a request ended without a reply (its events folded, not written) and another writer
    # appended to the log meanwhile: the next request drops the held events with the session
    # object, reopens the log and is answered; nothing is written twice or out of order
    serve, _, history, turn = started_second_request(fake, serve_factory, "held")
    assert turn.session.step_open  # held: folded in the object, not in the log
    other = serve.proxy.kernel.open_session(turn.session.id, keep_waiting_calls=True)
    other.set_task(goal="written by another worker")
    reply = serve.openai(session="held").chat.completions.create(model="fake-model", messages=history)
    assert reply.choices[0].message.content == "answer"
    session = log_of(serve, "held")
    assert [n.role for n in session.surface.nodes] == ["user", "assistant", "user", "assistant"]
    assert [e.type for e in session.events].count("user/message") == 2
    assert session.task["goal"] == "written by another worker"


def test_a_request_cut_off_after_its_step_start_resumes_after_a_restart(fake, serve_factory):
    # the client's new messages and step/start are folded, not written (the reply's commit
    # writes them); serve stops before the upstream answers, so the log holds nothing of that
    # request; the client sends the same history again to the restarted serve and gets its reply
    serve, upstream, history, _ = started_second_request(fake, serve_factory, "cut")
    before = [e.type for e in log_of(serve, "cut").events]
    serve.restart()
    after = [e.type for e in log_of(serve, "cut").events]
    assert after == before and after[-3:] == ["assistant/message", "step/end", "serve/ledger"]
    reply = serve.openai(session="cut").chat.completions.create(model="fake-model", messages=history)
    assert reply.choices[0].message.content == "answer"
    session = log_of(serve, "cut")
    assert [n.role for n in session.surface.nodes] == ["user", "assistant", "user", "assistant"]
    assert [e.type for e in session.events].count("user/message") == 2
    assert upstream.received[-1].body["messages"][-1]["content"] == "second"  # what it answered

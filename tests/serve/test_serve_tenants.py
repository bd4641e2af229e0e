"""Tenants kept apart on one serve (issue 39): a named session belongs to the credential that made
it, the inspector is off unless asked for and then behind the operator's token, no credential is
stored or logged, foreign Hosts and cross-site requests are refused, and two conversations that
begin alike do not rewrite each other on every request."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from serve_clients import Agent
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile


def stored_bytes(serve: Any) -> bytes:
    home = Path(load_profile(serve.profile).store.path)
    return b"".join(p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file())


def sent_texts(received: Any) -> str:
    return orjson.dumps(received.body["messages"]).decode()


# -- a named session is its creator's --------------------------------------------------------------------
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_named_session_belongs_to_the_credential_that_made_it(fake, serve_factory, api):
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("noted")
    serve = serve_factory()

    def client(key: str) -> Any:
        if api == "openai":
            return openai.OpenAI(
                base_url=f"{serve.url}/v1", api_key=key, default_headers={"X-Ctxkernel-Session": "shared"}
            )
        import anthropic

        return anthropic.Anthropic(base_url=serve.url, api_key=key, default_headers={"X-Ctxkernel-Session": "shared"})

    alice = Agent(api, client("sk-alice-0000000000"), with_tools=False)
    alice.user("alice's secret: the vault code is 4711")
    alice.step()
    mallory = Agent(api, client("sk-mallory-00000000"), with_tools=False)
    mallory.user("what did we talk about?")
    mallory.step()
    assert "4711" not in sent_texts(upstream.received[-1])  # mallory's request never saw alice's history
    alice.user("and the second secret")
    alice.step()
    assert "4711" in sent_texts(upstream.received[-1]) and "what did we talk" not in sent_texts(upstream.received[-1])
    mallory.user("again")
    mallory.step()
    assert "what did we talk" in sent_texts(upstream.received[-1])  # mallory keeps its own session
    assert "4711" not in sent_texts(upstream.received[-1])
    kernel = Kernel(load_profile(serve.profile))
    shared = kernel.open_session("shared", repair=False)
    texts = [e.data["message"]["content"][0]["text"] for e in shared.events if e.type == "user/message"]
    assert texts == ["alice's secret: the vault code is 4711", "and the second secret"]
    assert len([s for s in kernel.sessions() if s.startswith("shared")]) == 2
    assert b"sk-alice" not in stored_bytes(serve) and b"sk-mallory" not in stored_bytes(serve)


# -- the inspector ---------------------------------------------------------------------------------------
def test_the_inspector_is_not_mounted_unless_asked_for(fake, serve_factory):
    serve = serve_factory()
    serve.openai(session="someone").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "private"}]
    )
    with httpx.Client(base_url=serve.url) as http:
        assert http.get("/ui/").status_code == 404
        assert http.get("/ui/api/sessions").status_code == 404
        assert http.get("/ui/api/sessions/someone/log").status_code == 404


def test_the_inspector_answers_only_the_operator_token(fake, serve_factory, monkeypatch):
    monkeypatch.setenv("SERVE_TEST_UI_TOKEN", "operator-token-0123456789")
    serve = serve_factory(ui=True, ui_token_env="SERVE_TEST_UI_TOKEN")
    serve.openai(session="someone").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "private"}]
    )
    basic = base64.b64encode(b"anyone:operator-token-0123456789").decode()
    wrong = base64.b64encode(b"anyone:operator-token-012345678X").decode()
    with httpx.Client(base_url=serve.url) as http:
        refused = http.get("/ui/api/sessions")
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic ")
        assert "someone" not in refused.text
        for bad in (f"Basic {wrong}", "Bearer operator-token-012345678X", "Bearer sk-test-client"):
            assert http.get("/ui/api/sessions", headers={"authorization": bad}).status_code == 401
        for good in (f"Basic {basic}", "Bearer operator-token-0123456789"):
            listed = http.get("/ui/api/sessions", headers={"authorization": good})
            assert listed.status_code == 200 and "someone" in listed.text
        page = http.get("/ui/", headers={"authorization": f"Basic {basic}"})
        assert page.status_code == 200 and "<html" in page.text.lower()


# -- credentials ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_credential_a_provider_echoes_is_neither_stored_nor_logged(fake, serve_factory, caplog, api, stream):
    # not shaped like any known key, so only serve's knowledge of the exact value can find it
    key = "tenant-7-Zq0v9LmN3xR8pW2k"
    upstream, _ = fake
    serve = serve_factory()
    echo = f"Incorrect API key provided: {key}. You can find your API key at https://example.test."
    if api == "openai":
        upstream.fail_next = [(401, {"error": {"message": echo, "type": "invalid_request_error", "code": "bad_key"}})]
        url, body = "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        headers = {"authorization": f"Bearer {key}"}
    else:
        upstream.fail_next = [(401, {"type": "error", "error": {"type": "authentication_error", "message": echo}})]
        url, body = "/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        headers = {"x-api-key": key}
    caplog.set_level(logging.DEBUG, logger="ctxkernel")
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        answer = http.post(url, json={**body, "stream": stream}, headers={**headers, "X-Ctxkernel-Session": "echo"})
    assert answer.status_code == 401
    assert key not in answer.text  # scrubbed on the way back too
    assert key.encode() not in stored_bytes(serve)
    assert key not in caplog.text
    events = Kernel(load_profile(serve.profile)).open_session("echo", repair=False).events
    assert "Incorrect API key provided: ***" in events[-1].data["error"]


def test_the_server_key_a_provider_echoes_never_reaches_a_client(fake, serve_factory, monkeypatch):
    server_key = "operator-key-Hk29fLq0zzX"
    monkeypatch.setenv("SERVE_TEST_KEY", server_key)
    upstream, _ = fake
    serve = serve_factory(api_key_env="SERVE_TEST_KEY")
    upstream.fail_next = [(401, {"error": {"message": f"Incorrect API key provided: {server_key}", "type": "x"}})]
    answer = httpx.post(
        f"{serve.url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert answer.status_code == 401
    assert server_key not in answer.text and "***" in answer.text
    assert server_key.encode() not in stored_bytes(serve)


# -- Host and cross-site requests ----------------------------------------------------------------------
REFUSED = [
    ({"host": "evil.example"}, 403),
    ({"host": "evil.example:8787"}, 403),
    ({"origin": "http://evil.example"}, 403),
    ({"origin": "null"}, 403),
    ({"sec-fetch-site": "cross-site"}, 403),
    ({"sec-fetch-site": "same-site"}, 403),
    ({"content-type": "text/plain"}, 415),
    ({"content-type": "application/x-www-form-urlencoded"}, 415),
    ({"content-type": "multipart/form-data; boundary=x"}, 415),
]


@pytest.mark.parametrize(("headers", "status"), REFUSED)
def test_foreign_hosts_and_cross_site_requests_are_refused(fake, serve_factory, headers, status):
    upstream, _ = fake
    serve = serve_factory()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    with httpx.Client(base_url=serve.url) as http:
        answer = http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json", **headers}
        )
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["type"] in ("permission_error", "invalid_request_error")
        if "host" in headers:  # every route: a rebound name reads nothing, not even the metrics
            for path in ("/healthz", "/metrics", "/v1/models"):
                assert http.get(path, headers=headers).status_code == 403
    assert not upstream.received and not upstream.refused


def test_same_origin_requests_and_allowed_hosts_are_served(fake, serve_factory):
    serve = serve_factory(allowed_hosts=["proxy.internal"])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(base_url=serve.url) as http:
        for headers in (
            {"origin": serve.url, "sec-fetch-site": "same-origin"},
            {"host": "proxy.internal"},
            {"host": "localhost:1234"},
            {"content-type": "application/json; charset=utf-8"},
        ):
            assert http.post("/v1/chat/completions", json=body, headers=headers).status_code == 200, headers


# -- twins ------------------------------------------------------------------------------------------------
def test_identical_conversations_at_once_do_not_fork_endlessly(fake, serve_factory):
    # two CI jobs with one credential, one system prompt and one first message share a
    # fingerprint; their requests interleave. Each must be answered on its own history, and
    # the session must not be rewritten (dropped or forked) on every request
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply(f"reply {len(upstream.received)}")
    serve = serve_factory()
    jobs = {name: Agent("openai", serve.openai(), with_tools=False) for name in ("job-a", "job-b")}
    for job in jobs.values():
        job.user("run the nightly checks")
    for step in range(6):
        for name, job in jobs.items():
            job.step()
            sent = sent_texts(upstream.received[-1])
            other = "job-b" if name == "job-a" else "job-a"
            assert f"{other} step" not in sent  # never answered on the other job's history
            assert all(f"{name} step {i}" in sent for i in range(step))
            job.user(f"{name} step {step}")
    kernel = Kernel(load_profile(serve.profile))
    sessions = kernel.sessions()
    forks = [s for s in sessions if kernel.store.header(s).parent is not None]
    rewrites = sum(
        1
        for s in sessions
        for e in kernel.open_session(s, repair=False).events
        if e.type == "compaction/start" and e.data.get("kind") == "rewrite"
    )
    assert len(forks) <= 1, forks
    assert rewrites <= 1, rewrites

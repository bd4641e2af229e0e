"""Tenants kept apart on one serve (issue 39): a named session belongs to the credential that made
it, the inspector is off unless asked for and then behind the operator's token, no credential is
stored or logged, foreign Hosts and cross-site requests are refused, and two conversations that
begin alike do not rewrite each other on every request."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from serve_clients import Agent
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.errors import StoreError
from ctxkernel.profile import load_profile
from ctxkernel.serve.tenants import tenant_of, tenant_secret
from ctxkernel.testing import build_kernel


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


# -- one credential tag for every binding ---------------------------------------------------------------
def test_named_sessions_and_kept_responses_are_bound_to_one_credential_tag(fake, serve_factory):
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("noted")
    serve = serve_factory()
    alice = serve.openai(session="bound", api_key="sk-alice-0000000000")
    response = alice.responses.create(model="fake-model", input="remember 4711")
    store = Kernel(load_profile(serve.profile)).store
    session_owner = store.kv_get("serve", "tenant/bound")["tenant"]
    response_owner = store.kv_get("serve", f"response/{response.id}")["owner"]
    # one keyed hash of the credential, under the one key of the store
    assert session_owner == response_owner
    key = bytes.fromhex(store.kv_get("serve", "tenant-secret")["key"])
    assert session_owner == hmac.new(key, b"Bearer sk-alice-0000000000", hashlib.sha256).hexdigest()
    assert {k for k in store.kv_list("serve") if "secret" in k or "key" in k} == {"tenant-secret"}


def test_the_tenant_secret_env_keys_named_sessions_and_kept_responses_on_every_host(fake, serve_factory, monkeypatch):
    # two hosts serving one store with the same --tenant-secret-env: a tenant's named session and
    # kept responses follow it from one to the other; a host with another secret reads neither
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply(f"{len(body['messages'])} messages")
    monkeypatch.setenv("SERVE_TEST_TENANT_SECRET", "s" * 40)
    monkeypatch.setenv("SERVE_TEST_OTHER_SECRET", "o" * 40)
    first = serve_factory(tenant_secret_env="SERVE_TEST_TENANT_SECRET")
    alice = first.openai(session="moving", api_key="sk-alice-0000000000")
    response = alice.responses.create(model="fake-model", input="the vault code is 4711")
    first.stop()
    second = serve_factory(first.profile, tenant_secret_env="SERVE_TEST_TENANT_SECRET")
    again = second.openai(session="moving", api_key="sk-alice-0000000000").responses.create(
        model="fake-model", input="and now?", previous_response_id=response.id
    )
    assert again.output_text == "3 messages"
    assert "4711" in sent_texts(upstream.received[-1])
    second.stop()
    store = Kernel(load_profile(first.profile)).store
    assert store.kv_get("serve", "tenant-secret") is None  # the operator's key is kept nowhere
    tag = hmac.new(b"s" * 40, b"Bearer sk-alice-0000000000", hashlib.sha256).hexdigest()
    assert store.kv_get("serve", "tenant/moving")["tenant"] == tag
    other = serve_factory(first.profile, tenant_secret_env="SERVE_TEST_OTHER_SECRET")
    alice_elsewhere = other.openai(session="moving", api_key="sk-alice-0000000000")
    with pytest.raises(openai.BadRequestError) as refused:
        alice_elsewhere.responses.create(model="fake-model", input="and now?", previous_response_id=again.id)
    assert refused.value.body["code"] == "previous_response_not_found"
    alice_elsewhere.responses.create(model="fake-model", input="what is the code?")
    assert "4711" not in sent_texts(upstream.received[-1])


def test_a_short_tenant_secret_is_a_usage_error(tmp_path, monkeypatch, capsys):
    from ctxkernel.cli import main

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setenv("SHORT_SECRET", "too-short")
    assert main(["serve", "--profile", "basic", "--tenant-secret-env", "SHORT_SECRET"]) == 2
    err = capsys.readouterr().err
    assert "--tenant-secret-env SHORT_SECRET" in err and "at least 32 characters" in err


def test_every_process_of_a_store_makes_and_reads_the_same_tenant_secret(tmp_path):
    stores = [build_kernel(tmp_path, fsync=False).store for _ in range(6)]
    secrets: list[bytes] = []
    barrier = threading.Barrier(len(stores))

    def start(store: Any) -> None:
        barrier.wait()
        secrets.append(tenant_secret(store))

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(secrets) == 6 and len(set(secrets)) == 1 and len(secrets[0]) == 32
    assert tenant_secret(build_kernel(tmp_path, fsync=False).store) == secrets[0]
    tags = {tenant_of(secrets[0], c) for c in ("Bearer sk-one", "Bearer sk-two", "sk-one", "")}
    assert len(tags) == 4


@pytest.mark.parametrize("stored", [{"key": "zz" * 32}, {"key": "ab"}, {"hex": "ab" * 32}, ["ab" * 32]])
def test_a_damaged_tenant_secret_is_named_not_replaced(tmp_path, stored):
    store = build_kernel(tmp_path, fsync=False).store
    store.kv_put("serve", "tenant-secret", stored)
    with pytest.raises(StoreError, match="serve/tenant-secret.*damaged"):
        tenant_secret(store)
    assert store.kv_get("serve", "tenant-secret") == stored


# -- credentials scrubbed on the Responses routes and count_tokens ---------------------------------------
ECHOED_KEY = "tenant-9-Qm4v7LpN2xR8wW3k"
ECHO = f"Incorrect API key provided: {ECHOED_KEY}. You can find your API key at https://example.test."


def responses_post(serve: Any, stream: bool, session: str) -> httpx.Response:
    body = {"model": "fake-model", "input": "x", "stream": stream}
    headers = {"authorization": f"Bearer {ECHOED_KEY}", "X-Ctxkernel-Session": session}
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        return http.post("/v1/responses", json=body, headers=headers)


@pytest.mark.parametrize("upstream_kind", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_credential_echoed_to_a_responses_request_is_neither_stored_nor_logged(
    fake, serve_factory, caplog, upstream_kind, stream
):
    upstream, server = fake
    serve = serve_factory(**({"responses_upstream": f"{server.url}/v1"} if upstream_kind == "responses" else {}))
    upstream.fail_next = [(401, {"error": {"message": ECHO, "type": "invalid_request_error", "code": "bad_key"}})]
    caplog.set_level(logging.DEBUG, logger="ctxkernel")
    answer = responses_post(serve, stream, "echo-responses")
    assert answer.status_code == 401
    assert ECHOED_KEY not in answer.text and "***" in answer.text
    assert ECHOED_KEY.encode() not in stored_bytes(serve)
    assert ECHOED_KEY not in caplog.text
    events = Kernel(load_profile(serve.profile)).open_session("echo-responses", repair=False).events
    assert "Incorrect API key provided: ***" in events[-1].data["error"]


def stream_with_error(fake: Any, serve_factory: Any, api: str, message: str) -> tuple[Any, str]:
    """A streamed request of ``api`` with ECHOED_KEY as its credential, to a provider that reports
    an error with ``message`` inside its stream: serve, and the text the client got."""
    upstream, server = fake
    serve = serve_factory(**({"responses_upstream": f"{server.url}/v1"} if api == "responses" else {}))
    # a Responses stream's error event carries a code; the others an error object with a type
    error = (
        {"code": "server_error", "message": message}
        if api == "responses"
        else {"type": "overloaded_error", "message": message}
    )
    upstream.script = lambda api_name, body: Reply("partial", stream_error=error)
    headers = {"X-Ctxkernel-Session": f"mid-{api}"}
    if api == "anthropic":
        url = "/v1/messages"
        body: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        headers["x-api-key"] = ECHOED_KEY
    else:
        url = "/v1/chat/completions" if api == "openai" else "/v1/responses"
        body = {
            "model": "m",
            **({"messages": [{"role": "user", "content": "x"}]} if api == "openai" else {"input": "x"}),
        }
        headers["authorization"] = f"Bearer {ECHOED_KEY}"
    with (
        httpx.Client(base_url=serve.url, timeout=30) as http,
        http.stream("POST", url, json={**body, "stream": True}, headers=headers) as response,
    ):
        return serve, "".join(response.iter_text())


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses-chat", "responses"])
def test_a_credential_a_provider_echoes_mid_stream_never_reaches_the_client(fake, serve_factory, caplog, api):
    # an error the provider reports inside its stream keeps its type, not the key
    caplog.set_level(logging.DEBUG, logger="ctxkernel")
    serve, text = stream_with_error(fake, serve_factory, api, ECHO)
    assert "Incorrect API key provided: ***" in text
    assert ECHOED_KEY not in text
    assert ECHOED_KEY.encode() not in stored_bytes(serve)
    assert ECHOED_KEY not in caplog.text


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses-chat", "responses"])
def test_a_credential_where_a_stream_error_is_cut_leaves_no_part_of_it(fake, serve_factory, api):
    # the error's message is cut to 2,000 characters for the client and to 500 in the log: the
    # key is taken out before either cut, so neither leaves its first characters behind
    message = "x" * 450 + ECHOED_KEY + "y" * (1990 - 450 - len(ECHOED_KEY)) + ECHOED_KEY
    serve, text = stream_with_error(fake, serve_factory, api, message)
    assert "x***y" in text
    assert ECHOED_KEY[:10] not in text
    assert ECHOED_KEY[:10].encode() not in stored_bytes(serve)


@pytest.mark.parametrize("route", ["/v1/messages/count_tokens", "/v1/messages", "/v1/responses"])
def test_an_internal_error_keeps_the_credential_out_of_the_answer_and_the_log(
    fake, serve_factory, caplog, monkeypatch, route
):
    serve = serve_factory()

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the store refused {ECHOED_KEY}")

    monkeypatch.setattr(serve.proxy, "count_tokens" if route.endswith("count_tokens") else "open_turn", failing)
    caplog.set_level(logging.DEBUG, logger="ctxkernel")
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    if route == "/v1/messages":
        body["max_tokens"] = 5
    elif route == "/v1/responses":
        body = {"model": "m", "input": "x"}
    answer = httpx.post(f"{serve.url}{route}", json=body, headers={"x-api-key": ECHOED_KEY}, timeout=30)
    assert answer.status_code == 500 and answer.json()["error"]["type"] == "api_error"
    assert "the store refused ***" in answer.text and ECHOED_KEY not in answer.text
    assert "the store refused ***" in caplog.text and "Traceback" in caplog.text
    assert ECHOED_KEY not in caplog.text


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
def test_an_internal_error_mid_stream_is_an_error_event_without_the_credential(
    fake, serve_factory, caplog, monkeypatch, api
):
    # it escaped the stream: the client's stream was cut without an event and the server logged
    # a traceback of its own, where the same failure unstreamed is a 500 in the API's shape
    serve = serve_factory()

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the store refused {ECHOED_KEY}")

    monkeypatch.setattr(serve.proxy, "commit", failing)
    caplog.set_level(logging.DEBUG, logger="ctxkernel")
    url = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}[api]
    body: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    if api == "anthropic":
        body["max_tokens"] = 5
    elif api == "responses":
        body = {"model": "m", "stream": True, "input": "x"}
    headers = {"x-api-key" if api == "anthropic" else "authorization": ECHOED_KEY, "X-Ctxkernel-Session": "broken"}
    with (
        httpx.Client(base_url=serve.url, timeout=30) as http,
        http.stream("POST", url, json=body, headers=headers) as response,
    ):
        text = "".join(response.iter_text())
    assert "internal error: RuntimeError: the store refused ***" in text
    assert ECHOED_KEY not in text
    assert "the store refused ***" in caplog.text and "Traceback" in caplog.text
    assert ECHOED_KEY not in caplog.text
    assert 'ctxkernel_serve_errors_total{kind="internal"} 1.0' in httpx.get(f"{serve.url}/metrics").text


def test_count_tokens_reads_another_tenants_session_name_as_its_own(fake, serve_factory):
    upstream, _ = fake
    upstream.script = lambda api_name, body: Reply("noted")
    serve = serve_factory()

    def client(key: str) -> Any:
        import anthropic

        return anthropic.Anthropic(
            base_url=serve.url, api_key=key, max_retries=0, default_headers={"X-Ctxkernel-Session": "counted"}
        )

    secret = [{"role": "user", "content": "alice's long secret " + "word " * 400}]
    client("sk-alice-0000000000").messages.create(model="fake-model", max_tokens=8, messages=secret)
    question = [{"role": "user", "content": "hi"}]
    alice = client("sk-alice-0000000000").messages.count_tokens(model="fake-model", messages=question)
    mallory = client("sk-mallory-00000000").messages.count_tokens(model="fake-model", messages=question)
    assert alice.input_tokens > 400  # alice's session, with her history
    assert mallory.input_tokens < 50  # a session not started yet: mallory's own request only

"""The Responses API (``POST /v1/responses``) through the official ``openai`` SDK's
``responses.create``, streaming and not: against a Chat Completions upstream (translated) and a
Responses upstream (forwarded, reasoning items passed through as they came), ``store: false``
full-input sessions longer than the window, and ``previous_response_id`` answered by serve."""

from __future__ import annotations

import httpx
import orjson
import pytest
from serve_clients import big_result
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.profile import load_profile
from ctxkernel.serve.kept_responses import KeptResponses

from .conftest import write_profile

WINDOW, RESERVED = 8000, 1000
EFFECTIVE = WINDOW - RESERVED
HANDOFF = {
    "strategies": '["handoff", "basic"]',
    "extra_profile": 'capability_order = ["handoff", "basic"]',
    "window": 32000,
    "reserved": 2000,
}
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]


def run_turn(client, stream: bool, **kwargs):
    """One responses.create; returns the final Response object (streamed: from response.completed)."""
    if not stream:
        return client.responses.create(**kwargs)
    final = None
    kinds = []
    sequence = []
    with client.responses.stream(**kwargs) as events:
        for event in events:
            kinds.append(event.type)
            sequence.append(event.sequence_number)
        final = events.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert sequence == list(range(len(sequence)))
    return final


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("upstream_kind", ["chat", "responses"])
def test_store_false_session_longer_than_the_window(fake, serve_factory, stream, upstream_kind):
    upstream, server = fake
    config = {"responses_upstream": f"{server.url}/v1"} if upstream_kind == "responses" else {}
    serve = serve_factory(**config)
    steps = {"n": 0}

    def script(api, body):
        steps["n"] += 1
        if steps["n"] % 13 == 0:
            return Reply(f"finished part {steps['n']}")
        return Reply(f"reading {steps['n']}", [("read_file", {"path": f"src/m{steps['n']}.py"})])

    upstream.script = script
    client = serve.openai(session=f"resp-{upstream_kind}-{stream}")
    items = [{"role": "user", "content": "Refactor everything under src/."}]
    for step in range(30):
        response = run_turn(
            client, stream, model="fake-model", instructions="You are terse.", input=items, tools=TOOLS, store=False
        )
        output = [item.model_dump(exclude_none=True) for item in response.output]
        items += output
        calls = [o for o in output if o["type"] == "function_call"]
        if not calls:
            assert response.output_text.startswith("finished part")
            items.append({"role": "user", "content": "Carry on."})
            continue
        assert [c["name"] for c in calls] == ["read_file"]
        assert orjson.loads(calls[0]["arguments"])["path"].startswith("src/m")
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": big_result(step)} for c in calls]
        assert response.usage.input_tokens == upstream.received[-1].tokens
    expected_api = "openai" if upstream_kind == "chat" else "responses"
    assert {r.api for r in upstream.received} == {expected_api}
    assert len(upstream.received) == 30 and not upstream.refused
    # the client's history is several windows long; the provider never got more than one
    client_tokens = upstream.count("responses", {"input": items, "model": "m", "instructions": "You are terse."})
    assert client_tokens > 3 * WINDOW
    assert max(r.tokens for r in upstream.received) <= EFFECTIVE
    kernel = Kernel(load_profile(serve.profile))
    session = kernel.open_session(f"resp-{upstream_kind}-{stream}", repair=False)
    types = [e.type for e in session.events]
    assert types.count("compaction/summary") >= 1 and types.count("assistant/message") == 30


def test_plain_text_input_and_previous_response_id(fake, serve_factory):
    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply(f"answer {len(body['messages'])}")
    client = serve.openai()
    first = client.responses.create(model="fake-model", input="What is 2+2?", instructions="Be brief.")
    assert first.id.startswith("resp_") and first.status == "completed"
    assert first.output_text == "answer 2"  # the system prompt and the question
    assert upstream.received[-1].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    # the client sends only the new input: serve answers the rest from what it kept
    second = client.responses.create(
        model="fake-model", input="And 3+3?", previous_response_id=first.id, instructions="Be brief."
    )
    assert second.output_text == "answer 4"
    assert [m["content"] for m in upstream.received[-1].body["messages"]] == [
        "Be brief.",
        "What is 2+2?",
        "answer 2",
        "And 3+3?",
    ]
    # a restarted serve answers it from the store
    serve.restart()
    third = serve.openai().responses.create(model="fake-model", input="And 4+4?", previous_response_id=second.id)
    assert third.output_text == "answer 5"  # no instructions this time: no system message
    # one conversation, one session
    assert upstream.received[-1].headers.get("authorization") == "Bearer sk-test-client"
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        serve.openai().responses.create(model="fake-model", input="x", previous_response_id="resp_" + "0" * 32)
    assert refused.value.body["param"] == "previous_response_id"
    # store: false keeps nothing to continue from
    unstored = serve.openai().responses.create(model="fake-model", input="hi", store=False)
    with pytest.raises(openai.BadRequestError):
        serve.openai().responses.create(model="fake-model", input="x", previous_response_id=unstored.id)


def test_a_whole_input_with_store_is_kept_once_and_answered_exactly(fake, serve_factory, tmp_path, monkeypatch):
    """``responses.create`` in a loop with the whole input and ``store`` left at its default: each
    response is kept for ``previous_response_id``, and the store writes each item once (it wrote
    the whole input again with every response: 15 times the last body after 30 requests). The
    body is parsed from its new items, as with ``store: false``: what it repeats is proven by
    the memo against the body before, whose response names the conversation it continues."""
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, window=400_000, reserved=4_000))  # nothing compacted
    proven = []
    keep = KeptResponses.keep

    def spy(self, *args, **kwargs):
        done = keep(self, *args, **kwargs)
        proven.append(kwargs.get("after") is not None and done)
        return done

    monkeypatch.setattr(KeptResponses, "keep", spy)
    upstream.script = lambda api, body: Reply(f"read {len(body['messages'])}", [("read_file", {"path": "a.py"})])
    client = serve.openai(session="whole-input")
    items: list = [{"role": "user", "content": "Read the sources."}]
    responses = []
    for step in range(24):
        response = client.responses.create(model="fake-model", input=items, tools=TOOLS)
        responses.append(response)
        items += response.output  # the SDK's own models, as its docs loop does
        call = next(o for o in response.output if o.type == "function_call")
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": big_result(step)})
    assert proven[0] is False and all(proven[1:])  # the first body has nothing to continue
    sent = [i if isinstance(i, dict) else i.model_dump(exclude_unset=True) for i in items]
    kernel = Kernel(load_profile(serve.profile))
    written = sum(len(orjson.dumps(kernel.store.kv_get("serve", k))) for k in kernel.store.kv_list("serve"))
    assert written < 2 * len(orjson.dumps(sent))
    # a response of the middle is answered with the conversation up to it, also after a restart
    middle = responses[11]
    serve.restart()
    answer = {"type": "function_call_output", "call_id": middle.output[-1].call_id, "output": "stopped"}
    follow = serve.openai().responses.create(model="fake-model", input=[answer], previous_response_id=middle.id)
    assert follow.status == "completed"
    history = upstream.received[-1].body["messages"]
    assert history[0] == {"role": "user", "content": "Read the sources."}
    assert history[-1] == {"role": "tool", "tool_call_id": middle.output[-1].call_id, "content": "stopped"}
    assert [m["content"] for m in history if m["role"] == "tool"][:-1] == [big_result(n) for n in range(11)]


def test_identical_whole_inputs_of_two_tenants_keep_to_their_own(fake, serve_factory, tmp_path):
    """Two credentials, and two sessions of one, send byte-identical bodies (the memo proves one's
    prefix by another's body): each kept response refers only to its own session's, and reads
    back only to its tenant; a body after a ``store: false`` one (nothing kept to continue) is
    kept whole, and still exact."""
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, window=400_000, reserved=4_000))
    upstream.script = lambda api, body: Reply(f"read {len(body['messages'])}", [("read_file", {"path": "a.py"})])
    clients = {name: serve.openai(api_key=f"sk-{name}") for name in ("alice", "bob")}
    clients["alice-2"] = serve.openai(session="second", api_key="sk-alice")  # the same tenant's other session
    inputs: dict[str, list] = {name: [{"role": "user", "content": "Read the sources."}] for name in clients}
    kept: dict[str, list] = {name: [] for name in clients}
    for step in range(6):
        for name, client in clients.items():
            store = step != 2  # one request of each keeps nothing
            response = client.responses.create(model="fake-model", input=inputs[name], tools=TOOLS, store=store)
            kept[name].append((response.id, store))
            inputs[name] += [o.model_dump(exclude_none=True) for o in response.output]
            call = next(o for o in response.output if o.type == "function_call")
            inputs[name].append({"type": "function_call_output", "call_id": call.call_id, "output": big_result(step)})
    kernel = Kernel(load_profile(serve.profile))
    whose = {}
    for responses in kept.values():
        for response_id, stored in responses:
            record = kernel.store.kv_get("serve", f"response/{response_id}")
            assert (record is not None) == stored
            if record is not None:
                whose[response_id] = (record["owner"], record["key"])
                assert record["previous"] is None or whose[record["previous"]] == whose[response_id]
    assert len({whose[response_id] for responses in kept.values() for response_id, _ in responses[3:]}) == 3
    import openai

    alice_last = kept["alice"][-1][0]
    answer = {"type": "function_call_output", "call_id": "x", "output": "stopped"}
    with pytest.raises(openai.BadRequestError):
        clients["bob"].responses.create(model="fake-model", input=[answer], previous_response_id=alice_last)
    call_id = inputs["alice"][-1]["call_id"]
    answer["call_id"] = call_id
    follow = clients["alice"].responses.create(model="fake-model", input=[answer], previous_response_id=alice_last)
    assert follow.status == "completed"
    tool_results = [m["content"] for m in upstream.received[-1].body["messages"] if m["role"] == "tool"]
    assert tool_results == [big_result(n) for n in range(5)] + ["stopped"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_body_too_dense_to_keep_is_answered_and_not_kept(fake, serve_factory, tmp_path, stream):
    """A body parsed from its new items whose whole input has to be read to be kept (its proof
    names another tenant's response), and cannot be (too dense to read whole): the client still
    gets its answer, whole, and the response is not kept."""
    import openai

    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, window=400_000, reserved=4_000))
    upstream.script = lambda api, body: Reply("fine")
    first = [{"role": "user", "content": "[" * 60_000}]  # small enough to be read without the density check
    reply = run_turn(serve.openai(api_key="sk-alice"), stream, model="fake-model", input=first)  # bodies alike
    second = [
        *first,
        *(o.model_dump(exclude_none=True) for o in reply.output),
        {"role": "user", "content": "x" * 20_000},
    ]
    before = len(upstream.received)
    answer = run_turn(serve.openai(api_key="sk-bob"), stream, model="fake-model", input=second)
    assert answer.status == "completed" and answer.output_text == "fine"
    assert len(upstream.received) == before + 1
    with pytest.raises(openai.BadRequestError) as refused:
        serve.openai(api_key="sk-bob").responses.create(
            model="fake-model", input="go on", previous_response_id=answer.id
        )
    assert refused.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_reasoning_items_pass_through_a_responses_upstream(fake, serve_factory, stream):
    upstream, server = fake
    serve = serve_factory(responses_upstream=f"{server.url}/v1")
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "thinking it over"}],
        "encrypted_content": "gAAAAB-opaque-ciphertext==",
    }
    upstream.script = lambda api, body: Reply("done", [("read_file", {"path": "a.py"})], items=[reasoning])
    client = serve.openai(session=f"reasoning-{stream}")
    items = [{"role": "user", "content": "Look at a.py"}]
    response = run_turn(
        client,
        stream,
        model="fake-model",
        input=items,
        tools=TOOLS,
        store=False,
        include=["reasoning.encrypted_content"],
    )
    output = [item.model_dump(exclude_none=True) for item in response.output]
    assert [o["type"] for o in output] == ["reasoning", "message", "function_call"]
    assert output[0]["encrypted_content"] == reasoning["encrypted_content"]
    upstream.script = lambda api, body: Reply("all read")
    items += output + [{"type": "function_call_output", "call_id": output[2]["call_id"], "output": "print(1)"}]
    run_turn(
        client,
        stream,
        model="fake-model",
        input=items,
        tools=TOOLS,
        store=False,
        include=["reasoning.encrypted_content"],
    )
    sent = upstream.received[-1].body
    # the encrypted reasoning went back as it came, in its place, and the call and its output after it
    kinds = [i.get("type") for i in sent["input"]]
    assert kinds == ["message", "reasoning", "message", "function_call", "function_call_output"]
    assert sent["input"][1] == output[0]
    assert sent["include"] == ["reasoning.encrypted_content"] and sent["store"] is False
    assert "previous_response_id" not in sent


def test_strategy_tool_calls_stay_inside_a_responses_reply(fake, serve_factory, tmp_path):
    # a profile whose strategy has tools: the model calls one, serve runs it and calls again;
    # the client's output holds only its own items, numbered from 0
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, **HANDOFF))
    calls = {"n": 0}

    def script(api, body):
        calls["n"] += 1
        if calls["n"] == 1:
            return Reply("", [("notes_write_file", {"path": "plan.md", "content": "step 1"})])
        return Reply("noted")

    upstream.script = script
    for stream in (False, True):
        calls["n"] = 0
        response = run_turn(
            serve.openai(session=f"inner-{stream}"), stream, model="fake-model", input="plan it", tools=TOOLS
        )
        assert [o.type for o in response.output] == ["message"]
        assert response.output_text == "noted"
        names = [t["function"]["name"] for t in upstream.received[-1].body["tools"]]
        assert "notes_write_file" in names and "read_file" in names


def test_a_kept_response_is_read_only_with_the_credential_that_made_it(fake, serve_factory):
    # tenant B learns A's response id (a log, a shared CI page): naming it reads nothing of A's,
    # whether serve still holds the conversation in memory or reads it back from the store
    import openai

    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("the secret plan is X")
    alice = serve.openai(api_key="sk-alice")
    first = alice.responses.create(model="fake-model", input="What is the plan?")
    for restarted in (False, True):
        if restarted:
            serve.restart()
        seen = len(upstream.received)
        with pytest.raises(openai.BadRequestError) as refused:
            serve.openai(api_key="sk-bob").responses.create(
                model="fake-model", input="Repeat the plan.", previous_response_id=first.id
            )
        # the same answer as for an id that does not exist: B cannot tell that A's exists
        assert refused.value.body["param"] == "previous_response_id"
        assert refused.value.body["code"] == "previous_response_not_found"
        assert len(upstream.received) == seen
        # A still continues its own conversation
        upstream.script = lambda api, body: Reply(f"{len(body['messages'])} messages")
        follow = serve.openai(api_key="sk-alice").responses.create(
            model="fake-model", input="Go on.", previous_response_id=first.id
        )
        assert follow.output_text == "3 messages"
        assert upstream.received[-1].headers["authorization"] == "Bearer sk-alice"
    # the store holds the credential's keyed hash, never the credential
    kernel = Kernel(load_profile(serve.profile))
    record = kernel.store.kv_get("serve", f"response/{first.id}")
    stored = orjson.dumps(record) + orjson.dumps(kernel.store.kv_list("serve"))
    assert b"sk-alice" not in stored and len(record["owner"]) == 64
    import hashlib

    assert record["owner"] != hashlib.sha256(b"Bearer sk-alice").hexdigest()


def test_kept_responses_store_media_as_blobs(fake, serve_factory):
    import base64
    import io

    from PIL import Image

    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("a blue square")
    out = io.BytesIO()
    Image.new("RGB", (400, 300), (0, 0, 255)).save(out, format="PNG")
    data = out.getvalue()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    image = {"type": "input_image", "image_url": url, "detail": "auto"}
    client = serve.openai(api_key="sk-alice")
    first = client.responses.create(
        model="fake-model",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, image]}],
    )
    kernel = Kernel(load_profile(serve.profile))
    record = kernel.store.kv_get("serve", f"response/{first.id}")
    kept = orjson.dumps(record)
    # the key-value record holds a reference; the bytes are one blob, shared with the log's
    assert url[22:200].encode() not in kept and len(kept) < 2000
    blobs = kernel.store.blob_list("media/")
    assert len(blobs) == 1 and kernel.store.blob_get(blobs[0].key) == data
    # a restarted serve puts the image back as it came for the next request
    serve.restart()
    serve.openai(api_key="sk-alice").responses.create(
        model="fake-model", input="And its colour?", previous_response_id=first.id
    )
    sent = upstream.received[-1].body["messages"][0]["content"]
    assert sent[1] == {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def test_a_conversation_too_large_to_send_whole_is_not_kept(fake, serve_factory, monkeypatch):
    import openai

    from ctxkernel.serve import kept_responses

    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("ok")
    monkeypatch.setattr(kept_responses, "MAX_CONVERSATION_CHARS", 3000)
    client = serve.openai(api_key="sk-alice")
    first = client.responses.create(model="fake-model", input="short question")
    second = client.responses.create(model="fake-model", input="x " * 2000, previous_response_id=first.id)
    kernel = Kernel(load_profile(serve.profile))
    marker = kernel.store.kv_get("serve", f"response/{second.id}")
    assert marker["too_large"] is True and marker["items"] == [] and marker["size"] > 3000
    serve.restart()
    with pytest.raises(openai.BadRequestError) as refused:
        serve.openai(api_key="sk-alice").responses.create(
            model="fake-model", input="more", previous_response_id=second.id
        )
    assert "more than the 3000 bytes a request may carry" in refused.value.body["message"]


def test_a_tool_output_image_reaches_a_chat_upstream(fake, serve_factory):
    # a Chat tool message holds text only: the screenshot a tool answered with follows the run of
    # tool messages as a user message, instead of being left out
    import base64

    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("I see the screenshot")
    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n not really a png").decode()
    calls = [
        {"type": "function_call", "call_id": f"c{i}", "name": "read_file", "arguments": '{"path": "a"}'} for i in (1, 2)
    ]
    items = [
        {"role": "user", "content": "Take two screenshots."},
        *calls,
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "shot one"}, {"type": "input_image", "image_url": url}],
        },
        {"type": "function_call_output", "call_id": "c2", "output": "no screen"},
    ]
    serve.openai(session="tool-image").responses.create(model="fake-model", input=items, tools=TOOLS, store=False)
    sent = upstream.received[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert sent[2]["content"] == [{"type": "text", "text": "shot one"}]
    assert sent[4]["content"] == [{"type": "image_url", "image_url": {"url": url}}]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("upstream_kind", ["chat", "responses"])
def test_a_reused_tool_call_id_is_renamed_on_the_responses_route(fake, serve_factory, stream, upstream_kind):
    # a provider that reuses a call id (across turns, or twice in one reply): the client gets a
    # fresh id, the log holds it, and nothing is refused on the next request
    upstream, server = fake
    config = {"responses_upstream": f"{server.url}/v1"} if upstream_kind == "responses" else {}
    serve = serve_factory(**config)
    replies = iter(
        [
            Reply("first", [("read_file", {"path": "a.py"})], ids=["call_same"]),
            Reply("again", [("read_file", {"path": "b.py"})], ids=["call_same"]),
            Reply("twice in one", [("read_file", {"path": "c.py"}), ("read_file", {"path": "d.py"})], ids=["x", "x"]),
            Reply("done"),
        ]
    )
    upstream.script = lambda api, body: next(replies)
    sid = f"reuse-responses-{upstream_kind}-{stream}"
    client = serve.openai(session=sid)
    items: list = [{"role": "user", "content": "read the files"}]
    seen: list[str] = []
    for _ in range(3):
        response = run_turn(client, stream, model="fake-model", input=items, tools=TOOLS, store=False)
        output = [item.model_dump(exclude_none=True) for item in response.output]
        calls = [o for o in output if o["type"] == "function_call"]
        assert calls
        seen += [c["call_id"] for c in calls]
        items += output
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls]
    response = run_turn(client, stream, model="fake-model", input=items, tools=TOOLS, store=False)
    assert response.output_text == "done"
    assert seen[0] == "call_same" and len(set(seen)) == len(seen) == 4, seen
    events = Kernel(load_profile(serve.profile)).open_session(sid, repair=False).events
    logged = [
        b["id"]
        for e in events
        if e.type == "assistant/message"
        for b in e.data["message"]["content"]
        if b["type"] == "tool_call"
    ]
    answered = [e.data["message"]["content"][0]["call_id"] for e in events if e.type == "tool/result"]
    assert logged == answered == seen


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_unreadable_output_item_of_a_responses_upstream_is_an_upstream_error(fake, serve_factory, stream):
    # a streamed round whose items were no assistant message ended the stream without an event
    # (an EventError out of the translator), where the same reply unstreamed was a 502
    upstream, server = fake
    serve = serve_factory(responses_upstream=f"{server.url}/v1")
    broken = {"id": "ctc_1", "type": "custom_tool_call", "name": "edit"}  # no call_id, no input
    upstream.script = lambda api, body: Reply("", items=[broken])
    body = {"model": "fake-model", "input": "go", "stream": stream}
    headers = {"X-Ctxkernel-Session": f"unreadable-{stream}"}
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        answer = http.post("/v1/responses", json=body, headers=headers)
        assert answer.status_code == (200 if stream else 502), answer.text
        assert "custom_tool_call needs a string 'call_id'" in answer.text
        if stream:
            assert answer.text.rstrip().splitlines()[-2] == "event: error"
        upstream.script = lambda api, body: Reply("fine")
        again = http.post("/v1/responses", json={**body, "stream": False}, headers=headers)
    assert again.status_code == 200 and again.json()["output"][0]["content"][0]["text"] == "fine"


def test_a_tool_output_without_its_call_is_refused_naming_the_input(fake, serve_factory):
    # the session's pairing refusal named "messages", a field the Responses API does not have
    serve = serve_factory()
    body = {"model": "fake-model", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}
    with httpx.Client(base_url=serve.url, timeout=30) as http:
        answer = http.post("/v1/responses", json=body, headers={"X-Ctxkernel-Session": "orphan-output"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "input" and error["message"].startswith("input: ")
    assert "'nope' answers no earlier tool call" in error["message"]

"""The request parser's memo: whatever sequence of histories clients send (growing, rewritten,
sharing their first messages with another client's, in either API), parsing with the shared memo
gives exactly what parsing without any memo gives; and the memo stays within its bounds."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.serve import anthropic_wire, openai_wire
from ctxkernel.serve.wire import MessageMemo

TEXTS = st.sampled_from(["hello", "read the file", "done", "x" * 50, "héllo 🎉", ""])


def openai_history(texts: list[str]) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": "You are terse."}]
    for i, text in enumerate(texts):
        if i % 2:
            out.append({"role": "assistant", "content": text or "ok"})
        else:
            out.append({"role": "user", "content": text or "?"})
    if out[-1]["role"] != "user":
        out.append({"role": "user", "content": "go on"})
    return out


def anthropic_history(texts: list[str]) -> list[dict]:
    return [m for m in openai_history(texts) if m["role"] != "system"]


def body(api: str, messages: list[dict]) -> bytes:
    if api == "openai":
        return orjson.dumps({"model": "m", "messages": messages})
    return orjson.dumps({"model": "m", "max_tokens": 10, "system": "You are terse.", "messages": messages})


def parsed(api: str, raw: bytes, memo: MessageMemo | None) -> tuple:
    wire = openai_wire if api == "openai" else anthropic_wire
    request = wire.parse_request(raw, memo)
    return request.system, [m.to_dict() for m in request.messages], request.hashes


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["openai", "anthropic"]), st.lists(TEXTS, min_size=1, max_size=8)),
        min_size=1,
        max_size=8,
    ),
    st.integers(min_value=1, max_value=4),
)
def test_parsing_with_the_memo_is_parsing_without_it(sends, histories):
    memo = MessageMemo(limit=30, histories=histories)
    for api, texts in sends:
        make = openai_history if api == "openai" else anthropic_history
        # the same texts also grown by one exchange: the usual next request of that client
        for messages in (make(texts), make([*texts, "more", "again"])):
            raw = body(api, messages)
            assert parsed(api, raw, memo) == parsed(api, raw, None)
        assert len(memo._histories) <= histories
        assert memo.held_items <= memo.limit and len(memo._entries) <= memo.limit


def test_a_history_that_shares_its_start_but_differs_later_is_converted_afresh():
    memo = MessageMemo()
    first = openai_history(["same start", "a", "b"])
    second = openai_history(["same start", "a", "c"])  # same first items, other third one
    parsed("openai", body("openai", first), memo)
    system, messages, _ = parsed("openai", body("openai", second), memo)
    assert messages[-1]["content"][0]["text"] == "c"
    assert (system, messages) == parsed("openai", body("openai", second), None)[:2]


def test_the_same_json_in_the_other_api_is_not_taken_from_the_memo():
    memo = MessageMemo()
    item = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    openai_wire.parse_request(orjson.dumps({"model": "m", "messages": [item]}), memo)
    assert [k[:7] for k in memo._entries] == [b"openai\0"]
    anthropic_wire.parse_request(orjson.dumps({"model": "m", "max_tokens": 5, "messages": [item]}), memo)
    assert sorted(k.split(b"\0")[0] for k in memo._entries) == [b"anthropic", b"openai"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-20, 20) | st.sampled_from(["", "a", "ab", ",", "]", '"']),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["k", "l"]), inner, max_size=2),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON, min_size=1, max_size=5), st.lists(JSON, max_size=5), st.lists(JSON, max_size=6))
def test_a_remembered_history_is_reused_only_when_its_items_start_the_new_one(start, more, other):
    from ctxkernel.serve.wire import Digest, _continues

    # what the memo compares: the JSON of the last history (what it keeps of it: a digest of
    # its bytes up to the closing bracket) against the JSON of the new one
    remembered = Digest.of(orjson.dumps(start)[:-1])
    assert _continues(orjson.dumps(start + more), remembered)
    if _continues(orjson.dumps(other), remembered):
        assert other[: len(start)] == start


LEAN_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(LEAN_VALUES)
def test_the_lean_parse_reads_a_large_body_as_orjson_does(value):
    # the proving parse of a session's second body takes the standard library's lower peak:
    # it must read every body exactly as orjson does (a large one: the small ones go to orjson)
    from ctxkernel.serve.wire import SMALL_BODY_BYTES, parse_json

    # written by the standard library: orjson refuses to write an integer past 64 bits
    raw = json.dumps({"pad": "p" * SMALL_BODY_BYTES, "value": value}, ensure_ascii=False).encode()
    assert parse_json(raw, lean=True) == parse_json(raw) == orjson.loads(raw)


def test_the_memo_keeps_no_parsed_item_alive():
    # parsed items kept from one request to the next reached the collector's oldest generation
    # and set off full collections (bench_serve.py): the memo remembers their JSON instead
    import sys

    memo = MessageMemo()
    items = orjson.loads(orjson.dumps(openai_history(["a", "b", "c"])))
    before = [sys.getrefcount(item) for item in items]
    for texts in (["a", "b", "c"], ["a", "b", "c", "d", "e"]):
        openai_wire.parse_request(body("openai", openai_history(texts)), memo)
    memo.convert_history(b"openai", items, lambda i, item: ((), (), None))
    assert [sys.getrefcount(item) for item in items] == before


def _bytes_reachable(root: object) -> list[int]:
    """The sizes of every bytes-like object reachable from ``root``."""
    import gc

    seen, todo, sizes = set(), [root], []
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, memoryview)):
            sizes.append(len(obj))
        else:
            todo += gc.get_referents(obj)
    return sizes


def test_what_the_memo_remembers_of_a_body_is_not_the_body():
    # issue 40 item 3 (memos that do not keep whole bodies): a body, and a history compared as
    # JSON, are remembered as digests; only the body's other fields are kept as JSON
    memo = MessageMemo()
    history = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"{n} " + "lorem " * 2_000} for n in range(9)]
    for n in (7, 9):  # the second body continues the first: parsed from its appended bytes only
        raw = orjson.dumps({"model": "m", "temperature": 0, "messages": history[:n]})
        request = memo.parse(b"openai", raw)
        memo.convert_history(b"openai", request, lambda i, item: ((), (), None))
    assert request.previous is not None and request.items == history[7:9]
    memo.convert_history(b"anthropic", orjson.loads(orjson.dumps(history)), lambda i, item: ((), (), None))
    assert memo.held_chains == 1 and len(memo._histories) == 1
    assert max(_bytes_reachable(memo)) < len(raw) / 100, "the memo keeps a body's bytes"


# a surface as the session gives it: (seq, message) pairs; steps grow it, cut it, or replace
# a node's message object (a strategy's decoration) from one request to the next
SURFACE_STEPS = st.lists(
    st.tuples(st.sampled_from(["grow", "cut", "decorate", "same"]), st.integers(0, 6)), min_size=1, max_size=12
)


@settings(max_examples=150, deadline=None)
def _surfaces(steps, make):
    """The surface, as ``(seq, message)`` nodes, after each of ``steps``: ``grow`` appends ``n + 1``
    messages made by ``make(seq)``, ``cut`` drops ``n`` from the head or the tail, ``decorate``
    replaces one node's message (its seq kept)."""
    from ctxkernel.messages import Message

    nodes: list = []
    next_seq = 0
    for action, n in steps:
        if action == "grow":
            for _ in range(n + 1):
                nodes.append((next_seq, make(next_seq)))
                next_seq += 1
        elif action == "cut":
            nodes = nodes[n:] if n % 2 else nodes[: len(nodes) - n]
        elif action == "decorate" and nodes:
            seq, _ = nodes[n % len(nodes)]
            nodes[n % len(nodes)] = (seq, Message.user(f"decorated {seq}"))
        yield nodes


@given(SURFACE_STEPS)
def test_cached_wire_forms_are_the_forms_of_this_surface(steps):
    from ctxkernel.messages import Message
    from ctxkernel.serve.wire import wire_forms

    def convert(message: Message) -> dict:
        return {"text": message.to_dict()["content"][0]["text"], "id": id(message)}

    cache: dict = {}
    for nodes in _surfaces(steps, lambda seq: Message.user(f"m{seq}")):
        seqs, messages = [s for s, _ in nodes], [m for _, m in nodes]
        forms = wire_forms(seqs, messages, cache, convert)
        assert forms == [convert(m) for m in messages]
        assert len(cache) <= 2 * len(seqs) + 66


@settings(max_examples=100, deadline=None)
@given(SURFACE_STEPS, st.booleans(), st.sampled_from(["", "You are terse.", 'quote " and \\ and é']))
def test_the_upstream_body_bytes_are_the_body_whatever_the_cache_holds(steps, stream, system):
    # the messages are joined from each node's cached JSON: the bytes must read as the client's
    # body (unknown fields passed through) with exactly this surface, request after request
    from types import SimpleNamespace

    from ctxkernel.convert import to_openai_message
    from ctxkernel.messages import Message

    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    strategy_tools = [{"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}]
    client = openai_wire.parse_request(
        orjson.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": tools,
                "temperature": 0.5,
                "stream_options": {"include_usage": False},
                "user": "someone",
            }
        )
    )
    cache: dict = {}

    def message(seq: int) -> Message:
        role = Message.user if seq % 2 else Message.assistant
        return role(f"m{seq} \u2028 {system}")

    for nodes in _surfaces(steps, message):
        request = SimpleNamespace(
            seqs=[s for s, _ in nodes],
            messages=[m for _, m in nodes],
            system=system,
            cache_hints=False,
            session_id="",
            cache_key=None,
        )
        sent = orjson.loads(openai_wire.upstream_body(client, request, strategy_tools, stream=stream, cache=cache))
        expected_messages = [{"role": "system", "content": system}] if system else []
        expected_messages += [to_openai_message(m) for _, m in nodes]
        assert sent.pop("messages") == expected_messages
        assert sent == {
            "model": "m",
            "tools": tools + strategy_tools,
            "temperature": 0.5,
            "stream_options": {"include_usage": True} if stream else {"include_usage": False},
            "user": "someone",
            "stream": stream,
        }


@settings(max_examples=150, deadline=None)
@given(SURFACE_STEPS, st.lists(st.booleans(), min_size=12, max_size=12))
def test_the_kept_size_of_the_wire_forms_is_their_measure_summed_afresh(steps, measured):
    # the size kept from call to call (the last call's total plus the new nodes') is the sum of
    # the forms' measures computed afresh, whether or not the calls before it measured
    from ctxkernel.messages import Message
    from ctxkernel.serve.wire import wire_forms

    def convert(message: Message) -> bytes:
        return orjson.dumps(message.to_dict()) + b","

    cache: dict = {}
    for i, nodes in enumerate(_surfaces(steps, lambda seq: Message.user(f"m{seq}" * (seq % 5)))):
        seqs, messages = [s for s, _ in nodes], [m for _, m in nodes]
        forms = wire_forms(seqs, messages, cache, convert, measure=len if measured[i] else None)
        assert forms == [convert(m) for m in messages]
        assert forms.size == (sum(map(len, forms)) if measured[i] else 0)


@settings(max_examples=100, deadline=None)
@given(SURFACE_STEPS, st.booleans(), st.sampled_from(["", "You are terse."]))
def test_the_upstream_pieces_carry_the_length_of_their_concatenation(steps, stream, system):
    from types import SimpleNamespace

    from ctxkernel.messages import Message
    from ctxkernel.serve.upstream import Chunks

    client = openai_wire.parse_request(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    cache: dict = {}
    for nodes in _surfaces(steps, lambda seq: (Message.user if seq % 2 else Message.assistant)(f"m{seq} é")):
        request = SimpleNamespace(
            seqs=[s for s, _ in nodes],
            messages=[m for _, m in nodes],
            system=system,
            cache_hints=False,
            session_id="",
            cache_key=None,
        )
        chunks = openai_wire.upstream_chunks(client, request, [], stream=stream, cache=cache)
        assert chunks.nbytes == len(b"".join(chunks)) == Chunks(list(chunks)).nbytes


# -- parsing only what a body appends (MessageMemo.parse) ---------------------------------------------------
def _encode(body: dict, style: int) -> bytes:
    """A client's own JSON formatting: orjson, the standard library compact or with spaces (the
    messages' closing bracket is then not where orjson would put it), or ASCII-escaped."""
    import json

    if style == 0:
        return orjson.dumps(body)
    if style == 1:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    if style == 2:
        return json.dumps(body).encode()
    return json.dumps(body, separators=(",", ":")).encode()


def _full(api: str, raw: bytes, memo: MessageMemo | None) -> tuple:
    """Everything a parse gives, the body's other fields included (its ``messages`` hold only
    what was still to convert, so they are left out)."""
    wire = openai_wire if api == "openai" else anthropic_wire
    try:
        request = wire.parse_request(raw, memo)
    except Exception as exc:  # the same error with and without the memo
        return ("error", type(exc).__name__, str(exc))
    fields = {k: v for k, v in request.body.items() if k != "messages"}
    return (
        request.system,
        [m.to_dict() for m in request.messages],
        request.hashes,
        fields,
        request.extra,
        request.tools,
    )


EDITS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "grow",
                "grow",
                "grow",
                "mark",
                "mark",
                "grow_field",
                "grow_field",
                "field",
                "nested",
                "copy_last",
                "garbage",
                "style",
                "cut",
            ]
        ),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["openai", "anthropic"]), EDITS, st.integers(0, 3))
def test_parsing_only_the_appended_bytes_is_parsing_the_whole_body(api, edits, style):
    # any sequence of bodies a client (or an attacker) sends: growing, rewritten, its cache mark
    # moved to the new last message (Claude Code), other fields changed, items added to another
    # array than the messages, the last message copied after them, bytes that only look
    # appended, other formatting: parsed with the memo's remembered bodies, each gives exactly
    # what parsing it alone gives
    memo = MessageMemo()
    messages = anthropic_history(["hello", "done"])
    body: dict = {"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "t"}}]}
    if api == "anthropic":
        body = {"model": "m", "max_tokens": 10, "messages": messages, "tools": [{"name": "t", "input_schema": {}}]}
    n = 0
    for action, k in edits:
        raw = None
        if action == "grow":
            for _ in range(k + 1):
                n += 1
                role = "assistant" if body["messages"][-1]["role"] == "user" else "user"
                body["messages"].append({"role": role, "content": [{"type": "text", "text": f"m{n} ]}},"}]})
            if body["messages"][-1]["role"] != "user":
                body["messages"].append({"role": "user", "content": "go"})
        elif action == "mark":  # grow, and move the rolling cache mark onto the new last message
            for _ in range(k % 2 + 1):
                n += 1
                role = "assistant" if body["messages"][-1]["role"] == "user" else "user"
                body["messages"].append({"role": role, "content": [{"type": "text", "text": f"k{n}"}]})
            if body["messages"][-1]["role"] != "user":
                body["messages"].append({"role": "user", "content": [{"type": "text", "text": "go"}]})
            for message in body["messages"]:
                if isinstance(message["content"], list):
                    message["content"] = [
                        {k: v for k, v in b.items() if k != "cache_control"} for b in message["content"]
                    ]
            last = body["messages"][-1]
            last["content"] = [*_blocks(last)[:-1], {**_blocks(last)[-1], "cache_control": {"type": "ephemeral"}}]
        elif action == "field":
            body["temperature"] = k / 4
        elif action == "grow_field":  # a message appended while a field after the messages changes
            n += 1
            role = "assistant" if body["messages"][-1]["role"] == "user" else "user"
            body["messages"].append({"role": role, "content": [{"type": "text", "text": f"g{n}"}]})
            if body["messages"][-1]["role"] != "user":
                body["messages"].append({"role": "user", "content": "go"})
            body["metadata"] = {f"k{(n + i) % 3}": i for i in range(3)}  # a map written in another order
        elif action == "nested":
            body["messages"][-1]["content"] = [*_blocks(body["messages"][-1]), {"type": "text", "text": f"n{k}"}]
        elif action == "copy_last":
            body["metadata"] = {"last": [body["messages"][-1]]}
        elif action == "style":
            style = k
        elif action == "cut":
            body["messages"] = body["messages"][: max(1, len(body["messages"]) - 2 * k)]
            if body["messages"][-1]["role"] != "user":
                body["messages"].append({"role": "user", "content": "again"})
        else:  # bytes appended after the last message that are not messages
            raw = _encode(body, style)
            close = raw.rindex(b"]", 0, raw.index(b'"tools"'))
            raw = raw[:close] + [b",1]", b",{}],[", b',"x"', b"]"][k] + raw[close:]
        raw = raw if raw is not None else _encode(body, style)
        assert _full(api, raw, memo) == _full(api, raw, None)
        assert memo.held_chains <= memo.histories


def _blocks(message: dict) -> list:
    content = message["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


@pytest.mark.parametrize("compact", [True, False])
def test_a_growing_history_is_parsed_from_its_appended_bytes(compact):
    # a body written as orjson writes it (compact: Codex CLI, Claude Code) has its messages' end
    # proven when it is parsed whole, and the next body is parsed from its new items; a body
    # whose fields are written otherwise (here a blank after its opening brace) has it guessed,
    # the second body proves the guess (parsed whole once more), and from the third on only the
    # new items are parsed
    memo = MessageMemo()
    messages = openai_history(["a", "b", "c"])
    seen = []
    for step in range(4):
        messages = [*messages, {"role": "assistant", "content": f"r{step}"}, {"role": "user", "content": f"u{step}"}]
        raw = orjson.dumps({"model": "m", "messages": messages, "tools": []})
        raw = raw if compact else b"{ " + raw[1:]
        parsed = memo.parse(b"openai", raw)
        seen.append((parsed.previous is not None, parsed.proven, len(parsed.items)))
        memo.convert_history(b"openai", parsed, lambda i, item: ((), (), None))
    first = (False, compact, 6)
    assert seen == [first, (True, True, 2), (True, True, 2), (True, True, 2)]
    assert memo.parse(b"openai", raw).body is not memo.parse(b"openai", raw).body


def test_a_history_whose_cache_mark_moves_is_parsed_from_its_last_message_on():
    # Claude Code moves its rolling cache mark from the last message to the new last one, so
    # every body rewrites its previous last message: parsed from where that message started
    # (the rewritten message and the new ones), not whole, from the third body on. Before,
    # every such body was parsed and its history compared whole (4.1 ms against 0.5 a request
    # for a 617 KB history)
    memo = MessageMemo()
    roles = ["user", "assistant"]  # a history long enough that its last message is a small part
    messages = [{"role": roles[i % 2], "content": [{"type": "text", "text": f"earlier {i}"}]} for i in range(11)]

    def marked(history: list[dict]) -> list[dict]:
        last = history[-1]
        return [*history[:-1], {**last, "content": [{**last["content"][0], "cache_control": {"type": "ephemeral"}}]}]

    seen, converted = [], []
    for step in range(4):
        messages = [
            *messages,
            {"role": "assistant", "content": [{"type": "text", "text": f"r{step}"}]},
            {"role": "user", "content": [{"type": "text", "text": f"u{step}"}]},
        ]
        raw = orjson.dumps({"model": "m", "max_tokens": 9, "messages": marked(messages)})
        parsed = memo.parse(b"anthropic", raw)
        seen.append((parsed.previous is not None, parsed.proven, len(parsed.items)))
        out = memo.convert_history(b"anthropic", parsed, lambda i, item: ((item,), (str(i),), None))
        converted.append((out.count, out.messages, out.hashes))
    assert seen == [(False, True, 13), (True, True, 3), (True, True, 3), (True, True, 3)]
    for count, items, hashes in converted:  # each history is its own items, the last one marked
        assert count == len(items) == len(hashes) and hashes == [str(i) for i in range(count)]
        assert [m["content"][0]["text"] for m in items] == [m["content"][0]["text"] for m in messages[:count]]
        assert "cache_control" in items[-1]["content"][0] and not any(
            "cache_control" in m["content"][0] for m in items[:-1]
        )


@given(st.lists(JSON, min_size=1, max_size=4), st.sampled_from(["orjson", "spaced", "short"]))
def test_the_last_items_start_is_known_only_when_every_item_is_where_orjson_puts_it(items, style):
    from ctxkernel.serve.wire import _last_start

    encoded = [orjson.dumps(item) for item in items]
    joined = b",".join(encoded) if style != "spaced" else b", ".join(encoded)
    if style == "short":  # the items' bytes end before the slice does
        joined += b",1"
    raw = b'{"messages":[' + joined + b"]}"
    cut, stop = len(b'{"messages":['), len(raw) - 2
    start = _last_start(memoryview(raw), cut, stop, items)
    if style == "orjson":
        assert start == stop - len(encoded[-1])
    elif len(items) > 1 or style == "short":
        assert start == -1


def test_an_item_added_to_an_array_after_the_messages_is_not_taken_for_a_message():
    # the last message's JSON also ends another array after the messages, where the memo's
    # guess of the messages' end then falls: a body adding to that array has the appended
    # shape against the guess, and is still read as what it is
    memo = MessageMemo()
    last = {"role": "user", "content": "same"}
    first = {"model": "m", "messages": [{"role": "user", "content": "hi"}, last], "metadata": [last]}
    second = {**first, "metadata": [last, {"role": "user", "content": "not a message"}]}
    third = {**first, "metadata": [*second["metadata"], {"role": "user", "content": "nor this"}]}
    for body in (first, second, third):
        raw = orjson.dumps(body)
        assert _full("openai", raw, memo) == _full("openai", raw, None)
        assert len(openai_wire.parse_request(raw, memo).messages) == 2


# -- the Responses API's input (responses_wire.load_body) ---------------------------------------------------
def _responses_full(raw: bytes, memo: MessageMemo | None) -> tuple:
    """Everything a Responses parse gives, with the memo's remembered bodies or without any."""
    from ctxkernel.serve import responses_wire

    try:
        request = responses_wire.parse_request(responses_wire.load_body(raw, memo) if memo is not None else raw, memo)
    except Exception as exc:  # the same error with and without the memo
        return ("error", type(exc).__name__, str(exc))
    fields = {k: v for k, v in request.body.items() if k != "input"}
    return (request.system, [m.to_dict() for m in request.messages], request.hashes, fields, request.tools)


RESPONSES_EDITS = st.lists(
    st.tuples(
        st.sampled_from(
            ["turn", "turn", "turn", "call", "meta", "meta", "long", "store", "field", "cut", "garbage", "twice"]
        ),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=150, deadline=None)
@given(RESPONSES_EDITS, st.integers(0, 3))
def test_a_responses_input_parsed_from_its_appended_bytes_is_the_whole_input(edits, style):
    # Codex sends its whole input every time (store: false), items appended: parsed with the
    # memo's remembered bodies (its new items only), each body gives what parsing it alone gives
    memo = MessageMemo()
    items: list[dict] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "start ]},"}]},
    ]
    body: dict = {"model": "m", "instructions": "You are Codex.", "input": items, "store": False, "tools": []}
    for n, (action, k) in enumerate(edits):
        raw = None
        if action == "turn":  # the model's reply, then the next instruction
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"r{n}"}]}
            )
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"u{n}"}]})
        elif action == "call":  # reasoning and a call, then its output
            items.append({"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"enc{n}"})
            items.append({"type": "function_call", "call_id": f"c{n}", "name": "shell", "arguments": '{"cmd": "ls"}'})
            items.append({"type": "function_call_output", "call_id": f"c{n}", "output": f"file{n} ]"})
        elif action == "meta":  # a turn while the metadata after the input is written in another order (Codex)
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"m{n}"}]}
            )
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"v{n}"}]})
            keys = ["session_id", "turn_id", "window_id"]
            body["client_metadata"] = {keys[(n + i) % 3]: f"{keys[(n + i) % 3]}-1" for i in range(3)}
        elif action == "long":  # a turn while what follows the input changes its length
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"w{n}"}]})
            body["client_metadata"] = {"turn_id": "t" * (k + n)}
        elif action == "store":
            body["store"] = bool(k % 2)
        elif action == "field":
            body["temperature"] = k / 4
        elif action == "cut":
            del items[max(2, len(items) - 2 * k) :]
            if items[-1]["role" if "role" in items[-1] else "type"] == "assistant":
                items.append({"type": "message", "role": "user", "content": "again"})
        elif action == "twice":  # a turn, and the input field again after it: JSON reads the last one
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"z{n}"}]})
            raw = _encode(body, style)
            other = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "other"}]}]
            raw = raw[: raw.rindex(b"}")] + b',"input":' + orjson.dumps(other[: k + 1] * (k + 1)) + b"}"
        else:  # bytes appended after the last item that are not input items
            raw = _encode(body, style)
            close = raw.rindex(b"]", 0, raw.index(b'"store"'))
            raw = raw[:close] + [b",1]", b",{}],[", b',"x"', b"]"][k] + raw[close:]
        raw = raw if raw is not None else _encode(body, style)
        assert _responses_full(raw, memo) == _responses_full(raw, None)


def _item(text: str) -> bytes:
    return orjson.dumps({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})


A, B, C, N, Z = (_item(t) for t in "abcnz")


def _history_twice(items: list[bytes], after: bytes) -> bytes:
    return b'{"input":[' + Z + b'],"instructions":"be brief","input":[' + b",".join(items) + b"]," + after + b"}"


DEEP = b'{"type":"message","role":"user","content":"x","z":' + b"[" * 1022 + b"]" * 1022 + b"}"
HOSTILE = {
    # the history field twice, no place found for the new items' end
    "twice": [
        b'{"model":"m","input":[' + A + b'],"store":false}',
        b'{"model":"m","input":[' + A + b"," + N + b'],"input":[' + Z + b"," + N + b'],"x":1}',
    ],
    # a field before the history written again after it (the remembered body's parse holds the later value)
    "field twice": [
        b'{"model":"a","input":[' + A + b'],"model":"b","store":false}',
        b'{"model":"a","input":[' + A + b"," + B + b'],"model":"b","store":false}',
        b'{"model":"a","input":[' + A + b"," + B + b"," + C + b'],"store":true,"x":12}',
        b'{"model":"a","input":[' + A + b"," + B + b"," + C + b"," + N + b'],"model":"b","store":true }',
    ],
    # the remembered body holds the history field twice, a field between the two
    "history twice": [
        _history_twice([A], b'"store":false,"model":"m"'),
        _history_twice([A, B], b'"store":false,"model":"m"'),
        _history_twice([A, B, C], b'"store":false,"model":"n"'),  # what follows as long as before
        _history_twice([A, B, C, N], b'"store":true,"model":"n"'),
    ],
    # a trailing comma where the fields after the history were, as long as they were
    "trailing comma": [
        b'{"model":"m","input":[' + A + b'],"store":false}',
        b'{"model":"m","input":[' + A + b"," + B + b'],"store":false}',
        b'{"model":"m","input":[' + A + b"," + B + b"," + C + b"]," + b" " * 13 + b"}",
    ],
    # a new item nested as deep as a body may be, counted from the body
    "deep": [
        b'{"model":"m","input":[' + A + b'],"store":false}',
        b'{"model":"m","input":[' + A + b"," + DEEP + b'],"store":false}',
    ],
    "deep, what follows changed": [
        b'{"model":"m","input":[' + A + b'],"store":false}',
        b'{"model":"m","input":[' + A + b"," + DEEP + b'],"store":true,"x":12}',
    ],
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_responses_body_is_read_as_its_whole_parse_reads_it(case):
    # duplicated fields, invalid JSON, deep nesting: the memo's pieces give what JSON gives
    memo = MessageMemo()
    for raw in HOSTILE[case]:
        assert _responses_full(raw, memo) == _responses_full(raw, None)
        # each body starts with the one before: its record replaces that one's, whether it was
        # parsed from its new items or whole
        assert memo.held_chains == 1


def _call_and_output(step: int, output: str) -> list[dict]:
    return [
        {"type": "function_call", "call_id": f"c{step}", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"c{step}", "output": output},
    ]


def test_a_responses_input_whose_metadata_changes_length_is_parsed_from_its_new_items(monkeypatch):
    # Codex's metadata after the input: a value one digit longer made the body be parsed whole
    from ctxkernel.serve import responses_wire, wire

    whole = []
    load = wire.load_json_object
    monkeypatch.setattr(wire, "load_json_object", lambda raw, **kw: whole.append(len(raw)) or load(raw, **kw))
    memo = MessageMemo()
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]
    seen = []
    for step in range(5):
        items += _call_and_output(step, f"out ] {step}")
        meta = {"turn_id": "9" * (step + 1), "session_id": "s"}
        raw = orjson.dumps(
            {"model": "m", "input": items, "tools": [{"type": "function", "name": "shell"}], "client_metadata": meta}
        )
        parsed = responses_wire.load_body(raw, memo)
        seen.append(parsed.previous is not None)
        request = responses_wire.parse_request(parsed, memo)
        assert [m.to_dict() for m in request.messages] == [
            m.to_dict() for m in responses_wire.parse_request(raw).messages
        ]
    assert seen == [False, True, True, True, True]
    assert len(whole) == 1  # the first body only


def test_a_growing_responses_input_is_parsed_from_its_appended_bytes_from_the_third_request_on():
    # before, every body was parsed whole and every item looked up: 5 ms a request for a 787 KB
    # input, against 0.5 ms for a Chat Completions history that appends
    from ctxkernel.serve import responses_wire

    memo = MessageMemo()
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]
    seen = []
    for step in range(4):
        items += _call_and_output(step, f"out {step}")
        raw = orjson.dumps({"model": "m", "input": items, "store": False})
        parsed = responses_wire.load_body(raw, memo)
        seen.append((parsed.previous is not None, len(parsed.items)))
        request = responses_wire.parse_request(parsed, memo)
        assert len(request.messages) == 1 + 2 * (step + 1)
    assert seen == [(False, 3), (True, 2), (True, 2), (True, 2)]

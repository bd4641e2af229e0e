"""Kept responses: media taken out of an item and put back byte for byte, and every kept response
answering exactly the conversation of its request, however the requests repeat each other."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.serve.kept_responses import MAX_LINKS, MIN_BASE64, KeptResponses, attach_media, detach_media
from ctxkernel.serve.wire import WireError
from ctxkernel.store.jsonl import JsonlStore


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


media_bytes = st.binary(min_size=1, max_size=2048)
# what a parsed body holds (orjson reads a number past 64 bits as a float)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20))
media_string = st.one_of(
    media_bytes.map(data_url),
    st.binary(min_size=MIN_BASE64, max_size=4096).map(lambda b: base64.b64encode(b).decode()),
)
keys = st.sampled_from(["type", "content", "image_url", "data", "result", "text", "output", "file_data"])
json_values = st.recursive(
    st.one_of(json_leaf, media_string),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(keys, json_values, min_size=1, max_size=5))
def test_media_out_and_back_is_the_same_item(item):
    wrapped, blobs, chars = detach_media(item)
    # what goes to the key-value table holds no medium, and gives the item back with the blobs
    assert detach_media(wrapped["item"])[1] == {}
    assert attach_media(orjson.loads(orjson.dumps(wrapped)), blobs.get) == item
    assert chars >= sum(len(base64.b64encode(d)) for d in blobs.values())


def test_only_strings_that_come_back_the_same_are_taken_out():
    canonical = base64.b64encode(b"\x00" * MIN_BASE64).decode()
    item = {
        "type": "message",
        "content": [
            {"type": "input_image", "image_url": data_url(b"png bytes")},
            # base64 that does not re-encode to itself (whitespace inside): kept in place
            {"type": "input_image", "image_url": "data:image/png;base64,cG5n\nIGJ5dGVz"},
            {"type": "input_audio", "input_audio": {"data": canonical, "format": "wav"}},
            {"type": "input_text", "text": canonical},  # text is text, however it looks
            {"type": "input_audio", "input_audio": {"data": "c2hvcnQ=", "format": "wav"}},  # short: kept
        ],
    }
    wrapped, blobs, _ = detach_media(item)
    parts = wrapped["item"]["content"]
    assert parts[0]["image_url"] == "" and parts[2]["input_audio"]["data"] == ""
    assert parts[1] == item["content"][1] and parts[3] == item["content"][3] and parts[4] == item["content"][4]
    assert sorted(blobs.values()) == sorted([b"png bytes", b"\x00" * MIN_BASE64])
    assert attach_media(wrapped, blobs.get) == item


# -- a conversation kept is the conversation asked for -----------------------------------------------------
def fresh(store: JsonlStore) -> KeptResponses:
    """Kept responses read back from the store alone (what a restarted serve has)."""
    return KeptResponses(store, lambda key: store.blob_get(key))


def item(n: int) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"item {n}"}]}


# each request: (how many items of the last conversation the client repeats, 0 for none; or -1 to
# name the last response as previous_response_id; how many new items it adds; reply items)
requests = st.lists(st.tuples(st.integers(-1, 12), st.integers(0, 3), st.integers(1, 2)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(0, 3))
def test_a_kept_response_answers_exactly_its_requests_conversation(tmp_path_factory, steps, image_at):
    store = JsonlStore(tmp_path_factory.mktemp("kept"), fsync=False)
    kept = fresh(store)
    counter = iter(range(10_000))
    conversations: dict[str, list[Any]] = {}
    last: str | None = None
    for n, (repeat, new, replies) in enumerate(steps):
        fresh_items = [item(next(counter)) for _ in range(new)]
        if n == image_at and fresh_items:  # a medium goes to the blob table and comes back
            fresh_items[0]["content"].append({"type": "input_image", "image_url": data_url(bytes([n]) * 40)})
        output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"r{n}"}]}]
        output *= replies
        response_id = f"resp_{n:032d}"
        if repeat == -1 and last is not None:
            before = kept.conversation(last, "tenant-a")
            kept.keep(response_id, "tenant-a", "s", before, last, [*fresh_items, *output])
            conversations[response_id] = [*conversations[last], *fresh_items, *output]
        else:
            repeated = conversations[last][: max(repeat, 0)] if last is not None else []
            # a client that re-sends an item of the reply in another form (fields it left out)
            if repeated and repeat % 3 == 2:
                repeated[-1] = {**repeated[-1], "id": None}
                whole = [*repeated, *fresh_items]
                assert kept.keep(response_id, "tenant-a", "s", None, None, [*whole, *output])
            elif repeated and repeat % 3 == 1:
                # the caller proved the input begins with that conversation's first items
                whole = [*repeated, *fresh_items]
                after = (last, len(repeated))
                assert not kept.keep(response_id, "tenant-b", "s", None, None, [*fresh_items, *output], after=after)
                assert kept.keep(response_id, "tenant-a", "s", None, None, [*fresh_items, *output], after=after)
            else:
                whole = [*repeated, *fresh_items]
                assert kept.keep(response_id, "tenant-a", "s", None, None, [*whole, *output])
            conversations[response_id] = [*whole, *output]
        last = response_id
    # every response answers its own conversation, from memory and from the store alone
    for response_id, expected in conversations.items():
        for reader in (kept, fresh(store)):
            conversation = reader.conversation(response_id, "tenant-a")
            assert reader.items(conversation, response_id) == expected
    # and only to its tenant
    with pytest.raises(WireError):
        fresh(store).conversation(last, "tenant-b")


def test_a_whole_input_sent_again_is_written_once(tmp_path):
    """A client that sends its whole input with every request (``store`` true): the records hold
    each item once, not once per request."""
    store = JsonlStore(tmp_path, fsync=False)
    kept = fresh(store)
    items: list[Any] = []
    for n in range(40):
        items = [*items, item(n)]
        if n == 0:  # a medium in what every later request repeats
            items[0]["content"].append({"type": "input_image", "image_url": data_url(b"png" * 400)})
        output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"r{n}"}]}]
        kept.keep(f"resp_{n:032d}", "tenant-a", "s", None, None, [*items, *output])
        items += output
    written = sum(len(orjson.dumps(store.kv_get("serve", key))) for key in store.kv_list("serve"))
    assert written < 2 * len(orjson.dumps(items))
    reader = fresh(store)
    conversation = reader.conversation(f"resp_{39:032d}", "tenant-a")
    assert reader.items(conversation, f"resp_{39:032d}") == items


def test_a_damaged_reference_is_no_conversation(tmp_path):
    store = JsonlStore(tmp_path, fsync=False)
    kept = fresh(store)
    kept.keep(f"resp_{1:032d}", "tenant-a", "s", None, None, [item(1), item(2)])
    kept.keep(f"resp_{2:032d}", "tenant-a", "s", None, None, [item(1), item(2), item(3)])
    record = store.kv_get("serve", f"response/resp_{2:032d}")
    assert record["previous"] == f"resp_{1:032d}" and record["keep"] == 2 and len(record["items"]) == 1
    for keep in (3, -1, "2", True):  # past what it continues, negative, not a count
        store.kv_put("serve", f"response/resp_{2:032d}", {**record, "keep": keep})
        with pytest.raises(WireError) as refused:
            fresh(store).conversation(f"resp_{2:032d}", "tenant-a")
        assert refused.value.status == 400


class CountingStore(JsonlStore):
    reads = 0

    def kv_get(self, namespace, key):
        CountingStore.reads += 1
        return super().kv_get(namespace, key)


def test_a_read_walks_at_most_max_depth_records(tmp_path):
    """A prompt sent again and again (sampling, retries) refers to the last response each time;
    every MAX_LINKS records one holds its whole conversation, so no read walks further."""
    store = CountingStore(tmp_path, fsync=False)
    kept = fresh(store)
    prompt = [item(0), item(1)]
    for n in range(3 * MAX_LINKS + 5):
        output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"r{n}"}]}]
        assert kept.keep(f"resp_{n:032d}", "tenant-a", "s", None, None, [*prompt, *output])
    depths = [store.kv_get("serve", f"response/resp_{n:032d}").get("depth", 0) for n in range(3 * MAX_LINKS + 5)]
    assert max(depths) == MAX_LINKS - 1 and depths.count(0) == 4
    for n in (MAX_LINKS - 1, 2 * MAX_LINKS + 3, 3 * MAX_LINKS + 4):
        CountingStore.reads = 0
        reader = fresh(store)
        conversation = reader.conversation(f"resp_{n:032d}", "tenant-a")
        assert CountingStore.reads <= MAX_LINKS
        last = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"r{n}"}]}
        assert reader.items(conversation, f"resp_{n:032d}") == [*prompt, last]


def test_items_are_the_same_only_as_json(tmp_path):
    """Python holds 1, 1.0 and true equal; a client that sends true where the kept item said 1
    sent another item, and its conversation has what it sent."""
    store = JsonlStore(tmp_path, fsync=False)
    kept = fresh(store)
    first = [{"type": "message", "role": "user", "content": "a", "x": 1}]
    kept.keep(f"resp_{1:032d}", "tenant-a", "s", None, None, first)
    again = [{"type": "message", "role": "user", "content": "a", "x": True}, item(2)]
    kept.keep(f"resp_{2:032d}", "tenant-a", "s", None, None, again)
    reader = fresh(store)
    got = reader.items(reader.conversation(f"resp_{2:032d}", "tenant-a"), f"resp_{2:032d}")
    assert orjson.dumps(got) == orjson.dumps(again)  # as JSON: == would hold them equal either way

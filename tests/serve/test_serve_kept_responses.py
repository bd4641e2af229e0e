"""The parts behind kept responses: media taken out of an item and put back byte for byte."""

from __future__ import annotations

import base64

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel.serve.kept_responses import MIN_BASE64, attach_media, detach_media


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

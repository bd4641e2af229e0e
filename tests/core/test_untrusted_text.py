"""Untrusted text reaches the log whatever it holds (issue #13, item 9): lone surrogates (a
non-UTF-8 file name from ``os.listdir``, a ``"\\ud800"`` escape from a server) become U+FFFD at
the kernel boundary instead of killing the turn."""

from __future__ import annotations

import os
import sys

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxkernel import EventError, Message, ScriptedModel, Span, Summary, ToolCallBlock, ToolOutcome
from ctxkernel.loop import AgentLoop
from ctxkernel.text import REPLACEMENT, storable, storable_text

texts = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, categories=None), max_size=30)


def _reference(text: str) -> str:
    """Character by character: a high surrogate followed by a low one is their character, any
    other surrogate is U+FFFD, everything else is kept."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if "\ud800" <= c <= "\udbff" and i + 1 < len(text) and "\udc00" <= text[i + 1] <= "\udfff":
            out.append(chr(0x10000 + ((ord(c) - 0xD800) << 10) + (ord(text[i + 1]) - 0xDC00)))
            i += 2
            continue
        out.append(REPLACEMENT if "\ud800" <= c <= "\udfff" else c)
        i += 1
    return "".join(out)


@given(
    st.lists(
        st.one_of(texts, st.sampled_from(["\ud800", "\udcff", "\udfff", "\ud83d\ude00", "\ude00\ud83d"])), max_size=6
    )
)
def test_storable_text_always_encodes_and_changes_only_surrogates(parts):
    text = "".join(parts)
    out = storable_text(text)
    out.encode("utf-8")  # never raises
    assert out == _reference(text)
    if not any("\ud800" <= c <= "\udfff" for c in text):
        assert out is text


def test_storable_text_joins_pairs_and_replaces_lone_surrogates():
    assert storable_text("a\ud83d\ude00b") == "a\U0001f600b"
    assert storable_text("x\udcffy") == f"x{REPLACEMENT}y"
    assert storable_text("\ude00\ud83d") == REPLACEMENT * 2  # a pair in the wrong order is two lone halves
    clean = {"a": ["b", ("c", 1)], "d": None}
    assert storable(clean) is clean
    assert storable({"k\udcff": ["\ud800", 1]}) == {f"k{REPLACEMENT}": [REPLACEMENT, 1]}


@pytest.fixture
def non_utf8_listing(tmp_path) -> list[str]:
    """A real directory listing with a file name that is not UTF-8 (Linux keeps bytes)."""
    if sys.platform != "linux":
        pytest.skip("needs a file system that stores raw bytes in names")
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "ok.txt").write_text("x")
    with open(os.fsencode(folder) + b"/caf\xe9.txt", "wb") as f:
        f.write(b"x")
    names = sorted(os.listdir(folder))
    assert any("\udce9" in n for n in names)  # surrogateescape, as os.listdir returns it
    return names


def test_a_tool_output_with_a_non_utf8_file_name_does_not_kill_the_turn(make_kernel, non_utf8_listing):
    session = make_kernel().open_session()
    model = ScriptedModel([Message.assistant("", tool_calls=[ToolCallBlock("c1", "ls", {"path": "."})]), "listed"])
    result = AgentLoop(session, model, lambda call: "\n".join(non_utf8_listing)).run("list the files")
    assert result.reason == "completed"
    stored = next(e for e in session.events if e.type == "tool/result").data["message"]["content"][0]["content"]
    assert f"caf{REPLACEMENT}.txt" in stored and "ok.txt" in stored
    # the live surface and a replay from disk agree
    again = session.kernel.open_session(session.id)
    assert [n.message.to_dict() for n in again.surface.nodes] == [n.message.to_dict() for n in session.surface.nodes]


def test_every_entry_point_stores_surrogates_as_replacement_characters(make_kernel):
    session = make_kernel().open_session()
    session.user("user \udcff")
    session.prepare_request()
    committed = session.commit_reply(
        Message.assistant(
            "reply \ud800", tool_calls=[ToolCallBlock("c\udcff", "ls", {"path": "caf\udce9", "n\udcff": ["\udfff"]})]
        )
    )
    # the committed message is the stored one
    assert committed.text == f"reply {REPLACEMENT}"
    call = session.pending_calls[0]
    assert call.id == f"c{REPLACEMENT}" and call.arguments == {
        "path": f"caf{REPLACEMENT}",
        f"n{REPLACEMENT}": [REPLACEMENT],
    }
    session.tool_result(call.id, ToolOutcome("out \udcff", defer_message="later \ud800"))
    session.emit("basic", "note", {"text": "plugin \udcff"})
    session.set_harness_tools([{"type": "function", "function": {"name": "ls", "description": "caf\udce9"}}])
    session.prepare_request()  # the deferred message and the header are written here
    session.end_turn()
    raw = session.store.read(session.id, 0)
    text = orjson.dumps([e.to_dict() for e in raw]).decode()
    assert "\\ud" not in text.lower()
    assert text.count(REPLACEMENT) >= 9


def test_a_summary_from_a_hostile_summarizer_is_stored(make_kernel):
    session = make_kernel().open_session()
    for i in range(3):
        session.user(f"message {i} " + "word " * 50)
    first, last = session.surface.nodes[0].seq, session.surface.nodes[1].seq
    result = session.compact(Span(first, last, summary=Summary("summary \udcff of the start")), strategy="basic")
    assert REPLACEMENT in session.events[result.spans[0].replacement_seq].data["message"]["content"][0]["text"]


def test_data_a_store_cannot_hold_is_still_refused_and_nothing_is_written(make_kernel):
    session = make_kernel().open_session()
    session.user("hello")
    path = session.store.path(session.id)
    before = path.read_bytes()
    with pytest.raises(EventError, match="JSON-serialisable"):
        session.emit("basic", "note", {"value": object()})
    assert path.read_bytes() == before


def _reply_data(levels: int) -> dict[str, object]:
    """A reply event's data whose one tool call's arguments nest ``levels`` objects deep."""
    arguments: dict[str, object] = {}
    for _ in range(levels):
        arguments = {"a": arguments}
    return {"message": Message.assistant("x", [ToolCallBlock("c1", "f", arguments)]).to_dict()}


def _encodes(value: object) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def test_data_nested_as_deep_as_the_store_writes_is_refused_before_the_write(make_kernel):
    # orjson writes 254 levels; an event's data sits one level down in its stored record, so
    # data that encoded alone at the edge failed in the store with a bare TypeError
    levels = next(n for n in range(200, 260) if not _encodes([_reply_data(n)]))
    assert _encodes(_reply_data(levels))  # the edge: the data alone still encodes
    session = make_kernel().open_session()
    session.user("go")
    session.prepare_request()
    path = session.store.path(session.id)
    before = path.read_bytes()
    data = _reply_data(levels)["message"]
    with pytest.raises(EventError, match="not JSON-serialisable: Recursion limit"):
        session.commit_reply(Message.from_dict(data))
    assert path.read_bytes() == before
    session.commit_reply(Message.assistant("done"))  # the session goes on

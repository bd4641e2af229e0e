"""``prepare_request(history=..., trailer=...)``: a harness's new messages (a proxy's client's)
are put on the surface before the strategies run and written in one store write with the
request's ``step/start``, which is not synced on its own. The log is the one
``append_history`` + ``prepare_request`` write; a refusal writes nothing; an error after the
messages still writes them; a crash or a power cut at any point leaves a log that reopens
consistent and resumes."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxkernel
from ctxkernel import Message, StrategySpec, TextBlock, ToolCallBlock
from ctxkernel import events as ev
from ctxkernel.errors import ConfigError, EventError, StoreError
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.session import EventSpec
from ctxkernel.testing import build_kernel


class Seer:
    """A strategy whose pre_step records what the surface holds, and fails when told to."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self.fail = False

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("seer"))

    @ctxkernel.hookimpl
    def pre_step(self, ctx: Any, step: Any) -> None:
        self.seen.append([n.role for n in ctx.surface.nodes])
        if self.fail:
            raise RuntimeError("the seer failed")


def kernel(home: Path, seer: Seer | None = None, **tables: Any) -> ctxkernel.Kernel:
    plugins = [("seer", seer)] if seer else []
    strategies = ["seer", "basic"] if seer else ["basic"]
    return build_kernel(home, strategies=strategies, plugins=plugins, **tables)


def turns(shapes: list[tuple[int, int]], reply_words: int = 3) -> list[list[Message]]:
    """Per request, the messages a client adds: the tool results of the last reply's calls (or
    a user message), as a client would send them after each reply."""
    out: list[list[Message]] = []
    for turn, (steps, calls) in enumerate(shapes):
        out.append([Message.user(f"instruction {turn}: " + "word " * reply_words)])
        for step in range(steps):
            ids = [f"t{turn}s{step}c{i}" for i in range(calls)]
            out.append([Message.tool(i, f"result of {i}: " + "line\n" * 20) for i in ids])
    return out


def reply_for(messages: list[Message], index: int) -> Message:
    """The reply to request ``index``: calls when the next request answers them, else text."""
    if messages and messages[0].role == "tool":
        return Message.assistant(f"reply {index}", [ToolCallBlock(m.content[0].call_id, "read", {}) for m in messages])  # type: ignore[union-attr]
    return Message.assistant(f"reply {index}: " + "text " * 30)


def run(session: Any, requests: list[list[Message]], *, held: bool, defer: bool = False) -> None:
    for index, new in enumerate(requests):
        if held:
            session.prepare_request(history=new, defer_write=defer)
        else:
            session.append_history(new)
            session.prepare_request()
        following = requests[index + 1] if index + 1 < len(requests) else []
        session.commit_reply(reply_for(following, index))


def shape_of(session: Any) -> list[tuple[str, Any]]:
    """The log without what differs between two runs by design (times, compaction ids)."""
    out = []
    for event in session.events:
        data = {k: v for k, v in event.data.items() if k not in ("compaction_id", "holder", "time")}
        out.append((event.type, data if event.type in ev.MESSAGE_TYPES or event.type.startswith("turn/") else None))
    return out


def surface_of(session: Any) -> list[tuple[int, str, str]]:
    return [(n.seq, n.role, str(n.message.to_dict())) for n in session.surface.nodes]


def recount(session: Any) -> int:
    fresh = Meter(get_tokenizer())
    return sum(fresh.count_message(node.message) for node in session.surface.nodes)


def log_bytes(home: Path, session_id: str) -> bytes:
    return (home / "sessions" / f"{session_id}.jsonl").read_bytes()


# pairs of (replies that call tools, calls per reply); the window is small enough that basic
# compacts in pre_step, i.e. appends before the request's step/start, and snapshots are frequent
shapes = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2)), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None)
@given(shapes=shapes, window=st.sampled_from([1_500, 3_000, 100_000]), defer=st.booleans())
def test_held_history_writes_the_log_the_two_calls_write(shapes, window, defer):
    # defer_write: the step/start is held too and written by the reply's commit; the events
    # are the same, only fewer store writes carry them
    requests = turns(shapes)
    model = {"context_window": window, "reserved_output_tokens": 200}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        apart = kernel(Path(a), model=model, store={"snapshot_every": 7}).open_session("s", create=True)
        held = kernel(Path(b), model=model, store={"snapshot_every": 7}).open_session("s", create=True)
        run(apart, requests, held=False)
        run(held, requests, held=True, defer=defer)
        assert shape_of(held) == shape_of(apart)
        assert surface_of(held) == surface_of(apart)
        assert held.meter.surface_tokens() == recount(held)  # counts stay exact
        reopened = kernel(Path(b), model=model, store={"snapshot_every": 7}).open_session("s")
        assert surface_of(reopened) == surface_of(held)
        assert len(reopened.events) == len(held.events)


def record_writes(session: Any) -> list[list[str]]:
    """From now on, the event types of each store write ``session`` makes, one list per write."""
    writes: list[list[str]] = []
    real_append = session.store.append

    def counting(session_id: str, events: list[Any], start: int) -> None:
        writes.append([e.type for e in events])
        real_append(session_id, events, start)

    session.store.append = counting
    return writes


def test_the_strategies_see_the_messages_and_one_write_holds_them_and_the_step_start(tmp_path):
    seer = Seer()
    session = kernel(tmp_path, seer).open_session("s", create=True)
    session.prepare_request(history=[Message.user("first")])
    session.commit_reply(Message.assistant("done"))
    writes = record_writes(session)
    record = EventSpec("serve/ledger", {"at": 2, "hashes": ["x"]}, ignorable=True)
    session.prepare_request(history=[Message.user("second")], trailer=[record])
    assert seer.seen[-1] == ["user", "assistant", "user"]  # pre_step saw the new message
    assert writes == [["turn/end", "turn/start", "user/message", "serve/ledger", "step/start"]]


def test_a_history_that_does_not_pair_is_refused_with_nothing_written(tmp_path):
    session = kernel(tmp_path).open_session("s", create=True)
    session.prepare_request(history=[Message.user("first")])
    session.commit_reply(Message.assistant("calling", [ToolCallBlock("c1", "read", {})]))
    before, events, nodes = log_bytes(tmp_path, "s"), len(session.events), surface_of(session)
    for bad in ([Message.tool("nope", "a result for no call")], [Message.user("while c1 waits")]):
        with pytest.raises(EventError):
            session.prepare_request(history=bad)
        assert log_bytes(tmp_path, "s") == before
        assert (len(session.events), surface_of(session)) == (events, nodes)
    session.prepare_request(history=[Message.tool("c1", "the result")])  # and it goes on
    assert session.step_open


def test_an_error_after_the_messages_still_writes_them_as_append_history_would(tmp_path):
    seer = Seer()
    session = kernel(tmp_path / "a", seer).open_session("s", create=True)
    other = kernel(tmp_path / "b").open_session("s", create=True)
    for s in (session, other):
        s.prepare_request(history=[Message.user("first")])
        s.commit_reply(Message.assistant("done"))
    seer.fail = True
    with pytest.raises(ConfigError, match="its pre_step hook raised RuntimeError: the seer failed") as caught:
        session.prepare_request(history=[Message.user("second")])
    assert isinstance(caught.value.__cause__, RuntimeError)  # the plugin's own error, chained
    other.append_history([Message.user("second")])
    assert shape_of(session) == shape_of(other)
    reopened = kernel(tmp_path / "a", Seer()).open_session("s")
    assert surface_of(reopened) == surface_of(session) and len(reopened.events) == len(session.events)
    seer.fail = False
    session.prepare_request()  # the client's retry: nothing new to add
    session.commit_reply(Message.assistant("answered"))
    assert [n.role for n in session.surface.nodes] == ["user", "assistant", "user", "assistant"]


def resume(home: Path, history: list[Message]) -> Any:
    """What a restarted front door does: reopen, and send what the log lacks of the history."""
    session = kernel(home).open_session("s", keep_waiting_calls=True)
    logged = [n.message.to_dict() for n in session.surface.nodes]
    missing = [m for m in history if m.to_dict() not in logged]
    if not missing and not session.turn_open:  # the repair closed the unanswered turn: reopen it
        session.append_one(ev.TURN_START, {"turn": session.turn + 1})
    session.prepare_request(history=missing)
    session.commit_reply(Message.assistant("answered after the crash"))
    return session


def test_a_crash_after_the_write_reopens_consistent_and_resumes(tmp_path):
    session = kernel(tmp_path).open_session("s", create=True)
    history = [Message.user("first")]
    session.prepare_request(history=history)
    session.commit_reply(Message.assistant("done"))
    history += [Message.assistant("done"), Message.user("second")]
    session.prepare_request(history=history[2:])
    del session  # the process dies while the upstream answers: step/start written, no reply
    resumed = resume(tmp_path, history)
    types = [e.type for e in resumed.events]
    assert types.count("user/message") == 2  # the history once
    assert [n.role for n in resumed.surface.nodes] == ["user", "assistant", "user", "assistant"]
    assert resumed.meter.surface_tokens() == recount(resumed)
    reopened = kernel(tmp_path).open_session("s")
    assert surface_of(reopened) == surface_of(resumed)


def test_a_power_cut_before_the_reply_loses_only_the_unanswered_request(tmp_path):
    # the history and step/start are written unsynced: a power cut may take them, but only
    # with everything after them (the reply's commit syncs them); modelled by cutting the log
    # back to its last durable end
    session = kernel(tmp_path).open_session("s", create=True)
    history = [Message.user("first")]
    session.prepare_request(history=history)
    session.commit_reply(Message.assistant("done"))
    durable = log_bytes(tmp_path, "s")
    history += [Message.assistant("done"), Message.user("second")]
    session.prepare_request(history=history[2:])
    assert log_bytes(tmp_path, "s") != durable
    del session
    (tmp_path / "sessions" / "s.jsonl").write_bytes(durable)
    resumed = resume(tmp_path, history)
    assert [n.role for n in resumed.surface.nodes] == ["user", "assistant", "user", "assistant"]
    uninterrupted = kernel(tmp_path / "other").open_session("s", create=True)
    uninterrupted.prepare_request(history=history[:1])
    uninterrupted.commit_reply(Message.assistant("done"))
    uninterrupted.prepare_request(history=history[2:])
    uninterrupted.commit_reply(Message.assistant("answered after the crash"))
    assert shape_of(resumed) == shape_of(uninterrupted)


def test_a_failed_write_of_held_messages_leaves_the_log_as_it_was_and_the_object_stale(tmp_path):
    session = kernel(tmp_path).open_session("s", create=True)
    session.prepare_request(history=[Message.user("first")])
    session.commit_reply(Message.assistant("done"))
    before = log_bytes(tmp_path, "s")
    real_append = session.store.append

    def failing(session_id: str, events: list[Any], start: int) -> None:
        raise OSError("no space left on device")

    session.store.append = failing
    with pytest.raises(OSError):
        session.prepare_request(history=[Message.user("second")])
    session.store.append = real_append
    assert log_bytes(tmp_path, "s") == before
    assert session.stale  # folded in memory, not in the log: this object must not write on
    with pytest.raises(StoreError, match="reopen"):
        session.append_history([Message.user("third")])
    assert log_bytes(tmp_path, "s") == before
    reopened = kernel(tmp_path).open_session("s")
    assert [n.role for n in reopened.surface.nodes] == ["user", "assistant"]
    reopened.prepare_request(history=[Message.user("second")])
    reopened.commit_reply(Message.assistant("answered"))
    assert [n.role for n in reopened.surface.nodes] == ["user", "assistant", "user", "assistant"]


def test_the_old_call_shape_is_unchanged(tmp_path):
    session = kernel(tmp_path).open_session("s", create=True)
    session.user("hello")
    request = session.prepare_request()
    assert [m.role for m in request.messages] == ["user"]
    session.commit_reply(Message.assistant("hi"))
    assert [e.type for e in session.events][-3:] == ["step/start", "assistant/message", "step/end"]


def deferred(tmp_path: Path) -> tuple[Any, list[list[str]]]:
    """A session whose first request is answered, and a record of its store writes from then on."""
    session = kernel(tmp_path).open_session("s", create=True)
    session.prepare_request(history=[Message.user("first")], defer_write=True)
    session.commit_reply(Message.assistant("done"))
    return session, record_writes(session)


def test_a_deferred_request_is_one_store_write_made_by_the_reply(tmp_path):
    session, writes = deferred(tmp_path)
    before = log_bytes(tmp_path, "s")
    request = session.prepare_request(history=[Message.user("second")], defer_write=True)
    assert [m.text for m in request.messages] == ["first", "done", "second"]
    assert session.step_open and session.events[-1].type == "step/start"  # folded here ...
    assert log_bytes(tmp_path, "s") == before and writes == []  # ... and not written yet
    session.commit_reply(Message.assistant("answered"))
    assert writes == [["turn/end", "turn/start", "user/message", "step/start", "assistant/message", "step/end"]]
    reopened = kernel(tmp_path).open_session("s")
    assert surface_of(reopened) == surface_of(session)
    assert [e.type for e in reopened.events] == [e.type for e in session.events]


@pytest.mark.parametrize("ending", ["request_failed", "abandon_step", "refresh"])
def test_a_deferred_request_that_gets_no_reply_is_written_by_what_ends_it(tmp_path, ending):
    # a provider error, a client gone away, or a request dropped without either (the next
    # call refreshes first): the held events are written before anything else is, never lost
    # while the object lives and never after another writer's events
    session, writes = deferred(tmp_path)
    session.prepare_request(history=[Message.user("second")], defer_write=True)
    if ending == "request_failed":
        session.request_failed(ctxkernel.ModelError("the provider is down"))
    elif ending == "abandon_step":
        session.abandon_step("interrupted")
    else:
        session.refresh()
    assert writes and writes[0][:4] == ["turn/end", "turn/start", "user/message", "step/start"]
    assert [e.type for e in session.store.read("s", 0)] == [e.type for e in session.events]
    session.prepare_request(defer_write=True)
    session.commit_reply(Message.assistant("answered"))
    reopened = kernel(tmp_path).open_session("s")
    assert surface_of(reopened) == surface_of(session)
    assert [n.message.text for n in reopened.surface.nodes] == ["first", "done", "second", "answered"]


def test_a_deferred_request_cut_off_leaves_the_log_of_the_last_answer(tmp_path):
    # the process dies while the upstream answers: nothing of the request is in the log, and
    # the client's retry of its history is answered as if it came for the first time
    session = kernel(tmp_path).open_session("s", create=True)
    history = [Message.user("first")]
    session.prepare_request(history=history, defer_write=True)
    session.commit_reply(Message.assistant("done"))
    durable = log_bytes(tmp_path, "s")
    history += [Message.assistant("done"), Message.user("second")]
    session.prepare_request(history=history[2:], defer_write=True)
    assert log_bytes(tmp_path, "s") == durable
    del session
    resumed = resume(tmp_path, history)
    assert [n.role for n in resumed.surface.nodes] == ["user", "assistant", "user", "assistant"]
    assert resumed.meter.surface_tokens() == recount(resumed)


def test_a_refused_deferred_history_writes_nothing_and_holds_nothing(tmp_path):
    session, writes = deferred(tmp_path)
    before = log_bytes(tmp_path, "s")
    with pytest.raises(EventError):
        session.prepare_request(history=[Message.tool("nobody-called-this", "result")], defer_write=True)
    assert log_bytes(tmp_path, "s") == before and writes == []
    session.refresh()  # nothing held: nothing to write
    assert writes == []


CHILD = """
import sys
from pathlib import Path
from ctxkernel import Message
from ctxkernel.testing import build_kernel

session = build_kernel(Path(sys.argv[1]), strategies=["basic"]).open_session("s", create=True)
defer = sys.argv[2] == "defer"
for i in range(100_000):
    session.prepare_request(history=[Message.user(f"instruction {i}")], defer_write=defer)
    session.commit_reply(Message.assistant(f"reply {i}"))
    print(i, flush=True)
"""


@pytest.mark.parametrize("acks_before_kill", [1, 7, 23])
@pytest.mark.parametrize("mode", ["write", "defer"])
def test_a_writer_killed_anywhere_leaves_a_log_that_reopens_and_resumes(tmp_path, acks_before_kill, mode):
    # a real SIGKILL at an arbitrary point of the request loop (between, inside or after the
    # one write of a request's messages and step/start): every acknowledged reply is in the
    # log, no message is there twice, and the client's retry of its history is answered
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), mode], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acked = -1
    for _ in range(acks_before_kill):
        acked = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    session = build_kernel(tmp_path, strategies=["basic"]).open_session("s", keep_waiting_calls=True)
    texts = [n.message.text for n in session.surface.nodes]
    for i in range(acked + 1):
        assert texts.count(f"instruction {i}") == 1 and texts.count(f"reply {i}") == 1
    # the client sends its history: every instruction it sent, the one in flight included
    in_flight = acked + 1 if f"instruction {acked + 1}" in texts else acked + 2
    history = [Message.user(f"instruction {i}") for i in range(in_flight + 1)]
    missing = [m for m in history if m.text not in texts]
    if not missing and not session.turn_open:  # the repair closed the unanswered turn
        session.append_one(ev.TURN_START, {"turn": session.turn + 1})
    session.prepare_request(history=missing)
    session.commit_reply(Message.assistant("answered after the kill"))
    texts = [n.message.text for n in session.surface.nodes]
    assert all(texts.count(m.text) == 1 for m in history)
    assert texts[-1] == "answered after the kill"
    reopened = build_kernel(tmp_path, strategies=["basic"]).open_session("s")
    assert surface_of(reopened) == surface_of(session)
    assert session.meter.surface_tokens() == recount(session)


@dataclass(frozen=True, slots=True)
class Marked(TextBlock):
    """A text block of a harness's own class."""


def test_a_history_message_is_held_once_and_a_replay_reads_it_back_equal(tmp_path):
    """The node keeps the harness's own message object (not a second, parsed copy) when its
    parse equals it; one that does not survive the round trip keeps its parse."""
    home = tmp_path / "home"
    session = kernel(home).open_session()
    call = ToolCallBlock("c1", "read_file", {"path": "a.py"})
    sent = [Message.user("read a.py"), Message.assistant("reading", [call]), Message.tool("c1", "print(1)")]
    seqs = session.append_history(sent)
    held = [session.surface.node(seq).message for seq in seqs]
    assert all(h is m for h, m in zip(held, sent, strict=True))
    # a block of a class of the harness's own is written as a text block and read back as one:
    # not equal, so the node keeps what a replay reads
    odd = Message("user", (Marked("grep a and b"),))
    (seq,) = session.append_history([odd])
    node = session.surface.node(seq).message
    assert node is not odd and type(node.content[0]) is TextBlock and node.text == "grep a and b"
    reopened = kernel(home).open_session(session.id)
    assert [n.message for n in reopened.surface.nodes] == [n.message for n in session.surface.nodes]

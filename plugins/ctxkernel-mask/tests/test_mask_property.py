"""Property tests over random sessions and random settings: after every request

* no request splits a tool call from its results;
* the current step (the newest reply and everything after it) is never masked;
* a batch masked without pressure saves at least ``clear_at_least`` tokens, and more over the
  break-even rule's horizon than the cached prefix it rewrites costs;
* results of ``exclude_tools`` are never masked;
* a masked error keeps its first line;
* every masked output is read back whole through ``history_read_item`` by the id its placeholder names;

and a reopened session shows the same surface and offers the same tools.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from helpers_mask import mask_kernel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, ToolCallBlock

TOOLS = ("read", "bash", "todo", "write")


def _check_request(request) -> None:
    messages = request.messages
    for i, message in enumerate(messages):
        ids = [c.id for c in message.tool_calls]
        following = [m.tool_result.call_id for m in messages[i + 1 : i + 1 + len(ids)] if m.tool_result]
        assert sorted(following) == sorted(ids), f"calls {ids} not followed by their results: {following}"
    calls = {c.id for m in messages for c in m.tool_calls}
    assert all(m.tool_result.call_id in calls for m in messages if m.tool_result), "a result without its call"


def _current_step(session) -> list[tuple[int, Message]]:
    nodes = list(session.surface.nodes)
    last = max((i for i, n in enumerate(nodes) if n.role == "assistant"), default=len(nodes))
    return [(n.seq, n.message) for n in nodes[last:]]


def _mask_batches(session, since: int) -> list:
    return [
        e
        for e in session.events[since:]
        if e.type == "compaction/summary" and e.data.get("strategy") == "mask" and e.data.get("kind") == "mask"
    ]


def _original(session, seq: int):
    event = session.events[seq]
    while event.type == "tool/result" and (event.surface or {}).get("op") == "replace":
        event = session.events[event.surface["cites"][0]]
    return Message.from_dict(event.data["message"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_sessions_keep_every_mask_invariant(data):
    tail = data.draw(st.integers(0, 1_500), label="tail_tokens")
    pressure = data.draw(st.sampled_from([0.5, 0.7, 0.9]), label="pressure_ratio")
    mask_settings = {
        "tail_tokens": tail,
        "tail_ratio": data.draw(st.sampled_from([0.0, 0.1, 0.3]), label="tail_ratio"),
        "clear_at_least": data.draw(st.integers(1, 2_500), label="clear_at_least"),
        "pressure_ratio": pressure,
        "min_tokens": data.draw(st.integers(0, 80), label="min_tokens"),
        "args_tokens": data.draw(st.sampled_from([0, 150, 600]), label="args_tokens"),
        "exclude_tools": data.draw(st.lists(st.sampled_from(TOOLS), max_size=2, unique=True), label="exclude"),
        "error_lines": data.draw(st.integers(1, 4), label="error_lines"),
        # every masked original must be readable back: the tools are offered on every window here
        # (test_mask_plugin covers the window too small for them)
        "recall_min_window": 0,
    }
    window = data.draw(st.integers(8_000, 30_000), label="window")
    summary = data.draw(st.booleans(), label="summary")
    with tempfile.TemporaryDirectory() as tmp:
        kernel = mask_kernel(Path(tmp), window=window, reserve=1_000, settings=mask_settings, summary=summary)
        session = kernel.open_session()
        session.user("start the task")
        n = 0
        for _ in range(data.draw(st.integers(6, 30), label="steps")):
            n += 1
            if data.draw(st.integers(0, 9), label="user") == 0:
                session.user(f"also do thing {n}")
            before_step = _current_step(session)
            seen = len(session.events)
            request = session.prepare_request()
            _check_request(request)
            visible = {n.seq: n.message for n in session.surface.nodes}
            for seq, message in before_step:
                assert visible.get(seq) == message, f"the current step's node {seq} changed"
            for batch in _mask_batches(session, seen):
                if batch.data["reason"] == "batch":
                    assert batch.data["tokens_before"] - batch.data["tokens_after"] >= mask_settings["clear_at_least"]
                    rule = batch.data["break_even"]  # the profile's model has a price: every batch is weighed
                    assert rule["saving_usd"] > rule["cost_usd"]
                for span in batch.data["spans"]:
                    for cited in span["cites"]:
                        original = _original(session, cited)
                        result = original.tool_result
                        if result is not None:
                            assert (result.name or "") not in mask_settings["exclude_tools"]
            k = data.draw(st.integers(0, 3), label="calls")
            if k == 0:
                session.commit_reply(Message.assistant(f"thinking {n} " + "word " * data.draw(st.integers(1, 80))))
                continue
            calls = []
            for i in range(k):
                name = data.draw(st.sampled_from(TOOLS), label="tool")
                arguments = {"path": f"f{n}_{i}.py"}
                if name == "write":
                    arguments["content"] = "x = 1\n" * data.draw(st.integers(1, 300), label="write")
                calls.append(ToolCallBlock(f"c{n}_{i}", name, arguments))
            session.commit_reply(Message.assistant("", calls))
            for call in calls:
                lines = data.draw(st.integers(1, 80), label="lines")
                error = data.draw(st.integers(0, 4), label="error") == 0
                body = "\n".join(f"{call.id} line {j}: value_{j}" for j in range(lines))
                if error:
                    body = f"FAILED first line of {call.id}\n{body}\nValueError: bad {call.id}"
                session.tool_result(call.id, body, is_error=error)
        _check_request(session.prepare_request())
        _check_masks(session, mask_settings)
        again = mask_kernel(Path(tmp), window=window, reserve=1_000, settings=mask_settings, summary=summary)
        reopened = again.open_session(session.id)
        assert [n.message for n in reopened.surface] == [n.message for n in session.surface]
        assert reopened.request_header().tools == session.request_header().tools


def _check_masks(session, mask_settings) -> None:
    """Every masked result on the surface: an excluded tool's never; an error keeps its first
    line; the id its placeholder names reads the whole original back."""
    for node in session.surface.nodes:
        result = node.message.tool_result
        if result is None or not result.content.startswith("[masked "):
            continue
        original = _original(session, node.seq).tool_result
        assert (original.name or "") not in mask_settings["exclude_tools"]
        if original.is_error:
            assert original.content.splitlines()[0] in result.content
        item = result.content.split("id='", 1)[1].split("'", 1)[0]
        read = session.run_tool(
            {"id": f"r{node.seq}", "name": "history_read_item", "arguments": {"id": item, "max_chars": 20_000}}
        )
        assert not read.is_error, read.content
        assert original.content.splitlines()[-1] in read.content

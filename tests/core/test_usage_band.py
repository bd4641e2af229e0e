"""A provider's usage figure anchors pressure only when it is plausible: under-reporting cannot
switch compaction off, over-reporting cannot make it run at every step, honest usage anchors
exactly as before (docs/security.md, "Provider usage figures")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from ctxkernel import Message, ToolCallBlock
from ctxkernel.errors import EventError
from ctxkernel.meter import USAGE_SLACK_TOKENS, USAGE_TOLERANCE_FACTOR, usage_in_band, usage_slack
from ctxkernel.simulate.reading import check_usage
from ctxkernel.testing import build_kernel, make_profile

WORKLOAD = Path(__file__).resolve().parents[2] / "benchmarks" / "_workload.py"
WINDOW, RESERVED = 12_000, 1_000  # effective 11,000; basic compacts at 8,800


def benchmark_usage_for() -> Any:
    """The benchmarks' provider-usage helper (the honest provider every benchmark uses)."""
    spec = importlib.util.spec_from_file_location("bench_workload", WORKLOAD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.usage_for


def kernel(home: Path) -> Any:
    profile = make_profile(model={"context_window": WINDOW, "reserved_output_tokens": RESERVED})
    return build_kernel(home, strategies=["basic"], profile=profile, fsync=False)


def turn(session: Any, n: int, usage: Any) -> Any:
    """One user message, a tool call with a ~600-token result, a final answer; ``usage(request,
    reply)`` is what the provider reports for each request. Returns the last request."""
    session.user(f"step {n}: " + " ".join(f"task{n}_{i}" for i in range(40)))
    request = session.prepare_request()
    reply = Message.assistant(f"reading {n}", [ToolCallBlock(f"c{n}", "read", {"path": f"m{n}.py"})])
    session.commit_reply(reply, usage=usage(request, reply))
    session.tool_result(f"c{n}", "\n".join(f"line {i} of module {n}: value_{n}_{i} = {i * n}" for i in range(60)))
    request = session.prepare_request()
    reply = Message.assistant(f"done {n}: " + " ".join(f"fact{n}_{i}" for i in range(30)))
    session.commit_reply(reply, usage=usage(request, reply))
    session.end_turn()
    return request


def counted(session: Any) -> int:
    """The request as the meter counts it: header, surface, decorations."""
    _, _, _, header = session._tooling.compose()
    return header + session.meter.surface_tokens() + session._tracker.decoration_delta


def compactions(session: Any) -> list[list[int]]:
    """What each compaction replaced: equal lists mean the same decisions at the same points."""
    return [e.data["cites"] for e in session.events if e.type == "compaction/summary"]


def honest_run(home: Path, turns: int) -> Any:
    usage_for = benchmark_usage_for()
    session = kernel(home).open_session()
    for n in range(turns):
        turn(session, n, lambda request, reply: usage_for(session, request, reply))
    return session


def test_honest_usage_anchors_exactly_as_before(tmp_path: Path) -> None:
    usage_for = benchmark_usage_for()
    session = kernel(tmp_path).open_session()
    for n in range(30):
        turn(session, n, lambda request, reply: usage_for(session, request, reply))
        pressure = session.pressure()
        # an honest provider agrees with the meter: the anchored figure is the counted one
        assert pressure.anchored and pressure.tokens == counted(session)
    assert len(compactions(session)) >= 2


def test_under_reported_usage_does_not_switch_compaction_off(tmp_path: Path) -> None:
    # the provider: 10 prompt tokens for every request, whatever was sent
    session = kernel(tmp_path / "lying").open_session()
    with capture_logs() as logs:
        peak = 0
        for n in range(30):
            request = turn(session, n, lambda request, reply: {"prompt_tokens": 10, "completion_tokens": 1})
            peak = max(peak, request.pressure.tokens)
            pressure = session.pressure()
            if counted(session) > USAGE_TOLERANCE_FACTOR * (USAGE_SLACK_TOKENS + 11):  # out of the band
                assert not pressure.anchored and pressure.tokens == counted(session)
    # trusting the figure, the pressure stayed near 0% and nothing ever compacted; set aside, the
    # session compacts exactly where an honest provider's would
    assert compactions(session) == compactions(honest_run(tmp_path / "honest", 30))
    assert peak <= 11_000
    warnings = [entry for entry in logs if "outside the plausible band" in entry["event"]]
    assert len(warnings) == 1 and warnings[0]["reported_tokens"] == 11  # logged once per session
    reopened = kernel(tmp_path / "lying").open_session(session.id)
    assert reopened.pressure() == session.pressure()


def test_over_reported_usage_does_not_compact_at_every_step(tmp_path: Path) -> None:
    session = kernel(tmp_path / "lying").open_session()
    for n in range(30):
        turn(session, n, lambda request, reply: {"prompt_tokens": 10_000_000, "completion_tokens": 1})
        pressure = session.pressure()
        assert not pressure.anchored and pressure.tokens == counted(session)
    # trusting the figure, basic compacted at every step it was allowed to
    assert compactions(session) == compactions(honest_run(tmp_path / "honest", 30))


@pytest.mark.parametrize("drift", [0.6, 0.9, 1.1, 1.8])
def test_a_provider_tokenizer_within_the_band_still_anchors(tmp_path: Path, drift: float) -> None:
    # another tokenizer counts the same request differently: its figure anchors, and the pressure
    # is that figure plus the meter's count of what changed since
    session = kernel(tmp_path).open_session()
    sent: dict[str, int] = {}

    def scaled(request: Any, reply: Any) -> dict[str, int]:
        sent["prompt"] = int(request.pressure.tokens * drift)
        return {"prompt_tokens": sent["prompt"], "completion_tokens": 20}

    session.user("start " + "words " * 300)
    request = session.prepare_request()
    reply = Message.assistant("ok " * 50)
    session.commit_reply(reply, usage=scaled(request, reply))
    pressure = session.pressure()
    assert pressure.anchored and pressure.tokens == sent["prompt"] + 20
    session.user("more " * 100)
    grown = session.pressure()
    assert grown.anchored and grown.tokens == sent["prompt"] + 20 + session.meter.node_tokens(session.surface.nodes[-1])


@given(st.integers(min_value=0, max_value=10_000_000))
def test_the_band_edges(count: int) -> None:
    low = count / USAGE_TOLERANCE_FACTOR - USAGE_SLACK_TOKENS
    high = count * USAGE_TOLERANCE_FACTOR + USAGE_SLACK_TOKENS
    assert usage_in_band(count, count)
    assert usage_in_band(int(high), count) and not usage_in_band(int(high) + 1, count)
    if low > 0:
        assert usage_in_band(int(low) + 1, count) and not usage_in_band(int(low) - 1, count)
    else:
        assert usage_in_band(0, count)


def test_the_band_is_bounded_by_a_small_window(tmp_path: Path) -> None:
    # the small window: 2,000 tokens (1,800 effective), every reply reporting 10 prompt
    # tokens. With a fixed 2,048-token slack the band (counted / 2 - 2,048 .. 2 x counted + 2,048)
    # was wider than the window: the 60th request held 3,739 tokens while the kernel believed 99
    profile = make_profile(model={"context_window": 2_000, "reserved_output_tokens": 200})
    session = build_kernel(tmp_path, strategies=["basic"], profile=profile, fsync=False).open_session()
    requests = 0
    for n in range(30):
        session.user(f"step {n}: " + " ".join(f"task{n}_{i}" for i in range(20)))
        for k in range(2):
            session.prepare_request()
            requests += 1
            sent = counted(session)
            assert sent <= 1_800, f"request {requests} holds {sent} tokens, the effective window is 1,800"
            believed = session.pressure().tokens
            assert believed >= sent - 2 * usage_slack(2_000), (requests, believed, sent)
            calls = [ToolCallBlock(f"c{n}", "read", {"path": f"m{n}.py"})] if k == 0 else []
            reply = Message.assistant(f"step {n}.{k} " + " ".join(f"fact{n}_{i}" for i in range(15)), calls)
            session.commit_reply(reply, usage={"prompt_tokens": 10, "completion_tokens": 1})
            if calls:
                session.tool_result(f"c{n}", "\n".join(f"line {i} of module {n}" for i in range(40)))
        session.end_turn()
    assert requests == 60
    assert compactions(session), "the session never compacted"
    assert usage_slack(2_000) == 250 and usage_slack(128_000) == USAGE_SLACK_TOKENS and usage_slack(None) == 2_048


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -5}},
        {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 10**25}},
        {"prompt_tokens": 10**30},
        {"input_tokens": 2**63},
    ],
)
def test_a_usage_counter_out_of_range_is_refused_by_name(tmp_path: Path, usage: dict[str, Any]) -> None:
    """Every counter, the OpenAI cached-token detail included, is 0..2**53-1: a negative or huge
    figure is refused naming the field, before the log (which `ctxkernel simulate` imports) sees it."""
    session = kernel(tmp_path).open_session()
    session.user("hi")
    session.prepare_request()
    before = [e.seq for e in session.events]
    with pytest.raises(EventError, match=r"usage\.(prompt_tokens_details\.cached_tokens|prompt_tokens|input_tokens)"):
        session.commit_reply(Message.assistant("ok"), usage=usage)
    assert [e.seq for e in session.events] == before
    reply = session.commit_reply(Message.assistant("ok"), usage=None)
    assert reply.text == "ok"


def test_a_boolean_cached_token_detail_is_no_count(tmp_path: Path) -> None:
    session = kernel(tmp_path).open_session()
    session.user("hi")
    session.prepare_request()
    session.commit_reply(
        Message.assistant("ok"), usage={"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": True}}
    )
    assert session.events[-2].data["usage"]["cached_input_tokens"] == 0
    assert check_usage(session.events[-2].data["usage"]) is not None

"""The request guard (``[profile] guard_request``, guard.py ``fit_composed``): the composed request,
every decoration included, is checked against the effective window; only an overflowing one is
compacted once through the profile's overflow path and composed again, or refused with
:class:`ctxkernel.RequestTooLargeError` and a byte-identical log. Decay's anchors and reminders are
added after ``pre_step``, which is why a threshold measured there is not enough."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxkernel import HeaderTooLargeError, Message, RequestTooLargeError, ToolCallBlock
from ctxkernel.events import COMPACTION_END, COMPACTION_START
from ctxkernel.testing import build_kernel, make_profile
from ctxkernel_decay.testing import decay_kernel, log_bytes


def basic_kernel(
    home: Path, *, window: int, guard: bool = True, system: str | None = None, retain_ratio: float = 0.3
) -> Any:
    """``basic`` with no automatic compaction: only the guard (or a provider overflow) compacts."""
    profile = make_profile(model={"context_window": window, "reserved_output_tokens": 500})
    profile.profile.guard_request = guard
    if system is not None:
        profile.profile.system_prompt = system
    profile.model_policies = []
    settings = {"basic": {"auto": False, "threshold_ratio": 0.97, "retain_ratio": retain_ratio}}
    return build_kernel(home, strategies=["basic"], settings=settings, profile=profile, fsync=False)


def sent_tokens(session: Any, request: Any) -> int:
    """The request as it would be sent, counted from scratch: header plus every (decorated) message."""
    meter = session.meter
    return meter.count_header(request.system, request.tools) + sum(meter.count_message(m) for m in request.messages)


def compactions(session: Any) -> list[dict[str, Any]]:
    return [e.data for e in session.events if e.type == COMPACTION_START]


def step(session: Any, n: int, size: int) -> Any:
    """One request, a tool call and a result of about ``size`` tokens."""
    request = session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock(f"c{n}", "read", {"path": f"{n}.txt"})]))
    session.tool_result(f"c{n}", " ".join(f"w{n}x{k}" for k in range(size // 3)))
    return request


def parallel_step(session: Any, n: int, calls: int, size: int) -> Any:
    """One request, a reply of ``calls`` tool calls and their results of about ``size`` tokens each:
    one balanced span (a call and its results are never split)."""
    request = session.prepare_request()
    ids = [f"c{n}.{k}" for k in range(calls)]
    session.commit_reply(Message.assistant("", [ToolCallBlock(i, "read", {"path": f"{i}.txt"}) for i in ids]))
    for i in ids:
        session.tool_result(i, " ".join(f"w{i}x{k}" for k in range(size // 3)))
    return request


def test_a_header_over_the_window_is_refused_up_front_and_the_log_is_byte_identical(tmp_path: Path) -> None:
    # the system prompt alone is over the window: no compaction of the surface can make it fit,
    # which is the case the kernel's header rule (guard.py HEADER_MAX_SHARE) refuses before the
    # request guard runs, naming the smallest window that works
    kernel = basic_kernel(tmp_path, window=3_000, system="You are careful. " * 1_000)
    session = kernel.open_session()
    session.user("hello")
    before = log_bytes(session)
    with pytest.raises(HeaderTooLargeError, match=r"effective window of 2500") as refused:
        session.prepare_request()
    assert refused.value.header_tokens > 2_500
    assert refused.value.smallest_window == 2 * refused.value.header_tokens + 500
    assert log_bytes(session) == before
    assert not session.step_open
    with pytest.raises(HeaderTooLargeError):
        session.prepare_request()
    assert log_bytes(session) == before


def test_a_request_that_cannot_fit_is_refused_and_the_log_is_byte_identical(tmp_path: Path) -> None:
    # a header under half the window (~1,200 of 2,500), then one reply whose eight calls and
    # results fill the rest: the span cannot be split, nothing before it is left to summarise and
    # no result is large enough for the kernel's excerpts, so no compaction can make it fit
    kernel = basic_kernel(tmp_path, window=3_000, system="You are careful. " * 300)
    session = kernel.open_session()
    session.user("hello")
    parallel_step(session, 0, 8, 150)  # ~200 tokens per result, ~1,600 in all
    before = log_bytes(session)
    with pytest.raises(RequestTooLargeError, match=r"over the effective window of 2500") as refused:
        session.prepare_request()
    assert refused.value.limit == 2_500
    assert refused.value.prompt_tokens is not None and refused.value.prompt_tokens > 2_500
    assert log_bytes(session) == before
    assert not session.step_open
    # the refusal is repeatable and still writes nothing
    with pytest.raises(RequestTooLargeError):
        session.prepare_request()
    assert log_bytes(session) == before


def test_an_overflowing_request_is_compacted_once_and_fits(tmp_path: Path) -> None:
    kernel = basic_kernel(tmp_path, window=6_000)
    session = kernel.open_session()
    session.user("read the files one by one")
    window = 5_500
    n = 0
    while not compactions(session):
        events_before = len(session.events)
        request = step(session, n, 400)
        assert sent_tokens(session, request) <= window
        n += 1
        assert n < 40, "the guard never compacted"
    # the step that would have overflowed: exactly one compaction, by basic's overflow path,
    # committed before the step started, and the request it returned fits
    new = session.events[events_before:]
    starts = [e for e in new if e.type == COMPACTION_START]
    assert [(e.data["strategy"], e.data["kind"]) for e in starts] == [("basic", "summary")]
    assert [e.data.get("error") for e in new if e.type == COMPACTION_END] == [None]  # committed
    first_step = next(e.seq for e in new if e.type == "step/start")
    assert starts[0].seq < first_step
    assert sent_tokens(session, request) <= window
    # the next steps fit without another compaction until the surface has grown again
    for k in range(n, n + 3):
        assert sent_tokens(session, step(session, k, 400)) <= window
    assert len(compactions(session)) == 1


def test_a_request_that_fits_is_untouched(tmp_path: Path) -> None:
    guarded = basic_kernel(tmp_path / "guarded", window=20_000).open_session("s", create=True)
    plain = basic_kernel(tmp_path / "plain", window=20_000, guard=False).open_session("s", create=True)
    for session in (guarded, plain):
        session.user("read three files")
        for n in range(3):
            step(session, n, 400)
    a, b = guarded.prepare_request(), plain.prepare_request()
    assert a.messages == b.messages and a.system == b.system and a.tools == b.tools
    assert [(e.type, e.data) for e in guarded.events if "time" not in e.data] == [
        (e.type, e.data) for e in plain.events if "time" not in e.data
    ]
    assert compactions(guarded) == []


def test_decay_anchors_and_reminders_never_push_a_request_over_the_window(tmp_path: Path) -> None:
    """The gap the previous threshold left: with ``threshold_ratio = 1.0`` measured in ``pre_step``,
    a composed decay request reached 22,019 tokens in a 22,000 window. With the shipped shape
    (basic ``auto = false``, ``guard_request``) every request as sent fits, and basic compacts only
    when a composed request would overflow."""
    kernel = decay_kernel(tmp_path, window=8_000, reserve=1_000, settings={"growth_tokens": 1_500})
    session = kernel.open_session()
    session.user("read every file")
    for n in range(40):
        request = step(session, n, 300)
        assert sent_tokens(session, request) <= 7_000, n
    assert [c["strategy"] for c in compactions(session)].count("basic") >= 1


def test_a_request_the_overflow_path_could_not_help_does_not_disarm_the_next(tmp_path: Path) -> None:
    """``overflow_retries`` counts the attempts of one request. The second request's overflow path
    finds no head to summarise (its one tool result is the verbatim tail); the third request's
    can. Before the fix the streak the second left refused the third's guard (no compaction, the
    request refused) although a summary made it fit."""
    profile = make_profile(model={"context_window": 3_000, "reserved_output_tokens": 500})
    profile.profile.guard_request = True
    # ~1,200 of the 2,500-token window: the most a header may take (guard.py HEADER_MAX_SHARE)
    profile.profile.system_prompt = "You are careful. " * 300
    profile.model_policies = []
    settings = {"basic": {"auto": False, "threshold_ratio": 0.97, "retain_ratio": 0.1, "overflow_retries": 1}}
    session = build_kernel(
        tmp_path, strategies=["basic"], settings=settings, profile=profile, fsync=False
    ).open_session()
    session.user("hello")
    # one reply of seven calls: its results (~1,400 tokens, each too small for the kernel's
    # excerpts) are one span that cannot be split, so only "hello" is before it
    parallel_step(session, 1, 7, 150)
    over = session.prepare_request(allow_overflow=True)  # the open loop of ctxkernel simulate
    assert over.pressure.tokens > 2_500 and not compactions(session)  # nothing basic could summarise
    session.commit_reply(Message.assistant("", [ToolCallBlock("c2", "read", {"path": "2"})]))
    session.tool_result("c2", " ".join(f"v{k}" for k in range(75)))
    request = session.prepare_request()
    assert [c["strategy"] for c in compactions(session)] == ["basic"]
    assert sent_tokens(session, request) <= 2_500


def test_a_large_message_in_the_verbatim_tail_is_excerpted_when_the_summary_is_not_enough(tmp_path: Path) -> None:
    """basic's summary of the head keeps its verbatim tail; when that tail holds one large tool
    results (each under the per-message bound) the request can still be over the window. The guard
    then excerpts the largest messages too, instead of refusing a request it can fit."""
    session = basic_kernel(tmp_path, window=8_000, system="You are careful. " * 900).open_session()
    session.user("read the files one by one")  # the header is ~3,600 of the 7,500-token window
    for n in range(8):
        step(session, n, 150)
    # two results of ~2,000 tokens in one reply: each below half the window, so not excerpted up
    # front, and together with the header over the window (the span is the verbatim tail)
    parallel_step(session, 8, 2, 1_500)
    request = session.prepare_request()
    assert [(c["strategy"], c["kind"]) for c in compactions(session)] == [("basic", "summary"), ("kernel", "excerpt")]
    assert sent_tokens(session, request) <= 7_500


def test_the_overflow_path_keeps_a_smaller_tail_when_the_tail_holds_all_but_the_head(tmp_path: Path) -> None:
    """basic's overflow path keeps half of ``retain_ratio`` of the window verbatim (1,125 tokens
    here). When the two newest results together reach that, the cut falls before the first one
    and only the user's message is left to summarise: no region. An overflow then tries a smaller
    tail (within ``compaction_retries``) instead of giving up on a request it can fit."""
    # a header of ~1,200 of the 2,500-token window (at most half: guard.py HEADER_MAX_SHARE), so a
    # large retain_ratio makes a tail that two results reach and the newest does not
    kernel = basic_kernel(tmp_path, window=3_000, system="You are careful. " * 300, retain_ratio=0.9)
    session = kernel.open_session()
    session.user("read two files")
    step(session, 0, 515)
    step(session, 1, 515)  # each result ~700 tokens: the two are over 1,125, the newest under it
    request = session.prepare_request()
    assert [(c["strategy"], c["kind"]) for c in compactions(session)] == [("basic", "summary")]
    assert sent_tokens(session, request) <= 2_500


def test_a_compaction_that_grew_the_surface_is_still_composed_again(tmp_path: Path) -> None:
    """Regression: the guard's overflow path may commit something that does not shrink the surface
    (a summary longer than what it replaced, with the instructions kept beside it). The request was
    composed again only when the surface shrank, so ``allow_overflow`` returned the request composed
    before the commit: messages no longer on the surface (found by ``ctxkernel simulate``'s
    projection check: decay on a small window with model summaries)."""
    from pydantic import BaseModel, ConfigDict

    import ctxkernel

    class Settings(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class Noting:
        """A strategy whose overflow path only adds a notice: the log changes, the surface grows."""

        @ctxkernel.hookimpl
        def register_strategy(self, register: Any) -> None:
            register(ctxkernel.StrategySpec("noting", settings=Settings))

        @ctxkernel.hookimpl
        def request_error(self, ctx: Any, error: Any) -> bool:
            noting = ctxkernel.Strategy("noting", Settings)
            noting.on(ctx).add_message(Message.user("over the window", noting.source("notice")))
            return False

    profile = make_profile(model={"context_window": 3_000, "reserved_output_tokens": 500})
    profile.profile.guard_request = True
    profile.model_policies = []
    kernel = build_kernel(tmp_path, strategies=["noting"], plugins=[("noting", Noting())], profile=profile, fsync=False)
    session = kernel.open_session()
    session.user("read the files")
    noted = 0
    for n in range(40):  # small results: no message is large enough for the kernel's excerpts
        request = session.prepare_request(allow_overflow=True)
        assert list(request.seqs) == [node.seq for node in session.surface.nodes], n
        noted += "over the window" in request.messages[-1].text
        session.commit_reply(Message.assistant("", [ToolCallBlock(f"c{n}", "read", {"path": f"{n}.txt"})]))
        session.tool_result(f"c{n}", " ".join(f"w{n}x{k}" for k in range(30)))
    assert noted > 0  # the overflow path ran, and its notice is in the request that followed it

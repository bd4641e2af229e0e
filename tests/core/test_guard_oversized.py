"""One oversized tool result never breaks a session: with every shipped profile, a 50 MB result is
excerpted on the surface (the log keeps it whole), the next request and every later one fit the
effective window, tool pairing holds, and a reopened session composes the same requests
(docs/security.md, "Oversized content")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import ContextOverflowError, Kernel, Message, ToolCallBlock
from ctxkernel.guard import EXCERPT_SHARE, MAX_MESSAGE_SHARE, excerpt_budget
from ctxkernel.meter import EXACT_COUNT_CHARS, LARGE_NODE_TOKENS, bounded_count, get_tokenizer
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import build_kernel, make_profile, request_orphans

PROFILES = ["basic", "decay", "handoff", "rollover", "chapters"]
BIG_BYTES = 50 * 1024 * 1024


def big_result() -> str:
    """50 MB of build output, built in a few milliseconds (line numbers only at the start and the
    end, so the excerpt's head and tail are recognisable)."""
    middle = "compiling module: ok, 0 warnings, nothing to report here\n"
    head = "".join(f"HEAD line {i}\n" for i in range(50))
    tail = "".join(f"TAIL line {i}\n" for i in range(50)) + "BUILD FAILED: error in the last step\n"
    return head + middle * ((BIG_BYTES - len(head) - len(tail)) // len(middle)) + tail


BIG = big_result()


def honest(session: Any, request: Any, reply: Message) -> dict[str, int]:
    return {"prompt_tokens": request.pressure.tokens, "completion_tokens": session.meter.count_message(reply)}


def kernel_for(profile: str, home: Path) -> Kernel:
    return Kernel.from_profile(profile, store=JsonlStore(home, fsync=False), home=home)


def check(request: Any) -> None:
    assert request.pressure.tokens < request.pressure.effective_window, request.pressure
    assert request_orphans(request) == []


def small_turn(session: Any, n: int) -> Any:
    session.user(f"next step {n}: look at module {n}")
    request = session.prepare_request()
    check(request)
    reply = Message.assistant(f"reading {n}", [ToolCallBlock(f"r{n}", "read_file", {"path": f"m{n}.py"})])
    session.commit_reply(reply, usage=honest(session, request, reply))
    session.tool_result(f"r{n}", "".join(f"line {i} of m{n}.py\n" for i in range(200)))
    request = session.prepare_request()
    check(request)
    reply = Message.assistant(f"module {n} is fine")
    session.commit_reply(reply, usage=honest(session, request, reply))
    session.end_turn()
    return request


@pytest.mark.parametrize("profile", PROFILES)
def test_a_50_mb_tool_result_is_excerpted_and_every_request_fits(tmp_path: Path, profile: str) -> None:
    kernel = kernel_for(profile, tmp_path)
    session = kernel.open_session()
    for n in range(3):
        small_turn(session, n)
    session.user("run the build")
    request = session.prepare_request()
    reply = Message.assistant("building", [ToolCallBlock("big", "shell", {"command": "make"})])
    session.commit_reply(reply, usage=honest(session, request, reply))
    big_seq = session.tool_result("big", BIG)

    request = session.prepare_request()
    check(request)
    window = request.pressure.effective_window
    # the log keeps the result whole; the surface shows no message over the per-message bound
    assert session.events[big_seq].data["message"]["content"][0]["content"] == BIG
    assert all(session.meter.node_tokens(n) <= MAX_MESSAGE_SHARE * window for n in session.surface)
    sent = "\n".join(
        m.text + "".join(b.content for b in m.content if b.type == "tool_result") for m in request.messages
    )
    assert "BUILD FAILED" not in sent or f"item_{big_seq}" in sent  # any part of it shown comes with its pointer
    reply = Message.assistant("the build failed in its last step")
    session.commit_reply(reply, usage=honest(session, request, reply))
    session.end_turn()
    last = None
    for n in range(3, 8):
        last = small_turn(session, n)

    reopened = kernel_for(profile, tmp_path).open_session(session.id)
    for s in (session, reopened):  # the meter's index of large nodes is exactly what a scan finds
        s.meter.surface_tokens()
        assert set(s.meter.large) == {n.seq for n in s.surface if s.meter.node_tokens(n) >= LARGE_NODE_TOKENS}
    assert [n.seq for n in reopened.surface] == [n.seq for n in session.surface]
    assert [n.message.to_dict() for n in reopened.surface] == [n.message.to_dict() for n in session.surface]
    assert reopened.pressure() == session.pressure()
    # the reopened session goes on under the window like the live one would
    assert last is not None
    small_turn(reopened, 8)


def test_basic_excerpts_the_result_and_keeps_the_head_verbatim(tmp_path: Path) -> None:
    kernel = kernel_for("basic", tmp_path)
    session = kernel.open_session()
    for n in range(3):
        small_turn(session, n)
    before = [n.seq for n in session.surface]
    session.user("run the build")
    request = session.prepare_request()
    reply = Message.assistant("building", [ToolCallBlock("big", "shell", {"command": "make"})])
    session.commit_reply(reply, usage=honest(session, request, reply))
    big_seq = session.tool_result("big", BIG)
    request = session.prepare_request()
    # no summary: the excerpt alone brings the request far under the threshold
    assert not [e for e in session.events if e.type == "compaction/summary" and e.data["strategy"] == "basic"]
    assert request.seqs[: len(before)] == before
    excerpts = [e for e in session.events if e.type == "compaction/summary" and e.data["strategy"] == "kernel"]
    assert len(excerpts) == 1 and excerpts[0].data["cites"] == [big_seq]
    shown = request.messages[request.seqs.index(session.surface.nodes[-1].seq)]
    result = shown.tool_result
    assert result is not None and result.call_id == "big" and result.name == "shell"
    assert "HEAD line 0" in result.content and "BUILD FAILED" in result.content
    # the shipped basic profile carries the history tools: the excerpt names the one that reads the rest
    assert f"item_{big_seq}" in result.content and "history_read_item" in result.content
    assert session.meter.count_message(shown) <= excerpt_budget(request.pressure.effective_window)


def test_handoff_pointer_names_the_history_tool(tmp_path: Path) -> None:
    session = kernel_for("handoff", tmp_path).open_session()
    session.user("run the build")
    request = session.prepare_request()
    reply = Message.assistant("building", [ToolCallBlock("big", "shell", {"command": "make"})])
    session.commit_reply(reply, usage=honest(session, request, reply))
    big_seq = session.tool_result("big", BIG[:4_000_000])
    request = session.prepare_request()
    check(request)
    assert f"history_read_item(id='item_{big_seq}'" in "\n".join(m.text + str(m.tool_result) for m in request.messages)


def test_a_reply_with_oversized_tool_arguments_is_excerpted_with_its_results(tmp_path: Path) -> None:
    profile = make_profile(model={"context_window": 20_000, "reserved_output_tokens": 1_000})
    session = build_kernel(tmp_path, strategies=["basic"], profile=profile).open_session()
    session.user("write the file")
    session.prepare_request()
    calls = [
        ToolCallBlock("w", "write_file", {"path": "a.txt", "content": "data " * 30_000}),
        ToolCallBlock("v", "view", {}),
    ]
    session.commit_reply(Message.assistant("writing", calls))
    first = session.tool_result("w", "written")
    session.tool_result("v", "ok")
    request = session.prepare_request()
    check(request)
    excerpt = [m for m in request.messages if m.source.kind == "plugin" and m.source.form == "excerpt"]
    assert len(excerpt) == 1 and f"item_{first - 1}, item_{first}, item_{first + 1}" in excerpt[0].text
    assert not any(m.tool_calls for m in request.messages)  # the call went together with its results


def overflowing_session(tmp_path: Path, strategies: list[str], **basic: Any) -> tuple[Any, int]:
    """Five medium results, none over half the window, together over it (no automatic compaction);
    returns the session and the seq of the largest result."""
    profile = make_profile(
        model={"context_window": 20_000, "reserved_output_tokens": 1_000}, strategies={"basic": basic} if basic else {}
    )
    session = build_kernel(tmp_path, strategies=strategies, profile=profile).open_session()
    session.user("read everything")
    largest = 0
    for i, lines in enumerate([800, 1_200, 900, 1_300, 1_000]):  # lines of 6-7 tokens
        session.prepare_request()
        session.commit_reply(Message.assistant(f"read {i}", [ToolCallBlock(f"c{i}", "read", {"path": f"{i}.txt"})]))
        seq = session.tool_result(f"c{i}", "".join(f"row {j} of {i}\n" for j in range(lines)))
        largest = seq if lines == 1_300 else largest
    return session, largest


def test_an_overflow_no_strategy_could_relieve_excerpts_the_largest_results(tmp_path: Path) -> None:
    # basic with auto off and no overflow retries left: it declines, and the kernel's fallback
    # excerpts the largest results (largest first) until the request fits, then asks for a retry
    session, largest = overflowing_session(tmp_path, ["basic"], auto=False, overflow_retries=0)
    request = session.prepare_request()
    window = request.pressure.effective_window
    assert request.pressure.tokens > window
    error = ContextOverflowError("too long", prompt_tokens=request.pressure.tokens, limit=window)
    assert session.request_failed(error) is True
    excerpted = [
        c
        for e in session.events
        if e.type == "compaction/summary" and e.data["strategy"] == "kernel"
        for c in e.data["cites"]
    ]
    smallest = next(
        e.seq for e in session.events if e.type == "tool/result" and e.data["message"]["content"][0]["call_id"] == "c0"
    )
    assert largest in excerpted and smallest not in excerpted  # largest first, only as many as needed
    request = session.prepare_request(attempt=1)
    check(request)
    # a provider that keeps refusing: each fallback excerpts more, until nothing left is large
    # enough; then the error goes to the harness (no loop)
    answers = []
    while not answers or answers[-1]:
        answers.append(
            session.request_failed(ContextOverflowError("still too long", prompt_tokens=window + 1, limit=window))
        )
        assert len(answers) <= 5
    budget = excerpt_budget(window)
    assert all(session.meter.node_tokens(n) <= 2 * budget for n in session.surface)


def test_a_profile_without_strategies_is_left_unmanaged_on_overflow(tmp_path: Path) -> None:
    # simulate's "none" baseline: only the per-message bound applies
    session, _ = overflowing_session(tmp_path, [])
    request = session.prepare_request()
    window = request.pressure.effective_window
    assert (
        session.request_failed(ContextOverflowError("too long", prompt_tokens=request.pressure.tokens, limit=window))
        is False
    )
    assert not [e for e in session.events if e.type.startswith("compaction/")]


def test_counting_a_huge_text_is_bounded_and_never_undercounts() -> None:
    tokenizer = get_tokenizer()
    assert bounded_count(tokenizer, BIG[:EXACT_COUNT_CHARS]) == tokenizer.count(BIG[:EXACT_COUNT_CHARS])
    estimate = bounded_count(tokenizer, BIG)
    assert estimate >= len(BIG) - EXACT_COUNT_CHARS  # one token per byte beyond the exact part
    sample = BIG[: 3 * EXACT_COUNT_CHARS]
    assert bounded_count(tokenizer, sample) >= tokenizer.count(sample)


@settings(max_examples=200)
@given(st.text(min_size=0, max_size=400), st.integers(min_value=1, max_value=3))
def test_the_estimate_beyond_the_exact_part_is_an_upper_bound(piece: str, repeat: int) -> None:
    # the same rule with a 1,000-character exact part, so each example counts little
    tokenizer = get_tokenizer()
    text = "a" * 993 + piece * repeat * 50
    assert bounded_count(tokenizer, text, exact_chars=1_000) >= tokenizer.count(text)


def test_the_excerpt_budget_is_a_share_of_the_window() -> None:
    assert excerpt_budget(119_808) == int(EXCERPT_SHARE * 119_808) == 7_488
    assert excerpt_budget(2_000) == 256


def test_a_window_too_small_for_the_meter_index_is_scanned_whole(tmp_path: Path) -> None:
    # effective window 900: the bound (450 tokens) is below the meter's large-node index (512), so
    # the kernel looks at every node; a ~480-token result is still excerpted
    profile = make_profile(model={"context_window": 1_000, "reserved_output_tokens": 100})
    session = build_kernel(tmp_path, strategies=[], profile=profile).open_session()
    session.user("read")
    session.prepare_request()
    session.commit_reply(Message.assistant("", [ToolCallBlock("c", "read", {})]))
    seq = session.tool_result("c", "".join(f"row {j}\n" for j in range(120)))
    tokens = session.meter.node_tokens(session.surface.node(seq))
    assert MAX_MESSAGE_SHARE * 900 < tokens < LARGE_NODE_TOKENS
    request = session.prepare_request()
    check(request)
    assert session.surface.nodes[-1].seq != seq and f"item_{seq}" in request.messages[-1].tool_result.content

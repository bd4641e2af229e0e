"""A request header (system prompt and tool schemas) that leaves no room to manage the
conversation is refused up front, naming its size and the smallest window that works: at
``ctxkernel validate`` and on the first request, with nothing written. Never by clipping the
newest tool result (issue 38: Claude Code's 28k-token header at a 48k window)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxkernel import HeaderTooLargeError, Message, ToolCallBlock
from ctxkernel.guard import HEADER_MAX_SHARE, header_refusal, smallest_window
from ctxkernel.testing import build_kernel, make_profile
from ctxkernel.validate import validate_profile

#: a system prompt of ~2,600 tokens: more than half of a 4,000-token window's 3,500 effective
LONG_PROMPT = " ".join(f"rule{i}: always check item {i} before acting." for i in range(330))


def kernel(home: Path, window: int, reserved: int = 500, strategies: list[str] | None = None):
    profile = make_profile(model={"context_window": window, "reserved_output_tokens": reserved})
    profile.profile.system_prompt = LONG_PROMPT
    return build_kernel(home, strategies=strategies or ["basic"], profile=profile)


def stored(home: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def test_the_first_request_is_refused_naming_the_header_and_the_smallest_window(tmp_path: Path) -> None:
    session = kernel(tmp_path, 4_000).open_session()
    session.user("start")
    header = session.request_header().tokens
    assert header > HEADER_MAX_SHARE * 3_500
    before = stored(tmp_path)
    with pytest.raises(HeaderTooLargeError) as caught:
        session.prepare_request()
    error = caught.value
    smallest = smallest_window(header, 500)
    assert error.header_tokens == header and error.smallest_window == smallest
    text = str(error)
    assert f"costs {header} tokens" in text and f"smallest context_window that works is {smallest}" in text
    assert stored(tmp_path) == before  # nothing written
    # at the smallest window that works, the same session runs
    fits = kernel(tmp_path / "fits", smallest).open_session()
    fits.user("start")
    request = fits.prepare_request()
    assert request.pressure.tokens <= request.pressure.effective_window
    assert header_refusal(header, smallest, 500, 0) is None
    assert header_refusal(header, smallest - 1, 500, 0) is not None


def test_a_large_tool_result_is_never_clipped_to_make_room_for_the_header(tmp_path: Path) -> None:
    # before: the session ran, and the newest result was excerpted to fit behind the header
    session = kernel(tmp_path, 4_000).open_session()
    session.user("read the file")
    with pytest.raises(HeaderTooLargeError):
        session.prepare_request()
    assert not [e for e in session.events if e.type.startswith("compaction/")]


def test_an_unmanaged_session_is_not_refused(tmp_path: Path) -> None:
    # nothing manages it (simulate's `none` baseline): there is no room to keep
    profile = make_profile(model={"context_window": 4_000, "reserved_output_tokens": 500})
    profile.profile.system_prompt = LONG_PROMPT
    session = build_kernel(tmp_path, strategies=[], profile=profile).open_session()
    session.user("start")
    session.prepare_request()
    session.commit_reply(Message.assistant("ok", [ToolCallBlock("c1", "read", {"path": "a"})]))


def test_validate_fails_with_the_header_size_and_the_smallest_window(tmp_path: Path) -> None:
    body = (Path(__file__).resolve().parents[2] / "profiles" / "basic.toml").read_text()
    body = body.replace("context_window = 128000", "context_window = 4000").replace(
        "reserved_output_tokens = 8192", "reserved_output_tokens = 500"
    )
    body = body.replace('system_prompt = "You are a helpful coding agent."', f'system_prompt = "{LONG_PROMPT}"')
    path = tmp_path / "tight.toml"
    path.write_text(body)
    report = validate_profile(str(path))
    failures = [c for c in report.checks if c.level == "fail" and c.check == "budgets"]
    assert failures, [(c.check, c.level, c.message) for c in report.checks]
    assert "smallest context_window that works is" in failures[0].message
    assert "costs" in failures[0].message

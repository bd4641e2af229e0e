"""The memos a request reads more than once (``Session.pressure`` and the clear mark of
``guard.excerpt_oversized``) give the answer a fresh computation gives, after every step of a
drawn session: user messages, replies with tool calls, small and oversized results, compactions,
routes with and without a window of their own (one too small for the meter's index of large
nodes, so the bound scans the whole surface), provider usage in and out of the plausible band,
and a changed system prompt. A second session runs the same steps with both memos switched off
(cleared before every read): its surface and every pressure must be the same."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from request_memos_support import assert_steps_match, check_memos, no_memos, step, twin_sessions


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=30))
def test_memoised_answers_equal_fresh_ones_after_every_step(tmp_path_factory: Any, steps: list[Any]) -> None:
    assert_steps_match(twin_sessions(tmp_path_factory, "memo", "fresh"), steps, check_memos, no_memos)

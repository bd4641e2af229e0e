"""History search finds its candidates in bulk (issue 21): every page, its stop and its
scanned_events/scanned_chars are those of the one-event-at-a-time loop it replaced (kept here as
the reference), under tiny page budgets so every bound is reached."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkernel import Message, ToolCallBlock
from ctxkernel.recall import history as H
from ctxkernel.recall.history import History
from ctxkernel.testing import build_kernel


def reference_page(
    history: History,
    query: str | None,
    case_sensitive: bool,
    roles: frozenset[str],
    limit: int,
    per_item: int,
    lo: int,
    hi: int,
    order: str,
) -> dict[str, Any]:
    """The loop history search used before the bulk scan (the specification of a page)."""
    pattern = None if query is None else re.compile(re.escape(query), 0 if case_sensitive else re.IGNORECASE)
    events = history.session.events
    seqs = range(lo, hi + 1) if order == "asc" else range(hi, lo - 1, -1)
    items: list[int] = []
    scanned = chars = preview_used = 0
    stopped_at = None
    for seq in seqs:
        if scanned >= H.SCAN_EVENTS_PER_PAGE or chars >= H.SCAN_CHARS_PER_PAGE or len(items) >= limit:
            stopped_at = seq
            break
        if preview_used >= H.PREVIEW_CHARS_PER_PAGE:
            stopped_at = seq
            break
        event = events[seq]
        scanned += 1
        if history.role_of(event) not in roles:
            continue
        text = history.text_of(event)
        chars += len(text)
        if pattern is None:
            snippet, _ = H._head(text, per_item)
        else:
            found = pattern.search(text)
            if found is None:
                continue
            snippet, _ = H._around(text, found.start(), found.end(), per_item)
        room = H.PREVIEW_CHARS_PER_PAGE - preview_used
        if len(snippet) > room:
            snippet = H._clip_chars(snippet, room)
        preview_used += len(snippet)
        items.append(seq)
    return {"items": items, "scanned_events": scanned, "scanned_chars": chars, "stopped_at": stopped_at}


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    kernel = build_kernel(tmp_path_factory.mktemp("scan"), fsync=False)
    session = kernel.open_session()
    words = ["needle", "Needle", "hay", "stack", "NEEDLE in hay", "x" * 300, ""]
    for n in range(60):
        session.user(f"{words[n % 7]} user {n}")
        session.prepare_request()
        call = ToolCallBlock(f"c{n}", "grep", {"pattern": words[(n + 3) % 7]})
        session.commit_reply(Message.assistant(words[(n + 1) % 7] or "ok", [call]))
        session.tool_result(f"c{n}", (words[(n + 2) % 7] + " result ") * (1 + n % 5))
        session.end_turn()
    return History.for_session(session)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.sampled_from([None, "needle", "Needle", "hay", "absent", "x" * 50, "result"]),
    case_sensitive=st.booleans(),
    roles=st.sets(st.sampled_from(H.ROLES), min_size=1),
    limit=st.integers(1, 12),
    per_item=st.integers(1, 400),
    bounds=st.tuples(st.integers(0, 400), st.integers(0, 400)),
    order=st.sampled_from(["asc", "desc"]),
    budgets=st.tuples(st.integers(1, 80), st.integers(1, 3000), st.integers(1, 2000)),
)
def test_bulk_scan_pages_like_the_one_event_loop(
    history, monkeypatch, query, case_sensitive, roles, limit, per_item, bounds, order, budgets
):
    events, chars, preview = budgets
    monkeypatch.setattr(H, "SCAN_EVENTS_PER_PAGE", events)
    monkeypatch.setattr(H, "SCAN_CHARS_PER_PAGE", chars)
    monkeypatch.setattr(H, "PREVIEW_CHARS_PER_PAGE", preview)
    lo, hi = min(bounds), max(bounds)
    page = history._query(query, case_sensitive, None, sorted(roles), lo, hi, limit, per_item, None, order)
    want = reference_page(
        history, query, case_sensitive, frozenset(roles), limit, per_item, lo, min(hi, history.cursor - 1), order
    )
    assert [item["seq"] for item in page["items"]] == want["items"]
    assert page["scanned_events"] == want["scanned_events"]
    assert page["scanned_chars"] == want["scanned_chars"]
    assert page["has_more"] == (want["stopped_at"] is not None)

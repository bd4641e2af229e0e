"""The inspector's server side: the figures are ``ctxkernel inspect``'s, reads are bounded, ids are
validated, actions are POST-only and CSRF-protected. The pages in a real browser: test_ui_browser.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("starlette", reason="the inspector needs the 'ui' extra")
import ui_support as support
from starlette.testclient import TestClient

from ctxkernel import Message, ToolCallBlock
from ctxkernel import timeline as timeline_index
from ctxkernel.cli import main
from ctxkernel.snapshot import LazyEvents
from ctxkernel.ui import create_app
from ctxkernel.ui.data import MAX_SCAN

REPO = Path(__file__).resolve().parents[2]

LOCAL = "http://127.0.0.1"


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_") and not key.startswith("CTXKERNEL_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # no profile of the repository on the search path


@pytest.fixture(autouse=True)
def reset_logging():
    import structlog

    yield
    structlog.reset_defaults()


@pytest.fixture
def handoff(tmp_path):
    """A handoff session over a small window: window switches, a note, compactions."""
    profile = support.write_profile(
        tmp_path / "profiles", "uitest", tmp_path / "store", ["handoff", "basic"], window=6_000, reserved=1_000
    )
    kernel = support.kernel_for(profile)
    session = kernel.open_session()
    support.model_tool_turn(
        session, 0, "notes_write_file", {"path": "self/notes/plan.md", "content": "the plan " + support.PAYLOAD}
    )
    for n in range(1, 25):
        support.one_turn(session, n)
    return profile, kernel, session


def client(kernel, **kwargs):
    return TestClient(create_app(kernel, **kwargs), base_url=LOCAL)


def inspect_json(capsys, profile, session_id):
    capsys.readouterr()
    assert main(["inspect", session_id, "--profile", str(profile), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_session_view_is_what_inspect_prints(handoff, capsys):
    profile, _, session = handoff
    expected = inspect_json(capsys, profile, session.id)
    # the server opens its own kernel from the profile, as `ctxkernel ui --profile` does
    with TestClient(create_app(str(profile)), base_url=LOCAL) as c:
        view = c.get(f"/api/sessions/{session.id}").json()
        summary = c.get(f"/api/sessions/{session.id}/summary").json()
        rows = c.get("/api/sessions").json()["sessions"]
    assert view == expected
    assert expected["compactions"], "the session was meant to switch windows"
    assert summary["pressure"] == expected["pressure"]
    assert summary["compactions"] == len(expected["compactions"])
    assert summary["windows"] == expected["strategies"]["handoff"]["windows"] > 1
    (row,) = rows
    assert row["id"] == session.id and row["events"] == expected["events"] and row["profile"] == "uitest"
    assert row["last_activity"] == session.events[-1].time


def test_timeline_and_transactions_follow_the_log(handoff):
    _, kernel, session = handoff
    with client(kernel) as c:
        timeline = c.get(f"/api/sessions/{session.id}/timeline").json()
        txns = c.get(f"/api/sessions/{session.id}/transactions").json()["transactions"]
    replies = [e for e in session.events if e.type == "assistant/message"]
    assert [r["seq"] for r in timeline["requests"]] == [e.seq for e in replies]
    assert [r["tokens"] for r in timeline["requests"]] == [e.data["usage"]["input_tokens"] for e in replies]
    assert timeline["effective_window"] == 5_000
    assert {"strategy": "basic", "setting": "threshold_ratio", "ratio": 0.8} in timeline["thresholds"]
    summaries = [e for e in session.events if e.type == "compaction/summary"]
    windows = [m for m in timeline["markers"] if m["kind"] == "window"]
    assert [m["seq"] for m in windows] == [e.seq for e in summaries if e.data["kind"] == "window"]
    assert {t["summary_seq"] for t in txns if t["outcome"] == "committed"} == {e.seq for e in summaries}
    ends = {e.data["compaction_id"]: e for e in session.events if e.type == "compaction/end"}
    for t in txns:
        assert t["end"] == ends[t["id"]].seq
        assert t["outcome"] == (
            "failed" if ends[t["id"]].data.get("error") else "committed" if t["summary_seq"] else "empty"
        )


def basic_session_of_30_turns(tmp_path):
    """A ``basic`` session past its first snapshot (30 turns in a 6k window), and its profile."""
    profile = support.write_profile(
        tmp_path / "profiles", "basicui", tmp_path / "store", ["basic"], window=6_000, reserved=1_000
    )
    session = support.kernel_for(profile).open_session()
    for n in range(30):
        support.one_turn(session, n)
    return profile, session


def test_first_view_reads_nothing_before_the_snapshot(tmp_path):
    """Regression (issue 21): the timeline and the transactions were folded from every event at
    the first view, which read the whole history of a session the kernel had opened from its
    snapshot. Now they come from the snapshot's timeline index and the tail. (``basic`` alone:
    handoff's panel reads the receipts of its last windows from the log.)"""
    profile, session = basic_session_of_30_turns(tmp_path)
    app = create_app(support.kernel_for(profile))
    with TestClient(app, base_url=LOCAL) as c:
        answers = {p: c.get(f"/api/sessions/{session.id}{p}").json() for p in ("", "/timeline", "/transactions")}
        opened = app.state.inspector.open(session.id)
    assert isinstance(opened.session.events, LazyEvents) and opened.session.events.loaded == 0
    replies = [e.seq for e in session.events if e.type == "assistant/message"]
    timeline = answers["/timeline"]
    assert [p["seq"] for p in timeline["requests"]] == replies
    assert timeline["request_count"] == len(replies) and timeline["width"] == 1
    assert len(answers["/transactions"]["transactions"]) == len(answers[""]["compactions"]) > 0


def test_log_pages_the_open_session_holds_are_not_read_again(tmp_path):
    """The open session parsed the tail after its snapshot: the first view's last log page comes
    from it (no store read), the same rows a fresh inspector reads from the store. The events of a
    page before the snapshot, or past what the session has folded, are still one bounded store
    read, and never make the session load its history."""
    profile, session = basic_session_of_30_turns(tmp_path)
    app, fresh = create_app(support.kernel_for(profile)), create_app(support.kernel_for(profile))
    stats = app.state.inspector.stats
    with TestClient(app, base_url=LOCAL) as c, TestClient(fresh, base_url=LOCAL) as f:

        def page(client, **params):
            return client.get(f"/api/sessions/{session.id}/log", params=params).json()

        c.get(f"/api/sessions/{session.id}")
        events = app.state.inspector.open(session.id).session.events
        assert isinstance(events, LazyEvents) and 100 < events.base < len(events) - 20
        read = stats["events_read"]
        assert page(c, limit=20) == page(f, limit=20)
        assert page(c, start=events.base, limit=20) == page(f, start=events.base, limit=20)
        assert stats["events_read"] == read, "rows the open session holds are not read from the store"
        # a page across the snapshot reads only the events before it from the store
        assert page(c, start=events.base - 10, limit=20) == page(f, start=events.base - 10, limit=20)
        assert stats["events_read"] == read + 10 and events.loaded == 0
        assert page(c, start=events.base - 40, limit=20) == page(f, start=events.base - 40, limit=20)
        assert stats["events_read"] == read + 30 and events.loaded == 0
        for start in range(events.base - 45, len(events) + 5, 11):  # any page equals the store's
            for limit in (1, 7, 50):
                assert page(c, start=start, limit=limit) == page(f, start=start, limit=limit)
        support.one_turn(session, 99)  # another writer; the inspector has not refreshed yet
        assert page(c, limit=20) == page(f, limit=20)
        assert page(c, limit=20)["rows"][-1]["seq"] == len(session.events) - 1
    assert stats["opens"] == 1


def test_a_long_sessions_timeline_is_bounded(handoff):
    _, kernel, session = handoff
    with mock.patch.object(timeline_index, "MAX_POINTS", 4), client(kernel) as c:
        timeline = c.get(f"/api/sessions/{session.id}/timeline").json()
    replies = [e for e in session.events if e.type == "assistant/message"]
    points = timeline["requests"]
    assert 2 <= len(points) <= 4 and timeline["request_count"] == sum(p["count"] for p in points) == len(replies)
    assert timeline["width"] > 1 and timeline["measured"] == len(replies)
    for point in points:
        inside = [e.data["usage"]["input_tokens"] for e in replies if point["seq"] <= e.seq <= point["last_seq"]]
        assert (point["tokens"], point["tokens_min"], point["count"]) == (max(inside), min(inside), len(inside))


def test_surface_is_the_models_view(handoff):
    _, kernel, session = handoff
    with client(kernel) as c:
        surface = c.get(f"/api/sessions/{session.id}/surface").json()
    nodes = session.surface.nodes
    assert [n["seq"] for n in surface["nodes"]] == [n.seq for n in nodes]
    assert [n["role"] for n in surface["nodes"]] == [n.role for n in nodes]
    assert [n["tokens"] for n in surface["nodes"]] == [session.meter.node_tokens(n) for n in nodes]
    assert surface["tokens"] == session.meter.surface_tokens()
    replaced = [n for n in surface["nodes"] if n["replaces"]]
    assert replaced, "a window switch leaves a replacement on the surface"
    for item in replaced:
        op = session.events[item["seq"]].surface
        assert (item["replaces"]["first"], item["replaces"]["last"], item["replaces"]["count"]) == (
            op["cites"][0],
            op["cites"][-1],
            len(op["cites"]),
        )


def test_live_session_is_refreshed_not_reopened(handoff):
    _, kernel, session = handoff
    app = create_app(kernel)
    with TestClient(app, base_url=LOCAL) as c:
        before = c.get(f"/api/sessions/{session.id}").json()["events"]
        stats = app.state.inspector.stats
        assert stats["opens"] == 1
        read = stats["events_read"]
        support.one_turn(session, 99)
        assert c.get(f"/api/sessions/{session.id}/head").json()["events"] == len(session.events)
        after = c.get(f"/api/sessions/{session.id}").json()
        timeline = c.get(f"/api/sessions/{session.id}/timeline").json()
    assert after["events"] == len(session.events) > before
    assert stats["opens"] == 1, "the open session is refreshed, not replayed again"
    assert stats["events_read"] - read == len(session.events) - before, "only the new events were read"
    assert timeline["requests"][-1]["seq"] == [e.seq for e in session.events if e.type == "assistant/message"][-1]


def test_the_pages_first_requests_at_once_open_the_session_once(handoff):
    """The session page sends its first four requests at once (ui.js, loadAll): they wait for one
    open of the session instead of each replaying it (each used to open it: four opens)."""
    import asyncio
    import time

    import httpx

    _, kernel, session = handoff
    app = create_app(kernel)
    real_open = kernel.open_session

    def slow_open(*args, **kwargs):
        time.sleep(0.2)  # every request is inside the inspector before the first open ends
        return real_open(*args, **kwargs)

    async def first_view():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=LOCAL) as c:
            paths = ("", "/timeline", "/surface", "/transactions")
            return await asyncio.gather(*(c.get(f"/api/sessions/{session.id}{p}") for p in paths))

    with mock.patch.object(kernel, "open_session", side_effect=slow_open) as opens:
        answers = asyncio.run(first_view())
    assert [r.status_code for r in answers] == [200] * 4
    assert opens.call_count == 1 and app.state.inspector.stats["opens"] == 1
    assert {r.json()["events"] for r in (answers[0], answers[1], answers[2])} == {len(session.events)}


def big_log(store, session_id: str, events: int) -> None:
    """A valid log of ``events`` events written straight to the store (turns of a user message
    and a reply), in large batches: cheap to build, and replayable."""
    from ctxkernel.events import Event
    from ctxkernel.store.base import SessionHeader

    store.create(SessionHeader(id=session_id, created="2026-01-01T00:00:00.000Z", profile="big"))
    batch, seq, turn = [], 0, 0
    while seq < events:
        turn += 1
        for type_, data, op in (
            ("turn/start", {"turn": turn}, None),
            (
                "user/message",
                {"message": {"role": "user", "content": [{"type": "text", "text": f"question {turn}"}]}},
                {"op": "append"},
            ),
            (
                "assistant/message",
                {"message": {"role": "assistant", "content": [{"type": "text", "text": f"answer {turn}"}]}},
                {"op": "append"},
            ),
            ("turn/end", {"turn": turn, "reason": "completed"}, None),
        ):
            batch.append(Event(seq, type_, data, "2026-01-01T00:00:00.000Z", op))
            seq += 1
        if len(batch) >= 10_000:
            store.append(session_id, batch, seq - len(batch))
            batch = []
    if batch:
        store.append(session_id, batch, seq - len(batch))


def test_log_pages_read_only_the_page(tmp_path):
    from ctxkernel.testing import build_kernel

    kernel = build_kernel(tmp_path / "big", strategies=["basic"])
    big_log(kernel.store, "big", 100_000)
    total = kernel.store.next_seq("big")
    assert total == 100_000
    app = create_app(kernel)
    stats = app.state.inspector.stats
    with TestClient(app, base_url=LOCAL) as c:
        last = c.get("/api/sessions/big/log").json()
        assert stats == {"opens": 0, "events_read": 100}
        assert [r["seq"] for r in last["rows"]] == list(range(total - 100, total)) and last["next"] is None
        page = c.get("/api/sessions/big/log", params={"start": 50_000, "limit": 25}).json()
        assert [r["seq"] for r in page["rows"]] == list(range(50_000, 50_025))
        assert (page["previous"], page["next"]) == (49_975, 50_025)
        assert stats["events_read"] == 125
        # a filter scans at most MAX_SCAN events and says where to go on
        filtered = c.get("/api/sessions/big/log", params={"type": "turn/end", "limit": 5, "start": 1_000}).json()
        assert [r["seq"] for r in filtered["rows"]] == [1_003, 1_007, 1_011, 1_015, 1_019]
        assert filtered["next"] == 1_020 and stats["events_read"] - 125 <= 25
        sparse = c.get("/api/sessions/big/log", params={"type": "compaction/", "limit": 5}).json()
        assert sparse["rows"] == [] and sparse["end"] == MAX_SCAN and sparse["next"] == MAX_SCAN
        assert stats["events_read"] - 125 - 25 <= MAX_SCAN
        one = c.get("/api/sessions/big/events/77777").json()
        assert one["seq"] == 77_777
        # a page's rows are folded: their data comes with the one event, when a row is opened
        row = c.get("/api/sessions/big/log", params={"start": 77_777, "limit": 1}).json()["rows"][0]
        assert "data" not in row and {**row, "data": one["data"]} == one
        question = json.loads(one["data"]["text"])["message"]["content"][0]["text"]
        assert question.startswith("question ") and row["preview"] == question
        rows = c.get("/api/sessions").json()["sessions"]
        assert rows == [
            {
                "id": "big",
                "profile": "big",
                "origin": None,
                "parent": None,
                "created": "2026-01-01T00:00:00.000Z",
                "events": total,
                "last_activity": "2026-01-01T00:00:00.000Z",
            }
        ]
        assert stats["opens"] == 0, "listing sessions and paging the log never replay a session"
        assert stats["events_read"] <= 125 + 25 + MAX_SCAN + 2


def test_session_ids_are_validated(handoff):
    _, kernel, session = handoff
    with client(kernel) as c:
        # a slash, even escaped, never reaches a session route
        assert c.get("/api/sessions/a%2F..%2Fb").status_code == 404
        for bad in ("a b", "-x", "x" * 200, "%2e%2e", ".hidden", "a%00b"):
            for path in (
                f"/api/sessions/{bad}",
                f"/api/sessions/{bad}/log",
                f"/api/sessions/{bad}/head",
                f"/api/sessions/{bad}/surface",
            ):
                r = c.get(path)
                assert r.status_code == 400, (path, r.status_code)
                assert "invalid session id" in r.json()["error"]
        assert c.get("/sessions/a%20b").status_code == 400
        assert c.get("/sessions/nosuch").status_code == 404
        assert c.get("/api/sessions/nosuch").json() == {"error": "no session 'nosuch' in the jsonl store"}
        r = c.get(f"/api/sessions/{session.id}/log", params={"limit": "lots"})
        assert r.status_code == 400 and "limit" in r.json()["error"]
        assert c.get(f"/api/sessions/{session.id}/log", params={"limit": 100_000}).status_code == 400


def test_only_local_hosts_are_answered(handoff):
    _, kernel, _ = handoff
    with client(kernel) as c:
        assert c.get("/", headers={"Host": "attacker.example"}).status_code == 400
        assert c.get("/", headers={"Host": "localhost:8788"}).status_code == 200


def test_pages_escape_and_forbid_inline_script(handoff):
    _, kernel, session = handoff
    with client(kernel) as c:
        page = c.get(f"/sessions/{session.id}")
        surface = c.get(f"/api/sessions/{session.id}/surface")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    # session content travels as JSON strings, never as markup in the page
    assert "<script>window" not in page.text
    assert surface.headers["content-type"] == "application/json"


def test_actions_are_off_by_default(handoff):
    _, kernel, session = handoff
    with client(kernel) as c:
        c.get("/")
        token = c.app.state.csrf_token
        r = c.post(f"/api/sessions/{session.id}/actions/compact", headers={"X-CSRF-Token": token})
    assert r.status_code == 403 and "--allow-actions" in r.json()["error"]


def test_actions_need_post_token_and_same_origin(handoff):
    _, kernel, session = handoff
    events = kernel.store.next_seq(session.id)
    with client(kernel, allow_actions=True) as c:
        url = f"/api/sessions/{session.id}/actions/compact"
        assert c.get(url).status_code == 405
        # no cookie yet, no token
        assert c.post(url).status_code == 403
        page = c.get("/")
        token = c.app.state.csrf_token
        cookie = page.cookies.get("ctxkernel_csrf")
        assert cookie == token
        assert "samesite=strict" in page.headers["set-cookie"].lower()
        assert c.post(url, headers={"X-CSRF-Token": "wrong"}).status_code == 403
        assert c.post(url, headers={"X-CSRF-Token": token, "Origin": "https://attacker.example"}).status_code == 403
        assert c.post(url, headers={"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert kernel.store.next_seq(session.id) == events, "refused actions write nothing"
        listing = c.get(f"/api/sessions/{session.id}/actions").json()
        assert listing["actions"]["compact"] == {"available": True, "strategies": ["handoff", "basic"]}
        assert listing["strategies"] == [{"name": "handoff", "enabled": True}, {"name": "basic", "enabled": True}]
        r = c.post(url, headers={"X-CSRF-Token": token, "Origin": LOCAL})
        assert r.status_code == 200, r.text
        done = r.json()
    assert done["strategy"] == "handoff" and done["ok"] is True and done["events_written"] > 0
    session.refresh()
    last = [e for e in session.events if e.type == "compaction/summary"][-1]
    assert last.data["strategy"] == "handoff"
    assert kernel.store.next_seq(session.id) == events + done["events_written"]


def test_the_timeline_draws_no_thresholds_of_a_strategy_disabled_for_the_session(handoff):
    _, kernel, session = handoff
    with client(kernel) as c:
        before = c.get(f"/api/sessions/{session.id}/timeline").json()["thresholds"]
    assert {t["strategy"] for t in before} == {"basic"}
    assert session.set_strategy_enabled("basic", False)
    with client(kernel) as c:
        after = c.get(f"/api/sessions/{session.id}/timeline").json()["thresholds"]
    assert after == []


def test_strategy_toggle_is_logged_for_the_session_and_csrf_protected(handoff):
    _, kernel, session = handoff
    events = kernel.store.next_seq(session.id)
    with client(kernel, allow_actions=True) as c:
        url = f"/api/sessions/{session.id}/strategies/handoff/disable"
        assert c.post(url).status_code == 403  # no token
        c.get("/")
        token = c.app.state.csrf_token
        assert c.post(url, headers={"X-CSRF-Token": token, "Origin": "https://attacker.example"}).status_code == 403
        assert c.post(url, headers={"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert c.post(url, headers={"X-CSRF-Token": "forged", "Origin": LOCAL}).status_code == 403
        bad = c.post(f"/api/sessions/{session.id}/strategies/decay/disable", headers={"X-CSRF-Token": token})
        assert bad.status_code == 400 and "not in profile" in bad.json()["error"]
        odd = c.post(f"/api/sessions/{session.id}/strategies/Bad%20Name/disable", headers={"X-CSRF-Token": token})
        assert odd.status_code == 400 and "strategy names" in odd.json()["error"]
        assert (
            c.post(f"/api/sessions/{session.id}/strategies/handoff/drop", headers={"X-CSRF-Token": token}).status_code
            == 404
        )
        assert kernel.store.next_seq(session.id) == events, "refused toggles write nothing"
        r = c.post(url, headers={"X-CSRF-Token": token, "Origin": LOCAL})
        assert r.status_code == 200, r.text
        assert r.json()["changed"] is True and r.json()["events_written"] == 1
        listing = c.get(f"/api/sessions/{session.id}/actions").json()
        assert listing["strategies"][0] == {"name": "handoff", "enabled": False}
        assert listing["actions"]["compact"]["strategies"] == ["basic"]
    session.refresh()
    assert session.events[-1].type == "session/strategy"
    assert session.events[-1].data == {"strategy": "handoff", "enabled": False, "by": "ui"}
    assert not session.strategy_enabled("handoff")


def test_compare_page_reads_reports_only_under_its_roots(tmp_path, capsys):
    report = tmp_path / "reports" / "r.json"
    report.parent.mkdir()
    capsys.readouterr()
    assert (
        main(["simulate", "--workload", "chat-short", "--profile", "basic", "--format", "json", "--no-progress"]) == 0
    )
    report.write_text(capsys.readouterr().out)
    outside = tmp_path / "elsewhere.json"
    outside.write_text(report.read_text())
    from ctxkernel import Kernel

    kernel = Kernel.from_profile(None)
    with TestClient(create_app(kernel, read_roots=[tmp_path / "reports"]), base_url=LOCAL) as c:
        ok = c.get("/simulate", params={"report": str(report)})
        refused = c.get("/simulate", params={"report": str(outside)})
        dotted = c.get("/simulate", params={"report": str(tmp_path / "reports" / ".." / "elsewhere.json")})
        missing = c.get("/simulate", params={"report": "nope.json"})
    assert ok.status_code == 200 and 'class="profile"' in ok.text and 'id="metrics"' in ok.text
    for r in (refused, dotted):
        assert "outside the directories this server reads" in r.text and 'id="metrics"' not in r.text
    assert "is not a file" in missing.text


def test_compare_replay_is_a_protected_post(tmp_path):
    from ctxkernel import Kernel

    kernel = Kernel.from_profile(None)
    with TestClient(create_app(kernel), base_url=LOCAL) as c:
        c.get("/simulate")
        token = c.app.state.csrf_token
        refused = c.post("/simulate", data={"workload": "chat-short", "profiles": "basic"})
        assert refused.status_code == 403
        r = c.post(
            "/simulate", data={"workload": "chat-short", "profiles": "basic", "csrf": token}, follow_redirects=False
        )
        assert r.status_code == 303 and "/simulate?job=" in r.headers["location"]
        page = c.get(r.headers["location"])
        bad = c.post("/simulate", data={"workload": "nope", "profiles": "basic", "csrf": token})
    assert 'class="profile"' in page.text and "chat-short" in page.text
    assert bad.status_code == 400 and "unknown workload" in bad.text


def test_compare_replay_reads_profile_files_only_under_its_roots(tmp_path):
    # the profiles field took any path: it loaded a profile from anywhere, and its error told
    # whether a file existed outside the roots
    from ctxkernel import Kernel

    roots = tmp_path / "reports"
    roots.mkdir()
    inside, outside = roots / "mine.toml", tmp_path / "theirs.toml"
    for path in (inside, outside):
        path.write_text('[profile]\nstrategies = ["basic"]\n')
    kernel = Kernel.from_profile(None)
    with TestClient(create_app(kernel, read_roots=[roots]), base_url=LOCAL) as c:
        c.get("/simulate")
        token = c.app.state.csrf_token

        def replay(profiles: str):
            data = {"workload": "chat-short", "profiles": profiles, "csrf": token}
            return c.post("/simulate", data=data, follow_redirects=False)

        answers = {p: replay(p) for p in (str(outside), str(tmp_path / "absent.toml"), "../theirs.toml")}
        ok = replay(f"basic,{inside}")
    for profiles, answer in answers.items():
        assert answer.status_code == 400, profiles
        assert "outside the directories this server reads" in answer.text, profiles
        assert "does not exist" not in answer.text and "no profile named" not in answer.text
    assert ok.status_code == 303


def test_ui_command_needs_a_profile(capsys):
    assert main(["ui"]) == 2
    assert "--profile" in capsys.readouterr().err
    assert main(["ui", "--profile", "no-such-profile-here"]) == 2
    assert "no-such-profile-here" in capsys.readouterr().err


def test_docs_list_every_api_route_and_option():
    from starlette.routing import Route

    from ctxkernel.cli import build_parser

    text = (REPO / "docs" / "ui.md").read_text()
    app = create_app(support.kernel_for(support.write_profile(Path.cwd() / "p", "docs", Path.cwd() / "s", ["basic"])))
    api = [r for r in app.routes if isinstance(r, Route) and r.path.startswith("/api")]
    assert api
    for route in api:
        path = route.path.replace("{session_id}", "{id}")
        for method in sorted(route.methods - {"HEAD"}):
            assert f"`{method} {path}`" in text or f"`{method} {path}?" in text, (
                f"docs/ui.md does not list {method} {path}"
            )
    sub = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "ui")[1]
    for action in sub._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert f"`{option}" in text, f"docs/ui.md does not explain {option}"
    for image in ("sessions", "session", "compare", "chapters-panel"):
        assert f"(ui/{image}.png)" in text and (REPO / "docs" / "ui" / f"{image}.png").exists()


def test_surface_shows_decay_anchors_as_the_decay_panel_has_them(tmp_path):
    profile = support.write_profile(tmp_path / "profiles", "decaytest", tmp_path / "store", ["decay", "basic"])
    kernel = support.kernel_for(profile)
    session = kernel.open_session()
    for n in range(6):
        support.one_turn(session, n)
    # the model compresses its oldest messages into a block (decay's tool, as a model calls it)
    anchors = [p["anchor"] for p in reversed(session.project()["strategies"]["decay"]["positions"]) if p["anchor"]]
    span = {"from": anchors[1], "to": anchors[8], "summary": "early work " + support.PAYLOAD, "topic": "setup"}
    outcome = support.model_tool_turn(session, 7, "compress", {"spans": [span]})
    assert not outcome.is_error, outcome.content
    with client(kernel) as c:
        surface = c.get(f"/api/sessions/{session.id}/surface").json()
        panel = c.get(f"/api/sessions/{session.id}").json()["strategies"]["decay"]
    positions = {p["seq"]: p for p in panel["positions"]}
    assert positions and len(positions) == len(surface["nodes"])
    for node in surface["nodes"]:
        assert node["decay"]["anchor"] == positions[node["seq"]]["anchor"]
        assert node["decay"]["kind"] == positions[node["seq"]]["kind"]
    assert any(node["decay"]["anchor"] for node in surface["nodes"])
    (block,) = panel["blocks"]
    (shown,) = [node for node in surface["nodes"] if node["seq"] == block["seq"]]
    assert shown["decay"]["tier"] == block["tier"] and shown["decay"]["kind"] == "block"
    assert shown["replaces"]["count"] == block["sources"]


@pytest.fixture(params=["sqlite", "postgres"])
def row_store_profile(request, tmp_path):
    """A profile on the sqlite store, or on a throwaway PostgreSQL schema."""
    if request.param == "postgres":
        from ctxkernel.testing.store import postgres_dsn, postgres_schema

        with postgres_schema(postgres_dsn()) as dsn:
            yield support.write_profile(
                tmp_path / "p",
                "rows",
                tmp_path / "store",
                ["handoff", "basic"],
                window=6_000,
                reserved=1_000,
                backend="postgres",
                dsn=dsn,
            )
        return
    yield support.write_profile(
        tmp_path / "p", "rows", tmp_path / "store", ["handoff", "basic"], window=6_000, reserved=1_000, backend="sqlite"
    )


def test_database_stores_serve_the_same_figures_and_bounded_pages(row_store_profile, capsys):
    kernel = support.kernel_for(row_store_profile)
    assert kernel.store.backend in ("sqlite", "postgres")
    session = kernel.open_session()
    while not session.surface.hides_anything():  # until the first window switch
        support.one_turn(session, len(session.events))
    expected = inspect_json(capsys, row_store_profile, session.id)
    app = create_app(str(row_store_profile))
    stats = app.state.inspector.stats
    with TestClient(app, base_url=LOCAL) as c:
        page = c.get(f"/api/sessions/{session.id}/log", params={"start": 10, "limit": 7}).json()
        assert [r["seq"] for r in page["rows"]] == list(range(10, 17)) and stats["events_read"] == 7
        assert c.get(f"/api/sessions/{session.id}").json() == expected
    assert expected["compactions"]


def test_an_unreadable_session_is_listed_with_the_reason(handoff):
    _, kernel, session = handoff
    broken = kernel.store.sessions_dir / "broken.jsonl"
    broken.write_text('{"format_version": 99, "id": "broken"}\n')
    with client(kernel) as c:
        rows = {r["id"]: r for r in c.get("/api/sessions").json()["sessions"]}
        view = c.get("/api/sessions/broken")
    assert rows[session.id]["events"] == len(session.events)
    assert "format_version" in rows["broken"]["error"]
    assert view.status_code == 500 and "format_version" in view.json()["error"]


def test_create_app_takes_the_kernel_by_keyword_as_serve_mounts_it(handoff):
    _, kernel, session = handoff
    with pytest.raises(TypeError, match="needs a Kernel"):
        create_app()
    with TestClient(create_app(kernel=kernel), base_url=LOCAL) as c:
        assert c.get(f"/api/sessions/{session.id}/head").json() == {"events": len(session.events)}


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes: what "nothing was written" is checked against."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("strategies", [["basic"], ["decay"], ["handoff", "basic"], ["rollover"], ["chapters"]])
def test_inspecting_a_session_with_waiting_calls_writes_nothing(tmp_path, capsys, strategies):
    """A live proxy's session waits for the client's tool results; `inspect` and the ui only read:
    opening it must not close the waiting calls (crash repair) nor write anything else."""
    profile = support.write_profile(tmp_path / "profiles", "waiting", tmp_path / "store", strategies)
    kernel = support.kernel_for(profile)
    session = kernel.open_session()
    support.one_turn(session, 0)
    session.user("step 1: read two files")
    request = session.prepare_request()
    calls = [ToolCallBlock("w1", "read_file", {"path": "a.py"}), ToolCallBlock("w2", "read_file", {"path": "b.py"})]
    reply = Message.assistant("reading", calls)
    session.commit_reply(reply, usage=support.usage(session, request, reply))
    session.tool_result("w1", "first file")  # w2 still waits, as it does while the client runs it
    assert session.surface.pending_calls
    before = _tree(tmp_path / "store")

    view = inspect_json(capsys, profile, session.id)
    assert _tree(tmp_path / "store") == before, "ctxkernel inspect wrote to the store"
    assert view["events"] == len(session.events)
    with TestClient(create_app(str(profile)), base_url=LOCAL) as c:
        for path in ("", "/summary", "/surface", "/timeline", "/transactions", "/log", "/head", "/events/0"):
            assert c.get(f"/api/sessions/{session.id}{path}").status_code == 200, path
        for page in ("/", f"/sessions/{session.id}", "/api/sessions"):
            assert c.get(page).status_code == 200, page
    assert _tree(tmp_path / "store") == before, "the inspector wrote to the store"

    # the session goes on where it was: the client's result for the waiting call is accepted
    session.tool_result("w2", "second file")
    assert not session.surface.pending_calls


def test_json_is_bytes_from_orjson_and_a_value_it_refuses_is_still_exact():
    from hypothesis import given
    from hypothesis import strategies as st

    from ctxkernel.ui.app import json_bytes

    # what a strategy's panel may hold: any JSON value, integer keys, integers past 64 bits
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
    values = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    )

    @given(values)
    def round_trips(value):
        assert json.loads(json_bytes(value)) == value

    round_trips()
    assert json.loads(json_bytes({"big": 2**70, "list": [-(2**80)]})) == {"big": 2**70, "list": [-(2**80)]}
    assert json.loads(json_bytes({1: "a"})) == {"1": "a"}
    with pytest.raises(TypeError):
        json_bytes({"not json": object()})


def test_page_templates_are_compiled_once_for_every_app(handoff):
    from jinja2 import Environment

    _, kernel, session = handoff
    with client(kernel) as c:
        assert c.get(f"/sessions/{session.id}").status_code == 200
    # a second app (as each `ctxkernel serve` mount or test makes) renders without compiling again
    with mock.patch.object(Environment, "compile", side_effect=AssertionError("compiled again")), client(kernel) as c:
        page = c.get(f"/sessions/{session.id}")
    assert page.status_code == 200 and session.id in page.text


def test_a_csrf_token_of_any_characters_is_refused_not_a_server_error(handoff):
    # hmac.compare_digest raises TypeError on non-ASCII text: a header or cookie decoded from
    # latin-1 bytes answered 500 instead of the refusal
    _, kernel, session = handoff
    events = kernel.store.next_seq(session.id)
    with client(kernel, allow_actions=True) as c:
        c.get("/")
        token = c.app.state.csrf_token
        url = f"/api/sessions/{session.id}/actions/compact"
        odd = "jeton-\xe9".encode("latin-1")
        answers = [
            c.post(url, headers={"X-CSRF-Token": odd}),
            c.post(url, headers={"X-CSRF-Token": token, "Cookie": b"ctxkernel_csrf=" + odd}),
            c.post("/simulate", data={"workload": "chat-short", "csrf": "jeton-\u00e9\u4e2d"}),
        ]
    for r in answers:
        assert r.status_code == 403, r.text
        assert "CSRF token" in r.json()["error"]
    assert kernel.store.next_seq(session.id) == events


def test_compare_paths_the_system_cannot_look_up_are_refused_not_a_server_error(tmp_path):
    # a name past the file system's limit made is_file() raise (ENAMETOOLONG is not one of the
    # errors pathlib ignores): the report, the transcript and a profile path each answered 500
    from ctxkernel import Kernel

    long = "a" * 300
    kernel = Kernel.from_profile(None)
    with TestClient(create_app(kernel), base_url=LOCAL) as c:
        c.get("/simulate")
        token = c.app.state.csrf_token
        report = c.get("/simulate", params={"report": long})
        transcript = c.post("/simulate", data={"transcript": long, "csrf": token})
        profile = c.post("/simulate", data={"workload": "chat-short", "profiles": f"basic,{long}.toml", "csrf": token})
    assert report.status_code == 200 and "cannot be read" in report.text
    for r in (transcript, profile):
        assert r.status_code == 400 and "cannot be read" in r.text, r.text[-500:]


def test_a_report_with_a_figure_too_large_to_draw_is_refused(tmp_path):
    # 1.7e308 passed the report check; the chart's scale (5% above the peak) overflowed to
    # infinity and the page answered 500
    from ctxkernel import Kernel

    answers = {}
    kernel = Kernel.from_profile(None)
    with TestClient(create_app(kernel, read_roots=[tmp_path]), base_url=LOCAL) as c:
        for name, profile in {
            "peak": {"profile": "basic", "prompt_tokens": [100, 1.7e308]},
            "window": {"profile": "basic", "prompt_tokens": [100], "effective_window": 1.7e308},
            "negative": {"profile": "basic", "prompt_tokens": [-5]},
        }.items():
            (tmp_path / f"{name}.json").write_text(json.dumps({"source": {}, "profiles": [profile]}))
            answers[name] = c.get("/simulate", params={"report": f"{name}.json"})
    for name, r in answers.items():
        assert r.status_code == 200, (name, r.text[-300:])
        assert "must be a list of numbers from 0 to" in r.text or "must be a number from 0 to" in r.text, name
        assert 'id="chart"' not in r.text

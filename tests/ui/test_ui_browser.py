"""The inspector's pages in headless Chromium (Playwright driving the system browser).

Each test starts ``ctxkernel ui`` as its own process over a store the test writes, loads the pages,
checks the figures shown against ``ctxkernel inspect --json``, watches the page follow events the
test appends, and checks that hostile session content is shown as text and never runs. Screenshots
go to the test's tmp dir (``screenshots/``); set ``CTXKERNEL_UI_SCREENSHOTS=DIR`` to copy them there
(docs/ui/ holds a few).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ui_support as support

pytest.importorskip("starlette", reason="the inspector needs the 'ui' extra")
playwright = pytest.importorskip("playwright.sync_api", reason="browser tests need playwright (requirements-dev.txt)")


BROWSERS = ("chromium", "chromium-browser", "google-chrome")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
#: every element and attribute a hostile message could have smuggled in, checked in the live DOM
DOM_CHECK = """() => {
  const bad = [];
  for (const node of document.querySelectorAll('*')) {
    for (const attr of node.attributes) {
      if (attr.name.startsWith('on')) bad.push(`${node.tagName} ${attr.name}`);
      if (/^\\s*javascript:/i.test(attr.value) && ['href', 'src', 'action', 'xlink:href'].includes(attr.name)) bad.push(`${node.tagName} ${attr.name}=${attr.value}`);
    }
  }
  const scripts = [...document.scripts].map((s) => s.src);
  return {bad, scripts, images: document.images.length, pwned: window.__pwned === undefined ? null : String(window.__pwned)};
}"""


def chromium() -> str | None:
    found = os.environ.get("CTXKERNEL_TEST_CHROMIUM")
    if found and Path(found).exists():
        return found
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_") and key not in ("CTXKERNEL_TEST_CHROMIUM", "CTXKERNEL_UI_SCREENSHOTS"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def browser(tmp_path):
    path = chromium()
    if path is None:
        pytest.skip(
            "no Chromium: scripts/test-services.sh installs Debian's chromium and exports CTXKERNEL_TEST_CHROMIUM"
        )
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=ARGS)
        try:
            yield b
        finally:
            b.close()


class Shots:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.copy_to = os.environ.get("CTXKERNEL_UI_SCREENSHOTS")

    def take(self, page, name: str, **kwargs) -> Path:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path), **kwargs)
        assert path.stat().st_size > 5_000, f"screenshot {name} is (nearly) empty"
        if self.copy_to:  # for the docs: the first screenful only, to keep the files small
            Path(self.copy_to).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(self.copy_to) / path.name))
        return path

    def element(self, locator, name: str) -> Path:
        path = self.folder / f"{name}.png"
        locator.screenshot(path=str(path))
        if self.copy_to:
            shutil.copy(path, Path(self.copy_to) / path.name)
        return path


@pytest.fixture
def shots(tmp_path):
    return Shots(tmp_path / "screenshots")


def open_page(browser, base: str):
    """A page that may talk to the inspector only: anything else is aborted and recorded."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    record = {"dialogs": [], "errors": [], "outside": []}
    page.on("dialog", lambda d: (record["dialogs"].append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: record["errors"].append(str(e)))

    def route(r):
        if r.request.url.startswith(base + "/"):
            r.continue_()
        else:
            record["outside"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return page, record


def inspect_json(profile: Path, session_id: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "ctxkernel.cli", "inspect", session_id, "--profile", str(profile), "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return json.loads(out)


def n(value: int) -> str:
    return f"{value:,}"


@pytest.fixture
def hostile(tmp_path):
    """A handoff session whose messages, tool output and notes carry script payloads."""
    profile = support.write_profile(
        tmp_path / "profiles", "uitest", tmp_path / "store", ["handoff", "basic"], window=6_000, reserved=1_000
    )
    kernel = support.kernel_for(profile)
    session = kernel.open_session()
    support.model_tool_turn(
        session, 0, "notes_write_file", {"path": "self/notes/plan.md", "content": "plan " + support.PAYLOAD}
    )
    for i in range(1, 16):
        support.one_turn(session, i, hostile=i % 3 == 0)
    return profile, kernel, session


@pytest.fixture
def chapters(tmp_path):
    """A chapters session continued by the model into a child, with hostile chapter titles; the
    second chapter's file is then changed on disk (its hash no longer matches)."""
    from ctxkernel_chapters.plugin import settings_of
    from ctxkernel_chapters.tools import deterministic_continuation

    profile = support.write_profile(
        tmp_path / "profiles", "chaptest", tmp_path / "store", ["chapters"], window=8_000, reserved=1_000
    )
    kernel = support.kernel_for(profile)
    session = kernel.open_session()
    for i in range(8):
        support.one_turn(session, i, hostile=i % 2 == 0)
    args = deterministic_continuation(session.context, settings_of(session.context))
    args["title"] = "next " + support.XSS[0]
    for chapter in args["chapters"]:
        chapter["title"] = support.XSS[1] + " " + chapter["title"][:40]
    outcome = support.model_tool_turn(session, 20, "chapters_continue", args)
    assert outcome.continue_in, outcome.content
    return profile, kernel, session.id, outcome.continue_in


def test_pages_show_inspect_figures_update_live_and_run_nothing(browser, hostile, shots):
    profile, _, session = hostile
    expected = inspect_json(profile, session.id)
    with support.ui_server(profile) as base:
        page, record = open_page(browser, base)
        # -- sessions ----------------------------------------------------------------------------
        page.goto(f"{base}/ui/")
        row = page.locator(f'tr[data-session="{session.id}"]')
        row.locator("td.pressure .gauge-text").wait_for()
        p = expected["pressure"]
        assert row.locator("td.events").inner_text() == n(expected["events"])
        assert (
            row.locator("td.pressure .gauge-text").inner_text()
            == f"{n(p['tokens'])} / {n(p['effective_window'])} ({p['ratio'] * 100:.1f}%)"
        )
        assert row.locator("td.compactions").inner_text() == n(len(expected["compactions"]))
        assert row.locator("td.windows").inner_text() == n(expected["strategies"]["handoff"]["windows"])
        page.fill("#search", "no-such-id")
        assert page.locator("#sessions tbody tr").count() == 0
        page.fill("#search", session.id[:6])
        assert page.locator("#sessions tbody tr").count() == 1
        shots.take(page, "sessions-search")

        # -- session -------------------------------------------------------------------------------
        row.locator("a.session-link").click()
        page.wait_for_url(f"{base}/ui/sessions/{session.id}")
        page.locator("#surface-table").wait_for()
        assert page.inner_text("#pressure-tokens") == n(p["tokens"])
        assert page.inner_text("#effective-window") == n(p["effective_window"])
        assert page.inner_text("#events-count") == n(expected["events"])
        assert page.inner_text("#compactions-count") == n(len(expected["compactions"]))
        assert (
            page.inner_text("#surface-summary")
            == f"{n(expected['surface']['nodes'])} messages, {n(expected['surface']['tokens'])} tokens"
        )
        assert page.locator("#surface-table tbody tr").count() == expected["surface"]["nodes"]
        handoff_panel = page.locator('section.strategy[data-strategy="handoff"]')
        assert f"windows: {expected['strategies']['handoff']['windows']}" in handoff_panel.inner_text()
        # the timeline: one point per reply with usage, the window line, a marker per switch
        replies = [e for e in session.events if e.type == "assistant/message"]
        points = page.get_attribute("#timeline-chart polyline.tokens-line", "points").split()
        assert len(points) == len(replies)
        switches = sum(1 for c in expected["compactions"] if c["kind"] == "window")
        assert switches > 0 and page.locator("#timeline-chart line.marker-window").count() == switches
        assert page.locator("#timeline-chart line.threshold").count() >= 1
        assert page.locator("#transactions-table tbody tr").count() >= len(expected["compactions"])
        shots.take(page, "session", full_page=True)

        # the log pages; a filter shows only that type; an event expands
        assert page.locator("#log-rows details.event").count() == min(100, expected["events"])
        page.fill("#log-types", "compaction/summary")
        page.click("#log-apply")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#log-rows details.event')].every(d => d.dataset.type === 'compaction/summary')"
        )
        assert page.locator("#log-rows details.event").count() == len(expected["compactions"])
        first = page.locator("#log-rows details.event").first
        first.locator("summary").click()
        # an opened row fetches its data: the page sent only the previews
        first.locator("pre", has_text='"summary"').wait_for()
        assert first.get_attribute("data-loaded") == "yes"
        page.click("#log-last")

        # hostile content is on the page as text, and nothing of it ran
        text = page.evaluate("() => document.body.textContent")
        assert support.XSS[0] in text or "<script>window.__pwned" in text
        page.locator("details.message").nth(0).locator("summary").click()
        result = page.evaluate(DOM_CHECK)
        assert result["bad"] == [] and result["images"] == 0 and result["pwned"] is None
        assert all(src.endswith("/ui/static/ui.js") for src in result["scripts"])

        # -- live: the page follows new events without a reload ------------------------------------
        page.evaluate("() => { window.__same_document = true; }")
        before = expected["events"]
        support.one_turn(session, 50, hostile=True)
        support.one_turn(session, 51)
        after = inspect_json(profile, session.id)
        # body's data-events is set when an update has drawn everything, the log page included (the
        # overview's count is drawn before the log page is fetched: waiting on it raced the log)
        page.wait_for_function(f"() => document.body.dataset.events === '{after['events']}'", timeout=20_000)
        assert page.inner_text("#events-count") == n(after["events"])
        assert after["events"] > before
        assert page.evaluate("() => window.__same_document") is True
        assert page.inner_text("#pressure-tokens") == n(after["pressure"]["tokens"])
        assert page.locator("#surface-table tbody tr").count() == after["surface"]["nodes"]
        assert page.locator("#log-rows details.event").last.get_attribute("data-seq") == str(after["events"] - 1)
        result = page.evaluate(DOM_CHECK)
        assert result["bad"] == [] and result["images"] == 0 and result["pwned"] is None

        # -- compare: a replay started from the page ------------------------------------------------
        page.goto(f"{base}/ui/simulate")
        page.select_option('select[name="workload"]', "chat-short")
        page.fill('input[name="profiles"]', "basic")
        page.click('#replay-form button[type="submit"]')
        page.wait_for_url("**/ui/simulate?job=*")
        assert page.locator("svg#chart polyline.profile").count() == 1
        assert page.locator("#metrics tbody tr").count() == 1
        shots.take(page, "compare", full_page=True)
        # a bad id in the URL is refused with the rule
        page.goto(f"{base}/ui/sessions/bad%20id")
        assert "invalid session id" in page.inner_text("#error")

    assert record["dialogs"] == [] and record["errors"] == []
    assert record["outside"] == [], "the pages fetched something from outside the inspector"


def test_compact_now_from_the_page(browser, hostile, shots):
    profile, _, session = hostile
    before = inspect_json(profile, session.id)
    with support.ui_server(profile, "--allow-actions") as base:
        page, record = open_page(browser, base)
        page.goto(f"{base}/ui/sessions/{session.id}")
        button = page.locator("#action-compact")
        button.wait_for()
        assert page.locator("#strategy-toggles li").count() == 2  # the profile's handoff and basic
        button.click()
        page.wait_for_function(
            "() => document.getElementById('action-result').textContent.startsWith('compact: done')", timeout=30_000
        )
        after = inspect_json(profile, session.id)
        page.wait_for_function(
            f"() => document.getElementById('compactions-count').textContent === '{n(len(after['compactions']))}'"
        )
        # disable handoff for this session: logged, and the panel shows the new state
        page.locator("#toggle-handoff").click()
        page.wait_for_function(
            "() => document.getElementById('action-result').textContent.startsWith('disable handoff: done')"
        )
        page.wait_for_function(
            "() => document.querySelector('#strategy-toggles li[data-strategy=handoff]').dataset.enabled === 'false'"
        )
        assert "Compact now (basic)" in page.inner_text("#actions")
        shots.take(page, "actions")
        session.refresh()
        assert session.events[-1].data == {"strategy": "handoff", "enabled": False, "by": "ui"}
        after = inspect_json(profile, session.id)
        # a cross-site form post (no token, another Origin) is refused and writes nothing
        status = page.evaluate(
            """async (url) => (await fetch(url, {method: 'POST', headers: {'X-CSRF-Token': 'forged'}})).status""",
            f"{base}/ui/api/sessions/{session.id}/actions/compact",
        )
        assert status == 403
    assert len(after["compactions"]) == len(before["compactions"]) + 1
    assert after["compactions"][-1]["strategy"] == "handoff"
    assert inspect_json(profile, session.id)["events"] == after["events"]
    assert record["dialogs"] == [] and record["errors"] == []


def test_strategy_panels_show_chapters_notes_and_windows_as_text(browser, hostile, chapters, shots):
    profile, _, session = hostile
    chapter_profile, chapter_kernel, parent, child = chapters
    first = inspect_json(chapter_profile, parent)
    toc = first["strategies"]["chapters"]["toc"]
    # the model's chapter, then the turn in progress at the continuation (its request)
    assert [c["hash"] for c in toc] == ["ok", "ok"]
    assert toc[1]["title"].startswith("In progress at continuation")
    # change the archived chapter behind the registry's back (a blob file of the jsonl store):
    # the panel must say so
    chapter_file = chapter_kernel.store.blob_path(f"chapters/{toc[0]['path']}")
    chapter_file.write_text(chapter_file.read_text() + "\nedited later\n")
    expected = inspect_json(chapter_profile, parent)
    entry, in_progress = expected["strategies"]["chapters"]["toc"]
    assert entry["hash"] != "ok" and in_progress["hash"] == "ok"
    handoff_view = inspect_json(profile, session.id)
    with support.ui_server(profile) as base:
        page, record = open_page(browser, base)
        page.goto(f"{base}/ui/")
        child_row = page.locator(f'tr[data-session="{child}"]')
        # the chapters registry, not the session header, records ancestry (seed 003): the row links
        # its parent once its summary (which reads the registry's panel) has come
        child_row.locator("td.pressure .gauge-text").wait_for()
        assert child_row.locator(f'.continues a[href="/ui/sessions/{parent}"]').count() == 1
        page.locator(f'tr[data-session="{parent}"] td.pressure .gauge-text').wait_for()
        shots.take(page, "sessions")
        # sortable: by events, up then down
        events_column = page.locator('#sessions th[data-key="events"]')
        for click, direction in ((1, 1), (2, -1)):
            events_column.click()
            shown = [int(t.replace(",", "")) for t in page.locator("#sessions tbody td.events").all_inner_texts()]
            assert len(shown) == 3 and shown == sorted(shown, reverse=direction < 0), (click, shown)

        page.goto(f"{base}/ui/sessions/{parent}")
        panel = page.locator('section.strategy[data-strategy="chapters"] .panel-toc')
        panel.wait_for()
        cells = panel.locator("tbody tr").first.locator("td")
        headers = [h.inner_text() for h in panel.locator("thead th").all()]
        assert cells.nth(headers.index("title")).inner_text() == entry["title"]
        assert support.XSS[1] in entry["title"]
        assert cells.nth(headers.index("hash")).inner_text() == entry["hash"]
        assert page.inner_text("#events-count") == n(expected["events"])
        # the continuation is marked on the parent's timeline
        assert page.locator("#timeline-chart line.marker-continuation").count() == 1
        shots.take(page, "chapters", full_page=True)
        shots.element(page.locator('section.strategy[data-strategy="chapters"]'), "chapters-panel")
        result = page.evaluate(DOM_CHECK)
        assert result["bad"] == [] and result["images"] == 0 and result["pwned"] is None

        page.goto(f"{base}/ui/sessions/{child}")
        child_panel = page.locator('section.strategy[data-strategy="chapters"]')
        child_panel.wait_for()
        assert parent in child_panel.inner_text()

        page.goto(f"{base}/ui/sessions/{session.id}")
        notes = page.locator('section.strategy[data-strategy="handoff"] .panel-notes_list')
        notes.wait_for()
        headers = [h.inner_text() for h in notes.locator("thead th").all()]
        rows = notes.locator("tbody tr")
        expected_notes = handoff_view["strategies"]["handoff"]["notes_list"]
        assert rows.count() == len(expected_notes) >= 1
        for i, note in enumerate(expected_notes):
            assert rows.nth(i).locator("td").nth(headers.index("trust")).inner_text() == note["trust"]
            assert rows.nth(i).locator("td").nth(headers.index("path")).inner_text() == note["path"]
        shots.element(page.locator('section.strategy[data-strategy="handoff"]'), "handoff-panel")
        windows = page.locator('section.strategy[data-strategy="handoff"] .panel-window_list > table > tbody > tr')
        assert windows.count() == handoff_view["strategies"]["handoff"]["windows"]
        result = page.evaluate(DOM_CHECK)
        assert result["bad"] == [] and result["images"] == 0 and result["pwned"] is None
    assert record["dialogs"] == [] and record["errors"] == [] and record["outside"] == []


def test_a_long_sessions_timeline_draws_buckets_of_requests(browser, tmp_path):
    """Past 1,024 requests a point is a bucket of requests: the line is each bucket's peak, a band
    reaches its lowest, and the legend and the axis still count every request."""
    from ctxkernel.events import Event
    from ctxkernel.store.base import SessionHeader
    from ctxkernel.timeline import MAX_POINTS

    profile = support.write_profile(tmp_path / "profiles", "longtl", tmp_path / "store", ["basic"])
    kernel = support.kernel_for(profile)
    sid = "long-timeline"
    kernel.store.create(SessionHeader(id=sid, created="2026-01-01T00:00:00.000Z", profile="longtl"))
    requests, events = MAX_POINTS + 76, []
    for turn in range(1, requests + 1):
        reply = {"role": "assistant", "content": [{"type": "text", "text": f"answer {turn}"}]}
        for type_, data, op in (
            ("turn/start", {"turn": turn}, None),
            ("user/message", {"message": {"role": "user", "content": [{"type": "text", "text": "go"}]}}, "append"),
            ("assistant/message", {"message": reply, "usage": {"input_tokens": 100 + turn % 50}}, "append"),
            ("turn/end", {"turn": turn, "reason": "completed"}, None),
        ):
            events.append(Event(len(events), type_, data, "2026-01-01T00:00:00.000Z", op and {"op": op}))
    kernel.store.append(sid, events, 0)
    with support.ui_server(profile) as base:
        page, record = open_page(browser, base)
        page.goto(f"{base}/ui/sessions/{sid}")
        page.wait_for_selector("#timeline-chart polyline.tokens-line")
        points = page.get_attribute("#timeline-chart polyline.tokens-line", "points").split()
        assert len(points) == (requests + 1) // 2  # buckets of two requests
        assert page.locator("#timeline-chart polygon.tokens-band").count() == 1
        legend = page.inner_text("#timeline-legend")
        assert f"{n(requests)} of {n(requests)} requests report usage; a point is the peak of 2 requests" in legend
        assert page.locator("#timeline-chart text", has_text=f"request ({requests})").count() == 1
        assert record == {"dialogs": [], "errors": [], "outside": []}

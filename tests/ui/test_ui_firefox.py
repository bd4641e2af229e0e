"""The inspector's pages in headless Firefox (Debian's firefox-esr over WebDriver BiDi).

The issue asks the pages to work in a current Chromium and Firefox; test_ui_browser.py covers
Chromium in depth. This test loads every page in Firefox, checks the figures shown against
``ctxkernel inspect --json``, watches the session page follow events the test appends, and checks
that hostile session content is shown as text and never runs. Screenshots go to the test's tmp
dir (``screenshots-firefox/``); ``CTXKERNEL_UI_SCREENSHOTS=DIR`` copies them there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import firefox_bidi as bidi
import pytest
import ui_support as support

pytest.importorskip("starlette", reason="the inspector needs the 'ui' extra")
pytest.importorskip(
    "websockets", reason="the Firefox test speaks WebDriver BiDi with websockets (requirements-dev.txt)"
)


#: every element and attribute a hostile message could have smuggled in, checked in the live DOM
DOM_CHECK = """(() => {
  const bad = [];
  for (const node of document.querySelectorAll('*')) {
    for (const attr of node.attributes) {
      if (attr.name.startsWith('on')) bad.push(`${node.tagName} ${attr.name}`);
      if (/^\\s*javascript:/i.test(attr.value) && ['href', 'src', 'action', 'xlink:href'].includes(attr.name)) bad.push(`${node.tagName} ${attr.name}=${attr.value}`);
    }
  }
  const scripts = [...document.scripts].map((s) => s.src);
  return {bad, scripts, images: document.images.length, pwned: window.__pwned === undefined ? null : String(window.__pwned)};
})()"""


def firefox_binary() -> str | None:
    found = os.environ.get("CTXKERNEL_TEST_FIREFOX")
    if found and Path(found).exists():
        return found
    for name in ("firefox-esr", "firefox"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_") and key not in ("CTXKERNEL_TEST_FIREFOX", "CTXKERNEL_UI_SCREENSHOTS"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def firefox():
    binary = firefox_binary()
    if binary is None:
        pytest.skip(
            "no Firefox: scripts/test-services.sh installs Debian's firefox-esr and exports CTXKERNEL_TEST_FIREFOX"
        )
    browser = bidi.Firefox(binary)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture
def shots(tmp_path):
    folder = tmp_path / "screenshots-firefox"
    copy_to = os.environ.get("CTXKERNEL_UI_SCREENSHOTS")

    def take(browser, name: str, *, full_page: bool = False) -> Path:
        path = browser.screenshot(folder / f"{name}.png", full_page=full_page)
        assert path.stat().st_size > 5_000, f"screenshot {name} is (nearly) empty"
        if copy_to:
            Path(copy_to).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(copy_to) / f"firefox-{name}.png")
        return path

    return take


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
    return profile, session


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


def test_pages_work_in_firefox(firefox, hostile, shots):
    profile, session = hostile
    expected = inspect_json(profile, session.id)
    p = expected["pressure"]
    with support.ui_server(profile) as base:
        # -- sessions: the row's figures are inspect's; the search filters ------------------------------
        firefox.goto(f"{base}/ui/")
        row = f'tr[data-session="{session.id}"]'
        firefox.wait_for(f"!!document.querySelector('{row} td.pressure .gauge-text')")
        assert firefox.text(f"{row} td.events") == n(expected["events"])
        assert (
            firefox.text(f"{row} td.pressure .gauge-text")
            == f"{n(p['tokens'])} / {n(p['effective_window'])} ({p['ratio'] * 100:.1f}%)"
        )
        assert firefox.text(f"{row} td.compactions") == n(len(expected["compactions"]))
        assert firefox.text(f"{row} td.windows") == n(expected["strategies"]["handoff"]["windows"])
        firefox.fill("#search", "no-such-id")
        assert firefox.count("#sessions tbody tr") == 0
        firefox.fill("#search", session.id[:6])
        assert firefox.count("#sessions tbody tr") == 1
        shots(firefox, "sessions")

        # -- session: pressure, surface, timeline, log ------------------------------------------------
        firefox.goto(f"{base}/ui/sessions/{session.id}")
        firefox.wait_for("!!document.querySelector('#surface-table tbody tr')")
        assert firefox.text("#pressure-tokens") == n(p["tokens"])
        assert firefox.text("#effective-window") == n(p["effective_window"])
        assert firefox.text("#events-count") == n(expected["events"])
        assert firefox.text("#compactions-count") == n(len(expected["compactions"]))
        assert firefox.count("#surface-table tbody tr") == expected["surface"]["nodes"]
        replies = [e for e in session.events if e.type == "assistant/message"]
        points = firefox.value("document.querySelector('#timeline-chart polyline.tokens-line').getAttribute('points')")
        assert len(points.split()) == len(replies)
        switches = sum(1 for c in expected["compactions"] if c["kind"] == "window")
        assert switches > 0 and firefox.count("#timeline-chart line.marker-window") == switches
        assert firefox.count("#log-rows details.event") == min(100, expected["events"])
        firefox.fill("#log-types", "compaction/summary")
        firefox.click("#log-apply")
        firefox.wait_for(
            "[...document.querySelectorAll('#log-rows details.event')].every(d => d.dataset.type === 'compaction/summary')"
        )
        assert firefox.count("#log-rows details.event") == len(expected["compactions"])
        shots(firefox, "session", full_page=True)

        # hostile content is on the page as text, and nothing of it ran
        assert support.XSS[0] in firefox.value("document.body.textContent")
        result = firefox.value(DOM_CHECK)
        assert result["bad"] == [] and result["images"] == 0 and result["pwned"] is None
        assert all(src.endswith("/ui/static/ui.js") for src in result["scripts"])

        # -- live: the page follows new events without a reload -----------------------------------------
        firefox.value("window.__same_document = true")
        support.one_turn(session, 50, hostile=True)
        support.one_turn(session, 51)
        after = inspect_json(profile, session.id)
        firefox.wait_for(f"document.getElementById('events-count').textContent === '{n(after['events'])}'")
        assert after["events"] > expected["events"]
        assert firefox.value("window.__same_document") is True
        assert firefox.text("#pressure-tokens") == n(after["pressure"]["tokens"])
        assert firefox.count("#surface-table tbody tr") == after["surface"]["nodes"]
        result = firefox.value(DOM_CHECK)
        assert result["bad"] == [] and result["images"] == 0 and result["pwned"] is None

        # -- compare, and a bad id in the URL ---------------------------------------------------------------
        firefox.goto(f"{base}/ui/simulate")
        assert firefox.count("#replay-form") == 1
        shots(firefox, "compare")
        firefox.goto(f"{base}/ui/sessions/bad%20id")
        firefox.wait_for("document.getElementById('error').textContent.includes('invalid session id')")

    assert firefox.dialogs == [] and firefox.errors == []
    # data: URLs never leave the browser (Firefox itself loads a built-in font as one)
    outside = [u for u in firefox.requests if not u.startswith((base + "/", "data:"))]
    assert outside == [], "the pages fetched something from outside the inspector"

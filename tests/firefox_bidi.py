"""Headless Firefox driven over WebDriver BiDi, for the inspector's Firefox test (tests/ui/test_ui_firefox.py).

Firefox speaks WebDriver BiDi itself (``--remote-debugging-port``): no geckodriver, and no
Playwright build of Firefox (Playwright drives only its own patched Firefox, a download that is
blocked on machines without internet). The protocol is JSON over one WebSocket
(https://w3c.github.io/webdriver-bidi/); this module sends the few commands the test needs with
the ``websockets`` client and records what the page did: JavaScript errors, dialogs it opened and
every URL it requested.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

#: preferences for a quiet throwaway profile: no first-run pages, updates or telemetry
PREFS = """
user_pref("remote.active-protocols", 1);
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("browser.startup.homepage_override.mstone", "ignore");
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);
user_pref("app.update.disabledForTesting", true);
user_pref("network.captive-portal-service.enabled", false);
user_pref("network.connectivity-service.enabled", false);
user_pref("browser.safebrowsing.update.enabled", false);
"""
EVENTS = ["log.entryAdded", "network.beforeRequestSent", "browsingContext.userPromptOpened"]


class BiDiError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Firefox:
    """One headless Firefox with one page (its first browsing context)."""

    def __init__(self, binary: str, *, width: int = 1280, height: int = 900) -> None:
        self._home = tempfile.TemporaryDirectory(prefix="ctxkernel-firefox-")
        profile = Path(self._home.name) / "profile"
        profile.mkdir()
        (profile / "user.js").write_text(PREFS)
        self.log = Path(self._home.name) / "firefox.log"  # a file, not a pipe nobody reads
        port = _free_port()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, "--headless", "--no-remote", "--profile", str(profile), f"--remote-debugging-port={port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MOZ_HEADLESS": "1"},
            )
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        self._id = 0
        self.ws = self._connect(port)
        try:
            self.command("session.new", {"capabilities": {}})
            self.command("session.subscribe", {"events": EVENTS})
            self.context = self.command("browsingContext.getTree", {})["contexts"][0]["context"]
            self.command(
                "browsingContext.setViewport",
                {"context": self.context, "viewport": {"width": width, "height": height}},
            )
        except BaseException:
            self.close()
            raise

    def _connect(self, port: int) -> ClientConnection:
        deadline = time.monotonic() + 60
        while True:
            try:
                return connect(f"ws://127.0.0.1:{port}/session", max_size=None, open_timeout=5)
            except OSError:
                if self.process.poll() is not None:
                    err = self.log.read_text(errors="replace")[-2000:]
                    msg = f"firefox exited with {self.process.returncode}: {err}"
                    raise BiDiError(msg) from None
                if time.monotonic() > deadline:
                    self.close()
                    msg = "firefox did not open its WebDriver BiDi port within 60 s"
                    raise BiDiError(msg) from None
                time.sleep(0.2)

    # -- the protocol ------------------------------------------------------------------------------
    def _send(self, method: str, params: dict[str, Any]) -> int:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        return self._id

    def command(self, method: str, params: dict[str, Any], timeout: float = 60) -> Any:
        """Send a command and wait for its answer, recording the events that arrive meanwhile."""
        wanted = self._send(method, params)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                msg = f"{method}: no answer within {timeout:g} s"
                raise BiDiError(msg)
            message = json.loads(self.ws.recv(timeout=left))
            if message.get("type") == "event":
                self._record(message["method"], message["params"])
            elif message.get("id") == wanted:
                if message.get("type") == "error":
                    msg = f"{method}: {message.get('error')}: {message.get('message')}"
                    raise BiDiError(msg)
                return message["result"]

    def _record(self, method: str, params: dict[str, Any]) -> None:
        if method == "log.entryAdded" and (params.get("type") == "javascript" or params.get("level") == "error"):
            self.errors.append(str(params.get("text")))
        elif method == "network.beforeRequestSent":
            self.requests.append(params["request"]["url"])
        elif method == "browsingContext.userPromptOpened":
            self.dialogs.append(str(params.get("message")))
            # answered without waiting: the page stays blocked until the prompt is dismissed
            self._send("browsingContext.handleUserPrompt", {"context": params["context"], "accept": False})

    # -- what the test does -----------------------------------------------------------------------------
    def goto(self, url: str) -> None:
        self.command("browsingContext.navigate", {"context": self.context, "url": url, "wait": "complete"})

    def value(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression evaluated in the page (promises awaited)."""
        result = self.command(
            "script.evaluate",
            {
                "expression": f"(async () => JSON.stringify(await ({expression})))()",
                "target": {"context": self.context},
                "awaitPromise": True,
            },
        )
        if result.get("type") == "exception":
            msg = f"{expression}: {result['exceptionDetails'].get('text')}"
            raise BiDiError(msg)
        raw = result["result"]
        return None if raw.get("type") == "undefined" else json.loads(raw["value"])

    def text(self, selector: str) -> str:
        return str(self.value(f"document.querySelector({json.dumps(selector)}).textContent"))

    def count(self, selector: str) -> int:
        return int(self.value(f"document.querySelectorAll({json.dumps(selector)}).length"))

    def click(self, selector: str) -> None:
        self.value(f"document.querySelector({json.dumps(selector)}).click()")

    def fill(self, selector: str, text: str) -> None:
        """Type into a field as a user does: the value changes and an ``input`` event fires."""
        self.value(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)}); el.value = {json.dumps(text)};"
            " el.dispatchEvent(new Event('input', {bubbles: true})); })()"
        )

    def wait_for(self, expression: str, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = self.value(expression)
            if found:
                return found
            if time.monotonic() > deadline:
                msg = f"still false after {timeout:g} s: {expression}"
                raise BiDiError(msg)
            time.sleep(0.1)

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        shot = self.command(
            "browsingContext.captureScreenshot",
            {"context": self.context, "origin": "document" if full_page else "viewport"},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            with contextlib.suppress(Exception):  # the browser is stopped below either way
                self.command("session.end", {}, timeout=10)
            ws.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._home.cleanup()

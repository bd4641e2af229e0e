"""Test helpers for the decay strategy: a kernel with decay registered in code, a session driver.

Used by this distribution's tests and usable by integrators' tests::

    from ctxkernel_decay.testing import decay_kernel, Driver
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxkernel import Message, ToolCallBlock
from ctxkernel.testing import build_kernel, make_profile

from . import plugin as decay_plugin


def decay_kernel(
    home: Path,
    *,
    window: int = 20_000,
    reserve: int = 2_000,
    settings: dict[str, Any] | None = None,
    strategies: tuple[str, ...] = ("decay", "basic"),
    basic: dict[str, Any] | None = None,
) -> Any:
    """A kernel on a jsonl store in ``home`` whose profile runs ``strategies`` on a small window,
    shaped like the shipped profile: decay, then basic with no automatic compaction, called only
    by the kernel's guard on an overflowing composed request (``guard_request``) or by hand."""
    tables: dict[str, dict[str, Any]] = {}
    if "decay" in strategies:
        tables["decay"] = dict(settings or {})
    if "basic" in strategies:
        tables["basic"] = {"threshold_ratio": 0.97, "retain_ratio": 0.3, "auto": False, **(basic or {})}
    profile = make_profile(model={"context_window": window, "reserved_output_tokens": reserve})
    profile.profile.strategies = list(strategies)
    profile.profile.capability_order = list(strategies)
    profile.profile.guard_request = True
    profile.strategies = tables
    profile.model_policies = []  # the repo basic profile has policies for its own tables
    # tests need no fsync: durability is the store's own tests' business
    return build_kernel(home, profile=profile, fsync=False, plugins=[("decay", decay_plugin)])


class Driver:
    """Plays a model and a harness: user turns, assistant text, tool calls with results."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.n = 0

    def step(self, reply: Message) -> Any:
        request = self.session.prepare_request()
        self.session.commit_reply(reply)
        return request

    def user(self, text: str) -> None:
        self.session.user(text)

    def text(self, text: str) -> Any:
        return self.step(Message.assistant(text))

    def calls(self, results: list[str], text: str = "", name: str = "read") -> Any:
        calls = []
        for _ in results:
            self.n += 1
            calls.append(ToolCallBlock(f"c{self.n}", name, {"path": f"f{self.n}.py"}))
        request = self.step(Message.assistant(text, calls))
        for call, r in zip(calls, results, strict=True):
            self.session.tool_result(call.id, r)
        return request

    def run_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        self.n += 1
        return self.session.run_tool({"id": f"t{self.n}", "name": name, "arguments": arguments})


def log_bytes(session: Any) -> bytes:
    """The session's log file as stored (jsonl backend): refusals must leave it byte-identical."""
    path: Path = session.store.path(session.id)
    return path.read_bytes()

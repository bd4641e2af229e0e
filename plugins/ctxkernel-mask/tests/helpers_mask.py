"""A kernel running ``mask`` (and ``basic``) on a small window, and a driver playing model and harness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxkernel import Message, ToolCallBlock
from ctxkernel.testing import build_kernel, make_profile
from ctxkernel_mask import plugin as mask_plugin

#: settings small enough for short test sessions
SMALL = {"tail_tokens": 300, "tail_ratio": 0.2, "clear_at_least": 600, "min_tokens": 20, "args_tokens": 200}


def mask_kernel(
    home: Path,
    *,
    window: int = 40_000,
    reserve: int = 2_000,
    settings: dict[str, Any] | None = None,
    summary: bool = False,
    model: dict[str, Any] | None = None,
    cache: dict[str, Any] | None = None,
) -> Any:
    """The shipped profiles' shape: mask then basic; basic only guards (``mask``) or summarises
    at its threshold (``mask-summary`` with ``summary=True``). ``model`` and ``cache`` override
    those tables (the break-even rule's prices and horizon)."""
    profile = make_profile(
        model={"context_window": window, "reserved_output_tokens": reserve, **(model or {})},
        cache=cache or {},
    )
    profile.profile.strategies = ["mask", "basic"]
    profile.profile.guard_request = not summary
    basic = (
        {"threshold_ratio": 0.8, "retain_ratio": 0.16, "auto": True}
        if summary
        else {"auto": False, "threshold_ratio": 0.97, "retain_ratio": 0.3}
    )
    profile.strategies = {"mask": {**SMALL, **(settings or {})}, "basic": basic}
    profile.model_policies = []
    return build_kernel(home, profile=profile, fsync=False, plugins=[("mask", mask_plugin)])


class Driver:
    """Plays a model and a harness: user turns, replies with tool calls, their results."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.n = 0

    def user(self, text: str) -> None:
        self.session.user(text)

    def calls(self, *calls: tuple[str, dict[str, Any], str, bool], text: str = "") -> Any:
        """One step: a reply calling each ``(tool, arguments, output, is_error)``, then the results."""
        request = self.session.prepare_request()
        blocks = []
        for name, arguments, _, _ in calls:
            self.n += 1
            blocks.append(ToolCallBlock(f"call{self.n}", name, arguments))
        self.session.commit_reply(Message.assistant(text, blocks))
        for block, (_, _, output, is_error) in zip(blocks, calls):
            self.session.tool_result(block.id, output, is_error=is_error)
        return request

    def read(self, path: str, lines: int = 60, *, error: bool = False) -> Any:
        body = "\n".join(f"{path}:{i}: value_{i} = compute({i})" for i in range(lines))
        return self.calls(("read", {"path": path}, body, error))

    def text(self, text: str) -> Any:
        request = self.session.prepare_request()
        self.session.commit_reply(Message.assistant(text))
        return request

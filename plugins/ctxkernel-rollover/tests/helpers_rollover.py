"""Shared helpers for the rollover tests (imported by path: pytest uses importlib mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "rollover.toml"


def rollover_kernel(
    home: Path,
    *,
    window: int = 6_000,
    reserve: int = 1_000,
    plugins: list[tuple[str, Any]] | None = None,
    strategies: list[str] | None = None,
    tools: dict[str, Any] | None = None,
    **settings: Any,
) -> Kernel:
    profile = make_profile(
        PROFILE,
        model={"context_window": window, "reserved_output_tokens": reserve},
        strategies={"rollover": settings} if settings else {},
        tools=tools or {},
    )
    profile.profile.strategies = strategies or ["rollover"]
    return Kernel(profile, store=JsonlStore(home), home=home, entry_points=True, plugins=plugins)


def call(call_id: str, name: str, **arguments: Any) -> ToolCallBlock:
    return ToolCallBlock(call_id, name, arguments)


def step(session, model, *, harness=None) -> Message:
    """One request/reply; kernel tools run through the session, others through ``harness``."""
    request = session.prepare_request()
    reply = model.complete(request.messages, system=request.system, tools=request.tools)
    message = session.commit_reply(reply.message, usage=reply.usage)
    for c in session.pending_calls:
        if session.owns_tool(c.name):
            session.tool_result(c.id, session.run_tool(c))
        else:
            session.tool_result(c.id, harness(c) if harness else f"ran {c.name}")
    return message


def log_bytes(session) -> bytes:
    return session.store.path(session.id).read_bytes()


def rollover_summaries(session) -> list[dict[str, Any]]:
    return [e.data for e in session.events if e.type == "compaction/summary" and e.data.get("kind") == "window"]

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ctxkernel import Message, ScriptedModel, Session, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore


def surface_is_paired(session: Session) -> bool:
    """Every assistant tool call is followed by exactly its results, before anything else."""
    nodes = session.surface.nodes
    i = 0
    while i < len(nodes):
        message = nodes[i].message
        calls = [c.id for c in message.tool_calls] if message.role == "assistant" else []
        i += 1
        if message.role == "tool":
            return False  # a result without its call right before it
        seen = []
        while calls and i < len(nodes) and nodes[i].message.role == "tool":
            seen.append(nodes[i].message.tool_result.call_id)
            i += 1
        if seen != calls:
            return False
    return True


@dataclass
class Agent:
    """A scripted agent loop over one session; harness tools answer with ``tool_output``."""

    session: Session
    model: Any
    tool_output: Callable[[ToolCallBlock], str] = lambda call: "ok"
    requests: list[Any] = field(default_factory=list)

    def step_all(self) -> None:
        session = self.session
        while True:
            request = session.prepare_request()
            self.requests.append(request)
            assert request.pressure.tokens <= request.pressure.effective_window, request.pressure
            reply = self.model.complete(request.messages, system=request.system, tools=request.tools)
            session.commit_reply(reply.message, usage=reply.usage)
            for call in session.pending_calls:
                if session.owns_tool(call.name):
                    session.tool_result(call.id, session.run_tool(call))
                else:
                    session.tool_result(call.id, self.tool_output(call))
            if not session.wants_another_step:
                break

    def turn(self, text: str) -> None:
        self.session.user(text)
        self.step_all()
        self.session.end_turn()


def reading_script(result_every: int = 3) -> Callable[..., Message]:
    """A model that reads a file on most steps and finishes every ``result_every``-th one."""
    counter = {"n": 0}

    def script(messages: list[Message], system: str, tools: list[dict[str, Any]]) -> Message:
        counter["n"] += 1
        n = counter["n"]
        if n % result_every:
            return Message.assistant(f"reading file {n}", [ToolCallBlock(f"c{n}", "read", {"path": f"src/f{n}.py"})])
        return Message.assistant(f"done with step {n}. Next I will continue.")

    return script


@pytest.fixture
def handoff_kernel(tmp_path: Path) -> Callable[..., Any]:
    """A kernel running handoff then basic (entry points on: the installed plugin is used)."""

    def factory(
        *,
        window: int = 20_000,
        reserve: int = 2_000,
        handoff: dict[str, Any] | None = None,
        basic: dict[str, Any] | None = None,
        strategies: list[str] | None = None,
        home: Path | None = None,
        tools: dict[str, Any] | None = None,
    ) -> Any:
        tables: dict[str, dict[str, Any]] = {}
        if handoff:
            tables["handoff"] = handoff
        if basic:
            tables["basic"] = basic
        kernel = _kernel(home or tmp_path / "home", strategies or ["handoff", "basic"], window, reserve, tables, tools)
        return kernel

    return factory


def _kernel(
    home: Path,
    strategies: list[str],
    window: int,
    reserve: int,
    tables: dict[str, dict[str, Any]],
    tools: dict[str, Any] | None = None,
) -> Any:
    from ctxkernel.testing import make_profile

    profile = make_profile(model={"context_window": window, "reserved_output_tokens": reserve}, tools=tools or {})
    profile.profile.strategies = strategies
    profile.profile.capability_order = [s for s in strategies if s in ("handoff", "basic")]
    profile.strategies = tables
    from ctxkernel import Kernel

    return Kernel(profile, store=JsonlStore(home), home=home, entry_points=True)


@pytest.fixture
def agent() -> Callable[..., Agent]:
    def factory(
        session: Session,
        script: Any = None,
        *,
        tool_output: Callable[[ToolCallBlock], str] | None = None,
        overflow_above: int | None = None,
    ) -> Agent:
        model = ScriptedModel(script or reading_script(), overflow_above=overflow_above)
        return Agent(session, model, tool_output or (lambda call: "line of code\n" * 150))

    return factory


@pytest.fixture
def paired() -> Callable[[Session], bool]:
    return surface_is_paired

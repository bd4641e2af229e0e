"""Shared helpers for the chapters tests (imported by path: pytest uses importlib mode)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ctxkernel_chapters.plugin as chapters_plugin
from ctxkernel import Kernel, Message, ScriptedModel, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "profiles" / "chapters.toml"


def chapters_kernel(
    home: Path,
    *,
    window: int = 20_000,
    reserve: int = 1_000,
    plugins: list[tuple[str, Any]] | None = None,
    policies: list[dict[str, Any]] | None = None,
    store: Any = None,
    **settings: Any,
) -> Kernel:
    """A kernel on a jsonl store in ``home`` (or on ``store``) running only ``chapters``
    (registered in code)."""
    tables: dict[str, Any] = {
        "model": {
            "provider": "scripted",
            "name": "scripted-1",
            "context_window": window,
            "reserved_output_tokens": reserve,
        }
    }
    profile = make_profile(PROFILE, **tables)
    profile.strategies = {"chapters": settings}
    profile.model_policies = []
    if policies:
        from ctxkernel.profile import ModelPolicy

        profile.model_policies = [ModelPolicy.model_validate(p) for p in policies]
    return Kernel(
        profile,
        store=store if store is not None else JsonlStore(home),
        home=home,
        entry_points=False,
        plugins=[("chapters", chapters_plugin), *(plugins or [])],
    )


def log_bytes(session) -> bytes:
    return session.store.path(session.id).read_bytes()


def archive_files(home: Path) -> list[str]:
    """Names in the chapters archive: the strategy's blobs, files under <home>/blobs/chapters on jsonl."""
    root = home / "blobs" / "chapters"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def archive_file(session, name: str) -> Path:
    """Where the jsonl store keeps the archive's ``name`` (to tamper with it in a test)."""
    return session.store.blob_path(f"chapters/{name}")


def do_turn(session, model, user_text: str, *, tool_output=None, harness_calls: int = 0) -> None:
    """One user turn: the model replies through ``model``; harness tools return ``tool_output(call)``."""
    session.user(user_text)
    while True:
        request = session.prepare_request()
        reply = model.complete(request.messages, system=request.system, tools=request.tools)
        session.commit_reply(reply.message, usage=reply.usage)
        for call in session.pending_calls:
            if session.owns_tool(call.name):
                session.tool_result(call.id, session.run_tool(call))
            else:
                session.tool_result(call.id, tool_output(call) if tool_output else "ok")
        if not session.wants_another_step:
            break
    session.end_turn()


def reading_script(calls_per_turn: int = 2):
    """A model that reads ``calls_per_turn`` files per turn, then answers."""
    counter = {"n": 0, "in_turn": 0}

    def script(messages, system, tools):
        counter["n"] += 1
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        if messages and messages[-1].role == "user":
            counter["in_turn"] = 0
        counter["in_turn"] += 1
        n = counter["n"]
        if counter["in_turn"] <= calls_per_turn:
            return Message.assistant(f"reading file {n}", [ToolCallBlock(f"c{n}", "read", {"path": f"src/mod{n}.py"})])
        return Message.assistant(f"done with {last_user.text[:30] if last_user else ''} (reply {n})")

    return ScriptedModel(script)


def run_turns(session, turns: int, *, start: int = 0, lines: int = 40, calls_per_turn: int = 2, model=None) -> Any:
    model = model or reading_script(calls_per_turn)
    for t in range(start, start + turns):
        do_turn(
            session,
            model,
            f"task {t}: look at module {t}",
            tool_output=lambda call: f"# {call.arguments['path']}\n" + "x = compute(1, 2)\n" * lines,
        )
    return model


def call_tool(session, name: str, **arguments: Any):
    """Run a kernel tool outside a model step (the log is not touched by run_tool)."""
    return session.run_tool({"id": "t1", "name": name, "arguments": arguments})


def result_json(outcome) -> dict[str, Any]:
    assert not outcome.is_error, outcome.content
    return json.loads(outcome.content)


def continue_all(session, *, title: str = "next", handoff_note: str = "go on") -> dict[str, Any]:
    """``chapters_continue`` with every completed turn in one chapter; its JSON answer."""
    ends = [e.seq for e in session.events if e.type == "turn/end"]
    chapters = [{"start_seq": 0, "end_seq": ends[-1], "title": "all"}]
    return result_json(
        call_tool(session, "chapters_continue", title=title, handoff_note=handoff_note, chapters=chapters)
    )


def registry(session):
    """The registry after the session's committed chapters are written (a read, like the tools')."""
    from ctxkernel_chapters.settle import settle

    return settle(session.context)

"""The kernel's work ledger rides into handoff's new context (issue 38, item 2): after a manual
compaction the files the agent changed and its last failing command are still shown."""

from __future__ import annotations

from pathlib import Path

from ctxkernel import Kernel, Message, ToolCallBlock
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import make_profile

PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "handoff.toml"
FILES = [f"src/pkg/module_{i}.py" for i in range(4)]


def kernel(home: Path) -> Kernel:
    profile = make_profile(PROFILE, model={"context_window": 16_000, "reserved_output_tokens": 1_000})
    return Kernel(profile, store=JsonlStore(home), home=home, entry_points=True)


def act(session, call: ToolCallBlock, result: str, *, is_error: bool = False) -> None:
    session.prepare_request()
    session.commit_reply(Message("assistant", (call,)))
    session.tool_result(call.id, result, is_error=is_error)


def test_a_manual_compaction_carries_the_work_ledger(tmp_path):
    session = kernel(tmp_path).open_session()
    session.user("Refactor the package.")
    for i, path in enumerate(FILES):
        act(session, ToolCallBlock(f"e{i}", "Edit", {"file_path": path, "old_string": "a", "new_string": "b"}), "ok")
        act(session, ToolCallBlock(f"r{i}", "Read", {"file_path": f"docs/notes_{i}.md"}), "notes " * 300)
    act(
        session,
        ToolCallBlock("t1", "Bash", {"command": "pytest -x tests/pkg"}),
        "E   KeyError: 'name'\n" + "trace " * 200,
        is_error=True,
    )
    session.prepare_request()
    session.commit_reply(Message.assistant("I will look at the failure next. " * 20))
    session.end_turn()
    outcome = session.compact_now()
    assert outcome.committed, outcome.detail
    now = kernel(tmp_path).open_session(outcome.continued_in) if outcome.continued_in else session
    if outcome.continued_in:  # a continuation: its first request records and pins what it inherited
        now.user("go on")
        now.prepare_request()
    shown = "\n".join(n.message.text for n in now.surface)
    assert "<work-ledger>" in shown
    for path in FILES:
        assert path in shown
    assert "pytest -x tests/pkg" in shown and "KeyError: 'name'" in shown

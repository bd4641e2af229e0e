"""Configuration keys, the runtime toggle and profile validation (Parts 7-8)."""

from __future__ import annotations

import pytest

import ctxkernel_handoff
from ctxkernel import ProfileError, ToolCallBlock
from ctxkernel.recall.notes import Notes
from ctxkernel.validate import validate_profile
from ctxkernel_handoff import TOOL_NAMES


def kinds(session):
    return [(e.data["strategy"], e.data["kind"]) for e in session.events if e.type == "compaction/summary"]


def fill(agent_obj, turns):
    for t in range(turns):
        agent_obj.turn(f"instruction {t} " + "detail " * 20)


@pytest.mark.parametrize(("value", "accepted"), [(8_000, True), (7_999, False), (32_000, True), (32_001, False)])
def test_handoff_max_chars_bounds(handoff_kernel, value, accepted):
    if accepted:
        kernel = handoff_kernel(handoff={"handoff_max_chars": value})
        assert kernel.strategy_settings("handoff").handoff_max_chars == value
    else:
        with pytest.raises(ProfileError, match="handoff_max_chars"):
            handoff_kernel(handoff={"handoff_max_chars": value})


def test_unknown_keys_are_refused(handoff_kernel):
    with pytest.raises(ProfileError, match="unknown key 'strategies.handoff.handoffMaxChars'"):
        handoff_kernel(handoff={"handoffMaxChars": 9000})


def test_inject_tools_off_means_native_summaries_only(handoff_kernel, agent):
    kernel = handoff_kernel(handoff={"inject_tools": False})
    session = kernel.open_session()
    assert not any(session.owns_tool(name) for name in TOOL_NAMES)
    fill(agent(session), 12)
    assert kinds(session) and all(k == ("basic", "summary") for k in kinds(session))


def test_override_compaction_off_keeps_tools_and_explicit_switches(handoff_kernel, agent):
    kernel = handoff_kernel(handoff={"override_compaction": False})
    session = kernel.open_session()
    assert [name for name in TOOL_NAMES if session.owns_tool(name)] == list(TOOL_NAMES[:6])
    fill(agent(session), 12)
    assert kinds(session) and all(k == ("basic", "summary") for k in kinds(session))
    # a native summary hides something too: the history tools come with it
    assert all(session.owns_tool(name) for name in TOOL_NAMES)
    assert session.run_tool(ToolCallBlock("n", "new_context", {})).content.startswith("requested")
    session.user("continue")
    session.prepare_request()
    assert kinds(session)[-1] == ("handoff", "window")
    # a manual compaction follows the compaction mode: native
    session.end_turn()
    outcome = ctxkernel_handoff.compact_now(session.context)
    assert outcome.window is None


def test_default_strategy_native_and_model_policies(handoff_kernel, agent):
    kernel = handoff_kernel(handoff={"default_strategy": "native"})
    session = kernel.open_session()
    assert session.owns_tool("notes_read_file")  # notes/history stay usable
    outcome = session.run_tool(ToolCallBlock("n", "new_context", {}))
    assert outcome.is_error and "native strategy" in outcome.content
    fill(agent(session), 12)
    assert all(k == ("basic", "summary") for k in kinds(session))
    assert session.owns_tool("history_read_item")  # from the first summary on
    model = kernel.profile.model
    listed = handoff_kernel(
        handoff={
            "default_strategy": "native",
            "model_policies": [{"provider": model.provider, "model": model.name, "strategy": "window"}],
        },
        home=kernel.home / "listed",
    )
    other = listed.open_session()
    assert other.run_tool(ToolCallBlock("n", "new_context", {})).content.startswith("requested")
    other.set_route("someone", "else")
    assert other.run_tool(ToolCallBlock("m", "new_context", {})).is_error  # unlisted model: native


def test_enabled_false_turns_everything_off(handoff_kernel, agent):
    kernel = handoff_kernel(handoff={"enabled": False})
    session = kernel.open_session()
    assert not any(session.owns_tool(name) for name in TOOL_NAMES)
    fill(agent(session), 12)
    assert all(k == ("basic", "summary") for k in kinds(session))


def test_runtime_toggle_reinstalls_exactly_one_of_each_tool_and_rebuilds_notes(handoff_kernel, agent):
    kernel = handoff_kernel()
    session = kernel.open_session()
    second = kernel.open_session()
    Notes.for_session(session).write("keep.md", "kept")
    kernel.set_strategy_enabled("handoff", False)
    for s in (session, second):
        assert not any(s.owns_tool(name) for name in TOOL_NAMES)
    assert "Context windows" not in session._tooling.compose()[0]
    kernel.set_strategy_enabled("handoff", True)
    kernel.set_strategy_enabled("handoff", True)  # idempotent
    for s in (session, second):
        s.owns_tool("new_context")
        names = s.tools.names()
        assert sorted(n for n in names if n in TOOL_NAMES) == sorted(TOOL_NAMES[:6])  # history_*: once hidden
        assert all(s.may_offer_tool(name) for name in TOOL_NAMES)
        assert len(names) == len(set(names))
    assert Notes.for_session(session).read("keep.md").content == "kept"
    # disabled, pressure is handled natively; re-enabled, windows switch again
    kernel.set_strategy_enabled("handoff", False)
    fill(agent(session), 12)
    assert kinds(session) and all(k == ("basic", "summary") for k in kinds(session))
    kernel.set_strategy_enabled("handoff", True)
    fill(agent(session), 14)
    assert ("handoff", "window") in kinds(session)


def write_profile(tmp_path, strategies, handoff="", extra=""):
    text = f"""
[profile]
strategies = {strategies!r}
capability_order = {[s for s in strategies if s in ("handoff", "basic", "rollover")]!r}

[store]
backend = "jsonl"
path = "{tmp_path / "home"}"

[strategies.handoff]
{handoff}
{extra}
"""
    path = tmp_path / "p.toml"
    path.write_text(text.replace("'", '"'))
    return path


def handoff_checks(report):
    return [
        (c.level, c.check, c.message)
        for c in report.checks
        if c.strategy == "handoff" and c.check in ("tools", "store", "strategy")
    ]


def test_validate_warns_when_generated_has_no_summarizer(tmp_path):
    report = validate_profile(write_profile(tmp_path, ["handoff", "basic"], 'handoff_summary = "generated"'))
    assert any(level == "warn" and "fall back to an extractive handoff" in m for level, _, m in handoff_checks(report))
    clean = validate_profile(
        write_profile(tmp_path, ["handoff", "basic"], 'handoff_summary = "extractive"'), strict=True
    )
    assert clean.valid, clean.rows()


def test_validate_fails_without_basic_when_native_is_needed(tmp_path):
    report = validate_profile(
        write_profile(tmp_path, ["handoff"], 'handoff_summary = "extractive"\ninject_tools = false')
    )
    assert any(level == "fail" and "'basic'" in m for level, _, m in handoff_checks(report))
    assert not report.valid


def test_validate_fails_on_tool_collision_with_rollover(tmp_path):
    report = validate_profile(
        write_profile(tmp_path, ["handoff", "rollover", "basic"], 'handoff_summary = "extractive"')
    )
    assert any(
        level == "fail" and check == "tools" and "new_context" in m for level, check, m in handoff_checks(report)
    )


def test_validate_fails_when_notes_storage_is_not_writable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    path = tmp_path / "p.toml"
    path.write_text(
        f'[profile]\nstrategies = ["handoff", "basic"]\ncapability_order = ["handoff", "basic"]\n'
        f'[store]\nbackend = "jsonl"\npath = "{blocker / "home"}"\n[strategies.handoff]\nhandoff_summary = "extractive"\n'
    )
    report = validate_profile(path)
    assert any(
        level == "fail" and check == "store" and "not writable" in m for level, check, m in handoff_checks(report)
    )

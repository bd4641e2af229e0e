"""Retention probes: deterministic extraction rules per kind, and their share visible / recoverable."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import Message, ToolCallBlock
from ctxkernel.simulate import AssistantItem, Options, Recording, ToolResultItem, UserItem, build_workload, compare
from ctxkernel.simulate.probes import KINDS, TEXT_CHARS, extract


def _call(call_id: str, name: str, **arguments: object) -> AssistantItem:
    return AssistantItem(Message.assistant("", [ToolCallBlock(call_id, name, dict(arguments))]))


def _recording() -> Recording:
    items = [
        UserItem("Fix the parser. Do not touch the public API! Use tabs.\nAlways run the tests first."),
        UserItem("<environment_context>never mind me</environment_context>", instruction=False),
        _call("c1", "Edit", file_path="src/parser.py", old_string="a", new_string="b"),
        ToolResultItem("c1", "ok"),
        _call("c2", "str_replace_editor", command="view", path="/repo/README.md"),
        ToolResultItem("c2", "# readme"),
        _call("c3", "str_replace_editor", command="create", path="/repo/new.py", file_text="x = 1"),
        ToolResultItem("c3", "File created"),
        _call("c4", "apply_patch", input="*** Begin Patch\n*** Update File: lib/a.py\n@@\n*** Add File: lib/b.py\n"),
        ToolResultItem("c4", "Done"),
        _call("c5", "Bash", command="pytest -q"),
        ToolResultItem("c5", "Traceback (most recent call last):\n  File x\nValueError: bad token\nexit code: 1"),
        _call("c6", "shell", command=["bash", "-lc", "make lint"]),
        ToolResultItem("c6", "all good\nProcess exited with code 0"),
        _call("c7", "bash", command="ls missing"),
        ToolResultItem("c7", "ls: cannot access 'missing'", is_error=True),
        _call(
            "c8",
            "TodoWrite",
            todos=[
                {"content": "write the parser", "status": "completed"},
                {"content": "document the grammar", "status": "in_progress"},
                {"content": "add fuzz tests", "status": "pending"},
            ],
        ),
        ToolResultItem("c8", "Todos updated"),
    ]
    return Recording(items, {"kind": "transcript"})


def test_each_kind_follows_its_documented_rule():
    found = {(p.kind, p.text): p.items for p in extract(_recording())}
    by_kind = {k: sorted(t for kind, t in found if kind == k) for k in KINDS}
    assert by_kind["files_changed"] == ["/repo/new.py", "lib/a.py", "lib/b.py", "src/parser.py"]  # not the view
    assert by_kind["errors_seen"] == ["ValueError: bad token", "ls: cannot access 'missing'"]
    assert by_kind["commands_worked"] == ["make lint"]  # exit code 1 and an error result did not work
    assert by_kind["decisions"] == ["Always run the tests first.", "Do not touch the public API!"]
    assert by_kind["open_todos"] == ["add fuzz tests", "document the grammar"]
    assert found[("commands_worked", "make lint")] == (12, 13)  # the call and its result


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(UserItem, st.text(max_size=300)),
            st.builds(ToolResultItem, st.sampled_from(["c1", "c2"]), st.text(max_size=300), st.booleans()),
            st.builds(
                lambda name, args: _call("c1", name, **args),
                st.sampled_from(["Edit", "bash", "TodoWrite", "apply_patch", "str_replace_editor", "other"]),
                st.dictionaries(
                    st.sampled_from(["file_path", "path", "command", "todos", "input"]),
                    st.one_of(st.text(max_size=80), st.lists(st.text(max_size=20), max_size=4), st.integers()),
                    max_size=3,
                ),
            ),
        ),
        max_size=25,
    )
)
def test_extraction_is_deterministic_bounded_and_points_at_real_items(items):
    recording = Recording(items)
    first, again = extract(recording), extract(recording)
    assert first == again
    for probe in first:
        assert probe.kind in KINDS
        assert 0 < len(probe.text) <= TEXT_CHARS
        assert probe.text == " ".join(probe.text.split())
        assert probe.items and all(0 <= i < len(items) for i in probe.items)


def test_probes_are_visible_unmanaged_and_recoverable_through_history_tools():
    report = compare(["none", "basic", "handoff"], build_workload("chat-short"), Options(window=700))
    none, basic, handoff = (p["probes"] for p in report["profiles"])
    assert none["decisions"] == {"count": 2, "visible": 1.0, "recoverable": 1.0}
    assert none["files_changed"] == {"count": 0, "visible": None, "recoverable": None}
    for row in (basic, handoff):  # what is visible is recoverable; history tools bring the rest back
        assert row["decisions"]["recoverable"] >= row["decisions"]["visible"]
    assert handoff["decisions"]["recoverable"] == 1.0


def test_malformed_editor_arguments_give_no_probe_and_do_not_raise():
    # found by the property test: a model can send a list where a command string belongs
    items = [_call("c1", "str_replace_editor", command=["create"], path="a.py"), ToolResultItem("c1", "ok")]
    assert [p for p in extract(Recording(items)) if p.kind == "files_changed"] == []

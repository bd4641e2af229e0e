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
    # two recordings of the same items: one recording keeps its probes once extracted
    first, again = extract(Recording(items)), extract(Recording(list(items)))
    assert first == again
    recording = Recording(items)
    assert extract(recording) == first and recording.derived["probes"] == tuple(first)
    for probe in first:
        assert probe.kind in KINDS
        assert 0 < len(probe.text) <= TEXT_CHARS
        assert probe.text == " ".join(probe.text.split())
        assert probe.items and all(0 <= i < len(items) for i in probe.items)


def test_probes_are_visible_unmanaged_and_recoverable_through_history_tools():
    # chat-short, then a dozen turns more: at a window that leaves room for handoff's request
    # header (~1,400 tokens; at most half the window, guard.py HEADER_MAX_SHARE) the conversation
    # still outgrows it, so both strategies manage it
    chat = build_workload("chat-short")
    items = list(chat.items)
    for k in range(12):
        items.append(UserItem(f"Tell me more about part {k} of that."))
        items.append(AssistantItem(Message.assistant(" ".join(f"part{k} detail{i}" for i in range(60)) + ".")))
    report = compare(["none", "basic", "handoff"], Recording(items, chat.source), Options(window=3_400))
    assert report["profiles"][0]["peak_prompt_tokens"] > report["profiles"][0]["effective_window"]
    for row in report["profiles"][1:]:
        assert row["status"] == "ok" and row["compactions"] and not row["overflows"], row["profile"]
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


def test_shell_edits_count_as_files_changed():
    patch = "apply_patch <<'PATCH'\n*** Begin Patch\n*** Update File: src/app.ts\n@@\n-a\n+b\n*** End Patch\nPATCH"
    items = [
        _call("c1", "shell", command=["bash", "-lc", patch]),
        ToolResultItem(
            "c1", '{"output":"Success. Updated the following files:\\nM src/app.ts\\n","metadata":{"exit_code":0}}'
        ),
        _call("c2", "shell", command=["apply_patch", "*** Begin Patch\n*** Add File: docs/new.md\n+hi\n*** End Patch"]),
        ToolResultItem("c2", "Done"),
        _call("c3", "Bash", command="cat > notes/plan.md <<'EOF'\n# plan\nEOF"),
        ToolResultItem("c3", ""),
        _call("c4", "bash", command="cat <<EOF >> CHANGELOG.md\n- fix\nEOF\necho done > /dev/null"),
        ToolResultItem("c4", ""),
        _call("c5", "bash", command="tee -a config.toml <<EOF\nx = 1\nEOF"),
        ToolResultItem("c5", "x = 1"),
        _call("c6", "bash", command="grep -n foo src/a.py > /tmp/out.txt"),  # no heredoc: not an edit rule
        ToolResultItem("c6", ""),
    ]
    found = sorted(p.text for p in extract(Recording(items)) if p.kind == "files_changed")
    assert found == ["CHANGELOG.md", "config.toml", "docs/new.md", "notes/plan.md", "src/app.ts"]


def test_errors_are_found_in_json_encoded_output():
    items = [
        _call("c1", "shell", command=["bash", "-lc", "pnpm tsc --noEmit"]),
        ToolResultItem(
            "c1",
            '{"output":"src/a.ts(3,7): error TS2345: Argument of type \'string\' is not assignable.\\n",'
            '"metadata":{"exit_code":2}}',
        ),
        _call("c2", "shell", command=["bash", "-lc", "bash build.sh"]),
        ToolResultItem(
            "c2",
            '{"output":"build.sh: line 4: syntax error near unexpected token `fi\'\\n","metadata":{"exit_code":2}}',
        ),
        _call("c3", "shell", command=["bash", "-lc", "sed -n 1,5p missing.ts"]),
        ToolResultItem("c3", '{"output":"sed: missing.ts: No such file or directory\\n","metadata":{"exit_code":1}}'),
        _call("c4", "shell", command=["bash", "-lc", "ls"]),
        ToolResultItem("c4", '{"output":"README.md\\n","metadata":{"exit_code":0}}'),
    ]
    probes = extract(Recording(items))
    errors = sorted(p.text for p in probes if p.kind == "errors_seen")
    assert errors == [
        "build.sh: line 4: syntax error near unexpected token `fi'",
        "sed: missing.ts: No such file or directory",
        "src/a.ts(3,7): error TS2345: Argument of type 'string' is not assignable.",
    ]
    assert [p.text for p in probes if p.kind == "commands_worked"] == ["ls"]


def test_a_json_encoded_error_counts_as_visible_while_its_result_is_on_the_surface():
    items = [
        UserItem("Check the types."),
        _call("c1", "shell", command=["bash", "-lc", "pnpm tsc"]),
        ToolResultItem(
            "c1", '{"output":"x.ts(1,1): error TS2304: Cannot find name \\"foo\\".\\n","metadata":{"exit_code":2}}'
        ),
        AssistantItem(Message.assistant("Found it.")),
    ]
    (row,) = compare(["none"], Recording(items, {"kind": "transcript"}), Options())["profiles"]
    assert row["probes"]["errors_seen"] == {"count": 1, "visible": 1.0, "recoverable": 1.0}


def test_an_instruction_is_shown_only_whole():
    from ctxkernel.simulate.probes import canonical, shown_whole

    def shown(instruction: str, text: str) -> bool:
        return shown_whole(canonical(instruction), canonical(text))

    assert shown("yes", "yes")
    assert not shown("yes", "I think yes is the answer here.")  # a one-word instruction inside a sentence
    assert not shown("Use tabs.", "Use tabs. And spaces.")  # not where it ends
    assert shown("Use tabs.", "<user-instructions>\nUse tabs. [item_4]\n</user-instructions>")
    assert shown("Use tabs.\nNever spaces.", "> Use tabs.\n> Never spaces.")  # a quoted block
    assert shown("Use tabs.\nNever spaces.", "- User: Use tabs. Never spaces.\n- User: next")  # a summary's bullet
    assert shown("Use tabs.", "⟦p3⟧ Use tabs.")  # an anchor before it
    assert shown("Use tabs.", "Goal (goal = item_1): Use tabs.")  # a label
    assert not shown("Use tabs and spaces.", "- User: Use tabs and sp…")  # clipped is not whole


def test_instructions_are_checked_at_every_request():
    from ctxkernel.simulate.probes import InstructionWatch

    watch = InstructionWatch()
    keep, tabs = Message.user("Keep the API."), Message.user("Use tabs.")
    watch.check("", [keep])  # before any instruction: not counted
    watch.give("Keep the API.")
    watch.check("", [keep])
    watch.give("Use tabs.")
    watch.check("", [keep, tabs])
    watch.check("", [Message.user("a summary that says: keep the API"), tabs])  # the first left the surface
    watch.check("", [keep, tabs])  # and came back (an instruction block)
    assert watch.shares == [1.0, 1.0, 0.5, 1.0]
    items = [UserItem("Keep the API."), AssistantItem(Message.assistant("ok")), UserItem("Use tabs.")]
    items += [AssistantItem(Message.assistant(f"step {i}")) for i in range(3)]
    (row,) = compare(["none"], Recording(items, {"kind": "transcript"}), Options())["profiles"]
    assert row["instructions_visible"] == row["instructions_visible_min"] == row["instructions_visible_mean"] == 1.0


def test_slash_commands_and_their_output_are_not_instructions(tmp_path):
    import json

    from ctxkernel.simulate import load_recording

    def line(uuid, parent, content, **extra):
        return {
            "type": "user",
            "uuid": uuid,
            "parentUuid": parent,
            "message": {"role": "user", "content": content},
            **extra,
        }

    lines = [
        line("u1", None, "Port the parser."),
        line("u2", "u1", "<command-name>/compact</command-name>\n<command-message>compact</command-message>"),
        line("u3", "u2", "<local-command-stdout>Compacted</local-command-stdout>"),
        line("u4", "u3", "Caveat: the messages below were generated by local commands.", isMeta=True),
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    users = [i for i in load_recording(path).items if isinstance(i, UserItem)]
    assert [u.instruction for u in users] == [True, False, False, False]


def test_an_instruction_with_its_own_list_is_shown_flattened_into_a_summary():
    # regression: the Codex session's one instruction (a markdown list inside) was counted as never
    # shown: its own "- " items were stripped as if they were a quote's markers
    from ctxkernel.simulate.probes import canonical, shown_whole

    instruction = "# Context\n## Open tabs:\n- plan.md: docs/plan.md\n## My request:\nMigrate to prisma."
    summary = "## Primary Request and Intent\n- User: # Context ## Open tabs: - plan.md: docs/plan.md ## My request: Migrate to prisma.\n"
    assert shown_whole(canonical(instruction), canonical(summary))
    assert shown_whole(canonical(instruction), canonical("> " + instruction.replace("\n", "\n> ")))


def test_a_probe_is_visible_only_as_a_whole_not_inside_a_longer_word():
    # a command `ls` is not on a surface that says "tools", a changed file `a.py` not on one that
    # shows only `data.py`; the same names standing on their own (or under a folder) are
    from ctxkernel.simulate.probes import Probe, score, visible_text

    found = [
        Probe("commands_worked", "ls", (1,)),
        Probe("files_changed", "a.py", (0,)),
        Probe("files_changed", "src/b.py", (2,)),
        Probe("errors_seen", "KeyError: 'x'", (3,)),
    ]
    hidden = score(found, visible_text(["the tools it lists", "edited data.py and src/b.pyc"]), set())
    assert hidden["commands_worked"]["visible"] == 0.0
    assert hidden["files_changed"]["visible"] == 0.0
    shown = score(found, visible_text(["ran `ls` then edited a.py and /repo/src/b.py: KeyError: 'x'."]), set())
    assert [shown[k]["visible"] for k in ("commands_worked", "files_changed", "errors_seen")] == [1.0, 1.0, 1.0]
    # a text clipped at TEXT_CHARS is visible where its whole line is
    clipped = Probe("decisions", ("never touch the public apis " * 10)[:TEXT_CHARS], (4,))
    assert score([clipped], visible_text(["never touch the public apis " * 10]), set())["decisions"]["visible"] == 1.0


def test_an_error_line_is_matched_as_documented_not_in_any_case():
    """docs/simulate.md lists the error lines: ``...Error``/``...Exception`` names, compiler codes,
    and lines starting ``FAILED``, ``ERROR``, ``error:``, ``fatal:``. Matched in any case, source
    code a command printed (``failed: 0,``, ``linkError``) counted as an error seen, and the
    command as one that did not work."""
    from ctxkernel.simulate.probes import error_line

    for line in (
        "ValueError: bad token",
        "FAILED tests/test_a.py::test_x - assert 1 == 2",
        "ERROR collecting tests/test_b.py",
        "error: could not compile `demo`",
        "Error: ENOENT: no such file or directory",
        "fatal: not a git repository",
        "error[E0308]: mismatched types",
        "src/a.ts(3,5): error TS2345: Argument of type",
        "Program.cs(4,1): CS1002: ; expected",
        "bash: line 1: foo: command not found",
        '  File "x.py", line 2\nSyntaxError: invalid syntax',
    ):
        assert error_line(line, False), line
    for line in (
        "  failed: 0,",
        "  if (err instanceof Error) {",
        "const linkError = () => null;",
        "errors: []",
        "Passed: 12, failed: 0",
        "def on_error(self): ...",
    ):
        assert error_line(line, False) == "", line

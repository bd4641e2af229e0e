"""The strategy handle (issue #14 item 1): one typed object per strategy and session that carries
the strategy's name into everything it does."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

import ctxkernel
from ctxkernel import ConfigError, Message, Span, Summary
from ctxkernel.testing import build_kernel, throwaway_plugin

REPO = Path(__file__).resolve().parents[2]


class ProbeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: int = Field(default=3, ge=0)


PROBE = ctxkernel.Strategy("probe", ProbeSettings, capabilities={"observation"}, description="test probe")


class ProbePlugin:
    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(PROBE.spec)


@pytest.fixture
def session(tmp_path):
    kernel = build_kernel(tmp_path, strategies=["basic"], fsync=False)
    with throwaway_plugin(kernel, ProbePlugin(), "probe"):
        kernel.profile.strategies["probe"] = {"level": 7}
        yield kernel.open_session()


def test_settings_are_the_declared_model_validated_for_the_route(session):
    handle = PROBE.on(session.context)
    assert isinstance(handle.settings, ProbeSettings) and handle.settings.level == 7


def test_a_handle_declared_with_another_settings_model_is_refused(session):
    class Other(BaseModel):
        model_config = ConfigDict(extra="forbid")

    with pytest.raises(ConfigError, match="probe.*ProbeSettings.*Other"):
        _ = ctxkernel.Strategy("probe", Other).on(session.context).settings


def test_every_record_carries_the_strategys_name(session):
    handle = PROBE.on(session.context)
    seq = handle.emit("mark", {"n": 1})
    assert session.events[seq].type == "probe/mark" and session.events[seq].ignorable
    note = handle.notes().write("plan", "step one")
    assert note.path == "plan"
    written = [e for e in session.events if e.type.startswith("notes/")]
    assert written and written[-1].data.get("by") == "probe"


def test_strategy_notes_share_the_sessions_notes_object(session):
    """The window stamp set through a strategy's notes is the session's (handoff and rollover
    stamp every write with the current window this way)."""
    notes = PROBE.on(session.context).notes()
    notes.current_window = "win_7"
    assert notes.shared.current_window == "win_7" and PROBE.on(session.context).notes().current_window == "win_7"
    assert notes.write("a", "x").window == "win_7"
    assert len(notes) == len(notes.shared) == 1


def test_storage_is_namespaced_by_the_strategy(session):
    handle = PROBE.on(session.context)
    handle.kv_put("k", {"v": 1})
    assert handle.kv_get("k") == {"v": 1}
    assert session.store.kv_get("probe", "k") == {"v": 1}
    assert handle.kv_list() == {"k": {"v": 1}}
    handle.kv_delete("k")
    assert handle.kv_get("k") is None


def test_blobs_are_namespaced_by_the_strategy(session):
    blobs = PROBE.on(session.context).blobs
    info = blobs.put("reports/a.md", "# é")
    assert info == ctxkernel.BlobInfo.of("reports/a.md", "# é".encode())
    assert session.store.blob_get("probe/reports/a.md") == "# é".encode()
    assert blobs.get("reports/a.md") == "# é".encode() and blobs.stat("reports/a.md") == info
    blobs.put("reports/b.md", b"b")
    assert [i.key for i in blobs.list("reports/")] == ["reports/a.md", "reports/b.md"]
    blobs.delete("reports/a.md")
    assert blobs.get("reports/a.md") is None and [i.key for i in blobs.list()] == ["reports/b.md"]


@pytest.mark.parametrize("bad", ["../other/x", "/abs", "a/../../x", ""])
def test_blob_keys_cannot_leave_the_strategys_namespace(session, bad):
    with pytest.raises(ctxkernel.StoreError, match="invalid blob key"):
        PROBE.on(session.context).blobs.put(bad, b"x")
    assert session.store.blob_list() == []


def test_open_continuation_creates_a_session_tagged_with_the_strategy(session):
    opened = PROBE.on(session.context).open_continuation("child-1", origin="continue", parent=session.id)
    child = session.kernel.open_session(opened.id)  # the strategy gets the child's ctx; the harness its session
    assert child.id == "child-1" and child.kernel is session.kernel
    header = session.store.header("child-1")
    assert header.origin == "probe:continue" and header.parent == session.id
    with pytest.raises(ctxkernel.SessionExistsError):
        PROBE.on(session.context).open_continuation("child-1", origin="fork")


def test_state_is_per_strategy_and_session(session):
    handle = PROBE.on(session.context)
    handle.state["seen"] = 1
    assert PROBE.on(session.context).state == {"seen": 1}
    assert session.state["probe"] is handle.state


def test_compact_and_replace_are_recorded_in_the_strategys_name(session):
    handle = PROBE.on(session.context)
    session.user("read the file")
    call = ctxkernel.ToolCallBlock("c1", "read", {"path": "a.py"})
    session.prepare_request()
    session.commit_reply(Message.assistant("", tool_calls=[call]))
    session.tool_result("c1", "x" * 2000)
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))
    session.end_turn()
    tool_seq = next(n.seq for n in session.surface.nodes if n.role == "tool")
    handle.replace_tool_result(tool_seq, "[masked]", reason="mask")
    prune = next(e for e in session.events if e.type == "compaction/prune")
    assert prune.data["strategy"] == "probe" and prune.data["reason"] == "mask"
    nodes = session.surface.nodes
    result = handle.compact(Span(nodes[0].seq, nodes[-2].seq, summary=Summary("earlier work")), check_shrink=False)
    assert result.strategy == "probe"


def test_header_pressure_and_route_come_from_the_session(session):
    handle = PROBE.on(session.context)
    header = handle.request_header()
    assert header.tokens > 0 and header.system.startswith(session.kernel.profile.profile.system_prompt)
    assert handle.pressure().tokens >= header.tokens
    handle.set_route("openai", "gpt-4o")
    assert handle.route is not None and handle.route["model"] == "gpt-4o"


MIGRATED = [
    REPO / "examples/ctxkernel-observation-mask/src",
    REPO / "src/ctxkernel/default_plugins",
    REPO / "plugins/ctxkernel-decay/src",
    REPO / "plugins/ctxkernel-handoff/src",
    REPO / "plugins/ctxkernel-rollover/src",
    REPO / "plugins/ctxkernel-chapters/src",
    REPO / "plugins/ctxkernel-mask/src",
]


@pytest.mark.parametrize("root", MIGRATED, ids=lambda p: p.parent.name if p.name == "src" else p.name)
def test_migrated_strategies_never_pass_their_own_name_by_hand(root):
    """`strategy=NAME`, `emit(NAME, ...)`, `session.state[NAME]`, `session.settings(NAME)`: the
    handle carries the name; a plugin that writes it again has bypassed the handle."""
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                by_keyword = any(k.arg == "strategy" for k in node.keywords)
                # session.emit(name, kind, data) / session.settings(name); the handle's emit takes (kind, data)
                by_position = (node.func.attr == "emit" and len(node.args) >= 3) or (
                    node.func.attr == "settings" and node.args
                )
                assert not (by_keyword or by_position), f"{path}:{node.lineno} passes the strategy name by hand"
            target = node.value if isinstance(node, ast.Subscript) else None
            if isinstance(target, ast.Attribute) and target.attr == "state" and ast.unparse(target.value) == "session":
                raise AssertionError(f"{path}:{node.lineno} indexes session.state by hand")


def test_validating_signs_every_check_with_the_strategys_name(tmp_path):
    from ctxkernel.validate import ValidationReport

    kernel = build_kernel(tmp_path, strategies=["basic"], fsync=False)
    report = ValidationReport(where="probe.toml")
    assert PROBE.validating(kernel.profile, report) is None, "a profile without the strategy has nothing to check"
    kernel.profile.profile.strategies.append("probe")
    checks = PROBE.validating(kernel.profile, report)
    assert checks is not None and checks.report is report
    checks.ok("budgets", "fits")
    checks.warn("fallback", "no fallback")
    checks.fail("store", "not writable")
    assert [(c.check, c.level, c.strategy) for c in report.checks] == [
        ("budgets", "pass", "probe"),
        ("fallback", "warn", "probe"),
        ("store", "fail", "probe"),
    ]
    assert "strategy 'probe'" in report.checks[-1].message


@pytest.mark.parametrize("root", MIGRATED[2:5], ids=lambda p: p.parent.name)
def test_validate_profile_records_checks_through_the_handle(root):
    """decay, handoff and rollover: `validate_profile` records through `Strategy.validating`, never
    `report.ok/warn/fail(check, NAME, ...)` with the name written again (chapters: branch `blobs`)."""
    for path in root.rglob("plugin.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                if owner == "report" and node.func.attr in ("ok", "warn", "fail"):
                    raise AssertionError(f"{path}:{node.lineno} signs a check by hand")


def test_process_memory_is_shared_per_store_and_strategy(session):
    handle = PROBE.on(session.context)
    handle.process_memory["reserved"] = {"root": 3}
    sibling = session.kernel.open_session()
    assert PROBE.on(sibling.context).process_memory == {"reserved": {"root": 3}}
    assert ctxkernel.Strategy("other", ProbeSettings).on(sibling.context).process_memory == {}
    other_kernel = build_kernel(session.kernel.home / "elsewhere", strategies=["basic"], fsync=False)
    assert PROBE.on(other_kernel.open_session().context).process_memory == {}


def test_plugins_never_reach_the_kernel_or_the_store_of_a_session():
    """The handle is the plugins' only way in (its docstring): a plugin's source never follows
    ``session.kernel`` or ``session.store`` (helper modules for tests are exempt)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    reach = re.compile(r"\bsession\.(kernel|store)\b")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted((root / "plugins").glob("*/src/**/*.py"))
        if path.name != "testing.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if reach.search(line)
    ]
    assert offenders == []


class Recorder:
    """Records what every session hook and its tool's handler receive as ``ctx``."""

    def __init__(self) -> None:
        self.seen: dict[str, set[type]] = {}

    def saw(self, hook: str, ctx: Any) -> None:
        self.seen.setdefault(hook, set()).add(type(ctx))

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(PROBE.spec)

    @ctxkernel.hookimpl
    def session_opened(self, ctx: Any) -> None:
        self.saw("session_opened", ctx)

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        self.saw("register_tools", ctx)

        def handler(ctx: Any, args: Any) -> str:
            self.saw("tool handler", ctx)
            return "ok"

        register(PROBE.tool("probe_tool", "records its ctx", ctxkernel.ToolArgs, handler))

    @ctxkernel.hookimpl
    def system_prompt(self, ctx: Any) -> None:
        self.saw("system_prompt", ctx)

    @ctxkernel.hookimpl
    def pre_step(self, ctx: Any, step: Any) -> None:
        self.saw("pre_step", ctx)

    @ctxkernel.hookimpl
    def decorate_request(self, ctx: Any, request: Any) -> None:
        self.saw("decorate_request", ctx)

    @ctxkernel.hookimpl
    def sanitize_reply(self, ctx: Any, reply: Any) -> None:
        self.saw("sanitize_reply", ctx)

    @ctxkernel.hookimpl
    def commit(self, ctx: Any, result: Any) -> None:
        self.saw("commit", ctx)

    @ctxkernel.hookimpl
    def project(self, ctx: Any) -> None:
        self.saw("project", ctx)


def test_every_session_hook_and_tool_handler_receives_the_context_never_the_session(tmp_path):
    recorder = Recorder()
    kernel = build_kernel(tmp_path, strategies=["probe", "basic"], plugins=[("probe", recorder)], fsync=False)
    session = kernel.open_session()
    session.user("read a file")
    session.prepare_request()
    session.commit_reply(Message.assistant("", tool_calls=[ctxkernel.ToolCallBlock("c1", "probe_tool", {})]))
    session.tool_result("c1", session.run_tool(session.pending_calls[0]))
    session.prepare_request()
    session.commit_reply(Message.assistant("done"))
    session.end_turn()
    head = [n.seq for n in session.surface.nodes]
    session.compact(Span(head[0], head[2], summary="read a file"), strategy="probe")
    session.project()
    assert set(recorder.seen) == {
        "session_opened",
        "register_tools",
        "tool handler",
        "system_prompt",
        "pre_step",
        "decorate_request",
        "sanitize_reply",
        "commit",
        "project",
    }
    assert all(types == {ctxkernel.Context} for types in recorder.seen.values()), recorder.seen


def test_a_strategy_has_one_handle_per_session_and_a_session_is_refused(session):
    ctx = session.context
    assert PROBE.on(ctx) is PROBE.on(ctx) and PROBE.on(ctx).ctx is ctx
    with pytest.raises(TypeError, match="pass session.context"):
        PROBE.on(session)

"""Strategy tools and system-prompt sections: validation, run-time toggling, header and meter."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import Field

import ctxkernel
from ctxkernel import Message, Span, StrategySpec, Tool, ToolArgs, ToolCallBlock, ToolOutcome
from ctxkernel.testing import build_kernel, throwaway_plugin

SECTION = "## Notes strategy\nUse the `note` tool to keep facts that must survive compaction."


class NoteArgs(ToolArgs):
    text: str = Field(min_length=1)
    priority: Literal["low", "high"] = "low"
    ttl: int = Field(default=3, ge=1)


class NotesStrategy:
    def __init__(self) -> None:
        self.calls = 0

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("notes"))

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        def note(ctx: Any, args: NoteArgs) -> ToolOutcome:
            self.calls += 1
            ctxkernel.Strategy("notes").on(ctx).emit("note", {"text": args.text})
            return ToolOutcome("noted")

        register(Tool("note", "keep a fact", NoteArgs, note, strategy="notes"))
        register(Tool("forget", "drop a fact", NoteArgs, note, strategy="notes"))

    @ctxkernel.hookimpl
    def system_prompt(self, ctx: Any) -> str:
        return SECTION


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Any, Any, NotesStrategy]:
    plugin = NotesStrategy()
    kernel = build_kernel(tmp_path, strategies=["basic", "notes"], plugins=[("notes", plugin)])
    session = kernel.open_session()
    session.user("hello")
    return kernel, session, plugin


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"txt": "typo"}, ["unknown argument 'txt'", "missing required argument 'text'"]),
        ({"text": "x", "priority": "urgent"}, ["argument 'priority'", "'urgent'"]),
        ({"text": "x", "ttl": 0}, ["argument 'ttl'"]),
        ({"text": ""}, ["argument 'text'"]),
        ({"_raw": "{text: oops"}, ["not valid JSON"]),
    ],
)
def test_bad_arguments_give_an_error_outcome_naming_them_and_write_nothing(
    setup: Any, arguments: dict[str, Any], named: list[str]
) -> None:
    kernel, session, plugin = setup
    path = kernel.store.path(session.id)
    before = path.read_bytes()
    outcome = session.run_tool(ToolCallBlock("c1", "note", arguments))
    assert outcome.is_error
    for fragment in named:
        assert fragment in outcome.content
    if "_raw" not in arguments:
        assert "Accepted arguments: {text: string, priority:" in outcome.content and "ttl: integer" in outcome.content
    assert plugin.calls == 0
    assert path.read_bytes() == before


def test_good_arguments_run_the_handler(setup: Any) -> None:
    _, session, plugin = setup
    outcome = session.run_tool({"id": "c1", "name": "note", "arguments": {"text": "keep me", "priority": "high"}})
    assert (outcome.is_error, outcome.content, plugin.calls) == (False, "noted", 1)
    assert session.events[-1].type == "notes/note"


def test_unknown_tool_is_an_error_outcome_listing_kernel_tools(setup: Any) -> None:
    _, session, _ = setup
    outcome = session.run_tool(ToolCallBlock("c1", "nope", {}))
    assert outcome.is_error and "'nope'" in outcome.content and "note" in outcome.content


def test_section_is_in_the_request_and_its_header_and_counted(setup: Any) -> None:
    kernel, session, _ = setup
    request = session.prepare_request()
    assert request.system.count(SECTION) == 1
    assert request.system.startswith(kernel.profile.profile.system_prompt)
    header = [e for e in session.events if e.type == "request/header"][-1]
    assert header.data["system"] == request.system
    assert [t["function"]["name"] for t in header.data["tools"]] == ["note", "forget"]
    meter = session.meter
    assert request.pressure.tokens == meter.count_header(request.system, request.tools) + meter.surface_tokens()
    # the section's cost is in the pressure: without it the header is cheaper by at least its tokens
    with_header = meter.count_header(request.system, request.tools)
    session.commit_reply(Message.assistant("hi"))
    kernel.set_strategy_enabled("notes", False)
    session.user("again")
    request = session.prepare_request()
    assert SECTION not in request.system and request.tools == []
    without_header = meter.count_header(request.system, [])
    assert request.pressure.tokens == without_header + meter.surface_tokens()
    assert with_header - without_header >= meter.count_text(SECTION)


def test_disable_and_reenable_leaves_exactly_one_of_each_tool_and_section(setup: Any) -> None:
    kernel, session, _ = setup
    assert session.owns_tool("note")
    for _ in range(3):
        kernel.set_strategy_enabled("notes", False)
        assert not session.owns_tool("note") and not session.owns_tool("forget")
        assert session.kernel.hooks.system_prompt(session).count(SECTION) == 0
        kernel.set_strategy_enabled("notes", True)
        kernel.set_strategy_enabled("notes", True)  # enabling twice is a no-op
    request = session.prepare_request()
    assert session.tools.names() == ["note", "forget"]
    assert request.system.count(SECTION) == 1
    assert [t["function"]["name"] for t in request.tools] == ["note", "forget"]
    assert kernel.hooks.system_prompt(session) == [SECTION]
    # profile order of hooks is kept after re-registration: basic before notes
    assert kernel.plugins.enabled_names() == ["basic", "notes"]
    # and the tool still runs once per call
    session.commit_reply(Message.assistant("", [ToolCallBlock("c1", "note", {"text": "t"})]))
    session.tool_result("c1", session.run_tool(session.pending_calls[0]))
    assert sum(e.type == "notes/note" for e in session.events) == 1


def test_header_is_written_only_when_it_changes(setup: Any) -> None:
    kernel, session, _ = setup
    session.prepare_request()
    session.commit_reply(Message.assistant("a"))
    session.user("b")
    session.prepare_request()
    session.commit_reply(Message.assistant("c"))
    assert sum(e.type == "request/header" for e in session.events) == 1
    kernel.set_strategy_enabled("notes", False)
    session.user("d")
    session.prepare_request()
    headers = [e for e in session.events if e.type == "request/header"]
    assert len(headers) == 2 and SECTION not in headers[-1].data["system"]


class WrongTypes:
    """A strategy whose hooks answer with the wrong type (set per test)."""

    def __init__(self, section: Any = None, summary: Any = None, panel: Any = None, steward: Any = None) -> None:
        self.section, self.summary, self.panel, self.steward = section, summary, panel, steward

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("wrong"))

    @ctxkernel.hookimpl
    def system_prompt(self, ctx: Any) -> Any:
        return self.section

    @ctxkernel.hookimpl
    def summarize(self, ctx: Any, region: Any) -> Any:
        return self.summary

    @ctxkernel.hookimpl
    def project(self, ctx: Any) -> Any:
        return self.panel

    @ctxkernel.hookimpl
    def steward_actions(self, ctx: Any, request: Any) -> Any:
        return self.steward


def _wrong_kernel(tmp_path: Path, plugin: WrongTypes) -> Any:
    # basic compacts only when asked: the summary is asked for by compact_now, not by a request
    settings = {"basic": {"auto": False}}
    return build_kernel(tmp_path, strategies=["wrong", "basic"], plugins=[("wrong", plugin)], settings=settings)


@pytest.mark.parametrize("section", [42, b"bytes", ["a list"]])
def test_a_system_prompt_section_of_the_wrong_type_names_the_strategy(tmp_path: Path, section: Any) -> None:
    """A section that is not a str used to end prepare_request with a raw AttributeError or
    TypeError from the join; the log is left as it was."""
    session = _wrong_kernel(tmp_path, WrongTypes(section=section)).open_session()
    session.user("hello")
    before = len(session.events)
    with pytest.raises(ctxkernel.ConfigError, match=r"strategy 'wrong': its system_prompt hook returned") as info:
        session.prepare_request()
    assert type(section).__name__ in str(info.value) and "a str or None" in str(info.value)
    assert len(session.events) == before


def test_a_summary_of_the_wrong_type_names_the_strategy(tmp_path: Path) -> None:
    session = _wrong_kernel(tmp_path, WrongTypes(summary=42)).open_session()
    for i in range(30):
        session.user(f"message {i} " + "word " * 1500)
        session.prepare_request()
        session.commit_reply(ctxkernel.Message.assistant(f"reply {i}"))
        session.end_turn()
    before = len(session.events)
    with pytest.raises(ctxkernel.ConfigError, match=r"strategy 'wrong': its summarize hook returned int"):
        session.compact_now()
    assert len(session.events) == before


def test_a_status_panel_of_the_wrong_type_names_the_strategy(tmp_path: Path) -> None:
    session = _wrong_kernel(tmp_path, WrongTypes(panel="not a dict")).open_session()
    with pytest.raises(ctxkernel.ConfigError, match=r"strategy 'wrong': its project hook returned str"):
        session.project()


@pytest.mark.parametrize(
    "steward",
    [
        {"name": "compress", "arguments": {}},  # one call, not a list: its keys became "calls"
        ["compress"],
        [{"arguments": {}}],
        [{"name": "compress", "arguments": ["not", "a", "table"]}],
    ],
)
def test_steward_calls_of_the_wrong_shape_name_the_strategy(tmp_path: Path, steward: Any) -> None:
    """A dict returned instead of a list was taken apart into its keys, which the simulator then
    dropped in silence (the strategy's steward never acted); other shapes failed as bare errors."""
    kernel = _wrong_kernel(tmp_path, WrongTypes(steward=steward))
    session = kernel.open_session()
    session.user("hello")
    request = session.prepare_request()
    with pytest.raises(ctxkernel.ConfigError, match=r"strategy 'wrong': its steward_actions hook returned"):
        kernel.hooks.steward_actions(session, request)


def test_well_formed_steward_calls_pass_in_profile_order(tmp_path: Path) -> None:
    calls = [{"name": "compress", "arguments": {"ids": [1]}}, {"name": "drop"}]
    kernel = _wrong_kernel(tmp_path, WrongTypes(steward=calls))
    session = kernel.open_session()
    session.user("hello")
    assert kernel.hooks.steward_actions(session, session.prepare_request()) == calls


class Raising:
    """A strategy one of whose hooks raises (a third-party plugin's bug)."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook:
            raise KeyError(f"bug in {hook}")

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("raising"))

    @ctxkernel.hookimpl
    def pre_step(self, ctx: Any, step: Any) -> None:
        self._maybe_raise("pre_step")

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        self._maybe_raise("register_tools")

    @ctxkernel.hookimpl
    def system_prompt(self, ctx: Any) -> None:
        self._maybe_raise("system_prompt")

    @ctxkernel.hookimpl
    def decorate_request(self, ctx: Any, request: Any) -> None:
        self._maybe_raise("decorate_request")

    @ctxkernel.hookimpl
    def sanitize_reply(self, ctx: Any, reply: Any) -> None:
        self._maybe_raise("sanitize_reply")

    @ctxkernel.hookimpl
    def project(self, ctx: Any) -> None:
        self._maybe_raise("project")

    @ctxkernel.hookimpl
    def summarize(self, ctx: Any, region: Any) -> None:
        self._maybe_raise("summarize")

    @ctxkernel.hookimpl
    def steward_actions(self, ctx: Any, request: Any) -> None:
        self._maybe_raise("steward_actions")

    @ctxkernel.hookimpl
    def compact_now(self, ctx: Any, request: Any) -> None:
        self._maybe_raise("compact_now")

    @ctxkernel.hookimpl
    def commit(self, ctx: Any, result: Any) -> None:
        self._maybe_raise("commit")

    @ctxkernel.hookimpl
    def request_error(self, ctx: Any, error: Any) -> None:
        self._maybe_raise("request_error")

    @ctxkernel.hookimpl
    def session_opened(self, ctx: Any) -> None:
        self._maybe_raise("session_opened")

    @ctxkernel.hookimpl
    def snapshot_state(self, ctx: Any) -> None:
        self._maybe_raise("snapshot_state")


@pytest.mark.parametrize(
    "hook", ["pre_step", "register_tools", "system_prompt", "decorate_request", "sanitize_reply", "project"]
)
def test_a_hook_that_raises_is_named_with_its_strategy_and_the_log_is_unchanged(tmp_path: Path, hook: str) -> None:
    """A strategy's pre_step, register_tools, system_prompt (or decorate_request, sanitize_reply,
    project) that raised reached the harness as the bare exception (a KeyError out of
    prepare_request), naming neither strategy nor hook."""
    kernel = build_kernel(tmp_path, strategies=["basic", "raising"], plugins=[("raising", Raising(hook))])
    session = kernel.open_session()
    session.user("hello")
    if hook in ("sanitize_reply", "project"):
        session.prepare_request()
    logs = sorted(tmp_path.rglob("*.jsonl"))
    before = [p.read_bytes() for p in logs]
    with pytest.raises(ctxkernel.ConfigError, match=rf"strategy 'raising': its {hook} hook raised KeyError") as info:
        if hook == "sanitize_reply":
            session.commit_reply(Message.assistant("ok"))
        elif hook == "project":
            session.project()
        else:
            session.prepare_request()
    assert f"bug in {hook}" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)  # the plugin's own error, with its traceback
    assert [p.read_bytes() for p in logs] == before


def test_a_kernel_refusal_from_a_hook_is_not_renamed(tmp_path: Path) -> None:
    class Conflicting(Raising):
        @ctxkernel.hookimpl
        def register_tools(self, register: Any, ctx: Any) -> None:
            register("not a tool")

    kernel = build_kernel(tmp_path, strategies=["basic", "raising"], plugins=[("raising", Conflicting("none"))])
    session = kernel.open_session()
    session.user("hello")
    with pytest.raises(ctxkernel.ToolError, match="register_tools must register ctxkernel.Tool objects"):
        session.prepare_request()


def _long_session(tmp_path: Path) -> Any:
    """A session of ``basic`` (compacting only when asked) long enough to compact."""
    kernel = build_kernel(tmp_path, strategies=["basic"], settings={"basic": {"auto": False}})
    session = kernel.open_session()
    for i in range(30):
        session.user(f"message {i} " + "word " * 1500)
        session.prepare_request()
        session.commit_reply(Message.assistant(f"reply {i}"))
        session.end_turn()
    return session


@pytest.mark.parametrize(
    "hook",
    [
        "summarize",  # before the lock (basic without a summarizer model): nothing written
        "summarize_locked",  # inside the transaction: its start and an error end are written
        "steward_actions",
        "compact_now",
        "request_error",
        "session_opened",
        "snapshot_state",
    ],
)
def test_every_other_hook_that_raises_is_named_with_its_strategy(tmp_path: Path, hook: str) -> None:
    """summarize, steward_actions, compact_now, request_error, session_opened and snapshot_state
    let a strategy's bare exception (a KeyError) reach the harness, naming neither strategy nor
    hook. A failed compaction writes only its start and an end that records the named error."""
    session = _long_session(tmp_path)
    kernel = session.kernel
    locked = hook == "summarize_locked"
    hook = "summarize" if locked else hook
    if hook == "steward_actions":
        session.user("one more")
    request = session.prepare_request() if hook == "steward_actions" else None
    logs = sorted(tmp_path.rglob("*.jsonl"))
    before = [p.read_bytes() for p in logs]
    count = len(session.events)
    with (
        throwaway_plugin(kernel, Raising(hook), "raising"),
        pytest.raises(ctxkernel.ConfigError, match=rf"strategy 'raising': its {hook} hook raised KeyError") as info,
    ):
        if locked:
            seqs = [n.seq for n in session.surface]
            session.compact(Span(seqs[0], seqs[3]), strategy="basic")
        elif hook in ("summarize", "compact_now"):
            session.compact_now()
        elif hook == "steward_actions":
            kernel.hooks.steward_actions(session, request)
        elif hook == "request_error":
            session.request_failed(ctxkernel.ContextOverflowError("too long", prompt_tokens=10, limit=5))
        elif hook == "session_opened":
            kernel.open_session(session.id)
        else:
            kernel.hooks.snapshot_state(session)
    assert f"bug in {hook}" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)  # the plugin's own error, with its traceback
    session.refresh()
    written = session.events[count:]
    if locked:  # the compaction transaction's record of its failure, naming the strategy
        assert [e.type for e in written] == ["compaction/start", "compaction/end"]
        assert "strategy 'raising': its summarize hook raised KeyError" in written[-1].data["error"]
    else:
        assert [p.read_bytes() for p in logs] == before


def test_a_commit_hook_that_raises_leaves_the_compaction_committed_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit hook runs after the transaction is durable: its KeyError used to come out of
    compact_now as if the compaction had failed. Now the compaction's outcome is returned, the
    other strategies' commit hooks still run, and the error is logged naming the strategy."""
    session = _long_session(tmp_path)
    told: list[str] = []

    class Told:
        @ctxkernel.hookimpl
        def register_strategy(self, register: Any) -> None:
            register(StrategySpec("told"))

        @ctxkernel.hookimpl
        def commit(self, ctx: Any, result: Any) -> None:
            told.append(result.compaction_id)

    with (
        throwaway_plugin(session.kernel, Told(), "told"),
        throwaway_plugin(session.kernel, Raising("commit"), "raising"),
        caplog.at_level("ERROR", logger="ctxkernel"),
    ):
        outcome = session.compact_now()
    assert outcome.committed
    ends = [e for e in session.events if e.type == "compaction/end"]
    assert ends and "error" not in ends[-1].data
    assert told == [ends[-1].data["compaction_id"]]
    [record] = [r for r in caplog.records if "commit hook raised" in r.getMessage()]
    assert "'raising'" in record.getMessage() and "bug in commit" in record.getMessage()

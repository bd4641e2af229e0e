"""AgentLoop and its asyncio facade over the scripted model."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import ctxkernel
from ctxkernel import (
    AgentLoop,
    AsyncAgentLoop,
    AsyncSession,
    ContextOverflowError,
    Message,
    ModelError,
    ScriptedModel,
    StrategySpec,
    Tool,
    ToolArgs,
    ToolCallBlock,
    ToolOutcome,
)
from ctxkernel.testing import build_kernel


class NoteArgs(ToolArgs):
    text: str


class NotesPlugin:
    """A throwaway strategy with one kernel tool; ``stop`` concludes the turn."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("notes"))

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        def note(ctx: Any, args: NoteArgs) -> ToolOutcome:
            self.notes.append(args.text)
            return ToolOutcome("noted", conclude_turn=args.text == "stop")

        register(Tool("note", "remember a line", NoteArgs, note, strategy="notes"))


def call(call_id: str, name: str, **arguments: Any) -> ToolCallBlock:
    return ToolCallBlock(call_id, name, arguments)


def kernel_with_notes(tmp_path: Any) -> tuple[Any, NotesPlugin]:
    plugin = NotesPlugin()
    kernel = build_kernel(tmp_path, strategies=["basic", "notes"], plugins=[("notes", plugin)])
    return kernel, plugin


def test_kernel_and_harness_tools_in_one_batch(tmp_path: Any) -> None:
    kernel, plugin = kernel_with_notes(tmp_path)
    session = kernel.open_session()
    model = ScriptedModel(
        [
            Message.assistant(
                "working", [call("c1", "note", text="a"), call("c2", "shell", command="ls"), call("c3", "nope")]
            ),
            Message.assistant("done"),
        ]
    )
    harness_calls: list[str] = []

    def run_tool(c: ToolCallBlock) -> str:
        harness_calls.append(c.name)
        if c.name == "nope":
            raise RuntimeError("no such tool here")
        return "file.txt"

    result = AgentLoop(
        session,
        model,
        run_tool,
        tools=[{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
    ).run("go")

    assert result.reason == "completed" and result.steps == 2 and result.text == "done"
    assert plugin.notes == ["a"]
    assert harness_calls == ["shell", "nope"]
    results = [e.data["message"]["content"][0] for e in session.events if e.type == "tool/result"]
    assert [(r["call_id"], r.get("is_error", False)) for r in results] == [("c1", False), ("c2", False), ("c3", True)]
    assert "RuntimeError: no such tool here" in results[2]["content"]
    # the harness's tool schema is sent and recorded in the header with the kernel's
    header = next(e for e in session.events if e.type == "request/header")
    assert [t["function"]["name"] for t in header.data["tools"]] == ["note", "shell"]
    assert model.calls[0]["tools"] == header.data["tools"]
    assert session.events[-1].type == "turn/end" and session.events[-1].data["reason"] == "completed"


HARNESS_NOTE = {"type": "function", "function": {"name": "note", "description": "the harness's", "parameters": {}}}


def test_a_harness_tool_with_a_strategy_tools_name_wins_in_the_session_api(tmp_path: Any) -> None:
    # the request carried both schemas (a provider refuses a name twice) and owns_tool sent the
    # harness's own call to the strategy; now the harness's tool wins, as in serve
    kernel, plugin = kernel_with_notes(tmp_path)
    session = kernel.open_session()
    session.set_harness_tools([HARNESS_NOTE])
    session.user("go")
    request = session.prepare_request()
    assert [t["function"]["name"] for t in request.tools] == ["note"]
    assert request.tools[0]["function"]["description"] == "the harness's"
    assert session.request_header().tokens == session.meter.count_header(request.system, [HARNESS_NOTE])
    assert not session.owns_tool("note") and "note" not in session.tools.names()
    # a call of it given to run_tool anyway is refused by name, nothing written, the strategy not run
    before = len(session.events)
    outcome = session.run_tool(call("x", "note", text="a"))
    assert outcome.is_error and "harness" in outcome.content and "set_harness_tools" in outcome.content
    assert plugin.notes == [] and len(session.events) == before
    # without the harness's tool of that name the strategy's is offered again
    session.commit_reply(Message.assistant("ok"))
    session.set_harness_tools([])
    request = session.prepare_request()
    assert [t["function"]["name"] for t in request.tools] == ["note"] and session.owns_tool("note")
    assert request.tools[0]["function"]["description"] == "remember a line"


def test_a_reopened_session_keeps_the_harness_tool_that_won_the_name(tmp_path: Any) -> None:
    # restore_harness_tools took every header tool with a strategy tool's name for the strategy's,
    # so a reopened session offered the strategy's again (a new header) and owned the harness's call
    kernel, _ = kernel_with_notes(tmp_path)
    session = kernel.open_session()
    shell = {"type": "function", "function": {"name": "shell", "parameters": {}}}
    session.set_harness_tools([HARNESS_NOTE, shell])
    session.user("go")
    session.prepare_request()
    session.commit_reply(Message.assistant("ok"))
    session.end_turn()
    again = kernel.open_session(session.id)
    assert again.harness_tools == [HARNESS_NOTE, shell] and not again.owns_tool("note")
    again.user("more")
    again.prepare_request()
    assert [e.type for e in again.events].count("request/header") == 1  # the same header as before
    # a session whose harness shares no name keeps the strategy's tool, as before
    other = kernel.open_session()
    other.set_harness_tools([shell])
    other.user("go")
    other.prepare_request()
    other.commit_reply(Message.assistant("ok"))
    other.end_turn()
    reopened = kernel.open_session(other.id)
    assert reopened.harness_tools == [shell] and reopened.owns_tool("note")


def test_the_agent_loop_sends_a_clashing_call_to_the_harness(tmp_path: Any) -> None:
    kernel, plugin = kernel_with_notes(tmp_path)
    session = kernel.open_session()
    model = ScriptedModel([Message.assistant("", [call("c1", "note", text="mine")]), Message.assistant("done")])
    harness_calls: list[str] = []

    def run_tool(c: ToolCallBlock) -> str:
        harness_calls.append(c.name)
        return "the harness noted it"

    AgentLoop(session, model, run_tool, tools=[HARNESS_NOTE]).run("go")
    assert harness_calls == ["note"] and plugin.notes == []
    assert [t["function"]["name"] for t in model.calls[0]["tools"]] == ["note"]
    header = next(e for e in session.events if e.type == "request/header")
    assert header.data["tools"] == [HARNESS_NOTE]


def test_unknown_tool_without_a_harness_runner_gets_an_error_result(tmp_path: Any) -> None:
    session = build_kernel(tmp_path).open_session()
    model = ScriptedModel([Message.assistant("", [call("c1", "shell")]), Message.assistant("ok")])
    AgentLoop(session, model).run("go")
    result = next(e for e in session.events if e.type == "tool/result").data["message"]["content"][0]
    assert result["is_error"] and "unknown tool 'shell'" in result["content"]


def test_a_reply_reusing_or_lacking_a_call_id_gets_fresh_ids(tmp_path: Any) -> None:
    """A model that numbers calls per reply (``call_0`` every turn), repeats an id within a reply
    or sends none: the loop renames the call as the framework adapters do, rather than raising the
    session's refusal out of ``run`` (or sending an empty id back to the provider)."""
    session = build_kernel(tmp_path).open_session()
    seen: list[str] = []
    model = ScriptedModel(
        [
            Message.assistant("", [call("call_0", "read")]),
            Message.assistant("", [call("call_0", "read"), call("call_0", "read"), call("", "read")]),
            Message.assistant("done"),
        ]
    )
    result = AgentLoop(session, model, run_tool=lambda c: seen.append(c.id) or "ok").run("go")
    assert result.reason == "completed" and result.steps == 3
    ids = [c.id for m in result.replies for c in m.tool_calls]
    assert len(set(ids)) == 4 and "" not in ids and ids[0] == "call_0"
    assert seen == ids  # each result answers the id the log holds
    assert not session.surface.pending_calls


def test_conclude_turn_stops_after_the_batch(tmp_path: Any) -> None:
    kernel, _ = kernel_with_notes(tmp_path)
    session = kernel.open_session()
    model = ScriptedModel([Message.assistant("", [call("c1", "note", text="stop"), call("c2", "note", text="x")])])
    result = AgentLoop(session, model).run("go")
    assert result.steps == 1 and len(model.calls) == 1  # no second request although tools ran
    assert [e.type for e in session.events[-3:]] == ["tool/result", "step/end", "turn/end"]


def test_max_steps_ends_the_turn_aborted(tmp_path: Any) -> None:
    session = build_kernel(tmp_path).open_session()
    counter = iter(range(100))
    model = ScriptedModel(lambda m, s, t: Message.assistant("", [call(f"c{next(counter)}", "shell")]))
    result = AgentLoop(session, model, lambda c: "ok", max_steps=3).run("loop forever")
    assert result.reason == "aborted" and result.steps == 3
    assert session.events[-1].data == {"turn": 1, "reason": "aborted"}


class Decider:
    """A strategy whose request_error answer is scripted, and which records what it saw."""

    def __init__(self, answers: list[bool | None]) -> None:
        self.answers = answers
        self.errors: list[ModelError] = []

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(StrategySpec("decider"))

    @ctxkernel.hookimpl(tryfirst=True)
    def request_error(self, ctx: Any, error: ModelError) -> bool | None:
        self.errors.append(error)
        return self.answers.pop(0)


class FlakyModel:
    provider, model = "flaky", "f-1"

    def __init__(self, failures: list[ModelError]) -> None:
        self.failures = failures
        self.calls = 0

    def complete(self, messages: list[Message], *, system: str = "", tools: Any = None) -> ctxkernel.Reply:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return ctxkernel.Reply(Message.assistant("fine"), {"input_tokens": 10, "output_tokens": 1})


def test_retry_only_when_request_failed_says_so(tmp_path: Any) -> None:
    decider = Decider([True, False])
    kernel = build_kernel(tmp_path, strategies=["decider", "basic"], plugins=[("decider", decider)])
    session = kernel.open_session()
    model = FlakyModel([ModelError("boom 1"), ModelError("boom 2")])
    with pytest.raises(ModelError, match="boom 2"):
        AgentLoop(session, model).run("hi")
    assert model.calls == 2 and len(decider.errors) == 2
    assert session.events[-1].data["reason"] == "error"
    errors = [e.data["error"] for e in session.events if e.type == "step/end" and "error" in e.data]
    assert errors == ["ModelError: boom 1", "ModelError: boom 2"]


def test_retries_are_capped_even_if_a_hook_always_asks(tmp_path: Any) -> None:
    decider = Decider([True] * 10)
    kernel = build_kernel(tmp_path, strategies=["decider", "basic"], plugins=[("decider", decider)])
    session = kernel.open_session()
    model = FlakyModel([ContextOverflowError("too big")] * 10)
    with pytest.raises(ContextOverflowError):
        AgentLoop(session, model, max_retries=2).run("hi")
    assert model.calls == 3


def test_a_crashing_model_leaves_a_closed_turn(tmp_path: Any) -> None:
    session = build_kernel(tmp_path).open_session()

    class Broken:
        provider, model = "x", "y"

        def complete(self, *a: Any, **k: Any) -> Any:
            raise ValueError("adapter bug")

    with pytest.raises(ValueError, match="adapter bug"):
        AgentLoop(session, Broken()).run("hi")
    assert not session.turn_open and session.events[-1].data["reason"] == "error"
    # the session is usable afterwards
    AgentLoop(session, ScriptedModel(["back"])).run("again")
    assert session.events[-1].data == {"turn": 2, "reason": "completed"}


def test_async_loop_with_async_model_and_tools(tmp_path: Any) -> None:
    kernel, plugin = kernel_with_notes(tmp_path)
    session = kernel.open_session()
    loop_thread: list[int] = []
    session_threads: set[int] = set()
    original_append = session.append

    def spy_append(batch: Any, **options: Any) -> int:
        session_threads.add(threading.get_ident())
        return original_append(batch, **options)

    session.append = spy_append  # type: ignore[method-assign]
    script = ScriptedModel(
        [Message.assistant("", [call("c1", "note", text="a"), call("c2", "fetch", url="u")]), Message.assistant("done")]
    )

    class AsyncModel:
        provider, model = script.provider, script.model

        async def acomplete(self, messages: list[Message], *, system: str = "", tools: Any = None) -> ctxkernel.Reply:
            loop_thread.append(threading.get_ident())
            await asyncio.sleep(0)
            return script.complete(messages, system=system, tools=tools)

    async def fetch(c: ToolCallBlock) -> str:
        await asyncio.sleep(0)
        return f"fetched {c.arguments['url']}"

    async def main() -> Any:
        result = await AsyncAgentLoop(session, AsyncModel(), fetch).run("go")
        return result, threading.get_ident()

    result, main_thread = asyncio.run(main())
    assert result.reason == "completed" and result.text == "done" and plugin.notes == ["a"]
    assert set(loop_thread) == {main_thread}  # the async model ran on the event loop
    assert main_thread not in session_threads  # session writes never ran on the event loop
    contents = [e.data["message"]["content"][0]["content"] for e in session.events if e.type == "tool/result"]
    assert contents == ["noted", "fetched u"]


def test_async_loop_with_sync_model_and_concurrent_sessions(tmp_path: Any) -> None:
    kernel = build_kernel(tmp_path)
    sessions = [kernel.open_session() for _ in range(4)]

    async def main() -> list[Any]:
        loops = [
            AsyncAgentLoop(s, ScriptedModel([Message.assistant("", [call("c", "t")]), "done"]), lambda c: "ok")
            for s in sessions
        ]
        return await asyncio.gather(*(loop.run(f"task {i}") for i, loop in enumerate(loops)))

    results = asyncio.run(main())
    assert [r.reason for r in results] == ["completed"] * 4
    for s in sessions:
        reopened = kernel.open_session(s.id)
        assert [e.to_dict() for e in reopened.events] == [e.to_dict() for e in s.events]


def test_async_session_serialises_concurrent_calls(tmp_path: Any) -> None:
    """Many coroutines appending to one session at once: seqs stay contiguous and each call
    happens whole (the facade holds the session lock in the worker thread)."""
    session = build_kernel(tmp_path).open_session()
    facade = AsyncSession(session)

    async def main() -> None:
        await facade.user("start")
        await asyncio.gather(*(facade.call(session.emit, "test", "tick", {"i": i}) for i in range(40)))
        await facade.end_turn()

    asyncio.run(main())
    ticks = sorted(e.data["i"] for e in session.events if e.type == "test/tick")
    assert ticks == list(range(40))
    assert [e.seq for e in session.events] == list(range(len(session.events)))
    reopened = session.kernel.open_session(session.id)
    assert len(reopened.events) == len(session.events)


@pytest.mark.timeout(60)
def test_async_cancellation_closes_the_turn_interrupted(tmp_path: Any) -> None:
    session = build_kernel(tmp_path).open_session()

    class Hanging:
        provider, model = "h", "h"

        async def acomplete(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(3600)

    async def main() -> None:
        task = asyncio.create_task(AsyncAgentLoop(session, Hanging()).run("hi"))
        while not session.step_open:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert session.events[-1].type == "turn/end" and session.events[-1].data["reason"] == "interrupted"


def test_a_call_id_longer_than_the_bound_is_renamed(tmp_path: Any) -> None:
    """A provider's id is written to the log and sent back with every later request: one of
    100,000 characters is renamed like a reused one, not kept."""
    session = build_kernel(tmp_path).open_session()
    long_id = "call_" + "x" * 100_000
    model = ScriptedModel([Message.assistant("", [call(long_id, "read")]), Message.assistant("done")])
    result = AgentLoop(session, model, run_tool=lambda c: "ok").run("go")
    assert result.reason == "completed"
    (renamed,) = [c.id for m in result.replies for c in m.tool_calls]
    assert renamed.startswith("call_xxx") and len(renamed) <= ctxkernel.messages.MAX_CALL_ID_CHARS
    assert not session.surface.pending_calls


@pytest.mark.parametrize(
    ("call_id", "name", "named"),
    [
        ("c" * 257, "read", "id"),
        ("", "read", "id"),
        ("c1", "", "name"),
        ("c1", "r" * 257, "name"),
    ],
)
def test_a_reply_whose_call_id_or_name_is_out_of_bounds_is_refused(
    tmp_path: Any, call_id: str, name: str, named: str
) -> None:
    session = build_kernel(tmp_path).open_session()
    session.user("go")
    session.prepare_request()
    before = [e.seq for e in session.events]
    with pytest.raises(ctxkernel.EventError, match=rf"tool call 0: {named} must be a string of 1-256 characters"):
        session.commit_reply(Message.assistant("", [call(call_id, name)]))
    assert [e.seq for e in session.events] == before


def test_the_results_of_a_reply_with_many_calls_cost_linear_work(tmp_path: Any, monkeypatch: Any) -> None:
    """A provider's reply may hold thousands of tool calls (50,000 fit in 4 MB): each result used
    to list the reply's calls again to find its name, so committing them was quadratic (6,000
    calls: 32 s; 50,000: about 40 minutes). The calls are read a bounded number of times."""
    session = build_kernel(tmp_path, fsync=False).open_session()
    calls = [call(f"c{i}", "missing_tool") for i in range(1500)]
    model = ScriptedModel([Message.assistant("", calls), "done"])
    reads = {"blocks": 0}
    plain = Message.tool_calls.fget  # type: ignore[attr-defined]

    def counted(message: Message) -> list[ToolCallBlock]:
        reads["blocks"] += len(message.content)
        return plain(message)  # type: ignore[no-any-return]

    monkeypatch.setattr(Message, "tool_calls", property(counted))
    result = AgentLoop(session, model).run("go")
    assert result.reason == "completed" and result.steps == 2
    assert sum(e.type == "tool/result" for e in session.events) == 1500
    assert reads["blocks"] < 20 * 1500  # was about 1500 * 1500 / 2 * 2


@pytest.mark.parametrize("text", ["", "caf\udce9"], ids=["plain", "lone-surrogate"])
@pytest.mark.parametrize("depth", [300, 5_000])
def test_a_reply_with_arguments_nested_past_what_the_log_writes_is_an_event_error(
    tmp_path: Any, depth: int, text: str
) -> None:
    """At 5,000 levels the lone-surrogate scan walked the arguments in Python and raised a raw
    ``RecursionError`` out of ``commit_reply``; at 300 the log's depth check answered already."""
    session = build_kernel(tmp_path).open_session()
    session.user("go")
    session.prepare_request()
    nested: Any = "leaf"
    for _ in range(depth):
        nested = {"a": nested}
    before = [e.seq for e in session.events]
    with pytest.raises(ctxkernel.EventError, match="not JSON-serialisable: Recursion limit reached"):
        session.commit_reply(Message.assistant(text, [ToolCallBlock("c1", "read", {"x": nested})]))
    assert [e.seq for e in session.events] == before

"""Open-loop replay: Session API use, overflows, steward steps, child sessions, metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from simulate_support import replayed, workload

import ctxkernel
from ctxkernel import Message, Source, ToolCallBlock, ToolOutcome
from ctxkernel.profile import load_profile
from ctxkernel.simulate import (
    METRIC_KEYS,
    AssistantItem,
    Options,
    Recording,
    ToolResultItem,
    UserItem,
    build_workload,
    compare,
)
from ctxkernel.simulate.checks import InvariantChecker
from ctxkernel.simulate.replay import Replay, run_profile
from ctxkernel.testing import build_kernel

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def write_profile(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(body)
    return str(path)


UNMANAGED = "[profile]\nstrategies = []\n"
BASIC_OVERFLOW_ONLY = '[profile]\nstrategies = ["basic"]\n[strategies.basic]\nauto = false\n'


def test_workloads_are_deterministic_from_the_seed():
    a, b, c = build_workload("coding-long", 7), build_workload("coding-long", 7), build_workload("coding-long", 8)
    assert a.items == b.items
    assert a.items != c.items
    assert a.requests >= 300  # hundreds of steps
    users = [i.text for i in a.items if isinstance(i, UserItem)]
    assert len(users) >= 5  # the task and several corrections
    biggest = max(len(i.content) for i in a.items if isinstance(i, ToolResultItem))
    assert biggest > 8_000  # test runs with large outputs


def test_every_profile_gets_the_same_metric_keys(tmp_path):
    report = compare(["basic", write_profile(tmp_path, "unmanaged", UNMANAGED)], build_workload("chat-short"))
    assert [list(p) for p in report["profiles"]] == [list(METRIC_KEYS)] * 2
    assert all(p["status"] == "ok" for p in report["profiles"])


@pytest.mark.slow
def test_unmanaged_profile_overflows_and_managed_one_does_not(tmp_path):
    unmanaged = replayed("none", "coding-long", window=40_000)
    assert unmanaged["strategies"] == [] and unmanaged["status"] == "ok"
    basic = replayed("basic", "coding-long", window=40_000)
    assert unmanaged["overflows"] > 0
    assert unmanaged["peak_prompt_tokens"] > unmanaged["effective_window"]
    assert basic["overflows"] == 0
    assert basic["peak_prompt_tokens"] <= basic["effective_window"]
    assert basic["compactions"].get("summary", 0) > 0
    assert basic["invariant_violations"] == 0
    # the window override reaches the profile: 40k minus the profile's 8192 reservation
    assert basic["effective_window"] == 40_000 - 8_192
    # basic's summaries take messages off the surface; the history tools of its profile reach them
    assert unmanaged["history_reachable"] == 1.0 and basic["history_reachable"] == 1.0


def test_overflow_is_reported_to_the_session_and_retried(tmp_path):
    # with automatic compaction off, basic only acts on the overflow the simulator reports
    metrics = run_profile(
        write_profile(tmp_path, "late", BASIC_OVERFLOW_ONLY), workload("coding-long"), Options(window=40_000)
    )
    assert metrics["overflow_retries"] > 0
    assert metrics["overflows"] == 0
    assert metrics["compactions"]["summary"] == metrics["overflow_retries"]


def test_the_stand_in_summarizer_counts_summary_calls():
    m = replayed("basic", "coding-long", window=60_000, model="claude-sonnet-4-5")
    assert m["summarizer"] == "stand-in"
    assert m["summary_calls"] == m["compactions"]["summary"] > 0
    assert m["summary_input_tokens"] > m["summary_output_tokens"] > 0
    plain = replayed("basic", "coding-long", window=60_000, summarizer="extractive")
    assert plain["summary_calls"] == 0 and plain["summary_input_tokens"] == 0
    assert plain["summarizer"] == "extractive"


def test_summaries_are_priced_as_model_calls_of_a_models_length():
    priced = replayed("basic", "coding-long", window=60_000, model="claude-sonnet-4-5")
    free = replayed("basic", "coding-long", window=60_000, model="claude-sonnet-4-5", summarizer="extractive")
    # the model calls a harness would pay: input on top of the requests, output on top of the replies
    assert priced["billed_input_tokens"] == sum(priced["prompt_tokens"]) + priced["summary_input_tokens"]
    assert free["billed_input_tokens"] == sum(free["prompt_tokens"])
    assert priced["cost_usd"] > free["cost_usd"] > 0
    # a stand-in summary is as long as a model's eight sections (before: capped at 6,000 characters)
    per_summary = priced["summary_output_tokens"] / priced["summary_calls"]
    assert per_summary > 6_000 / 4
    # a strategy that writes its own summaries runs no summarizer
    assert replayed("handoff", "coding-long", window=60_000)["summarizer"] is None


def test_unavailable_strategy_is_reported_not_raised(tmp_path):
    path = write_profile(tmp_path, "ghost", '[profile]\nstrategies = ["no-such-strategy"]\n')
    m = run_profile(path, build_workload("chat-short"), Options())
    assert m["status"] == "unavailable"
    assert "no-such-strategy" in m["error"]
    assert list(m) == list(METRIC_KEYS)


def test_orphan_calls_get_synthetic_results_and_instructions_are_measured():
    call = ToolCallBlock("c1", "search", {"q": "x"})
    recording = Recording(
        [
            UserItem("Always answer in French."),
            AssistantItem(Message.assistant("", [call])),
            # no result recorded for c1
            UserItem("Continue."),
            AssistantItem(Message.assistant("D'accord.")),
        ]
    )
    m = run_profile("basic", recording, Options())
    assert m["synthetic_results"] == 1
    assert m["invariant_violations"] == 0
    assert m["instructions_visible"] == 1.0


# -- steward and child sessions -----------------------------------------------------------------------
class _NoteArgs(ctxkernel.ToolArgs):
    text: str


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StewardPlugin:
    """A throwaway strategy with one tool that opens a child session to continue in."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.kernel: Any = None

    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(ctxkernel.StrategySpec("stewardtest", settings=_Settings, capabilities={"recall"}))

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: Any) -> None:
        register(
            ctxkernel.Tool("move_on", "continue in a new session", _NoteArgs, self._move_on, strategy="stewardtest")
        )

    def _move_on(self, ctx: Any, args: _NoteArgs) -> ToolOutcome:
        self.calls.append(args.text)
        # the test plays the harness here: it opens the child through the kernel it built
        child = self.kernel.open_session(parent=ctx.id, origin="stewardtest")
        child.user(Message.user(f"continued: {args.text}", Source.plugin_form("stewardtest", "handoff")))
        return ToolOutcome("moved", continue_in=child.id)

    @ctxkernel.hookimpl
    def steward_actions(self, ctx: Any, request: Any) -> list[dict[str, Any]] | None:
        if len(ctx.surface.nodes) > 6 and not self.calls:
            return [{"name": "move_on", "arguments": {"text": "the story so far"}}]
        return None


def test_steward_step_runs_strategy_tools_and_follows_the_child(tmp_path):
    plugin = StewardPlugin()
    profile = load_profile(write_profile(tmp_path, "stewardtest", '[profile]\nstrategies = ["stewardtest"]\n'))
    kernel = plugin.kernel = build_kernel(tmp_path / "home", profile=profile, plugins=[("stewardtest", plugin)])
    replay = Replay(kernel, build_workload("chat-short"), Options())
    replay.run()
    m = replay.metrics()
    assert plugin.calls == ["the story so far"]
    assert m["steward_requests"] == 1
    assert m["requests"] == m["recorded_requests"] + 1
    assert m["sessions"] == 2
    assert replay.session.header.parent == replay.sessions[0].id
    # the parent's step: an assistant message holding the steward's call, then its result
    parent_roles = [n.role for n in replay.sessions[0].surface.nodes][-2:]
    assert parent_roles == ["assistant", "tool"]
    assert m["invariant_violations"] == 0
    # a recall-capable strategy declares the parent's events reachable through the lineage...
    assert m["history_reachable_declared"] == 1.0
    # ...but it has no recall tool that fetches them back: measured, only the child's surface counts
    assert m["history_reachable_method"] is None
    assert m["history_reachable_calls"] == 0 and m["recall_calls"] == 0
    assert m["history_reachable"] < 1.0


def test_a_replaced_steward_is_used_and_unknown_tools_are_errors(tmp_path):
    seen = []

    def steward(session, request):
        seen.append(request.step)
        return [{"name": "no_such_tool", "arguments": {}}] if len(seen) == 1 else []

    m = run_profile("basic", build_workload("chat-short"), Options(steward=steward))
    assert m["steward_requests"] == 1 and m["steward_errors"] == 1
    assert m["invariant_violations"] == 0


# -- the independent checks can fail -----------------------------------------------------------------
def test_checker_reports_orphans_split_groups_and_bad_citations(tmp_path):
    kernel = build_kernel(tmp_path)
    session = kernel.open_session()
    session.user("hi")
    request = session.prepare_request()
    checker = InvariantChecker(session.id)
    a = Message.assistant("", [ToolCallBlock("x", "t", {}), ToolCallBlock("y", "t", {})])
    request.messages = [Message.user("hi"), a, Message.tool("x", "ok"), Message.user("cut"), Message.tool("y", "late")]
    request.seqs = [1, 10, 11, 12, 13]
    checker.check_request(session, request)
    got = sorted({v["kind"] for v in checker.violations})
    assert got == ["orphan_call", "orphan_result", "projection"]

    class FakeEvent:
        def __init__(self, seq, surface):
            self.seq, self.surface = seq, surface

    class FakeSession:
        events = [
            FakeEvent(0, {"op": "append"}),
            FakeEvent(1, {"op": "append"}),
            FakeEvent(2, {"op": "replace", "start": 0, "end": 1, "cites": [0]}),
        ]

    bad = InvariantChecker("fake")
    bad.fold(FakeSession())
    assert [v["kind"] for v in bad.violations] == ["citation"]


# -- a summarizer model over HTTP (a loopback stand-in for an OpenAI-compatible server) -------------
def test_openai_summarizer_calls_are_counted(monkeypatch):
    import http.server
    import json
    import threading

    served = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            served.append(body["model"])
            answer = {
                "choices": [
                    {"message": {"role": "assistant", "content": "## Primary Request and Intent\n- streaming parser"}}
                ],
                "usage": {"prompt_tokens": 1000 + len(served), "completion_tokens": 50},
                "model": body["model"],
            }
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        m = run_profile("basic", workload("coding-long"), Options(window=60_000, summarizer=f"openai:tiny-model@{url}"))
    finally:
        server.shutdown()
        server.server_close()
    calls = len(served)
    assert calls > 0 and set(served) == {"tiny-model"}
    assert m["summary_calls"] == calls == m["compactions"]["summary"]
    assert m["summary_input_tokens"] == sum(1000 + i for i in range(1, calls + 1))
    assert m["summary_output_tokens"] == 50 * calls
    assert m["billed_input_tokens"] == sum(m["prompt_tokens"]) + m["summary_input_tokens"]


def test_summarizer_that_cannot_be_built_makes_the_profile_unavailable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    m = run_profile("basic", build_workload("chat-short"), Options(summarizer="openai:gpt-4o-mini"))
    assert m["status"] == "unavailable" and "OPENAI_API_KEY" in m["error"]


def test_a_simulated_session_log_replays_again(tmp_path):
    kernel = build_kernel(tmp_path / "home")
    replay = Replay(kernel, build_workload("chat-short"), Options())
    replay.run()
    from ctxkernel.simulate import load_recording

    log = kernel.store.path(replay.session.id)
    again = load_recording(log)
    assert again.source["format"] == "kernel"
    assert again.requests == build_workload("chat-short").requests
    assert [i.text for i in again.items if isinstance(i, UserItem)] == [
        i.text for i in build_workload("chat-short").items if isinstance(i, UserItem)
    ]


def test_a_strategy_that_raises_fails_its_profile_only(tmp_path, monkeypatch):
    import ctxkernel.default_plugins.basic as basic

    @ctxkernel.hookimpl(trylast=True)
    def broken(ctx, step):
        if ctx.turn > 2:
            raise ValueError("strategy bug")

    # pluggy reads the module's hook implementations when a kernel registers it
    monkeypatch.setattr(basic, "pre_step", broken)
    report = compare(["basic", write_profile(tmp_path, "unmanaged", UNMANAGED)], build_workload("chat-short"))
    failed, unmanaged = report["profiles"]
    assert failed["status"] == "failed"
    assert "ValueError: strategy bug" in failed["error"] and "test_simulate_replay.py" in failed["error"]
    assert list(failed) == list(METRIC_KEYS)
    assert unmanaged["status"] == "ok" and unmanaged["requests"] == 8


def test_the_unmanaged_baseline_is_not_bounded_by_the_kernel():
    # regression: none had its oversized results excerpted by the kernel's guard ("excerpt:3",
    # no overflow) and billed requests a provider would have refused
    from ctxkernel.simulate import Recording

    # each result fits the window alone (so the window is not refused for it) but is over the
    # kernel's bound of half the window, which a managed profile would excerpt
    big = "\n".join(f"line {i}: " + "data " * 12 for i in range(1_200))
    items = [UserItem("dump it")]
    for i in range(3):
        items.append(AssistantItem(Message.assistant("", [ToolCallBlock(f"c{i}", "bash", {"command": "dump"})])))
        items.append(ToolResultItem(f"c{i}", big))
    items.append(AssistantItem(Message.assistant("done")))
    m = run_profile("none", Recording(items, {"kind": "transcript"}), Options(window=40_000))
    assert m["status"] == "ok" and m["compactions"] == {}
    assert max(m["prompt_tokens"]) > 20_000 > m["effective_window"] / 2  # the first result, whole
    assert m["peak_prompt_tokens"] > m["effective_window"] and m["overflows"] > 0
    assert m["cost_usd"] is None


# -- a window that cannot hold the recording's largest message ---------------------------------------------
def _one_large_result(lines: int) -> Recording:
    """A synthetic session whose largest message is one tool result of ``lines`` short lines."""
    log = "\n".join(f"entry {i}: disk full on /var" for i in range(lines))
    return Recording(
        [
            UserItem("why did the build fail?"),
            AssistantItem(Message.assistant("", [ToolCallBlock("c1", "bash", {"command": "cat build.log"})])),
            ToolResultItem("c1", log),
            AssistantItem(Message.assistant("The disk is full.")),
        ],
        {"kind": "transcript"},
    )


@pytest.mark.parametrize(
    ("lines", "window", "why"),
    [
        (400, 2_000, "more than the effective window of 1750"),  # ~4,000 tokens: larger than the whole window
        (12, 256, "too small for its excerpt"),  # over half of 224 tokens, which no excerpt can shrink
    ],
)
def test_a_window_that_cannot_hold_the_largest_message_is_refused_for_every_profile(lines, window, why):
    from ctxkernel.simulate import profile_names
    from ctxkernel.simulate.corpus import aggregate
    from ctxkernel.simulate.report import aggregate_rows

    names = profile_names("none,all")
    report = compare(names, _one_large_result(lines), Options(window=window))
    rows = report["profiles"]
    assert [r["status"] for r in rows] == ["refused"] * len(names), [(r["profile"], r["error"]) for r in rows]
    for row in rows:
        assert why in row["error"] and "largest message (a tool result)" in row["error"], row["error"]
        assert "smallest context_window that works" in row["error"]
        assert row["effective_window"] == window - window // 8 if window < 16_384 else window - 8_192
        assert row["overflows"] is None and row["cost_usd"] is None and row["prompt_tokens"] == []
    # the corpus summary counts the refused session alike for every profile, beside ok and failed
    aggregated = aggregate([{"profiles": rows}], names)
    assert {name: (a["ok"], a["refused"]) for name, a in aggregated.items()} == dict.fromkeys(names, (0, 1))
    table = aggregate_rows({"aggregate": aggregated})
    assert table[0][:3] == ["profile", "ok", "refused"] and all(r[1:3] == ["0", "1"] for r in table[1:])


def test_the_smallest_window_a_refusal_names_replays_the_session():
    recording = _one_large_result(400)
    refused = run_profile("basic", recording, Options(window=2_000))
    smallest = int(refused["error"].split("smallest context_window that works is ")[1].split()[0])
    assert run_profile("basic", recording, Options(window=smallest - 1))["status"] == "refused"
    metrics = run_profile("basic", recording, Options(window=smallest))
    assert metrics["status"] == "ok" and metrics["overflows"] == 0


def test_a_message_over_half_the_window_is_left_to_the_kernels_excerpt():
    # fits the window, is over the kernel's bound, and the window is large enough for an excerpt:
    # replayed (managed profiles excerpt it), as is any session when no --window is given
    recording = _one_large_result(400)
    for options in (Options(window=7_000), Options()):
        for name in ("none", "basic"):
            metrics = run_profile(name, recording, options)
            assert metrics["status"] == "ok", (name, metrics["error"])
    assert run_profile("basic", recording, Options(window=7_000))["compactions"] == {"excerpt": 1}


def _long_task(words: int, instruction: bool = True) -> Recording:
    """A synthetic session whose user message (the task, or harness context) is ``words`` words."""
    task = "Please " + " ".join(f"check module{i}" for i in range(words))
    return Recording(
        [
            UserItem(task, instruction=instruction),
            AssistantItem(Message.assistant("", [ToolCallBlock("c1", "bash", {"command": "ls"})])),
            ToolResultItem("c1", "module0.py module1.py"),
            AssistantItem(Message.assistant("Checked.")),
        ],
        {"kind": "transcript"},
    )


def test_a_window_whose_instruction_budget_cannot_hold_the_task_is_refused():
    from ctxkernel.simulate import profile_names

    # a task of about 300 tokens: it fits a 1,050-token effective window (and half of it), but not
    # the instruction budget of 20% of it, which is all the kernel keeps through a compaction
    names = profile_names("none,all")
    rows = compare(names, _long_task(100), Options(window=1_200))["profiles"]
    assert [r["status"] for r in rows] == ["refused"] * len(names), [(r["profile"], r["error"]) for r in rows]
    for row in rows:
        assert "largest instruction" in row["error"] and "instruction budget of 210" in row["error"], row["error"]
    smallest = int(rows[0]["error"].split("smallest context_window that works is ")[1].split()[0])
    for name in ("none", "mask"):  # (basic's own header needs a larger window than this)
        assert run_profile(name, _long_task(100), Options(window=smallest - 1))["status"] == "refused"
        metrics = run_profile(name, _long_task(100), Options(window=smallest))
        assert metrics["status"] == "ok" and metrics["instructions_visible_min"] == 1.0, (name, metrics["error"])
    # harness context is no instruction: the kernel does not protect it, and simulate does not refuse
    assert run_profile("mask", _long_task(100, instruction=False), Options(window=1_200))["status"] == "ok"

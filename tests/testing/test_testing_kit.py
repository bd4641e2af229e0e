"""The test kit for strategy authors: build_kernel's settings tables and check_conformance's
scripted tool calls (a strategy tool's success path runs under every invariant)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

import ctxkernel
from ctxkernel.testing import ConformanceError, ConformanceStep, build_kernel, check_conformance


class RecallSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_chars: int = Field(default=2_000, ge=10, le=100_000)


class RecallArgs(ctxkernel.ToolArgs):
    turn: int = Field(ge=1, le=ctxkernel.MAX_INT_ARG, description="the turn whose user message to recall")


RECALL = ctxkernel.Strategy("recall-turn", RecallSettings, capabilities={"tools"})


def recall_turn(ctx: ctxkernel.Context, args: RecallArgs) -> ctxkernel.ToolOutcome:
    opened = False
    for event in ctx.events:
        if event.type == "turn/start":
            opened = event.data["turn"] == args.turn
        elif opened and event.type == "user/message":
            text = event.data["message"]["content"][0]["text"]
            return ctxkernel.ToolOutcome(text[: RECALL.on(ctx).settings.max_chars])
    return ctxkernel.ToolOutcome(f"no turn {args.turn} in this session", is_error=True)


class RecallTurn:
    @ctxkernel.hookimpl
    def register_strategy(self, register: Any) -> None:
        register(RECALL.spec)

    @ctxkernel.hookimpl
    def register_tools(self, register: Any, ctx: ctxkernel.Context) -> None:
        register(RECALL.tool("recall_turn", "The user's message of an earlier turn.", RecallArgs, recall_turn))


PLUGINS = [("recall-turn", RecallTurn())]


def conformance(tmp_path, tool_calls, turns: int = 6) -> Any:
    return check_conformance(
        tmp_path,
        ["recall-turn", "basic"],
        settings={"recall-turn": {"max_chars": 500}},
        plugins=PLUGINS,
        entry_points=False,
        turns=turns,
        tool_calls=tool_calls,
    )


def test_build_kernel_takes_the_strategies_settings_tables(tmp_path):
    kernel = build_kernel(
        tmp_path,
        strategies=["recall-turn", "basic"],
        settings={"recall-turn": {"max_chars": 77}},
        plugins=PLUGINS,
        model={"context_window": 16_000},
    )
    assert kernel.strategy_settings("recall-turn") == RecallSettings(max_chars=77)
    assert kernel.profile.profile.strategies == ["recall-turn", "basic"]
    assert kernel.profile.model.context_window == 16_000


def test_build_kernel_refuses_tables_given_as_strategies(tmp_path):
    with pytest.raises(TypeError, match=r"settings=\{"):
        build_kernel(tmp_path, strategies={"recall-turn": {"max_chars": 77}}, plugins=PLUGINS)


def test_scripted_tool_calls_run_the_tools_success_path(tmp_path):
    seen: list[tuple[int, int]] = []

    def script(point: ConformanceStep) -> list[dict[str, Any]] | None:
        seen.append((point.turn, point.step))
        if point.turn >= 1 and point.step == 0:
            return [{"name": "recall_turn", "arguments": {"turn": point.turn}}]  # the turn before
        return None

    report = conformance(tmp_path, script)
    assert report.tool_calls_checked == 5
    assert "scripted strategy tool calls succeed" in report.checks
    assert report.restarts_checked == 6  # three points, each from the snapshot and by a full replay
    assert (0, 0) in seen and (5, 1) in seen


def test_a_failing_scripted_call_is_a_conformance_error(tmp_path):
    def script(point: ConformanceStep) -> list[dict[str, Any]] | None:
        return [{"name": "recall_turn", "arguments": {"turn": 999}}] if point.turn == 2 and point.step == 0 else None

    with pytest.raises(ConformanceError, match=r"recall_turn\(\{\"turn\":999\}\) at turn 2 failed: no turn 999"):
        conformance(tmp_path, script)


@pytest.mark.parametrize(
    "call",
    [{"name": "read_file", "arguments": {}}, {"name": "no_such_tool"}, {"name": "recall_turn", "arguments": [1]}, "x"],
)
def test_a_scripted_call_must_name_a_strategy_tool(tmp_path, call):
    with pytest.raises(ConformanceError, match=r"the strategy tools are \['recall_turn'\]"):
        conformance(tmp_path, lambda point: [call] if point.step == 0 else None)


def test_a_script_that_never_lets_a_turn_end_is_reported(tmp_path):
    with pytest.raises(ConformanceError, match="never let it finish"):
        conformance(tmp_path, lambda point: [{"name": "recall_turn", "arguments": {"turn": 1}}])


def test_the_documented_script_runs(tmp_path):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "testing-a-strategy.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "tool_calls=" in b]
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/testing-a-strategy.md", "exec"), namespace)  # our own doc
    # the doc's test installs recall-turn from its distribution; here it comes in code
    assert conformance(tmp_path, namespace["recall_the_previous_turn"]).tool_calls_checked == 5


def test_a_conformance_step_hands_the_strategys_context(tmp_path):
    """A tool_calls callback reads the strategy's own state through ``point.ctx``, the context its
    hooks receive (``STRATEGY.on(point.ctx)``), never through the Session."""
    seen: list[Any] = []

    def recall_when_configured(point: ConformanceStep) -> list[dict[str, Any]] | None:
        seen.append(point.ctx)
        assert isinstance(point.ctx, ctxkernel.Context) and point.ctx is point.session.context
        if point.turn >= 1 and point.step == 0 and RECALL.on(point.ctx).settings.max_chars == 500:
            return [{"name": "recall_turn", "arguments": {"turn": point.turn}}]
        return None

    report = conformance(tmp_path, recall_when_configured, turns=3)
    assert report.tool_calls_checked == 2 and seen


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"turns": 0}, "turns=0"),
        ({"turns": -3}, "turns=-3"),
        ({"turns": True}, "turns=True"),
        ({"context_window": 0}, "context_window"),
        ({"context_window": 1_000, "reserved_output_tokens": 2_000}, "reserved_output_tokens (2000)"),
        ({"snapshot_every": -1}, "snapshot_every"),
    ],
)
def test_check_conformance_refuses_arguments_that_would_check_nothing(tmp_path, kwargs, named):
    """turns=0 used to pass with no request made while reporting 'pairing in every request' and
    'restart equivalence'; a bad window was blamed on 'model_policies.model'; snapshot_every=-1 ran."""
    with pytest.raises(ValueError, match=r"check_conformance") as info:
        check_conformance(tmp_path, ["basic"], entry_points=False, **kwargs)
    assert named in str(info.value) and "model_policies" not in str(info.value)
    assert not list(tmp_path.iterdir())  # nothing was run


@pytest.mark.parametrize(
    ("tables", "named"),
    [
        ({"model": {"context_window": 0}}, "model.context_window"),
        ({"model": {"context_window": True}}, "model.context_window"),
        ({"store": {"snapshot_every": -4}}, "store.snapshot_every"),
        ({"model": {"context_windw": 8000}}, "unknown key 'model.context_windw'"),
    ],
)
def test_build_kernel_validates_the_tables_it_overrides(tmp_path, tables, named):
    """The overrides were copied in unvalidated: a kernel with a window of 0 (or True) was built."""
    with pytest.raises(ctxkernel.ProfileError, match=named):
        build_kernel(tmp_path, **tables)


@pytest.mark.parametrize("strategies", ["basic", {"basic": {"threshold_ratio": 0.5}}, [1], ["basic", None]])
def test_check_conformance_refuses_strategies_that_are_not_a_list_of_names(tmp_path, strategies):
    """A string ran strategies 'b', 'a', 's'...; a table of settings ran its keys with the settings
    dropped in silence; a non-string name ended in a pydantic traceback."""
    with pytest.raises(TypeError, match=r"check_conformance\(strategies=\.\.\.\) takes the list of strategy names"):
        check_conformance(tmp_path, strategies, entry_points=False, turns=1)

from ctxkernel import Message, ToolCallBlock
from ctxkernel.pairing import PairingProblem, pairing_problems
from ctxkernel.testing import check_conformance


def test_basic_passes_the_conformance_suite(tmp_path):
    report = check_conformance(tmp_path, ["basic"], entry_points=False)
    assert report.compactions > 0  # the workload really needed management
    assert report.peak_prompt_tokens <= report.effective_window
    assert "effective window never exceeded" in report.checks


def test_pairing_problems_names_each_kind_in_order():
    calls = Message.assistant("", [ToolCallBlock("x", "t", {}), ToolCallBlock("y", "t", {})])
    messages = [
        Message.tool("z", "early"),
        calls,
        Message.tool("x", "ok"),
        Message.tool("x", "twice"),
        Message.user("cut"),
    ]
    assert pairing_problems(messages) == [
        PairingProblem("orphan_result", 0, ("z",)),
        PairingProblem("split_group", 3, ("x",), ("x", "y")),
        PairingProblem("orphan_calls", 4, ("y",)),
    ]
    assert pairing_problems([Message.user("hi"), calls, Message.tool("y", "ok"), Message.tool("x", "ok")]) == []

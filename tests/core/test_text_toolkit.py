"""The shared summarising and clipping toolkit (``ctxkernel.text``, issue #14 item 3): one clip
for every strategy, one extractive summary for ``basic`` and the simulator."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ctxkernel import Message, ToolCallBlock
from ctxkernel.compaction import SUMMARY_SECTIONS
from ctxkernel.text import (
    COMMAND_KEYS,
    ELLIPSIS,
    clip,
    extractive_summary,
    failed,
    first_line,
    keep_newest,
    one_line,
    safe_cut,
    string_arguments,
)

REPO = Path(__file__).resolve().parents[2]
GRAPHEMES = st.sampled_from(["a", "é", "e\u0301", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧", "\n", " ", "```\n", "x" * 7])


@given(st.lists(GRAPHEMES, max_size=60), st.integers(min_value=1, max_value=80), st.booleans())
def test_clip_keeps_the_limit_and_whole_graphemes(parts, limit, single_line):
    text = "".join(parts)
    out = clip(text, limit, single_line=single_line)
    assert len(out) <= max(limit, 1)
    if out.endswith(ELLIPSIS) and out != text:
        body = out[: -len(ELLIPSIS)]
        source = " ".join(text.split()) if single_line else text
        if body and source.startswith(body):  # a plain prefix cut: it must end on a grapheme boundary
            assert safe_cut(source, len(body)) == len(body)


@given(st.lists(GRAPHEMES, max_size=400), st.integers(min_value=0, max_value=40))
def test_clip_to_a_single_line_is_the_clip_of_the_collapsed_text(parts, limit):
    text = "".join(parts)
    assert clip(text, limit, single_line=True) == clip(one_line(text), limit)


def test_clip_to_a_single_line_collapses_only_what_it_keeps(monkeypatch):
    """A 50 MB tool result quoted on one line (a handoff's activity line) costs what its first
    characters do: collapsing all of its whitespace made a list of its 10 million words."""
    import ctxkernel.text as toolkit

    collapsed: list[int] = []

    def recording(text: str) -> str:
        collapsed.append(len(text))
        return one_line(text)

    monkeypatch.setattr(toolkit, "one_line", recording)
    text = "word \n" * 1_000_000
    assert clip(text, 160, single_line=True) == clip(one_line(text), 160)
    assert collapsed and max(collapsed) <= 10_000
    collapsed.clear()
    assert clip(" " * 100_000 + "end", 160, single_line=True) == "end"  # mostly blank: read on to its end


@given(st.text(max_size=300), st.integers(min_value=0, max_value=200))
def test_clip_with_an_overflow_note_counts_what_it_left_out(text, limit):
    out = clip(text, limit, overflow="in the history")
    if len(text) <= limit:
        assert out == text
    else:
        body, note = out.rsplit("\n[… ", 1)
        assert len(body) <= limit
        assert note == f"{len(text) - len(body)} more characters; in the history]"


def test_extractive_summary_has_the_eight_sections_and_is_deterministic():
    call = ToolCallBlock("c1", "read_file", {"path": "src/parser.py"})
    messages = [
        Message.user("Fix the failing test in parser.py"),
        Message.assistant("Reading the parser.", tool_calls=[call]),
        Message.tool("c1", "Traceback (most recent call last): ValueError", is_error=True, name="read_file"),
        Message.assistant("The tokenizer drops the last token. Next I will patch it."),
    ]
    first = extractive_summary(messages, max_chars=4000)
    assert first == extractive_summary(messages, max_chars=4000)
    assert [line[3:] for line in first.splitlines() if line.startswith("## ")] == list(SUMMARY_SECTIONS)
    assert "parser.py" in first and "read_file" in first and "ValueError" in first


def test_no_strategy_keeps_its_own_clip():
    """The five `_clip` copies the issue counted are gone: what remains named `_clip` in a
    strategy is a one-line call into the toolkit, and basic has no summary code of its own."""
    sources = [REPO / "src/ctxkernel/default_plugins/basic.py", *REPO.glob("plugins/*/src/*/*.py")]
    for path in sources:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "_clip":
                calls = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                assert len(node.body) == 1 and "clip" in calls, f"{path}:{node.lineno} {node.name} is its own copy"
    basic = (REPO / "src/ctxkernel/default_plugins/basic.py").read_text()
    assert "def extractive_summary" not in basic and "from ctxkernel.text import extractive_summary" in basic


LINES = st.lists(st.sampled_from(["user: a", "user: a longer request", "called x", "assistant: ok", "e" * 30]))


@given(LINES, st.integers(min_value=-5, max_value=120))
def test_keep_newest_keeps_the_longest_suffix_that_fits(lines, budget):
    kept = keep_newest(lines, budget)
    assert kept == lines[len(lines) - len(kept) :]
    assert sum(len(line) + 1 for line in kept) <= max(budget, 0)
    if len(kept) < len(lines):  # one more line would not have fitted
        assert sum(len(line) + 1 for line in lines[len(lines) - len(kept) - 1 :]) > budget


@given(LINES, st.integers(min_value=-5, max_value=120))
def test_keep_newest_gives_up_spared_lines_last(lines, budget):
    spare = lambda line: line.startswith("user: ")  # noqa: E731
    kept = keep_newest(lines, budget, spare=spare)
    assert sum(len(line) + 1 for line in kept) <= max(budget, 0)
    it = iter(lines)
    assert all(line in it for line in kept), "kept lines stay in their order"
    if any(spare(line) for line in lines) and len([x for x in kept if spare(x)]) < len([x for x in lines if spare(x)]):
        assert all(spare(line) for line in kept), "a spared line went while another line stayed"


def test_extraction_helpers():
    assert first_line("\n  first\nsecond") == "first" and first_line(" \n", "(empty)") == "(empty)"
    call = ToolCallBlock("c", "run", {"command": "pytest", "path": "a.py", "cmd": 3})
    assert string_arguments(call) == ["a.py"] and string_arguments(call, COMMAND_KEYS) == ["pytest"]
    assert string_arguments(ToolCallBlock("c", "run", ["not", "an", "object"])) == []  # type: ignore[arg-type]
    result = Message.tool("c", "ok\nTraceback (most recent call last)").tool_result
    assert result is not None and failed(result)
    clean = Message.tool("c", "all good").tool_result
    assert clean is not None and not failed(clean)


def test_strategies_summarise_with_the_toolkit():
    """decay's steward and handoff's extractive body build their own lines (their formats differ)
    but extract and trim with the toolkit: no first-line, path-key or newest-first code of their own."""
    for path in (
        "plugins/ctxkernel-decay/src/ctxkernel_decay/steward.py",
        "plugins/ctxkernel-handoff/src/ctxkernel_handoff/excerpts.py",  # the extractive body
    ):
        source = (REPO / path).read_text()
        assert "keep_newest(" in source and "first_line(" in source, path
        assert ".splitlines()[0]" not in source and "_PATH_KEYS" not in source, path
        assert "reversed(entries)" not in source, path


def test_no_hand_made_ellipsis_clip_outside_the_toolkit():
    """A clip is ``ctxkernel.text.clip`` (or ``safe_cut`` + ``ELLIPSIS``), not ``text[:n] + "…"``,
    which can split a grapheme. logging.py is the exception: it sits below every module (text.py
    included) and bounds log values, which no model reads."""
    sources = [*REPO.glob("src/ctxkernel/**/*.py"), *REPO.glob("plugins/*/src/**/*.py"), *REPO.glob("examples/**/*.py")]
    allowed = {REPO / "src/ctxkernel/logging.py", REPO / "src/ctxkernel/text.py"}
    found = []
    for path in sources:
        if path in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if '] + "…"' in line or '] + "\\u2026"' in line:
                found.append(f"{path.relative_to(REPO)}:{number}")
    assert not found, found


@given(
    st.lists(
        st.sampled_from(["Error", "error", "Errors", "_Error", "Exception:", "Traceback", "FAILED", "FAIL", " ", "\n"])
        | st.text(max_size=40),
        max_size=120,
    ),
    st.booleans(),
)
def test_failed_answers_as_the_error_markers_over_the_first_2000_characters(pieces, flagged):
    """``failed`` skips the regex when none of its words occurs: the answer must not change."""
    from ctxkernel.messages import ToolResultBlock
    from ctxkernel.text import ERROR_MARKERS, failed

    content = "".join(pieces)
    result = ToolResultBlock("c1", content, is_error=flagged)
    assert failed(result) == (flagged or bool(ERROR_MARKERS.search(content[:2000])))

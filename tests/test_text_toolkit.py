"""The shared summarising and clipping toolkit (``ctxkernel.text``, issue #14 item 3): one clip
for every strategy, one extractive summary for ``basic`` and the simulator."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ctxkernel import Message, ToolCallBlock
from ctxkernel.compaction import SUMMARY_SECTIONS
from ctxkernel.text import ELLIPSIS, clip, extractive_summary, safe_cut

REPO = Path(__file__).resolve().parents[1]
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

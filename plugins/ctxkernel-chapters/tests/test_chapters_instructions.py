"""The table of contents does not repeat the instructions the kernel's block already pins
(issue 38): each instruction of the user shows once in the window a compaction leaves."""

from __future__ import annotations

from helpers_chapters import chapters_kernel, do_turn, reading_script

from ctxkernel.instructions import BLOCK_CLOSE, BLOCK_OPEN

RULES = "Rule one: keep the parser strict.\nRule two: report every trailing comma with its line."


def test_an_instruction_is_not_quoted_by_the_toc_and_pinned_by_the_kernel(tmp_path):
    session = chapters_kernel(tmp_path, window=8_000, reserve=1_000).open_session()
    model = reading_script(2)
    for turn in range(14):
        text = (RULES if turn % 2 == 0 else "fix the lexer too") + f" (turn {turn})"
        do_turn(session, model, text, tool_output=lambda call: f"# {call.arguments['path']}\n" + "x = f(1, 2)\n" * 40)
    (toc,) = [n.message.text for n in session.surface.nodes if n.message.source.form == "toc"]
    assert BLOCK_OPEN in toc, "the kernel pinned nothing: the test does not reach its case"
    block = toc[toc.index(BLOCK_OPEN) : toc.index(BLOCK_CLOSE)]
    quoted = toc[: toc.index(BLOCK_OPEN)].split("[[user instructions]]")
    quotes = quoted[1] if len(quoted) > 1 else ""
    for turn in range(14):
        marker = f"(turn {turn})"
        # before: the multi-line rules were quoted ("> ..." lines) and pinned again, 4 of them
        assert not (marker in block and marker in quotes), f"instruction {marker} is shown twice"
    # every instruction is still visible: in the block, in the quotes or in a chapter bullet
    for turn in range(14):
        assert f"(turn {turn})" in toc or any(f"(turn {turn})" in n.message.text for n in session.surface.nodes)

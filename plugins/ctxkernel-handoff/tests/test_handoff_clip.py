"""Priority-aware clipping of a generated body (Part 3)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkernel import SUMMARY_SECTIONS
from ctxkernel_handoff.clip import (
    MARKER,
    WEIGHTS,
    clip_sections,
    clip_with_receipt,
    cut_text,
    open_fence,
    safe_cut,
    split_pieces,
)


def reply(sizes: dict[str, int], preamble: str = "") -> str:
    return preamble + "\n\n".join(f"## {name}\n" + ("x" * sizes.get(name, 300)) for name in SUMMARY_SECTIONS)


def kept_of(result, name):
    return next((kept, orig) for piece, kept, orig in result.shortened if piece == name)


def test_no_clip_no_receipt():
    text = reply({})
    result = clip_with_receipt(text, len(text), "there")
    assert result.text == text and not result.clipped and result.receipt == ""


def test_every_section_keeps_its_heading_and_files_give_ground_first():
    text = reply({"Files and Code": 6_000, "Critical Context": 2_000, "Next Step": 2_000})
    result = clip_sections(text, 4_000)
    assert len(result.text) <= 4_000
    for name in SUMMARY_SECTIONS:
        assert f"## {name}\n" in result.text
    files_kept, files_orig = kept_of(result, "Files and Code")
    critical_kept, critical_orig = kept_of(result, "Critical Context")
    assert files_kept / files_orig < critical_kept / critical_orig
    assert critical_kept > files_kept
    # short sections were not touched and carry no marker
    section = result.text.split("## Pending Jobs\n")[1].split("\n\n## ")[0]
    assert section == "x" * 300
    # a trimmed section ends with the marker
    files_section = result.text.split("## Files and Code\n")[1].split("\n\n## ")[0]
    assert files_section.endswith(MARKER)


def test_critical_context_written_last_survives_an_overrun():
    text = reply({name: 1_500 for name in SUMMARY_SECTIONS})
    result = clip_sections(text, 5_000)
    tail = result.text.split("## Critical Context\n")[1]
    assert len(tail) > 600  # a plain tail cut would have deleted it entirely


def test_receipt_names_pieces_and_where_the_untrimmed_reply_is():
    text = reply({"Files and Code": 8_000})
    result = clip_with_receipt(text, 3_000, "history_read_item id=win_3_summary format=json")
    assert len(result.text) + 1 + len(result.receipt) <= 3_000
    assert result.receipt.startswith("<clipping_receipt>") and result.receipt.endswith("</clipping_receipt>")
    assert f"kept {len(result.text)} of {len(text)} source characters" in result.receipt
    kept, orig = kept_of(result, "Files and Code")
    assert f"Files and Code {kept}/{orig}" in result.receipt
    assert "win_3_summary" in result.receipt


def test_unsectioned_reply_is_clipped_from_the_end_and_the_receipt_says_why():
    text = "plain prose " * 1_000
    result = clip_with_receipt(text, 2_000, "x")
    assert len(result.text) + 1 + len(result.receipt) <= 2_000
    assert result.text.endswith(MARKER)
    assert "not sectioned" in result.receipt


def test_layout_that_does_not_fit_is_reported():
    text = "\n\n".join(f"## Section {i}\n" + "y" * 400 for i in range(60))
    result = clip_with_receipt(text, 2_500, "x")
    assert "did not fit" in result.receipt
    assert len(result.text) + 1 + len(result.receipt) <= 2_500


def test_a_cut_inside_a_code_block_closes_the_fence():
    body = "intro\n```python\n" + "print('hello')\n" * 200 + "```\nafter\n"
    text = "## Files and Code\n" + body + "\n\n## Critical Context\n" + "c" * 200
    result = clip_sections(text, 1_000)
    files = result.text.split("## Critical Context")[0]
    assert open_fence(files) is None
    assert "```python\nprint('hello')" in files
    assert "## Critical Context\n" + "c" * 200 in result.text  # the next heading is not swallowed by code


def test_a_fence_that_does_not_fit_retreats_out_of_the_block():
    text = "before the block\n" * 3 + "```\n" + "z" * 500
    excerpt, note = cut_text(text, len("before the block\n" * 3) + 5)
    assert excerpt == ("before the block\n" * 3).rstrip("\n")
    assert note and "retreated" in note
    assert open_fence(excerpt) is None


def test_a_repair_that_would_delete_everything_is_refused():
    text = "```\n" + "z" * 500
    excerpt, note = cut_text(text, 6)
    assert excerpt == text[:6] and "refused" in note


def test_cuts_never_split_graphemes():
    family = "👨\u200d👩\u200d👧"
    flags = "🇫🇷🇩🇪"
    accent = "e\u0301"
    for text in (family * 10, flags * 10, accent * 30, "a👍🏽" * 20):
        for position in range(len(text) + 1):
            cut = safe_cut(text, position)
            assert cut <= position
            head = text[:cut]
            assert not head.endswith("\u200d")  # never right after a joiner
            if cut < len(text):
                assert text[cut] not in "\u0301\u200d\U0001f3fd"  # never before a mark, joiner or modifier
            # regional indicators stay paired
            assert sum(1 for ch in head if 0x1F1E6 <= ord(ch) <= 0x1F1FF) % 2 == 0


def test_split_pieces_round_trips():
    text = "preamble\n" + reply({"Files and Code": 50})
    pieces = split_pieces(text)
    assert "".join(p.text for p in pieces) == text
    assert pieces[0].name == "(preamble)" and [p.name for p in pieces[1:]] == list(SUMMARY_SECTIONS)


section_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=600)


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(section_text, min_size=1, max_size=8),
    fenced=st.lists(st.booleans(), min_size=8, max_size=8),
    budget=st.integers(min_value=200, max_value=4_000),
)
def test_clip_properties(bodies, fenced, budget):
    text = "\n\n".join(
        f"## {SUMMARY_SECTIONS[i]}\n" + (f"```\n{body}\n```" if fenced[i] else body) for i, body in enumerate(bodies)
    )
    result = clip_with_receipt(text, budget, "win_1_summary")
    # within budget, receipt included
    assert len(result.text) + (1 + len(result.receipt) if result.receipt else 0) <= budget
    if not result.clipped:
        assert result.text == text
        return
    # when the sectioned layout fits, every heading survives on its own line, and a clipped piece
    # whose source was fence-balanced stays balanced (a synthesized fence or a retreat)
    if result.reason is None:
        source = {p.name: p for p in split_pieces(text)}
        clipped = {name for name, _, _ in result.shortened}
        for i in range(len(bodies)):
            assert re.search(rf"(^|\n)## {re.escape(SUMMARY_SECTIONS[i])}\n", result.text)
        for piece in split_pieces(result.text):
            if (
                piece.name in clipped
                and piece.name in source
                and open_fence(source[piece.name].body) is None
                and not any("refused" in n for n in result.notes)
            ):
                assert open_fence(piece.body.replace(MARKER, "")) is None


@pytest.mark.timeout(60)
def test_a_heading_line_full_of_blanks_is_split_in_one_pass():
    """A summarizer's reply is untrusted: a heading followed by a long run of blanks made the
    heading pattern retry the run from each of its characters (quadratic: 16,000 blanks took
    2.4 s, the 200,000 here hours). Names are stripped of their blanks, as before."""
    text = "## Files and Code" + " " * 200_000 + "x\nbody\n## Next Step \t\r\nmore"
    pieces = split_pieces(text)
    assert [p.name for p in pieces] == ["Files and Code" + " " * 200_000 + "x", "Next Step"]
    assert "".join(p.text for p in pieces) == text
    result = clip_with_receipt(text, 2_000, "history_read_item id=win_1_summary format=json")
    assert result.clipped and len(result.text) + 1 + len(result.receipt) <= 2_000


def test_every_summary_section_has_a_clipping_weight():
    assert set(WEIGHTS) == set(SUMMARY_SECTIONS)

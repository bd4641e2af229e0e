"""The reading tools' paging (paging.py): long lines in pieces, pages within a budget, searches
that find a match across a cut. Drawn with a small piece size so that every text has cuts."""

from __future__ import annotations

from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from ctxkernel_chapters import paging

TEXT = st.text(alphabet="ab \n", max_size=300)


@given(TEXT, st.booleans())
def test_pieces_hold_the_text_and_each_fits(text, at_space):
    with mock.patch.object(paging, "LINE_CHARS", 10):
        pieces = paging.pieces(text, at_space=at_space)
    assert all(len(piece) <= 10 for piece, _ in pieces)
    rebuilt: list[str] = []
    for piece, continued in pieces:
        if continued:
            rebuilt[-1] += piece
        else:
            rebuilt.append(piece)
    original = text.splitlines()
    if not at_space:  # cut exactly: the pieces are the lines
        assert rebuilt == original
    else:  # cut at a space, which the line break stands for: only those spaces are gone
        assert [line.replace(" ", "") for line in rebuilt] == [line.replace(" ", "") for line in original]
        assert sum(map(len, rebuilt)) >= sum(map(len, original)) - sum(c for _, c in pieces)


@given(TEXT, st.booleans(), st.data())
def test_a_match_is_named_by_the_piece_where_it_starts(text, at_space, data):
    lines = text.splitlines()
    line_no = data.draw(st.integers(0, len(lines) - 1)) if lines else None
    if line_no is None or not lines[line_no]:
        return
    line = lines[line_no]
    start = data.draw(st.integers(0, len(line) - 1))
    needle = line[start : start + data.draw(st.integers(1, 6))]
    with mock.patch.object(paging, "LINE_CHARS", 10):
        pieces = paging.pieces(text, at_space=at_space)
        found = list(paging.matches(text, needle, at_space=at_space))
        first_piece = sum(len(paging.cuts(earlier, at_space=at_space)) for earlier in lines[:line_no])
        starts = paging.cuts(line, at_space=at_space)
    first = line.find(needle)
    owner = first_piece + max(k for k, s in enumerate(starts) if s <= first)
    assert owner in [index for index, _ in found]
    assert all(0 <= index < len(pieces) for index, _ in found)


def test_a_page_stops_at_its_budget_but_holds_one_piece_at_least():
    pieces = [("x" * 9_000, False)] * 5
    assert len(paging.page(pieces, 0, 10)) == 2  # 18,000 of 20,000 characters
    assert paging.page([("y" * 30_000, False)], 0, 10) == [("y" * 30_000, False)]
    assert paging.page(pieces, 4, 10) == pieces[4:]

"""How the reading tools page a text: lines, long lines in pieces, pages within a budget.

``chapters_read`` and ``chapters_artifact`` answer a page of lines. A text held in the archive
may have a line of any length (a pasted log in a user message, a JSON document in an artifact),
so a line longer than :data:`LINE_CHARS` is read as several pieces, and a page stops at
:data:`PAGE_CHARS` characters: no answer brings a large text back whole. The pieces are
numbered like lines, by the pages and by the searches alike, and a search looks in the whole
line, so a match across a cut is found and named by the piece where it starts.

A chapter is prose: its long lines are cut at a space where one is near the limit (the space
becomes the line break, so the text reads, and compares with whitespace collapsed, the same).
An artifact is kept verbatim: its lines are cut at the limit exactly, and a reader marks the
pieces that continue a line (``chapters_artifact`` numbers them ``N+``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

#: a longer line is read in pieces of at most this many characters
LINE_CHARS = 2_000
#: the most characters one page holds (at least one piece): ``history_read_item``'s largest page
PAGE_CHARS = 20_000
#: characters of a line a search hit shows, from a little before the match
PREVIEW_CHARS = 240


def cuts(line: str, *, at_space: bool) -> list[int]:
    """Where each piece of ``line`` starts. With ``at_space`` a piece ends at the last space of
    its second half when there is one, and the space is left out of both pieces."""
    starts = [0]
    at = 0
    while len(line) - at > LINE_CHARS:
        end = at + LINE_CHARS
        space = line.rfind(" ", at + LINE_CHARS // 2, end + 1) if at_space else -1
        at = space + 1 if space != -1 else end
        starts.append(at)
    return starts


def pieces(text: str, *, at_space: bool = False) -> list[tuple[str, bool]]:
    """The text's lines as the tools number them, each with whether it continues the line before."""
    out: list[tuple[str, bool]] = []
    for line in text.splitlines():
        starts = cuts(line, at_space=at_space)
        for k, start in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(line)
            if k + 1 < len(starts) and line[end - 1 : end] == " " and at_space:
                end -= 1  # the space the line was cut at: the line break stands for it
            out.append((line[start:end], k > 0))
    return out


def page(numbered: list[tuple[str, bool]], offset: int, limit: int) -> list[tuple[str, bool]]:
    """Pieces ``offset`` .. ``offset + limit - 1``, fewer when they would hold more than
    :data:`PAGE_CHARS` characters (one at least)."""
    chunk: list[tuple[str, bool]] = []
    size = 0
    for piece in numbered[offset : offset + limit]:
        size += len(piece[0])
        if chunk and size > PAGE_CHARS:
            break
        chunk.append(piece)
    return chunk


def matches(text: str, needle: str, *, at_space: bool = False) -> Iterator[tuple[int, str]]:
    """Each line of ``text`` holding ``needle`` (lower case) as ``(index, preview)``: the index (from
    0) of the piece where the match starts, as :func:`pieces` numbers them, found in the whole line;
    the preview is the text around the match."""
    index = 0
    for line in text.splitlines():
        starts = cuts(line, at_space=at_space)
        lowered = line.lower()
        # lower() may change a line's length (a few letters lower to two characters); then the
        # match is named by the line's first piece
        exact = len(lowered) == len(line)
        start = lowered.find(needle)
        while start != -1:
            piece = bisect_right(starts, start) - 1 if exact else 0
            # from a little before the match, and the whole line when it is short
            begin = min(max(0, start - 80), max(0, len(line) - PREVIEW_CHARS)) if exact else 0
            yield index + piece, " ".join(line[begin : begin + PREVIEW_CHARS].split())
            nxt = starts[piece + 1] if exact and piece + 1 < len(starts) else len(line)
            start = lowered.find(needle, nxt) if exact else -1
        index += len(starts)

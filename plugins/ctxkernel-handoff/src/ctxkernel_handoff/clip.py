"""Priority-aware clipping of a generated handoff body, with a mechanical clipping receipt.

The host's directive asks for eight ``## `` sections and writes ``## Critical Context`` last, so a
plain cut from the end deletes decisions, constraints and open questions first. Instead, every
piece (the preamble before the first heading, and each ``## `` section) first keeps a reservation
for the truncation marker, so the split never empties a piece without saying so, then a small
floor of its own text; only the rest is split by weight, water-filling up to each piece's length.
Critical Context, Next Step, Pending Jobs and Current Work get the larger weights; Files and Code
(long paths and snippets) gives ground first. A floor is a share of the budget, not a promise that
a whole bullet survives inside it.

Cuts are safe for the text they land in: a cut inside a fenced code block closes it with a
synthesized fence, or retreats out of the block when the fence does not fit (the receipt reports
the retreat); when retreating would delete every remaining character the repair is refused and the
excerpt is handed on as it stands. A cut never splits a grapheme (combining marks, joiners,
variation selectors, emoji modifiers, regional-indicator pairs).

The receipt is generated here, never by the model: it states how many source characters were kept,
the pieces this clip shortened (kept/original lengths), the reason when the reply was not
sectioned or the sectioned layout did not fit, and where the untrimmed reply can be read. Its
reservation is taken only when the reply actually has to be clipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ctxkernel.text import cut_text, open_fence, safe_cut

MARKER = "… [truncated]"
#: what a trimmed piece ends with: a line break, then the marker
MARKER_TEXT = "\n" + MARKER
SEPARATOR = "\n\n"
#: characters of its own text each clipped piece keeps before the weighted split
FLOOR = 48
#: weight of each mandated section in the split (unknown headings and the preamble weigh 1)
WEIGHTS: dict[str, float] = {
    "Critical Context": 4.0,
    "Next Step": 3.5,
    "Pending Jobs": 3.0,
    "Current Work": 3.0,
    "Primary Request and Intent": 2.0,
    "Errors and Fixes": 1.5,
    "Key Technical Concepts": 1.0,
    "Files and Code": 0.4,
}
#: a ``## `` heading line; its name is the rest of the line, stripped. Greedy to the line's end:
#: a lazy name followed by ``\s*$`` retried a run of blanks from each of its characters, so a
#: summarizer's heading with 200,000 blanks in it took hours
_HEADING = re.compile(r"^## +(.+)$", re.MULTILINE)


@dataclass
class Piece:
    name: str  # "(preamble)" or the heading text
    heading: str  # the heading line with its newline ("" for the preamble)
    body: str

    @property
    def text(self) -> str:
        return self.heading + self.body


@dataclass
class ClipResult:
    text: str
    clipped: bool
    source_chars: int
    kept_chars: int
    shortened: list[tuple[str, int, int]] = field(default_factory=list)  # (piece, kept, original)
    reason: str | None = None  # why the layout was not (fully) used
    notes: list[str] = field(default_factory=list)  # fence repairs
    receipt: str = ""


def split_pieces(text: str) -> list[Piece]:
    """The preamble and each ``## `` section, in order; joined they give ``text`` back."""
    matches = list(_HEADING.finditer(text))
    if not matches:
        return [Piece("(preamble)", "", text)]
    pieces = []
    if matches[0].start() > 0:
        pieces.append(Piece("(preamble)", "", text[: matches[0].start()]))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        line_end = text.find("\n", m.start())
        line_end = end if line_end == -1 or line_end > end else line_end + 1
        pieces.append(Piece(m.group(1).strip(), text[m.start() : line_end], text[line_end:end]))
    return pieces


# -- the weighted split --------------------------------------------------------------------------------
def _water_fill(demands: list[int], weights: list[float], amount: int) -> list[int]:
    """Split ``amount`` by weight, capping each share at its demand and passing surplus on."""
    shares = [0] * len(demands)
    active = [i for i, d in enumerate(demands) if d > 0]
    while amount > 0 and active:
        total = sum(weights[i] for i in active)
        given = 0
        for i in active:
            want = int(amount * weights[i] / total)
            share = min(want, demands[i] - shares[i])
            shares[i] += share
            given += share
        active = [i for i in active if shares[i] < demands[i]]
        if given == 0:  # rounding left a few characters: hand them out one by one by weight
            for i in sorted(active, key=lambda j: -weights[j]):
                if amount - given <= 0:
                    break
                shares[i] += 1
                given += 1
            active = [i for i in active if shares[i] < demands[i]]
        amount -= given
    return shares


def _weight(name: str) -> float:
    return WEIGHTS.get(name, 1.0)


def clip_sections(text: str, budget: int) -> ClipResult:
    """Clip ``text`` to ``budget`` characters by priority (no receipt; see :func:`clip_with_receipt`)."""
    source = len(text)
    if source <= budget:
        return ClipResult(text, False, source, source)
    pieces = split_pieces(text)
    sectioned = any(p.heading for p in pieces)
    if not sectioned:
        return _plain(text, budget, "the reply is not sectioned (no '## ' headings): clipped from the end")
    last = len(pieces) - 1
    # a clipped piece ends with the marker and, unless it is the last, the blank line before the
    # next heading: both are reserved, so a heading never lands on the marker's line
    tails = [len(MARKER_TEXT) + (0 if i == last else len(SEPARATOR)) for i in range(len(pieces))]
    bases: list[int] = []
    for p, tail in zip(pieces, tails, strict=True):
        full = len(p.text)
        minimum = len(p.heading) + FLOOR + tail
        bases.append(full if full <= minimum else minimum)
    if sum(bases) > budget:
        return _plain(
            text,
            budget,
            f"the sectioned layout did not fit: {len(pieces)} pieces need {sum(bases)} characters for headings, "
            f"markers and floors, the budget is {budget}; clipped from the end",
        )
    demands = [len(p.text) - b for p, b in zip(pieces, bases, strict=True)]
    shares = _water_fill(demands, [_weight(p.name) for p in pieces], budget - sum(bases))
    out: list[str] = []
    result = ClipResult("", True, source, 0)
    for i, (piece, base, share) in enumerate(zip(pieces, bases, shares, strict=True)):
        allowed = base + share
        if allowed >= len(piece.text):
            out.append(piece.text)
            continue
        body, note = cut_text(piece.body, allowed - len(piece.heading) - tails[i])
        kept = piece.heading + body.rstrip("\n") + MARKER_TEXT + ("" if i == last else SEPARATOR)
        out.append(kept)
        result.shortened.append((piece.name, len(kept), len(piece.text)))
        if note:
            result.notes.append(f"{piece.name}: {note}")
    result.text = "".join(out)
    result.kept_chars = len(result.text)
    return result


def _plain(text: str, budget: int, reason: str) -> ClipResult:
    room = max(0, budget - len(MARKER_TEXT))
    body, note = cut_text(text, room)
    clipped = body.rstrip("\n") + MARKER_TEXT if room > 0 else ""
    result = ClipResult(clipped, True, len(text), len(clipped), [("(whole reply)", len(clipped), len(text))], reason)
    if note:
        result.notes.append(note)
    return result


def render_receipt(result: ClipResult, untrimmed: str) -> str:
    """The one-line clipping receipt written beside the body."""
    parts = [f"kept {result.kept_chars} of {result.source_chars} source characters"]
    if result.shortened:
        parts.append("shortened: " + "; ".join(f"{name} {kept}/{orig}" for name, kept, orig in result.shortened))
    if result.reason:
        parts.append(f"reason: {result.reason}")
    if result.notes:
        parts.append("code blocks: " + "; ".join(result.notes))
    parts.append(f"untrimmed reply: {untrimmed}")
    parts.append("this receipt describes this clip only; it cannot certify that the summarizer omitted nothing")
    return "<clipping_receipt>" + " | ".join(parts) + "</clipping_receipt>"


def clip_with_receipt(text: str, budget: int, untrimmed: str) -> ClipResult:
    """Clip ``text`` so that body, a newline and receipt fit ``budget`` together.

    Without clipping, the whole budget is the body's and no receipt is written.
    """
    if len(text) <= budget:
        return ClipResult(text, False, len(text), len(text))
    reserve = 400
    for _ in range(6):
        result = clip_sections(text, max(0, budget - reserve - 1))
        receipt = render_receipt(result, untrimmed)
        if len(result.text) + 1 + len(receipt) <= budget:
            result.receipt = receipt
            return result
        reserve = len(receipt) + 16
    # the receipt alone does not fit beside any usable body: keep what fits and still say so
    result = clip_sections(text, max(0, budget // 2))
    receipt = render_receipt(result, untrimmed)
    result.receipt = receipt[: max(0, budget - len(result.text) - 1)]
    return result


__all__ = [
    "MARKER",
    "ClipResult",
    "Piece",
    "clip_sections",
    "clip_with_receipt",
    "cut_text",
    "open_fence",
    "render_receipt",
    "safe_cut",
    "split_pieces",
]

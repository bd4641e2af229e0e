"""The table of contents: the deterministic text that stands for archived chapters.

It is the replacement message of an in-place compaction and the one seed event of a continued
session. Bullets are keyed by chapter path: a later table of contents parses the earlier one
it replaces and merges its bullets (de-duplicated by path) and its carried prose (never
dropped; identical paragraphs kept once), so nothing archived earlier disappears from view.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ctxkernel.text import attr, guard

TOC_OPEN = "<chapters-toc>"
TOC_CLOSE = "</chapters-toc>"
CHAPTERS = "[[chapters]]"
HANDOFF = "[[handoff note]]"
CARRIED = "[[carried forward]]"
INSTRUCTIONS = "[[user instructions]]"
_MARKERS = (TOC_OPEN, TOC_CLOSE, CHAPTERS, HANDOFF, CARRIED, INSTRUCTIONS)
#: the pseudo-XML frame of a table of contents: text inside it may neither open nor close one
FRAMES = ("chapters-toc",)
INTRO = (
    "Earlier parts of this conversation are archived as Markdown chapters. Read one with "
    "chapters_read(chapter=<id>), search them all with chapters_search(query=...), and large tool "
    "outputs with chapters_artifact."
)
#: the start of every table of contents, up to its first bullet: the same text in every session,
#: so a meter may count it once per process (:func:`render_pieces`' head always starts with it)
FIXED_HEAD = "\n".join([TOC_OPEN, INTRO, "", CHAPTERS]) + "\n"
_BULLET = re.compile(r"^- \[([^\]]+)\] ")
_FOLD = re.compile(r"^- \[fold:([^\]]+)\] (\d+)–(\d+): (\d+) ")
_NUMBER = re.compile(r"^- \[[^\]]+\] (\d+) ")


@dataclass
class Toc:
    bullets: dict[str, str] = field(default_factory=dict)  # path -> bullet line, in order
    carried: list[str] = field(default_factory=list)  # paragraphs, in order, unique
    instructions: list[str] = field(default_factory=list)  # the user's own messages, oldest first, unique

    def add_bullet(self, path: str, line: str) -> None:
        self.bullets[path] = line  # a re-written chapter keeps its place, newest text wins

    def instruct(self, text: str) -> None:
        text = text.strip()
        if text:
            if text in self.instructions:
                self.instructions.remove(text)
            self.instructions.append(text)

    def carry(self, text: str) -> None:
        for paragraph in re.split(r"\n\s*\n", text.strip()):
            paragraph = paragraph.strip()
            if paragraph and paragraph not in self.carried:
                self.carried.append(paragraph)


def bullet(record: dict[str, Any], archive_label: str, *, with_summary: bool = True) -> str:
    # the title is model-written: escaped like an attribute, it cannot end its quotes and forge
    # the seqs or token count after it, nor close the table of contents
    title = attr(" ".join(str(record.get("title", "")).split())[:100])
    line = (
        f'- [{archive_label}/{record["path"]}] {record["number"]:03d} "{title}" · '
        f"seqs {record['start_seq']}–{record['end_seq']} · {record['tokens']} tokens"
    )
    summary = guard(" ".join(str(record.get("summary", "")).split()), *FRAMES)
    if with_summary and summary:
        line += f" — {summary[:400]}"
    return line


def _escape(text: str) -> str:
    """Keep carried prose from being read as structure: a line equal to a marker gets a space, and
    no line may open or close the table of contents."""
    return "\n".join(f" {line}" if line.strip() in _MARKERS else line for line in guard(text, *FRAMES).splitlines())


def is_toc(text: str) -> bool:
    return text.lstrip().startswith(TOC_OPEN)


def parse(text: str) -> Toc:
    """Bullets and carried prose of a table of contents (handoff notes become carried prose)."""
    toc = Toc()
    body = text.split(TOC_OPEN, 1)[-1]
    body = body.rsplit(TOC_CLOSE, 1)[0]
    section = None
    chunks: dict[str, list[str]] = {HANDOFF: [], CARRIED: []}
    handoffs: list[str] = []
    quote: list[str] = []
    for line in body.splitlines():
        stripped = line.rstrip()  # markers sit at column 0; escaped prose starts with a space
        if stripped in (CHAPTERS, HANDOFF, CARRIED, INSTRUCTIONS):
            if section == HANDOFF and chunks[HANDOFF]:
                handoffs.append("\n".join(chunks[HANDOFF]))
                chunks[HANDOFF] = []
            section = stripped
            continue
        if section == CHAPTERS:
            match = _BULLET.match(line)
            if match:
                toc.add_bullet(match.group(1), line)
        elif section == INSTRUCTIONS:
            # one instruction per quoted block: every line starts with '>', blocks are apart
            if line.startswith(">"):
                quote.append(line[2:] if line.startswith("> ") else line[1:])
            elif quote:
                toc.instruct("\n".join(quote))
                quote = []
        elif section in chunks:
            chunks[section].append(line[1:] if line.startswith(" ") and line[1:].strip() in _MARKERS else line)
    if quote:
        toc.instruct("\n".join(quote))
    if chunks[HANDOFF]:
        handoffs.append("\n".join(chunks[HANDOFF]))
    for note in handoffs:
        toc.carry(note)
    toc.carry("\n".join(chunks[CARRIED]))
    return toc


def _fold_line(folder: str, lo: int, hi: int, count: int) -> str:
    return (
        f"- [fold:{folder}] {lo:03d}–{hi:03d}: {count} earlier chapter(s) in {folder}/, listed with their summaries "
        'in the manifest; read one with chapters_read(chapter="<number>") or search them with chapters_search'
    )


#: an upper bound of a text's tokens without tokenising it (see :func:`byte_bound`)
AtMost = Callable[[str], int]


def byte_bound(text: str) -> int:
    """At least as many tokens as ``text`` has: its UTF-8 bytes. Every token of a byte-level BPE
    (tiktoken's encodings) covers at least one byte; pass it as ``at_most`` only for such a
    tokenizer (``meter.message_at_most`` says which: None for the others)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _fit(
    entries: list[tuple[str, str]], count: Callable[[str], int], budget: int, at_most: AtMost | None = None
) -> tuple[list[tuple[str, str]], int, int]:
    """Bring the bullets under ``budget``: the oldest lose their summaries first, then the oldest
    fold into one line per folder (number range and count). Returns (entries, shortened, folded).
    When even ``at_most`` of every line fits, nothing is shortened: nothing is counted either."""
    entries = list(entries)
    shortened = folded = 0
    if at_most is not None and sum(at_most(line) + 1 for _, line in entries) <= budget:
        return entries, 0, 0

    cache: dict[str, int] = {}

    def cost() -> int:
        # lines are counted one by one (cached): a newline between lines is one token
        total = 0
        for _, line in entries:
            if line not in cache:
                cache[line] = count(line)
            total += cache[line] + 1
        return total

    i = 0
    while cost() > budget and i < len(entries):
        key, line = entries[i]
        if not key.startswith("fold:") and " — " in line:
            entries[i] = (key, line.split(" — ", 1)[0])
            shortened += 1
        i += 1
    while cost() > budget:
        index = next((k for k, (key, _) in enumerate(entries) if not key.startswith("fold:")), None)
        if index is None or index == len(entries) - 1:
            break  # keep the newest chapter's own bullet
        key, line = entries.pop(index)
        number = _NUMBER.match(line)
        folder = key.rsplit("/", 1)[0]
        fold_key = f"fold:{folder}"
        n = int(number.group(1)) if number else 0
        at = next((k for k, (other, _) in enumerate(entries) if other == fold_key), None)
        if at is None:
            entries.insert(0, (fold_key, _fold_line(folder, n, n, 1)))
        else:
            old = _FOLD.match(entries[at][1])
            lo, hi, c = (int(old.group(2)), int(old.group(3)), int(old.group(4))) if old else (n, n, 0)
            entries[at] = (fold_key, _fold_line(folder, min(lo, n), max(hi, n), c + 1))
        folded += 1
    return entries, shortened, folded


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in guard(text, *FRAMES).splitlines())


def _pick_instructions(
    instructions: list[str], count: Callable[[str], int] | None, budget: int | None, at_most: AtMost | None = None
) -> tuple[list[str], int]:
    """The newest instructions that fit ``budget`` (all without a budget, or when even ``at_most``
    of them all fits: then none is counted), in their order."""
    if count is None or budget is None:
        return list(instructions), 0
    if at_most is not None and sum(at_most(text) + 2 for text in instructions) <= budget:
        return list(instructions), 0
    picked: list[str] = []
    used = 0
    for text in reversed(instructions):
        cost = count(text) + 2
        if used + cost <= budget:
            picked.append(text)
            used += cost
    picked.reverse()
    return picked, len(instructions) - len(picked)


def quote_piece(instruction: str) -> str:
    """The piece of a table of contents that quotes ``instruction`` when another quote follows it
    (:func:`render_pieces`): its quoted lines and the blank line after them. A strategy may count
    it when the instruction lands and add that count later (the cut after it is exact)."""
    return _quote(instruction.strip()) + "\n\n"


def render(
    toc: Toc,
    *,
    handoff: str = "",
    count: Callable[[str], int] | None = None,
    bullet_budget: int | None = None,
    instruction_budget: int | None = None,
    at_most: AtMost | None = None,
) -> tuple[str, int]:
    """The table-of-contents text, and how many bullets were shortened or folded to fit the budget.

    The user's own instructions are quoted verbatim, newest first within ``instruction_budget``;
    the ones that do not fit are counted in the text (they stay in the chapters). ``at_most``
    (an upper bound of ``count``, e.g. :func:`byte_bound`) spares counting what fits even so:
    the text is the same with it or without."""
    pieces, changed = render_pieces(
        toc,
        handoff=handoff,
        count=count,
        bullet_budget=bullet_budget,
        instruction_budget=instruction_budget,
        at_most=at_most,
    )
    return "".join(pieces), changed


def render_pieces(
    toc: Toc,
    *,
    handoff: str = "",
    count: Callable[[str], int] | None = None,
    bullet_budget: int | None = None,
    instruction_budget: int | None = None,
    at_most: AtMost | None = None,
    quote: Callable[[str], str] = quote_piece,
) -> tuple[list[str], int]:
    """:func:`render`'s text as the pieces it joins (``"".join(pieces)`` is the text): the head
    up to the instructions' marker, each quoted instruction but the last as its
    :func:`quote_piece`, the last quote, and the rest. Each quote starts with ``>`` after a piece
    that ends with a newline: a cut that ``Meter.joins_exactly`` proves exact for cl100k, so a
    meter counts the text from the quotes' counts (``Meter.count_joined`` checks every cut).
    ``quote`` may serve the pieces a caller kept (it must return :func:`quote_piece`'s text)."""
    entries = list(toc.bullets.items())
    shortened = folded = 0
    if count is not None and bullet_budget is not None:
        entries, shortened, folded = _fit(entries, count, bullet_budget, at_most)
    lines = [line for _, line in entries]
    head = [TOC_OPEN, INTRO, "", CHAPTERS]
    head += lines or ["(no chapters yet)"]
    if shortened or folded:
        head.append(
            f"({shortened} bullet(s) shortened, {folded} folded to fit the bullet budget; the manifest keeps every summary)"
        )
    instructions, left_out = _pick_instructions(toc.instructions, count, instruction_budget, at_most)
    rest: list[str] = []
    if left_out:
        rest.append(f"({left_out} earlier or longer instruction(s) are in the chapters only)")
    if handoff.strip():
        rest += ["", HANDOFF, _escape(handoff.strip())]
    if toc.carried:
        rest += ["", CARRIED, _escape("\n\n".join(toc.carried))]
    rest.append(TOC_CLOSE)
    if not instructions:
        return ["\n".join(head + rest)], shortened + folded
    head += ["", INSTRUCTIONS]
    quotes = [quote(t) for t in instructions[:-1]]
    last = _quote(instructions[-1]) + "\n"
    return ["\n".join(head) + "\n", *quotes, last, "\n".join(rest)], shortened + folded


def fold_ranges(bullets: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Folder -> (lowest, highest) chapter number of each folded line among ``bullets``."""
    folds = {}
    for key, line in bullets.items():
        match = _FOLD.match(line)
        if key.startswith("fold:") and match:
            folds[key[len("fold:") :]] = (int(match.group(2)), int(match.group(3)))
    return folds


def in_fold(folds: dict[str, tuple[int, int]], key: str, number: int) -> bool:
    lo, hi = folds.get(key.rsplit("/", 1)[0], (1, 0))
    return lo <= number <= hi


def merged(
    previous: Iterable[str],
    records: Iterable[dict[str, Any]],
    archive_label: str,
    extra_prose: Iterable[str] = (),
    instructions: Iterable[str] = (),
) -> Toc:
    """A table of contents from earlier ones (texts) plus chapter records, bullets keyed by path."""
    toc = Toc()
    for text in previous:
        old = parse(text)
        for instruction in old.instructions:
            toc.instruct(instruction)
        for path, line in old.bullets.items():
            toc.add_bullet(path, line)
        for paragraph in old.carried:
            toc.carry(paragraph)
    folds = fold_ranges(toc.bullets)
    for record in records:
        key = f"{archive_label}/{record['path']}"
        if key not in toc.bullets and in_fold(folds, key, record["number"]):
            continue  # already counted in a folded line
        toc.add_bullet(key, bullet(record, archive_label))
    for prose in extra_prose:
        toc.carry(prose)
    for instruction in instructions:
        toc.instruct(instruction)
    return toc

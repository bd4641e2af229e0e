"""Building the bounded handoff that opens a new window.

Layout, in this order, within ``handoff_max_chars``::

    <window_handoff window="N+1" ...>
    snapshot   window index, goal, open todos, the last four user instructions verbatim (mandatory)
    notes      up to the 8 most recent notes, ~1,800 characters each (optional, a bounded share)
    body       <generated_handoff> or <extractive_handoff>, every character left over
    receipt    <clipping_receipt> only when the generated body had to be clipped
    </window_handoff>

The mandatory snapshot is rendered first and is bounded by construction (goal 1,000 characters,
todos 1,200, four instructions of 1,000 each), so an unused allowance returns to the body; note
previews take at most half of what the snapshot leaves, so they cannot eat the body.

``generated`` asks the summarizer model once and wraps its reply; ``extractive`` excerpts the
region's records and never calls a model. A failed call, or a body budget too small for a usable
generated body, falls back to extractive without blocking the switch and the window record says
why (``generated_discarded``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ctxkernel import SUMMARY_SECTIONS, Message, Summary, get_logger
from ctxkernel.recall.history import History
from ctxkernel.recall.notes import Note, render_note
from ctxkernel.redact import redact
from ctxkernel.text import attr, guard, tag

from .clip import clip_with_receipt
from .excerpts import _ACTIVITY_HEAD, FRAMES, Excerpts, Extract, _clip, _one_line, extract
from .strategy import STRATEGY

if TYPE_CHECKING:
    from ctxkernel import Context, Node

log = get_logger("ctxkernel.handoff")

INSTRUCTIONS = 4
#: windows listed in the handoff's window index (the newest; history_list_windows has them all)
WINDOW_INDEX = 6
INSTRUCTION_CHARS = 1_000
GOAL_CHARS = 1_000
TODO_ENTRIES = 12
TODO_CHARS = 1_200
#: characters of a todo entry's status (the model writes it: "pending", "in_progress", ...)
TODO_STATUS_CHARS = 40
NOTES_INJECTED = 8
NOTE_PREVIEW_CHARS = 1_800
#: share of what the snapshot leaves that note previews may take at most
NOTES_SHARE = 0.5
#: below this many characters a generated body is not usable: the handoff falls back to extractive
MIN_GENERATED_BODY = 1_200
#: notes the strategy writes itself; never injected (the body already carries the same text)
HANDOFF_NOTE = "handoff.md"
HANDOFF_LOG_NOTE = "handoff-log.md"
NOTES_PREFIX = "self/notes/"
#: the frames a handoff draws; text inside it (instructions, notes, summaries, excerpts) may
#: neither open nor close one (``note`` first: render_note guards it itself)


def directive(budget: int) -> str:
    return (
        "Your task is to write the handoff for the next context window: a summary of the conversation so "
        "far that lets the work continue without it. Write exactly these eight sections, in this order, "
        "each as a '## ' heading, writing '(none)' under a section with nothing to say and never dropping "
        "a section: " + "; ".join(SUMMARY_SECTIONS) + ". Quote the user's instructions verbatim where they still "
        "apply and name the item ids (item_<seq>) of evidence worth re-reading. If the conversation begins "
        "with an earlier handoff, merge it into yours instead of copying it. Keep the whole summary under "
        f"{budget} characters."
    )


@dataclass
class Handoff:
    """A built handoff: the message text, what is recorded, and the window record."""

    text: str
    full: str  # the unclipped handoff for handoff.md (a generated one: the summarizer's raw reply)
    summary: Summary  # recorded in compaction/summary (untrimmed reply or extractive body)
    record: dict[str, Any] = field(default_factory=dict)
    #: ``text`` cut where :func:`handoff_tokens` may add counts, and the count of each piece known
    #: before the switch (None: tokenised): empty for one piece, the whole text
    pieces: tuple[str, ...] = ()
    piece_counts: tuple[int | None, ...] = ()
    #: the first piece (everything before the activity lines) as its parts (:class:`Frame`'s,
    #: then the body's lead): the fixed texts, numbers and quoted instructions among them are
    #: counted without tokenising them (:func:`handoff_tokens`); empty: the piece is tokenised
    lead: tuple[Part, ...] = ()

    def message(self) -> Message:
        return Message.user(self.text, STRATEGY.source("handoff"))


@dataclass
class Generated:
    """The one summarizer call of a switch (made at most once, reused by every budget attempt)."""

    text: str | None
    provider: str | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    error: str | None = None


def call_summarizer(ctx: Context, nodes: list[Node], budget: int, header: tuple[str, list[Any]]) -> Generated:
    """Ask the summarizer model once: request header, the outgoing region, then the directive last
    (so a provider prefix cache serves everything before it)."""
    model = STRATEGY.on(ctx).summarizer
    if model is None:
        return Generated(None, error="no summarizer model is configured ([summarizer] kind is 'extractive')")
    system, tools = header
    messages = [n.message for n in nodes]
    messages.append(Message.user(directive(budget), STRATEGY.source("directive")))
    try:
        reply = model.complete(messages, system=system, tools=tools)
    except Exception as exc:  # any failure falls back to extractive, never blocks the switch
        log.warning("handoff summary call failed", session=ctx.id, error=f"{type(exc).__name__}: {exc}")
        # the reason is stored in the session log: a provider error may echo a key
        reason = redact(f"{type(exc).__name__}: {exc}"[:2000])[:500]
        return Generated(None, getattr(model, "provider", None), getattr(model, "model", None), None, reason)
    provider = reply.provider or getattr(model, "provider", None)
    name = reply.model or getattr(model, "model", None)
    text = reply.message.text.strip()
    if not text:
        return Generated(None, provider, name, reply.usage, "the summarizer returned an empty reply")
    return Generated(text, provider, name, reply.usage)


# -- the snapshot -----------------------------------------------------------------------------------
def instruction_text(history: History, seq: int) -> str:
    return history.text_of(history.events[seq])


class Numbered(NamedTuple):
    """A part of a handoff that is ``f"{prefix}{number}{suffix}"``, fixed texts around a number:
    counted with ``Meter.count_numbered``, which tokenises no digit and counts the fixed texts
    once per process (it falls back to counting the whole part when it cannot prove that exact)."""

    prefix: str
    number: int
    suffix: str

    def __str__(self) -> str:
        return f"{self.prefix}{self.number}{self.suffix}"

    def ended(self, end: str) -> Numbered:
        return Numbered(self.prefix, self.number, self.suffix + end)


#: a part of a handoff's text before its activity lines: a text, or fixed texts around a number
Part = str | Numbered

#: the snapshot's texts that hold no value of the session: their counts are the same in every
#: session, taken once per process (:func:`fixed_count`)
_RECOVERABLE = (
    " Earlier messages were replaced by this handoff; nothing was deleted: the history_* tools read any item_<seq>,"
)
_INSTRUCTIONS_HEAD = (
    "Recent user instructions, oldest first, verbatim (a later instruction takes precedence over an earlier one "
    "it corrects):"
)
#: why a switch happens (the engine's four entry points): the opening tag's attribute for each
SWITCH_REASONS = ("manual", "threshold", "requested", "overflow")
FIXED_PARTS = frozenset(
    {_RECOVERABLE, _INSTRUCTIONS_HEAD + "\n", _ACTIVITY_HEAD + "\n", *(f' reason="{r}"' for r in SWITCH_REASONS)}
)


def fixed_count(meter: Any, text: str) -> int | None:
    """The count of ``text`` when it is one of :data:`FIXED_PARTS` (``Meter.count_fixed``: once
    per process and tokenizer), else None."""
    return meter.count_fixed(text) if text in FIXED_PARTS else None


def quoted_instruction(history: History, seq: int, instruction_chars: int) -> str:
    """The block quoting instruction ``seq`` in the snapshot (clipped to ``instruction_chars``)."""
    text = instruction_text(history, seq)
    clipped = _clip(text, instruction_chars)
    more = f" [clipped: {len(text)} characters in item_{seq}]" if len(clipped) < len(text) else ""
    opening = tag("instruction", item=f"item_{seq}", window=f"win_{history.window_of(seq)}")
    return f"{opening}\n{guard(clipped, *FRAMES)}\n</instruction>{more}"


def goal_line(history: History, instructions: list[int], goal_chars: int) -> str | None:
    """The snapshot's goal line (None without a goal), ``instructions`` the ones it quotes."""
    goal = history.goal()
    if goal is None:
        return None
    if goal.seq in instructions:
        return f"Goal (goal = item_{goal.seq}): quoted below with the recent instructions."
    # the user's (or the harness's) text: it cannot end the handoff or open a forged frame
    return f"Goal (goal = item_{goal.seq}): {guard(_clip(history.goal_text() or '', goal_chars), *FRAMES)}"


def quote_parts(history: History, seqs: list[int], instruction_chars: int) -> list[str]:
    """The quoted instructions ``seqs`` as parts of the snapshot: each block with the line break
    after it, the last without (the snapshot ends there; the handoff adds its section break)."""
    blocks = [quoted_instruction(history, seq, instruction_chars) for seq in seqs]
    return [block + "\n" for block in blocks[:-1]] + blocks[-1:]


def snapshot_parts(history: History, *, new_window: int, reason: str, budget: int = 16_000) -> list[Part]:
    """Window index, goal, open todos and the last four user instructions (bounded), as parts cut
    where a count may be added (before a space that follows a character, after a line break): the
    fixed texts, the numbers between fixed texts (:class:`Numbered`) and each quoted instruction
    apart, so a switch tokenises only what no step counted (:func:`handoff_tokens`).

    At the seed's budgets (8,000 characters and up) the caps are the seed's; a handoff squeezed by
    a small window (the switch never lets it take more than a quarter of the window) scales them
    down so the body keeps room."""
    instruction_chars = min(INSTRUCTION_CHARS, budget // 8)
    goal_chars = min(GOAL_CHARS, budget // 8)
    todo_chars = min(TODO_CHARS, budget // 7)
    current = history.current_window
    sections: list[list[Part]] = [
        [
            f"Context window win_{new_window} (a {reason}",
            Numbered(" switch from win_", current.number, ","),
            Numbered(" whose items start at item_", current.start_seq, ")."),
            _RECOVERABLE,
            Numbered(
                " and win_", current.number, "_summary is the untrimmed summary (history_read_item, format json)."
            ),
        ]
    ]
    index = [
        f"win_{w.number} item_{w.start_seq}-item_{w.end_seq if w.end_seq is not None else history.cursor - 1}"
        for w in history.windows[-WINDOW_INDEX:]
    ]
    earlier = len(history.windows) - WINDOW_INDEX
    sections.append(
        [
            "Window index: "
            + ("… " if earlier > 0 else "")
            + " · ".join(index)
            + f" · win_{new_window} (this window)"
            + ("; history_list_windows lists all" if earlier > 0 else "")
        ]
    )
    instructions = history.instructions[-INSTRUCTIONS:]
    goal = goal_line(history, instructions, goal_chars)
    if goal is not None:
        sections.append([goal])
    todos = [t for t in history.checklist() if t.open]
    if todos:
        out = ["Open todos (checklist):"]
        used = 0
        for entry in todos[:TODO_ENTRIES]:
            # the model's todo list (any status, any text): one guarded line per entry
            line = guard(
                f"- [{_one_line(entry.status, TODO_STATUS_CHARS)}] {entry.ref}: {_one_line(entry.text, 160)}", *FRAMES
            )
            if used + len(line) > todo_chars:
                out.append(f"- … {len(todos) - len(out) + 1} more: history_read_item checklist")
                break
            out.append(line)
            used += len(line) + 1
        else:
            if len(todos) > TODO_ENTRIES:
                out.append(f"- … {len(todos) - TODO_ENTRIES} more: history_read_item checklist")
        sections.append(["\n".join(out)])
    if instructions:
        sections.append([_INSTRUCTIONS_HEAD + "\n", *quote_parts(history, instructions, instruction_chars)])
    return _joined_sections(sections, "\n\n")


def _joined_sections(sections: list[list[Part]], between: str) -> list[Part]:
    """The sections' parts in order, ``between`` added to the last part of each but the last."""
    parts: list[Part] = []
    for section in sections:
        if parts:
            parts[-1] = _ended(parts[-1], between)
        parts.extend(section)
    return parts


def _ended(part: Part, end: str) -> Part:
    return part.ended(end) if isinstance(part, Numbered) else part + end


def render_notes(notes: list[Note], budget: int) -> str:
    """Previews of the most recent notes within ``budget`` characters ("" when none fit).

    Short notes keep their whole text; the room they leave is shared by the longer ones, each
    capped at about 1,800 characters (water-filling).
    """
    chosen = [n for n in notes if n.path not in (HANDOFF_NOTE, HANDOFF_LOG_NOTE)][-NOTES_INJECTED:]
    head = f"Recent notes (newest last; full text: notes_read_file with the path, under {NOTES_PREFIX}):"
    while chosen:
        overhead = [len(render_note(n, max_chars=0)) + 80 for n in chosen]  # tag, attributes, clip notice
        room = budget - len(head) - 1 - sum(overhead)
        if room >= 80 * len(chosen):
            wants = [min(len(n.content), NOTE_PREVIEW_CHARS) for n in chosen]
            shares = _water_fill(wants, room)
            # render_note guards its own frame; the handoff's frames are guarded here
            blocks = [
                guard(render_note(n, max_chars=share), *FRAMES[1:]) for n, share in zip(chosen, shares, strict=True)
            ]
            text = head + "\n" + "\n".join(blocks)
            if len(text) <= budget:
                return text
        chosen = chosen[1:]  # drop the oldest until the previews fit their share
    return ""


def _water_fill(wants: list[int], room: int) -> list[int]:
    shares = [0] * len(wants)
    open_ = [i for i, w in enumerate(wants) if w > 0]
    while room > 0 and open_:
        each = max(1, room // len(open_))
        for i in list(open_):
            give = min(each, wants[i] - shares[i], room)
            shares[i] += give
            room -= give
            if shares[i] >= wants[i]:
                open_.remove(i)
            if room <= 0:
                break
    return shares


# -- assembling --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Frame:
    """What a handoff holds besides its body: the frame's tags, the snapshot and the note previews,
    and the characters ``left`` for the body."""

    opening: str
    closing: str
    snapshot: str
    notes: str
    left: int
    #: ``opening``, the snapshot and the notes, with the breaks between them, as the parts
    #: :func:`handoff_tokens` counts (see :func:`snapshot_parts`)
    parts: tuple[Part, ...] = ()


def frame(history: History, notes: list[Note], *, budget: int, reason: str) -> Frame:
    """The parts of the handoff for window ``current + 1`` that come before its body."""
    new_window = history.current_window.number + 1
    opening = (
        tag(
            "window_handoff",
            window=f"win_{new_window}",
            previous=f"win_{new_window - 1}",
            reason=reason,
            summary_item=f"win_{new_window - 1}_summary",
        )
        + "\n"
    )
    closing = "\n</window_handoff>"
    opening_parts: tuple[Part, ...] = (
        Numbered('<window_handoff window="win_', new_window, '"'),
        Numbered(' previous="win_', new_window - 1, '"'),
        f' reason="{attr(reason)}"',
        Numbered(' summary_item="win_', new_window - 1, '_summary">\n'),
    )
    if "".join(map(str, opening_parts)) != opening:  # the tag's form is the toolkit's: one part if it differs
        opening_parts = (opening,)
    snapshot_in_parts = snapshot_parts(history, new_window=new_window, reason=reason, budget=budget)
    snapshot = "".join(map(str, snapshot_in_parts))
    left = budget - len(opening) - len(closing) - len(snapshot) - 2
    notes_text = render_notes(notes, int(max(0, left) * NOTES_SHARE))
    left -= len(notes_text) + (2 if notes_text else 0)
    parts = [*opening_parts, *snapshot_in_parts]
    parts[-1] = _ended(parts[-1], "\n\n")  # the handoff's break after the snapshot
    if notes_text:
        parts.append(notes_text + "\n\n")
    return Frame(opening, closing, snapshot, notes_text, left, tuple(parts))


def assemble(
    history: History,
    nodes: list[Node],
    notes: list[Note],
    *,
    budget: int,
    mode: str,
    reason: str,
    generated: Generated | None,
    discarded: str | None = None,
    excerpts: Excerpts | None = None,
) -> Handoff:
    """The handoff for opening window ``current + 1`` within ``budget`` characters."""
    summary_ref = f"win_{history.current_window.number}_summary"
    fixed = frame(history, notes, budget=budget, reason=reason)
    opening, closing, snapshot, notes_text, left = fixed.opening, fixed.closing, fixed.snapshot, fixed.notes, fixed.left
    record: dict[str, Any] = {"handoff_summary": mode, "budget_chars": budget}
    extracted: Extract | None = None
    body = ""
    full = ""
    summary: Summary
    wrap_g = ("<generated_handoff>\n", "\n</generated_handoff>")
    wrap = ("<extractive_handoff>\n", "\n</extractive_handoff>")
    body_room = left - len(wrap_g[0]) - len(wrap_g[1])
    if mode == "generated" and generated is not None and generated.text is not None and body_room >= MIN_GENERATED_BODY:
        # the summarizer's text is model output: it cannot close or open the handoff's frames
        clip = clip_with_receipt(
            guard(generated.text, *FRAMES), body_room, f"history_read_item id={summary_ref} format=json"
        )
        body = wrap_g[0] + clip.text + wrap_g[1] + (("\n" + clip.receipt) if clip.receipt else "")
        record["clipped"] = clip.clipped
        if clip.clipped:
            record["receipt"] = {
                "kept_chars": clip.kept_chars,
                "source_chars": clip.source_chars,
                "shortened": [list(s) for s in clip.shortened],
                "reason": clip.reason,
                "code_blocks": clip.notes,
            }
        full = generated.text
        summary = Summary(generated.text, provider=generated.provider, model=generated.model, usage=generated.usage)
    else:
        if mode == "generated":
            if discarded:
                record["generated_discarded"] = discarded
            elif generated is not None and generated.error:
                record["generated_discarded"] = f"error: {generated.error}"
            else:
                record["generated_discarded"] = "budget"
            record["handoff_summary"] = "extractive"
            record["requested_summary"] = "generated"
        extracted = extract(history, nodes, max(0, left - len(wrap[0]) - len(wrap[1])), excerpts)
        body = wrap[0] + extracted.text + wrap[1]
        # a call that was made is accounted even when its text is not used
        made = generated is not None and (generated.usage is not None or generated.provider is not None)
        summary = Summary(
            generated.text if (made and generated and generated.text) else extracted.text,
            provider=generated.provider if made and generated else None,
            model=generated.model if made and generated else None,
            usage=generated.usage if made and generated else None,
        )
    parts = [snapshot] + ([notes_text] if notes_text else []) + [body]
    text = opening + "\n\n".join(parts) + closing
    if not full:
        full = text
    record.update({"handoff_chars": len(text), "snapshot_chars": len(snapshot), "notes_chars": len(notes_text)})
    if extracted is None or not extracted.lines:
        return Handoff(text, full, summary, record)
    # the activity lines were counted as their excerpts were rendered: the text is what comes
    # before them (ending with a line break), the lines each with its line break, and the tail
    # (the body's closing tag, which starts the line after the last line, and the frame's)
    start = len(text) - len(closing) - len(body) + len(wrap[0]) + len(extracted.lead)
    end = len(text) - len(closing) - len(wrap[1]) + 1  # the last line's break opens wrap[1]
    lines: list[str]
    counts: list[int | None]
    if None not in extracted.counts:  # every kept line was counted at a step end: one piece
        lines, counts = [text[start:end]], [sum(cast("list[int]", extracted.counts))]
    else:
        lines, counts = _line_pieces(text[start:end], extracted.lines, extracted.counts)
    pieces, piece_counts = _merged((text[:start], *lines, text[end:]), (None, *counts, None))
    lead: tuple[Part, ...] = ()
    if extracted.lead_parts:
        before_heading, *rest = extracted.lead_parts
        lead = tuple(part for part in (*fixed.parts, wrap[0] + before_heading, *rest) if part)
        if "".join(map(str, lead)) != pieces[0]:  # never expected: the parts are the text's own
            lead = ()
    return Handoff(text, full, summary, record, pieces, piece_counts, lead)


def _line_pieces(text: str, lines: list[str], counts: list[int | None]) -> tuple[list[str], list[int | None]]:
    """``text`` (``lines``, each with its line break) as pieces to count: a run of lines whose
    counts are known is one piece counted by adding them (each follows a line break and its cut
    was proven exact, :func:`line_tokens`); a run of lines rendered uncounted (the newest reply
    before a manual switch, or a process that started in this window) is one piece to tokenise."""
    chars = [0, *accumulate(map(len, lines))]  # line i starts at chars[i] + i (a break after each)
    ends = [at + i for i, at in enumerate(chars)]
    pieces: list[str] = []
    totals: list[int | None] = []
    at, end = 0, len(lines)
    while at < end:
        try:
            cold = counts.index(None, at)  # found in C: most lines were counted at step ends
        except ValueError:
            cold = end
        if cold > at:
            pieces.append(text[ends[at] : ends[cold]])
            totals.append(sum(cast("list[int]", counts[at:cold])))
        at = cold
        while at < end and counts[at] is None:
            at += 1
        if at > cold:
            pieces.append(text[ends[cold] : ends[at]])
            totals.append(None)
    return pieces, totals


def _merged(pieces: tuple[str, ...], counts: tuple[int | None, ...]) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """Neighbouring pieces of unknown count joined: each is tokenised once, with its neighbour."""
    out: list[str] = []
    known: list[int | None] = []
    for piece, tokens in zip(pieces, counts, strict=True):
        if tokens is None and known and known[-1] is None:
            out[-1] += piece
        else:
            out.append(piece)
            known.append(tokens)
    return tuple(out), tuple(known)


def _lead_counts(meter: Any, lead: tuple[Part, ...]) -> tuple[list[str], list[int | None]]:
    """The texts of ``lead``'s parts and the count of each that is known without tokenising it."""
    texts: list[str] = []
    counts: list[int | None] = []
    for part in lead:
        if isinstance(part, Numbered):
            texts.append(str(part))
            counts.append(meter.count_numbered(part.prefix, part.number, part.suffix))
        else:
            texts.append(part)
            counts.append(fixed_count(meter, part))
    return texts, counts


def handoff_tokens(ctx: Context, handoff: Handoff) -> int:
    """Exactly ``ctx.meter.count_message(handoff.message())``, tokenising only the pieces whose
    count the handoff does not hold (the snapshot, the notes, the frame: ~1-2 KB of a 16 KB
    handoff), with the meter's ``count_joined`` (which takes a known count only across a cut its
    ``joins_exactly`` proves exact, and counts the rest together).

    The activity lines' piece is their counts added: each line's count is of the line and its line
    break, taken when the meter proved the cut before the line exact (:func:`line_tokens`), and
    each line follows the previous one's line break (or the heading's); the piece after them starts
    with ``</extractive_handoff>``.

    The first piece (before the lines) is counted from its parts (:attr:`Handoff.lead`): the fixed
    texts once per process (:func:`fixed_count`), the numbers between fixed texts from their
    digits (:class:`Numbered`), the rest tokenised, neighbours of unknown count together."""
    meter = ctx.meter
    if handoff.pieces:
        pieces, counts = handoff.pieces, handoff.piece_counts
        if handoff.lead and counts[0] is None:
            texts, known = _lead_counts(meter, handoff.lead)
            pieces, counts = _merged((*texts, *pieces[1:]), (*known, *counts[1:]))
        text_tokens = meter.count_joined(pieces, counts)
    else:
        text_tokens = meter.count_text(handoff.text)
    # a user message of one text block: the meter's per-message overhead plus its text
    return meter.count_message(Message.user("")) + text_tokens

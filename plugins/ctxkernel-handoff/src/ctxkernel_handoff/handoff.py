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

import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import orjson

from ctxkernel import SUMMARY_SECTIONS, Message, Summary, get_logger
from ctxkernel.recall.history import History
from ctxkernel.recall.notes import Note, render_note
from ctxkernel.redact import redact
from ctxkernel.text import PATH_KEYS, attr, clip, first_line, guard, keep_newest, string_arguments, tag

from .clip import clip_with_receipt
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
FRAMES = ("note", "window_handoff", "instruction", "generated_handoff", "extractive_handoff")


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
    except Exception as exc:  # noqa: BLE001 - any failure falls back to extractive, never blocks the switch
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
def _clip(text: str, limit: int) -> str:
    return clip(text, limit)


def _one_line(text: str, limit: int) -> str:
    return clip(text, limit, single_line=True)


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
_ACTIVITY_HEAD = "Activity so far, oldest first (read any item in full with history_read_item):"
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
    return f"Goal (goal = item_{goal.seq}): {_clip(history.goal_text() or '', goal_chars)}"


def quote_parts(history: History, seqs: list[int], instruction_chars: int) -> list[str]:
    """The quoted instructions ``seqs`` as parts of the snapshot: each block with the line break
    after it, the last without (the snapshot ends there; the handoff adds its section break)."""
    blocks = [quoted_instruction(history, seq, instruction_chars) for seq in seqs]
    return [block + "\n" for block in blocks[:-1]] + blocks[-1:]


def render_snapshot(history: History, *, new_window: int, reason: str, budget: int = 16_000) -> str:
    """Window index, goal, open todos and the last four user instructions (bounded).

    At the seed's budgets (8,000 characters and up) the caps are the seed's; a handoff squeezed by
    a small window (the switch never lets it take more than a quarter of the window) scales them
    down so the body keeps room.
    """
    return "".join(map(str, snapshot_parts(history, new_window=new_window, reason=reason, budget=budget)))


def snapshot_parts(history: History, *, new_window: int, reason: str, budget: int = 16_000) -> list[Part]:
    """:func:`render_snapshot`'s text as parts cut where a count may be added (before a space
    that follows a character, after a line break): the fixed texts, the numbers between fixed
    texts (:class:`Numbered`) and each quoted instruction apart, so a switch tokenises only what
    no step counted (:func:`handoff_tokens`)."""
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
            line = f"- [{entry.status}] {entry.ref}: {_one_line(entry.text, 160)}"
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


# -- the extractive body -------------------------------------------------------------------------------
_FILES = "Files touched: "
_CARRIED = "Carried from an earlier generated handoff"
_PREVIOUS = re.compile(r"<(generated|extractive)_handoff>\n?(.*?)\n?</\1_handoff>", re.DOTALL)


@dataclass(frozen=True, slots=True, eq=False)  # compared by identity: a switch looks for None among hundreds
class Excerpt:
    """What one surface node contributes to an extractive body: its activity lines, the files it
    names, and for an earlier handoff the block it carries. A node's excerpt never changes (a
    replacement is a new node), so it is rendered once (:class:`Excerpts`)."""

    entries: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    #: True for a tool call's files (each moves to the end: the newest are listed); False for an
    #: earlier handoff's list, merged where it stands
    moves: bool = True
    carried: str | None = None  # replaces what an older handoff carried
    #: per entry, the exact token count of the entry and its line break as the body holds it (see
    #: :func:`line_tokens`); None for an entry rendered without a meter
    tokens: tuple[int | None, ...] = ()


def excerpt(history: History, node: Node) -> Excerpt:
    """The :class:`Excerpt` of one surface node (guarded: it cannot open or close a frame)."""
    message = node.message
    item = f"item_{node.seq}"
    if message.role == "user":
        if message.source.kind != "plugin":
            return Excerpt((guard(f"- {item} user: {_one_line(message.text, 300)}", *FRAMES),))
        found = _PREVIOUS.search(message.text)
        if message.source.form == "handoff" and found:
            if found.group(1) != "extractive":
                return Excerpt(carried=guard(f"{_CARRIED} ({item}): " + _one_line(found.group(2), 4_000), *FRAMES))
            entries: list[str] = []
            files: dict[str, None] = {}
            carried = None
            for line in found.group(2).splitlines():
                if line.startswith(_FILES):
                    files.update(dict.fromkeys(f.strip() for f in line[len(_FILES) :].split(", ") if f.strip()))
                elif line.startswith("- item_"):
                    entries.append(guard(line, *FRAMES))
                elif line.startswith(_CARRIED):
                    carried = guard(line, *FRAMES)
            return Excerpt(tuple(entries), tuple(files), False, carried)
        if message.source.form != "handoff":
            return Excerpt((guard(f"- {item} notice: {_one_line(message.text, 200)}", *FRAMES),))
        return Excerpt()
    if message.role == "assistant":
        lines = [f"- {item} assistant: {_one_line(message.text, 300)}"] if message.text.strip() else []
        paths: list[str] = []
        for call in message.tool_calls:
            args = call.arguments if isinstance(call.arguments, dict) else {}
            paths.extend(string_arguments(call, PATH_KEYS))
            rendered = orjson.dumps(args).decode() if args else ""
            lines.append(f"- {item} call {call.name} {_one_line(rendered, 160)}")
        return Excerpt(tuple(guard(line, *FRAMES) for line in lines), tuple(paths))
    result = message.tool_result
    assert result is not None
    name = history.tool_name(result.call_id) or result.name or "tool"
    head = result.content[:2_000]  # the first line is all that is shown (the whole text if it is one line)
    first = first_line(head if "\n" in head.strip() else result.content, "(empty)")
    flag = " ERROR" if result.is_error else ""
    line = f"- {item} result{flag} {name}: {_one_line(first, 160)} ({len(result.content)} chars)"
    return Excerpt((guard(line, *FRAMES),))


class LineMeter(Protocol):
    """What counting an activity line needs of the session's meter."""

    def count_text(self, text: str) -> int: ...

    def joins_exactly(self, left: str, right: str) -> bool: ...


def line_tokens(meter: LineMeter, entry: str) -> int | None:
    """The exact count of ``entry`` and its line break as a piece of a text cut just after the line
    break before it and just after its own (an activity line of the body, whose text is counted by
    adding such pieces): None when the meter cannot prove the cut before it exact."""
    return meter.count_text(entry + "\n") if meter.joins_exactly("\n", entry) else None


#: a node's seq, read in C for every node of a region
_SEQ = attrgetter("seq")
#: files an extractive body lists (the newest)
FILES_LISTED = 20


class Material:
    """The extractive body's material for the first nodes of the surface, in surface order, kept
    as they land (at step ends, :meth:`Excerpts.extend`): their excerpts, and what the body needs
    of all of them, folded as they come (the entries before each position, the positions that name
    a file or carry a block, the files named, moved as the body lists them). A switch's region is
    a run from the surface's start, so its body reads these at its length and walks back only
    over the lines it keeps (:func:`extract`), instead of over every excerpt of the window."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.parts: list[Excerpt] = []
        self.entry_ends: list[int] = []  # entries of parts[: i + 1]
        self.named: list[int] = []  # positions of the parts that name a file
        self.carrying: list[int] = []  # positions of the parts that carry a block
        self.files: dict[str, None] = {}  # every part's files, folded as the body folds them

    def __len__(self) -> int:
        return len(self.parts)

    def add(self, seq: int, part: Excerpt) -> None:
        at = len(self.parts)
        self.seqs.append(seq)
        self.parts.append(part)
        self.entry_ends.append((self.entry_ends[-1] if at else 0) + len(part.entries))
        if part.carried is not None:
            self.carrying.append(at)
        if part.files:
            self.named.append(at)
            _fold_files(self.files, part)

    def files_of(self, length: int) -> list[str]:
        """The files the first ``length`` parts name, as the body lists them (the newest)."""
        named = bisect_left(self.named, length)
        if named == len(self.named):  # no later part names a file: the running fold is theirs
            return list(self.files)[-FILES_LISTED:]
        files: dict[str, None] = {}
        for at in self.named[:named]:  # only the parts naming a file
            _fold_files(files, self.parts[at])
        return list(files)[-FILES_LISTED:]

    def carried_of(self, length: int) -> str | None:
        """The block the newest of the first ``length`` parts that carries one carries."""
        carrying = bisect_left(self.carrying, length)
        return self.parts[self.carrying[carrying - 1]].carried if carrying else None


def _fold_files(files: dict[str, None], part: Excerpt) -> None:
    """Add ``part``'s files to ``files``: a tool call's move to the end (the newest files are
    listed), an earlier handoff's list is merged where it stands."""
    if part.moves:
        for path in part.files:
            files.pop(path, None)
            files[path] = None
    else:
        files.update(dict.fromkeys(part.files))


class Excerpts:
    """The excerpts of surface nodes, by seq, each rendered once: a switch assembles the
    extractive body from them instead of re-rendering its whole window. Bounded by the surface
    (:meth:`prune`, :meth:`keep`); a process that starts cold renders what it lacks at its
    first switch.

    Rendered at a step end (:func:`ctxkernel_handoff.engine.warm_excerpts`), each activity line
    is also counted as the body holds it (:func:`line_tokens`, kept on its excerpt): a switch then
    counts its handoff from those counts (:func:`handoff_tokens`) instead of tokenising the whole
    text, and forgetting a node forgets its counts with it."""

    def __init__(self) -> None:
        self._by_seq: dict[int, Excerpt] = {}
        self.material = Material()
        self.retired: tuple[dict[int, Excerpt], Material] | None = None

    def of(self, history: History, node: Node, meter: LineMeter | None = None) -> Excerpt:
        """The excerpt of ``node``, rendered when this is its first call; with ``meter`` its lines
        are counted as it is rendered."""
        found = self._by_seq.get(node.seq)
        if found is None:
            found = excerpt(history, node)
            if found.entries:
                counted = (line_tokens(meter, entry) if meter is not None else None for entry in found.entries)
                found = Excerpt(found.entries, found.files, found.moves, found.carried, tuple(counted))
            self._by_seq[node.seq] = found
        return found

    def extend(self, nodes: Sequence[Node]) -> None:
        """Add to the :class:`Material` the surface's nodes after the ones it holds, while their
        excerpts are rendered (a step end renders the new nodes first: a few a step). A process
        that started in this window has not rendered its first nodes: its material stays empty
        until its first switch builds it (:meth:`cover`). A surface whose covered nodes changed
        (a result shrunk, a native summary) starts it again."""
        material = self.material
        held = len(material)
        if held and (held > len(nodes) or nodes[held - 1].seq != material.seqs[-1]):
            material = self.material = Material()
            held = 0
        get = self._by_seq.get
        for node in nodes[held:]:
            found = get(node.seq)
            if found is None:
                return
            material.add(node.seq, found)

    def cover(self, history: History, nodes: list[Node]) -> Material:
        """The :class:`Material` holding at least ``nodes`` (a run from the surface's start) as its
        first parts: the nodes it lacks are rendered now (uncounted), and one that holds other
        nodes (the surface changed under it) is built again from ``nodes``."""
        material = self.material
        held = len(material)
        seqs = list(map(_SEQ, nodes))  # in C: a node's excerpt is its seq's
        if (material.seqs[: len(seqs)] if held >= len(seqs) else material.seqs) != seqs[:held]:
            material = self.material = Material()
            held = 0
        for node in nodes[held:]:
            material.add(node.seq, self.of(history, node))
        return material

    def prune(self, visible: Callable[[int], bool]) -> None:
        """Forget the nodes no longer on the surface (replaced by a switch or a shrink)."""
        self._by_seq = {seq: e for seq, e in self._by_seq.items() if visible(seq)}

    def keep(self, nodes: Iterable[Node]) -> None:
        """Forget every node but ``nodes`` (the surface a switch left: O(the kept tail), not O(the
        nodes it replaced))."""
        get = self._by_seq.get
        # what the switch replaced (hundreds of excerpts) is freed at the next step end
        # (:meth:`release`), not inside the commit: moved, not removed
        self.retired = (self._by_seq, self.material)
        self._by_seq = {node.seq: found for node in nodes if (found := get(node.seq)) is not None}
        self.material = Material()  # the next step end adds the surface left (:meth:`extend`)

    def release(self) -> None:
        """Free the excerpts a switch replaced (:meth:`keep` holds them until a step ends)."""
        self.retired = None

    def __len__(self) -> int:
        return len(self._by_seq)


@dataclass(frozen=True)
class Extract:
    """An extractive body: its ``text``, which is ``lead`` (the file list, the carried block, the
    heading and the note of omitted entries) then the activity ``lines`` kept, joined by line
    breaks; ``counts[i]`` is ``lines[i]``'s count with its line break (:func:`line_tokens`), None
    when it was rendered uncounted. A body cut to its budget has no ``lines`` (nothing is counted
    from parts then)."""

    text: str
    lead: str
    lines: list[str] = field(default_factory=list)
    counts: list[int | None] = field(default_factory=list)
    #: ``lead`` cut before its heading and after it (the heading is a fixed text, counted once
    #: per process); empty when the body has no ``lines``
    lead_parts: tuple[str, ...] = ()


def extract(history: History, nodes: list[Node], budget: int, excerpts: Excerpts | None = None) -> Extract:
    """Excerpts of the outgoing region (a run from the surface's start) with item ids, newest kept
    first.

    A previous extractive handoff in the region is merged, not nested: its file list and activity
    lines join this window's, so one chronological list spans the windows and loses its oldest
    lines first. A previous generated handoff is carried as one clipped block.

    Built from the region's :class:`Material` (kept at step ends when ``excerpts`` holds it): the
    file list, the carried block and the number of entries are read at the region's length, and
    only the lines kept are visited, from the newest.
    """
    material = (excerpts if excerpts is not None else Excerpts()).cover(history, nodes)
    length = len(nodes)
    files = material.files_of(length)
    carried = material.carried_of(length)
    parts: list[str] = []
    if files:
        parts.append(guard(_FILES + ", ".join(_clip(f, 120) for f in files), *FRAMES))
    if carried:
        parts.append(_clip(carried, max(0, int((budget - sum(len(p) for p in parts)) * 0.3))))
    fixed = sum(len(p) + 2 for p in parts)
    head = _ACTIVITY_HEAD
    kept, counts = _newest_lines(material.parts[:length], budget - fixed - len(head) - 80)
    start = (material.entry_ends[length - 1] if length else 0) - len(kept)  # given up, oldest first
    lead = [p for p in parts if p]
    lines = [head]
    if start:
        lines.append(f"(… {start} earlier entries omitted: history_list_items lists them)")
    # every piece was guarded on its own (a frame's tag cannot span the line breaks joining them)
    before = ("\n\n".join(lead) + "\n\n" if lead else "") + "\n".join(lines)
    if not kept:
        return Extract(before, before) if len(before) <= budget else Extract(_clip(before, budget), before)
    # the lead's parts: what precedes the heading, the heading, the note of omitted entries
    lead_parts = ("\n\n".join(lead) + "\n\n" if lead else "", head + "\n", "\n".join(lines[1:]) + "\n" if start else "")
    body = Extract(before + "\n" + "\n".join(kept), before + "\n", kept, counts, lead_parts)
    return body if len(body.text) <= budget else Extract(_clip(body.text, budget), body.lead)


def _newest_lines(parts: list[Excerpt], room: int) -> tuple[list[str], list[int | None]]:
    """The newest activity lines of ``parts`` that fit in ``room`` characters (each with its line
    break), in their order, and their counts (:func:`line_tokens`): the newest parts whose lines
    reach ``room`` are gathered, and :func:`ctxkernel.text.keep_newest` cuts their lines (an older
    line cannot fit where a newer one did not)."""
    gathered: list[Excerpt] = []  # the newest parts with lines, newest first
    size = 0
    for part in reversed(parts):
        if part.entries:
            gathered.append(part)
            size += sum(map(len, part.entries)) + len(part.entries)
            if size > room:
                break
    lines: list[str] = []
    counts: list[int | None] = []
    for part in reversed(gathered):
        lines += part.entries
        counts += part.tokens
    kept = keep_newest(lines, room)
    return kept, counts[len(lines) - len(kept) :]


def extractive_body(history: History, nodes: list[Node], budget: int, excerpts: Excerpts | None = None) -> str:
    """The text of :func:`extract`."""
    return extract(history, nodes, budget, excerpts).text


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

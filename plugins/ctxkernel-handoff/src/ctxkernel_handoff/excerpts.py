"""The extractive body of a handoff: an excerpt of each surface node of the outgoing window (its
activity lines, the files it touched, a generated handoff it carries), rendered at step ends and
kept (:class:`Excerpts`), and the body built from them within its budget (:func:`extract`).

A previous extractive handoff in the region is merged, not nested; a previous generated one is
carried as one clipped block. Every excerpt is guarded against the handoff's own frame tags.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

import orjson

from ctxkernel.recall.history import History
from ctxkernel.text import KERNEL_FRAMES, PATH_KEYS, clip, first_line, guard, keep_newest, string_arguments

if TYPE_CHECKING:
    from ctxkernel import Node

#: the handoff's own frame tags, and the kernel's that share its message (the user's pinned
#: instructions, the work ledger): every text a handoff quotes is guarded against them
FRAMES = ("note", "window_handoff", "instruction", "generated_handoff", "extractive_handoff", *KERNEL_FRAMES)
_ACTIVITY_HEAD = "Activity so far, oldest first (read any item in full with history_read_item):"


def _clip(text: str, limit: int) -> str:
    return clip(text, limit)


def _one_line(text: str, limit: int) -> str:
    return clip(text, limit, single_line=True)


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

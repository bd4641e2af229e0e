"""Session-private notes, stored in the session's own log.

A note is a small named text (``path``, e.g. ``goal`` or ``plan/step-2``) with a stable id, the
window it was written in, created/updated times and a trust mark saying who its text came from:

* ``model-authored`` — the model wrote it with a notes tool;
* ``user-injected`` — the user (or the integrator on the user's behalf) put it there;
* ``tool-output`` — it holds text that came out of a tool. Such text must never pass as the
  model's or the user's own words, so the mark is shown wherever a note is injected
  (:func:`render_note`), and appending less-trusted text downgrades a note's mark.

Storage: every change is an ignorable plugin event in the session log, ``notes/write`` or
``notes/delete``, or is committed with a compaction: writes staged with :meth:`Notes.staged` ride
in the transaction's ``compaction/summary`` event (:data:`COMMITTED_WRITES`), so they land in its
one durable batch exactly when its replacement does, and a refused or failed compaction writes
none of them. State is rebuilt by replaying the log (a cursor over ``session.events``), so a
restart, a second process or a shared store backend all see the same notes, and a refused write
leaves no trace (it is validated before its one event is appended). Nothing is overwritten:
``write``/``update``/``append`` add a version, ``delete`` archives, and every earlier version
stays retrievable with :meth:`Notes.versions`.

Limits (per session, configurable): active note count, total active bytes and bytes per note.
A write over a limit is refused with an error naming the limit and the fix; nothing is evicted.
Listing and search are paged and bounded so a lookup cannot flood the context window.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..events import COMPACTION_SUMMARY, random_hex
from ..logging import get_logger
from ..snapshot import folded_cursor
from ..text import ELLIPSIS, safe_cut

# the values and rules of one note (note_rules.py); their names are kept here for callers
from .note_rules import (
    MAX_PAGE,
    MAX_PATH_CHARS,
    PATH_ALPHABET,
    TRUST_MARKS,
    Note,
    NoteNotFoundError,
    NotePathError,
    NotesError,
    NotesLimitError,
    NotesLimits,
    NotesPage,
    SearchHit,
    SearchResult,
    Trust,
    check_path,
    check_trust,
    render_note,
    utf8_size,
    weaker_trust,
)

if TYPE_CHECKING:
    from ..events import Event
    from ..session import Session

NAMESPACE = "notes"
WRITE = f"{NAMESPACE}/write"
DELETE = f"{NAMESPACE}/delete"
STATE_KEY = "recall.notes"
#: the key of a ``compaction/summary`` event's data holding the note writes committed with it
#: (:meth:`Notes.staged`); each entry has the shape of a ``notes/write`` event's data
COMMITTED_WRITES = "note_writes"
#: the format of :meth:`Notes.folded` in session snapshots (bump it when that shape changes)
FOLDED_VERSION = 1

log = get_logger("ctxkernel.recall")


@dataclass
class _State:
    cursor: int = 0
    active: dict[str, str] = field(default_factory=dict)  # path -> id
    notes: dict[str, Note] = field(default_factory=dict)  # id -> latest (active or archived)
    history: dict[str, list[int]] = field(default_factory=dict)  # id -> seqs of its events
    total_bytes: int = 0


class Notes:
    """The notes of one session. Get it with :meth:`Notes.for_session`."""

    def __init__(self, session: Session, limits: NotesLimits | None = None) -> None:
        self.session = session
        self.limits = limits or NotesLimits()
        #: window id used when a write names none (a windowed strategy keeps it current)
        self.current_window: str | None = None
        self._state = _State()

    @classmethod
    def for_session(cls, session: Session, limits: NotesLimits | None = None) -> Notes:
        """The session's notes object (one per session object, shared by every strategy)."""
        notes = session.state.get(STATE_KEY)
        if not isinstance(notes, Notes):
            notes = cls(session, limits)
            folded = session.snapshot_indexes.pop(STATE_KEY, None)
            if folded is not None:
                notes._restore(folded)
            session.state[STATE_KEY] = notes
        elif limits is not None:
            notes.limits = limits
        notes.sync()
        return notes

    # -- session snapshots --------------------------------------------------------------------------
    def folded(self) -> dict[str, Any]:
        """The folded notes as plain JSON, for a session snapshot (bounded by the notes, not by
        the log: every note's latest version and the seqs of its events), folded to the end of the
        log first."""
        self.sync()
        state = self._state
        return {
            "version": FOLDED_VERSION,
            "cursor": state.cursor,
            "notes": [asdict(note) for note in state.notes.values()],
            "active": list(state.active.items()),  # in the fold's order, which listings keep
            "history": state.history,
            "total_bytes": state.total_bytes,
        }

    def _restore(self, data: Any) -> None:
        """Start from :meth:`folded` output; anything malformed is set aside with a warning (the
        notes are then folded from the first event, as without a snapshot)."""
        try:
            cursor = folded_cursor(data, FOLDED_VERSION, len(self.session.events))
            notes = {}
            for raw in data["notes"]:
                note = Note(**{**raw, "windows": tuple(raw["windows"])})
                if not all(isinstance(v, str) for v in (note.id, note.path, note.content)):
                    msg = "a note's id, path and content must be strings"
                    raise ValueError(msg)
                notes[note.id] = note
            history = {str(k): [int(seq) for seq in v] for k, v in data["history"].items()}
            active = {str(path): str(note_id) for path, note_id in data["active"]}
            total = data["total_bytes"]
            if not set(active.values()) <= set(notes) or type(total) is not int:
                msg = "an active path names a note the snapshot does not hold, or total_bytes is not an integer"
                raise ValueError(msg)
        except Exception as exc:  # a malformed part costs a full fold, never the open
            log.warning(
                "notes snapshot set aside; folding the whole log",
                session=self.session.id,
                reason=f"{type(exc).__name__}: {exc}"[:300],
            )
            return
        self._state = _State(cursor=cursor, active=active, notes=notes, history=history, total_bytes=total)

    # -- replay -----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Fold the log events not seen yet (O(new events))."""
        events = self.session.events
        state = self._state
        while state.cursor < len(events):
            event = events[state.cursor]
            state.cursor += 1
            if event.type == WRITE or event.type == DELETE:
                self._fold(event, event.data)
            elif event.type == COMPACTION_SUMMARY:
                folded: set[Any] = set()
                for entry in _committed(event):
                    if entry.get("id") not in folded:  # one version per note and event (see versions)
                        folded.add(entry.get("id"))
                        self._fold(event, entry)

    def _fold(self, event: Event, d: dict[str, Any]) -> None:
        state = self._state
        note_id = d.get("id")
        if not isinstance(note_id, str):
            return  # not ours to interpret; replay never fails on a foreign event
        previous = state.notes.get(note_id)
        if event.type == DELETE:
            if previous is None or previous.archived:
                return
            state.active.pop(previous.path, None)
            state.total_bytes -= previous.size
            state.notes[note_id] = replace(previous, archived=True, updated=event.time, updated_seq=event.seq)
            state.history.setdefault(note_id, []).append(event.seq)
            return
        note = _apply_write(previous, d, event.seq, event.time)
        if previous is not None and not previous.archived:
            state.total_bytes -= previous.size
        state.notes[note_id] = note
        state.active[note.path] = note_id
        state.total_bytes += note.size
        state.history.setdefault(note_id, []).append(event.seq)

    def _refresh(self) -> None:
        self.session.refresh()
        self.sync()

    # -- reading ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        self._refresh()
        return len(self._state.active)

    @property
    def total_bytes(self) -> int:
        self._refresh()
        return self._state.total_bytes

    def read(self, path: str) -> Note:
        self._refresh()
        note_id = self._state.active.get(check_path(path))
        if note_id is None:
            msg = f"no note at path {path!r}; {self._known_paths_hint()}"
            raise NoteNotFoundError(msg)
        return self._state.notes[note_id]

    def exists(self, path: str) -> bool:
        self._refresh()
        return check_path(path) in self._state.active

    def get(self, note_id: str) -> Note:
        """A note by id, archived ones included (``note.archived`` says which)."""
        self._refresh()
        note = self._state.notes.get(note_id)
        if note is None:
            msg = f"no note with id {note_id!r}; {self._known_paths_hint()}"
            raise NoteNotFoundError(msg)
        return note

    def active(self) -> list[Note]:
        """Every active note, oldest update first."""
        self._refresh()
        notes = [self._state.notes[i] for i in self._state.active.values()]
        return sorted(notes, key=lambda n: n.updated_seq)

    def versions(self, note_id: str) -> list[Note]:
        """Every version of a note, oldest first (the last one is current or archived)."""
        self.get(note_id)
        out: list[Note] = []
        current: Note | None = None
        by_seq = self.session.events
        for seq in self._state.history[note_id]:
            event = by_seq[seq]
            if event.type == DELETE:
                assert current is not None
                current = replace(current, archived=True, updated=event.time, updated_seq=event.seq)
            elif event.type == COMPACTION_SUMMARY:
                entry = next(e for e in _committed(event) if e.get("id") == note_id)
                current = _apply_write(current, entry, event.seq, event.time)
            else:
                current = _apply_write(current, event.data, event.seq, event.time)
            out.append(current)
        return out

    def list(self, prefix: str = "", *, limit: int = 50, cursor: str | None = None) -> NotesPage:
        """Active notes whose path starts with ``prefix``, sorted by path, one page at a time.

        ``cursor`` is the ``next_cursor`` of the previous page.
        """
        self._refresh()
        if not 1 <= limit <= MAX_PAGE:
            msg = f"list limit must be between 1 and {MAX_PAGE}, got {limit}"
            raise NotesError(msg)
        paths = sorted(p for p in self._state.active if p.startswith(prefix))
        if cursor:
            paths = [p for p in paths if p > cursor]
        page = paths[:limit]
        total = len(paths)
        next_cursor = page[-1] if total > limit else None
        return NotesPage([self._state.notes[self._state.active[p]] for p in page], next_cursor, total)

    def search(
        self,
        query: str,
        *,
        prefix: str = "",
        case_sensitive: bool = True,
        max_files: int = 20,
        max_lines_per_file: int = 10,
        max_line_chars: int = 300,
    ) -> SearchResult:
        """Lines of active notes containing ``query`` (a plain substring), bounded three ways."""
        self._refresh()
        if not query:
            msg = "search query must be a non-empty string"
            raise NotesError(msg)
        for name, value, top in (
            ("max_files", max_files, MAX_PAGE),
            ("max_lines_per_file", max_lines_per_file, 1000),
            ("max_line_chars", max_line_chars, 10_000),
        ):
            if not 1 <= value <= top:
                msg = f"search {name} must be between 1 and {top}, got {value}"
                raise NotesError(msg)
        needle = query if case_sensitive else query.lower()
        hits: list[SearchHit] = []
        files = 0
        truncated = False
        for path in sorted(self._state.active):
            if not path.startswith(prefix):
                continue
            note = self._state.notes[self._state.active[path]]
            matched = 0
            for number, line in enumerate(note.content.splitlines(), 1):
                if needle in (line if case_sensitive else line.lower()):
                    if matched == 0:
                        if files == max_files:
                            return SearchResult(hits, files, True)
                        files += 1
                    if matched == max_lines_per_file:
                        truncated = True
                        break
                    matched += 1
                    # the line's first max_line_chars characters (whole graphemes), then "…"
                    text = line if len(line) <= max_line_chars else line[: safe_cut(line, max_line_chars)] + ELLIPSIS
                    hits.append(SearchHit(note.id, path, note.trust, number, text))
        return SearchResult(hits, files, truncated)

    # -- writing ----------------------------------------------------------------------------------
    def write(
        self, path: str, content: str, *, trust: str = "model-authored", window: str | None = None, strategy: str = ""
    ) -> Note:
        """Create the note at ``path``, or add a version replacing its content (the old one stays
        retrievable with :meth:`versions`)."""
        self._refresh()
        path = check_path(path)
        check_trust(trust)
        current = self._current(path)
        op = "update" if current else "create"
        return self._commit(op, current, path, content, trust, window, strategy)

    def create(
        self, path: str, content: str, *, trust: str = "model-authored", window: str | None = None, strategy: str = ""
    ) -> Note:
        """Like :meth:`write`, but refuse when a note already exists at ``path``."""
        self._refresh()
        if self._current(check_path(path)) is not None:
            msg = f"a note already exists at {path!r}; update it, append to it, or choose another path"
            raise NotesError(msg)
        return self.write(path, content, trust=trust, window=window, strategy=strategy)

    def update(
        self,
        note_id: str,
        content: str,
        *,
        trust: str = "model-authored",
        window: str | None = None,
        strategy: str = "",
    ) -> Note:
        """Replace an active note's content by id (a new version; the old one stays retrievable)."""
        note = self.get(note_id)
        if note.archived:
            msg = f"note {note_id} ({note.path!r}) is archived; write a new note instead"
            raise NotesError(msg)
        check_trust(trust)
        return self._commit("update", note, note.path, content, trust, window, strategy)

    def append(
        self, path: str, text: str, *, trust: str = "model-authored", window: str | None = None, strategy: str = ""
    ) -> Note:
        """Append ``text`` to the note at ``path`` (created when missing)."""
        self._refresh()
        path = check_path(path)
        check_trust(trust)
        current = self._current(path)
        if current is None:
            return self._commit("create", None, path, text, trust, window, strategy)
        return self._commit("append", current, path, text, trust, window, strategy)

    def delete(self, path_or_id: str, *, window: str | None = None, strategy: str = "") -> Note:
        """Archive a note (by path or id). It leaves the active set; its versions stay readable."""
        self._refresh()
        note_id = self._state.active.get(path_or_id) or path_or_id
        note = self._state.notes.get(note_id)
        if note is None or note.archived:
            msg = f"no active note {path_or_id!r}; {self._known_paths_hint()}"
            raise NoteNotFoundError(msg)
        data = {"id": note.id, "path": note.path, "window": window or self.current_window, "by": strategy}
        self.session.emit(NAMESPACE, "delete", data)
        self.sync()
        return self._state.notes[note.id]

    def staged(self, *, strategy: str = "") -> StagedNotes:
        """Note writes to commit with a compaction transaction instead of appending them now (see
        :class:`StagedNotes`)."""
        self._refresh()
        return StagedNotes(self, strategy)

    # -- internals ----------------------------------------------------------------------------------
    def _current(self, path: str) -> Note | None:
        note_id = self._state.active.get(path)
        return None if note_id is None else self._state.notes[note_id]

    def _commit(
        self, op: str, current: Note | None, path: str, text: str, trust: str, window: str | None, strategy: str
    ) -> Note:
        data, _ = self._write_data(op, current, path, text, trust, window, strategy)
        self.session.emit(NAMESPACE, "write", data)  # one event: written whole or not at all
        self.sync()
        return self._state.notes[str(data["id"])]

    def _write_data(
        self,
        op: str,
        current: Note | None,
        path: str,
        text: str,
        trust: str,
        window: str | None,
        strategy: str,
        *,
        files: int | None = None,
        total_bytes: int | None = None,
    ) -> tuple[dict[str, Any], int]:
        """A write's event data, checked against the limits (``files`` and ``total_bytes``: the
        active notes as they will be when it lands; by default as they are), and the note's size
        in bytes after it. Each text is sized once: an append adds its text's bytes to the note's
        instead of joining and encoding the whole note."""
        if not isinstance(text, str):
            msg = f"note content must be a string, got {type(text).__name__}"
            raise NotesError(msg)
        size = utf8_size(text) + (current.size if (op == "append" and current) else 0)
        self._check_limits(current, path, size, files=files, total_bytes=total_bytes)
        data = {
            "id": current.id if current else "n_" + random_hex(16),
            "path": path,
            "op": op,
            "trust": trust,
            "window": window or self.current_window,
            "by": strategy,
        }
        data["text" if op == "append" else "content"] = text
        return data, size

    def _check_limits(
        self, current: Note | None, path: str, size: int, *, files: int | None = None, total_bytes: int | None = None
    ) -> None:
        """Refuse a write that leaves the note at ``path`` ``size`` bytes long if it breaks a limit."""
        limits = self.limits
        files = len(self._state.active) if files is None else files
        total_bytes = self._state.total_bytes if total_bytes is None else total_bytes
        if size > limits.max_note_bytes:
            msg = (
                f"note {path!r} would be {size} bytes; the limit is {limits.max_note_bytes} bytes per note. "
                "Nothing was written: keep notes short, or split the text over several notes"
            )
            raise NotesLimitError(msg)
        if current is None and files >= limits.max_files:
            msg = (
                f"the session already has {files} notes, the limit is {limits.max_files}. "
                "Nothing was written: delete (archive) or merge notes first"
            )
            raise NotesLimitError(msg)
        total = total_bytes - (current.size if current else 0) + size
        if total > limits.max_session_bytes:
            msg = (
                f"the session's notes would hold {total} bytes; the limit is {limits.max_session_bytes}. "
                "Nothing was written: delete (archive) or shorten notes first"
            )
            raise NotesLimitError(msg)

    def _known_paths_hint(self) -> str:
        paths = sorted(self._state.active)
        if not paths:
            return "there are no notes"
        shown = ", ".join(repr(p) for p in paths[:10])
        more = f" and {len(paths) - 10} more" if len(paths) > 10 else ""
        return f"notes: {shown}{more}"


class StagedNotes:
    """Note writes staged to commit with a compaction transaction, in its one durable batch: pass
    :attr:`data` in the transaction's ``data`` (it lands in the ``compaction/summary`` event, under
    :data:`COMMITTED_WRITES`), and the notes fold the writes from there, as if each had been a
    ``notes/write`` event at that seq.

    Each write is checked when it is staged, as :meth:`Notes.write` and :meth:`Notes.append`
    would check it (path, trust mark, limits, counting the writes staged before it), and refused
    with the same errors; nothing is written until the transaction commits, and a refused or failed
    transaction writes none of them. One write per path: combine the texts first.
    """

    def __init__(self, notes: Notes, strategy: str) -> None:
        self._notes = notes
        self._strategy = strategy
        self._entries: list[dict[str, Any]] = []
        self._files = len(notes._state.active)
        self._bytes = notes._state.total_bytes

    def write(self, path: str, content: str, *, trust: str = "model-authored", window: str | None = None) -> None:
        """Stage replacing the note at ``path`` (created when missing)."""
        self._stage(path, content, trust, window, append=False)

    def append(self, path: str, text: str, *, trust: str = "model-authored", window: str | None = None) -> None:
        """Stage appending ``text`` to the note at ``path`` (created when missing)."""
        self._stage(path, text, trust, window, append=True)

    @property
    def data(self) -> dict[str, Any]:
        """What to merge into the transaction's ``data`` (empty when nothing is staged)."""
        return {COMMITTED_WRITES: [dict(e) for e in self._entries]} if self._entries else {}

    def __len__(self) -> int:
        return len(self._entries)

    def _stage(self, path: str, text: str, trust: str, window: str | None, *, append: bool) -> None:
        notes = self._notes
        path = check_path(path)
        check_trust(trust)
        if any(e["path"] == path for e in self._entries):
            msg = f"note {path!r} is already staged in this batch; stage one write per note (combine the texts)"
            raise NotesError(msg)
        current = notes._current(path)
        op = "create" if current is None else ("append" if append else "update")
        data, size = notes._write_data(
            op, current, path, text, trust, window, self._strategy, files=self._files, total_bytes=self._bytes
        )
        self._files += current is None
        self._bytes += size - (current.size if current else 0)
        self._entries.append(data)


def _committed(event: Event) -> list[dict[str, Any]]:
    """The note writes a ``compaction/summary`` event committed (malformed entries skipped)."""
    entries = event.data.get(COMMITTED_WRITES)
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _apply_write(previous: Note | None, d: dict[str, Any], seq: int, time: str) -> Note:
    raw_trust = d.get("trust")
    trust: str = raw_trust if isinstance(raw_trust, str) and raw_trust in TRUST_MARKS else "tool-output"
    window = d.get("window")
    if previous is None or previous.archived:
        content = d.get("content", d.get("text", ""))
        return Note(
            id=d["id"],
            path=d.get("path", ""),
            content=content if isinstance(content, str) else "",
            trust=trust,
            window=window,
            created=time,
            updated=time,
            version=1,
            created_seq=seq,
            updated_seq=seq,
            windows=(window,) if window else (),
        )
    if d.get("op") == "append":
        content = previous.content + str(d.get("text", ""))
        trust = weaker_trust(previous.trust, trust)
    else:
        content = str(d.get("content", ""))
    windows = previous.windows if (not window or window in previous.windows) else (*previous.windows, window)
    return replace(
        previous,
        path=d.get("path", previous.path),
        content=content,
        trust=trust,
        window=window or previous.window,
        updated=time,
        version=previous.version + 1,
        updated_seq=seq,
        windows=windows,
    )


__all__ = [
    "COMMITTED_WRITES",
    "DELETE",
    "MAX_PAGE",
    "MAX_PATH_CHARS",
    "PATH_ALPHABET",
    "STATE_KEY",
    "TRUST_MARKS",
    "WRITE",
    "Trust",
    "check_trust",
    "utf8_size",
    "Note",
    "NoteNotFoundError",
    "NotePathError",
    "Notes",
    "NotesError",
    "NotesLimitError",
    "NotesLimits",
    "NotesPage",
    "SearchHit",
    "SearchResult",
    "StagedNotes",
    "check_path",
    "render_note",
    "weaker_trust",
]

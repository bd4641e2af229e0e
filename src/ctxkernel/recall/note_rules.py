"""What a note is: its values (:class:`Note`, its pages and search hits), the rules a path and a
trust mark follow, the limits a session's notes keep, and how a note is rendered for the model.
:mod:`ctxkernel.recall.notes` keeps a session's notes in its log by these rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import CtxKernelError
from ..text import attr, guard

Trust = Literal["model-authored", "user-injected", "tool-output"]
TRUST_MARKS: tuple[str, ...] = ("model-authored", "user-injected", "tool-output")
# Appending text of a lower rank downgrades the note's mark: a note holding any tool output is
# marked tool-output, so injected text can never borrow the authority of the model or the user.
_TRUST_RANK = {"tool-output": 0, "model-authored": 1, "user-injected": 2}

MAX_PATH_CHARS = 256
#: what a path component may hold: letters and digits (any script), ``.``, ``_`` and ``-``.
#: Paths are rendered into ``<note path="...">`` headers and model-chosen, so nothing with a
#: meaning in markup (quotes, ``<``, ``>``, ``&``, ``=``), no space and no control character.
PATH_ALPHABET = "letters, digits, '.', '_' and '-', in '/'-separated names"
MAX_PAGE = 200


class NotesError(CtxKernelError):
    """A notes operation was refused; nothing was written."""


class NotePathError(NotesError):
    """A note path is not acceptable."""


class NotesLimitError(NotesError):
    """A write would exceed a notes limit; nothing was evicted or written."""


class NoteNotFoundError(NotesError):
    """No note with that path or id."""


@dataclass(frozen=True)
class NotesLimits:
    """Per-session bounds. Over-limit writes are refused, never evicted."""

    max_files: int = 64
    max_session_bytes: int = 4_000_000
    max_note_bytes: int = 1_000_000


def utf8_size(text: str) -> int:
    """``len(text.encode())``, without encoding an ASCII text (``str.isascii`` reads a flag CPython
    keeps on every string, so most notes are sized in constant time)."""
    return len(text) if text.isascii() else len(text.encode())


@dataclass(frozen=True)
class Note:
    """One note as of its latest version (or of an earlier one from :meth:`Notes.versions`)."""

    id: str
    path: str
    content: str
    trust: str
    window: str | None
    created: str
    updated: str
    version: int
    created_seq: int
    updated_seq: int
    archived: bool = False
    #: windows that changed this note, oldest first (the first is where it was created)
    windows: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return utf8_size(self.content)

    @property
    def created_window(self) -> str | None:
        """The window the note was first written in."""
        return self.windows[0] if self.windows else self.window

    def to_dict(self, *, content: bool = True) -> dict[str, Any]:
        out = {
            "id": self.id,
            "path": self.path,
            "trust": self.trust,
            "window": self.window,
            "created_window": self.created_window,
            "created": self.created,
            "updated": self.updated,
            "version": self.version,
            "bytes": self.size,
            "archived": self.archived,
        }
        if content:
            out["content"] = self.content
        return out


@dataclass(frozen=True)
class NotesPage:
    items: list[Note]
    next_cursor: str | None
    total: int


@dataclass(frozen=True)
class SearchHit:
    id: str
    path: str
    trust: str
    line: int  # 1-based
    text: str


@dataclass(frozen=True)
class SearchResult:
    hits: list[SearchHit]
    files_matched: int
    truncated: bool  # more matches exist than the bounds let through


def check_path(path: Any) -> str:
    """Validate a note path: ``/``-separated names, no empty, ``.`` or ``..`` component."""
    if not isinstance(path, str) or not path:
        msg = f"a note path must be a non-empty string, got {path!r:.80}"
        raise NotePathError(msg)
    if len(path) > MAX_PATH_CHARS:
        msg = f"note path is {len(path)} characters; at most {MAX_PATH_CHARS} are accepted"
        raise NotePathError(msg)
    if path.startswith("/") or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        msg = f"note path {path!r} is absolute; use a relative name such as 'goal' or 'plan/next'"
        raise NotePathError(msg)
    if any(ord(c) < 32 or c == "\\" for c in path):
        msg = f"note path {path!r:.80} contains a control character or backslash; use '/' to separate names"
        raise NotePathError(msg)
    bad = sorted({c for c in path if not (c.isalnum() or c in "._-/")})
    if bad:
        shown = "".join(bad[:10])
        msg = (
            f"note path {path!r:.80} contains {shown!r}; a note path holds only {PATH_ALPHABET}, e.g. 'plan/step-2.md'"
        )
        raise NotePathError(msg)
    for part in path.split("/"):
        if part in ("", ".", ".."):
            msg = f"note path {path!r} has an empty, '.' or '..' component; use '/'-separated names such as 'plan/next'"
            raise NotePathError(msg)
    return path


def check_trust(trust: Any) -> str:
    if not isinstance(trust, str) or trust not in TRUST_MARKS:
        msg = f"trust mark must be one of {list(TRUST_MARKS)}, got {trust!r}"
        raise NotesError(msg)
    return trust


def weaker_trust(a: str, b: str) -> str:
    return a if _TRUST_RANK[a] <= _TRUST_RANK[b] else b


def render_note(note: Note, *, max_chars: int | None = None) -> str:
    """The note as injected into the model's context, trust mark first."""
    content = note.content
    if max_chars is not None and len(content) > max_chars:
        content = (
            content[:max_chars] + f"\n[… {len(note.content) - max_chars} more characters; read the note to see them]"
        )
    # every attribute escaped: a path or window id written before paths were restricted (or by
    # another writer) cannot end its attribute and add a forged trust mark
    head = (
        f'<note path="{attr(note.path)}" id="{attr(note.id)}" trust="{attr(note.trust)}" '
        f'window="{attr(note.window or "-")}" updated="{attr(note.updated)}" version="{attr(note.version)}">'
    )
    # the text cannot close its own block or open a fake one with a better trust mark
    return f"{head}\n{guard(content, 'note')}\n</note>"


__all__ = [
    "MAX_PAGE",
    "MAX_PATH_CHARS",
    "PATH_ALPHABET",
    "TRUST_MARKS",
    "Note",
    "NoteNotFoundError",
    "NotePathError",
    "NotesError",
    "NotesLimitError",
    "NotesLimits",
    "NotesPage",
    "SearchHit",
    "SearchResult",
    "Trust",
    "check_path",
    "check_trust",
    "render_note",
    "utf8_size",
    "weaker_trust",
]

"""The chapter file format: Markdown with a YAML frontmatter (not XML; see the README).

::

    ---
    chapter: "003-database-schema"
    title: "Database Schema"
    session: "…author session…"
    root: "…root session…"
    seqRange: [184, 231]
    sha256: "…sha256 of the body…"
    tokens: 7420
    generatedAt: "2026-09-15T17:22:04Z"
    artifacts: 2
    ---
    # Database Schema

    **User:** Let's design the user table…

Every string in the frontmatter is written double-quoted by PyYAML, so any title (colons, quotes,
newlines, ``---`` lines, control characters) parses back to the same string and never ends the
frontmatter early. ``sha256`` covers the body bytes after the closing ``---`` line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from .storage import ArchiveError, IntegrityError

FIELDS = ("chapter", "title", "session", "root", "seqRange", "sha256", "tokens", "generatedAt", "artifacts")


class _Quoted(str):
    """A string the dumper writes double-quoted (escapes everything YAML could misread)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style='"'))


@dataclass(frozen=True)
class ChapterFile:
    chapter: str
    title: str
    session: str
    root: str
    seq_range: tuple[int, int]
    sha256: str
    tokens: int
    generated_at: str
    artifacts: int
    body: str

    def frontmatter(self) -> dict[str, Any]:
        return {
            "chapter": self.chapter,
            "title": self.title,
            "session": self.session,
            "root": self.root,
            "seqRange": [self.seq_range[0], self.seq_range[1]],
            "sha256": self.sha256,
            "tokens": self.tokens,
            "generatedAt": self.generated_at,
            "artifacts": self.artifacts,
        }


def body_sha256(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def render_chapter_file(
    *,
    chapter: str,
    title: str,
    session: str,
    root: str,
    seq_range: tuple[int, int],
    tokens: int,
    generated_at: str,
    artifacts: int,
    body: str,
) -> tuple[str, str]:
    """The file text and the body's sha256."""
    digest = body_sha256(body)
    front = {
        "chapter": _Quoted(chapter),
        "title": _Quoted(title),
        "session": _Quoted(session),
        "root": _Quoted(root),
        "seqRange": [int(seq_range[0]), int(seq_range[1])],
        "sha256": _Quoted(digest),
        "tokens": int(tokens),
        "generatedAt": _Quoted(generated_at),
        "artifacts": int(artifacts),
    }
    head = yaml.dump(
        front, Dumper=_Dumper, allow_unicode=True, sort_keys=False, width=float("inf"), default_flow_style=None
    )
    return f"---\n{head}---\n{body}", digest


def parse_chapter(text: str, *, where: str = "chapter", expect_sha256: str | None = None) -> ChapterFile:
    """Parse a chapter file and verify its body against its own sha256 (and ``expect_sha256``,
    the registry's figure, when given). Raises :class:`IntegrityError` on any mismatch."""
    if not text.startswith("---\n"):
        msg = f"{where}: a chapter file starts with a '---' frontmatter line"
        raise ArchiveError(msg)
    end = text.find("\n---\n", 3)
    if end < 0:
        msg = f"{where}: the frontmatter has no closing '---' line"
        raise ArchiveError(msg)
    try:
        front = yaml.safe_load(text[4 : end + 1])
    except yaml.YAMLError as exc:
        msg = f"{where}: the frontmatter is not valid YAML ({exc})"
        raise ArchiveError(msg) from None
    if not isinstance(front, dict) or set(front) != set(FIELDS):
        got = sorted(front) if isinstance(front, dict) else type(front).__name__
        msg = f"{where}: the frontmatter must have exactly the keys {list(FIELDS)}, got {got}"
        raise ArchiveError(msg)
    body = text[end + 5 :]
    digest = body_sha256(body)
    if digest != front["sha256"]:
        msg = f"{where}: the body's sha256 is {digest}, the frontmatter says {front['sha256']}: the file was changed; refused"
        raise IntegrityError(msg)
    if expect_sha256 is not None and expect_sha256 != digest:
        msg = f"{where}: the registry records sha256 {expect_sha256}, the file has {digest}: the file was replaced; refused"
        raise IntegrityError(msg)
    seq_range = front["seqRange"]
    if not (isinstance(seq_range, list) and len(seq_range) == 2 and all(isinstance(s, int) for s in seq_range)):
        msg = f"{where}: seqRange must be [start, end], got {seq_range!r}"
        raise ArchiveError(msg)
    return ChapterFile(
        chapter=str(front["chapter"]),
        title=str(front["title"]),
        session=str(front["session"]),
        root=str(front["root"]),
        seq_range=(seq_range[0], seq_range[1]),
        sha256=digest,
        tokens=int(front["tokens"]),
        generated_at=str(front["generatedAt"]),
        artifacts=int(front["artifacts"]),
        body=body,
    )

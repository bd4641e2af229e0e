"""The content-addressed artifact store: large tool results, kept verbatim, read in pages.

An artifact is stored in the archive (the strategy's blobs) under its handle
``<root>/artifacts/<sha256>.txt``. Reading verifies that the content still hashes to its name.
Queries go through ``chapters_artifact`` (toc | search | read), which is read-only and checks
names with :func:`storage.check_name`. They page it as :mod:`.paging` says: its long lines cut at
the limit exactly and numbered ``N+`` where they continue a line, so no answer brings a result too
large for the context back whole.
"""

from __future__ import annotations

import hashlib
import re

from .paging import LINE_CHARS, matches, pieces
from .paging import page as page_of
from .storage import Archive, ArchiveError, IntegrityError, NotInArchiveError, VerifiedCache, check_name

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/artifacts/([0-9a-f]{64})\.txt")
#: how a chapter's body names an artifact it itemises (render.py): ``[artifact `<handle>`, N chars]``
HANDLE_IN_TEXT = re.compile(r"\[artifact `([A-Za-z0-9][A-Za-z0-9._-]*/artifacts/[0-9a-f]{64}\.txt)`")
#: a handle wherever it stands (the live window's ``[artifact <handle>: ...]``, a model's own text)
HANDLE_ANYWHERE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/artifacts/[0-9a-f]{64}\.txt")


def handle_for(root: str, digest: str) -> str:
    return f"{root}/artifacts/{digest}.txt"


def store(archive: Archive, root: str, content: str) -> tuple[str, str]:
    """Store ``content`` (idempotent: content-addressed, an existing copy is not rewritten);
    returns ``(handle, sha256)``."""
    data = content.encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    handle = handle_for(root, digest)
    if not archive.exists(handle):
        archive.write(handle, data)
    return handle, digest


def load(archive: Archive, handle: str) -> str:
    """The artifact's text, after checking the name is a handle and the content its hash."""
    check_name(handle)  # refuses '..' and absolute paths first
    match = _NAME.fullmatch(handle)
    if not match:
        msg = f"{handle!r} is not an artifact handle; handles look like '<root>/artifacts/<sha256>.txt'"
        raise ArchiveError(msg)
    try:
        data = archive.read(handle)
    except NotInArchiveError:
        msg = f"artifact {handle!r} is not in the store"
        raise ArchiveError(msg) from None
    if hashlib.sha256(data).hexdigest() != match.group(1):
        msg = f"artifact {handle!r} no longer matches its sha256: it was changed after it was stored; refused"
        raise IntegrityError(msg)
    return data.decode("utf-8")


#: verified artifact texts for search, ``(text, lower-cased text)`` by sha256 (the handle's name)
SEARCHABLE = VerifiedCache(limit=256)


def searchable(archive: Archive, handle: str) -> tuple[str, str]:
    """The artifact's text and its lower case, read and verified once: a handle names its content's
    sha256, and the store keeps the stored bytes' digest, so an unchanged artifact is not read again."""
    match = _NAME.fullmatch(check_name(handle))
    if not match:
        msg = f"{handle!r} is not an artifact handle; handles look like '<root>/artifacts/<sha256>.txt'"
        raise ArchiveError(msg)
    info = archive.stat(handle)
    if info is None:
        msg = f"artifact {handle!r} is not in the store"
        raise ArchiveError(msg)
    if info.sha256 != match.group(1):
        msg = f"artifact {handle!r} no longer matches its sha256: it was changed after it was stored; refused"
        raise IntegrityError(msg)
    cached = SEARCHABLE.get(info.sha256)
    if cached is None:
        text = load(archive, handle)
        cached = (text, text.lower())
        SEARCHABLE.put(info.sha256, cached)
    return cached


def list_handles(archive: Archive, root: str) -> list[str]:
    return archive.list(f"{root}/artifacts", ".txt")


def toc(text: str, *, max_entries: int = 60) -> str:
    """An overview: size, then the lines that look like headings or section starts, with line numbers."""
    lines_ = pieces(text)
    split = sum(continued for _, continued in lines_)
    out = [
        f"{len(lines_)} lines, {len(text)} characters"
        + (
            f" (lines over {LINE_CHARS} characters are read in pieces: {split} pieces numbered N+ continue "
            "the line before)"
            if split
            else ""
        )
    ]
    picks = []
    for i, (line, continued) in enumerate(lines_, 1):
        stripped = line.strip()
        if re.match(
            r"^(#{1,6} |[A-Z][A-Za-z ]{2,40}:$|={3,}|-{3,}|diff --git|@@ |Traceback|[A-Za-z_./-]+\.\w+:\d+)", stripped
        ):
            picks.append(f"{i}{'+' if continued else ':'} {stripped[:160]}")
    if not picks:  # no structure: every nth line
        step = max(1, len(lines_) // max_entries)
        picks = [
            f"{i + 1}{'+' if lines_[i][1] else ':'} {lines_[i][0].strip()[:160]}" for i in range(0, len(lines_), step)
        ]
    if len(picks) > max_entries:
        out.append(f"(showing {max_entries} of {len(picks)} entries)")
        picks = picks[:max_entries]
    return "\n".join(out + picks)


def search(text: str, query: str, *, limit: int = 50) -> str:
    needle = query.lower()
    hits = [f"{i + 1}: {preview}" for i, preview in matches(text, needle)]
    if not hits:
        return f"no line contains {query!r}"
    more = f"\n({len(hits) - limit} more matches; narrow the query)" if len(hits) > limit else ""
    return f"{len(hits)} matching line(s):\n" + "\n".join(hits[:limit]) + more


def page(text: str, offset: int, limit: int) -> str:
    """Lines ``offset+1`` .. ``offset+limit`` with line numbers, fewer when they would hold more than
    :data:`~.paging.PAGE_CHARS` characters (one at least), and where the next page starts."""
    lines_ = pieces(text)
    chunk = page_of(lines_, offset, limit)
    # a piece that continues the line before is numbered ``N+``: the line was cut, not broken
    body = "\n".join(f"{offset + i + 1}{'+' if continued else ':'} {line}" for i, (line, continued) in enumerate(chunk))
    nxt = offset + len(chunk)
    tail = (
        f"\n(lines {offset + 1}-{nxt} of {len(lines_)}; next page: offset={nxt})"
        if nxt < len(lines_)
        else f"\n(end: {len(lines_)} lines)"
    )
    return body + tail

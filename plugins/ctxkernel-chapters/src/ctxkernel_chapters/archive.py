"""Turning chapter plans into chapter files and registry records.

Two phases so that a refusal writes nothing: :func:`prepare` renders every chapter in memory
(file text, sha256, tokens, the artifacts it itemises), :func:`publish` stores the artifacts and
the files in the archive (:class:`storage.Archive`, the strategy's blobs). Verified reads
(:func:`read_verified`) check the registry's sha256 and the file's own before anything is cited
or served; their results are cached by content hash (:data:`VERIFIED`).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxkernel.events import utc_now

from . import artifacts
from .chapter_file import ChapterFile, parse_chapter, render_chapter_file
from .render import render_range
from .storage import Archive, ArchiveError, NotInArchiveError, VerifiedCache
from .toc import TOC_OPEN

if TYPE_CHECKING:
    from ctxkernel import Context

    from .segment import ChapterPlan
    from .settings import ChaptersSettings


#: parsed chapters that passed verification, by (path, stored sha256, registry sha256)
VERIFIED = VerifiedCache()
#: lower-cased chapter bodies for search, by the body's sha256
LOWERED = VerifiedCache()


def lowered_body(chapter: ChapterFile) -> str:
    """The verified chapter's body in lower case (computed once per body)."""
    text = LOWERED.get(chapter.sha256)
    if text is None:
        text = chapter.body.lower()
        LOWERED.put(chapter.sha256, text)
    return str(text)


def archive_label(settings: ChaptersSettings) -> str:
    """How chapter paths are shown to the model (and the folder ``ctxkernel export`` names)."""
    return settings.archive_root.rstrip("/") or "."


def slugify(title: str) -> str:
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:40].strip("-")
    return slug or "chapter"


def chapter_name(number: int, title: str) -> str:
    """``NNN-slug``: the chapter's name in its frontmatter and, with ``.md``, its file name."""
    return f"{number:03d}-{slugify(title)}"


def chapter_path(root: str, number: int, title: str) -> str:
    """Where chapter ``number`` of lineage ``root`` is stored (relative to the archive)."""
    return f"{root}/chapters/{chapter_name(number, title)}.md"


@dataclass
class Prepared:
    record: dict[str, Any]
    text: str
    artifacts: dict[str, str] = field(default_factory=dict)  # handle -> content


def prepare(
    ctx: Context,
    settings: ChaptersSettings,
    plans: list[ChapterPlan],
    numbers: list[int],
    *,
    root: str,
    status: str,
    plan_id: str = "",
    keep: frozenset[int] = frozenset(),
    force_defer: frozenset[int] = frozenset(),
    created: list[str] | None = None,
    floor_tokens: int | None = None,
) -> list[Prepared]:
    """Render each planned chapter in memory; nothing is written. ``keep`` and ``force_defer``
    are the model's keep/defer decisions for tool results (seeds), over the size floor's.
    ``created`` and ``floor_tokens`` re-render a committed plan exactly as it was planned (its
    times and the defer floor it was planned with); by default now and the settings' floor."""
    count = ctx.meter.count_text
    floor = settings.tool_result_defer_floor_tokens if floor_tokens is None else floor_tokens
    times = created or [utc_now() for _ in plans]
    out = []
    for plan, number, when in zip(plans, numbers, times, strict=True):
        found: dict[str, str] = {}

        def defer(content: str, found: dict[str, str] = found) -> str:
            handle = artifacts.handle_for(root, hashlib.sha256(content.encode("utf-8")).hexdigest())
            found[handle] = content
            return handle

        prose, n_artifacts = render_range(
            ctx.events,
            plan.start_seq,
            plan.end_seq,
            count=count,
            floor_tokens=floor,
            defer=defer,
            toc_marker=TOC_OPEN,
            keep=keep,
            force_defer=force_defer,
        )
        heading = " ".join(plan.title.split()) or f"Chapter {number}"
        body = f"# {heading}\n\n{prose}"
        tokens = count(body)
        name = chapter_name(number, plan.title)
        path = chapter_path(root, number, plan.title)
        text, digest = render_chapter_file(
            chapter=name,
            title=plan.title,
            session=ctx.id,
            root=root,
            seq_range=(plan.start_seq, plan.end_seq),
            tokens=tokens,
            generated_at=when,
            artifacts=n_artifacts,
            body=body,
        )
        record = {
            "id": f"{ctx.id}/{number}",
            "number": number,
            "author_session": ctx.id,
            "path": path,
            "start_seq": plan.start_seq,
            "end_seq": plan.end_seq,
            "sha256": digest,
            "tokens": tokens,
            "title": plan.title,
            "summary": plan.summary,
            "artifacts": sorted(found),
            "created": when,
            "status": status,
            "plan": plan_id,
        }
        out.append(Prepared(record, text, found))
    return out


def publish(archive: Archive, prepared: list[Prepared]) -> None:
    """Store the artifacts, then each chapter file (each put durable and atomic)."""
    for item in prepared:
        for handle, content in item.artifacts.items():
            root = handle.split("/", 1)[0]
            artifacts.store(archive, root, content)
        archive.write(item.record["path"], item.text.encode("utf-8"))


def read_verified(archive: Archive, record: dict[str, Any]) -> ChapterFile:
    """The chapter, after checking its body against the registry's sha256; raises
    :class:`storage.IntegrityError` for a changed file (it is reported, never served).

    A file whose stored sha256 was verified before is served from :data:`VERIFIED` without
    being read again: the same bytes verify the same way."""
    info = archive.stat(record["path"])
    if info is None:
        msg = f"{record['path']!r} is not in the archive"
        raise NotInArchiveError(msg)
    key = (record["path"], info.sha256, record["sha256"])
    cached: ChapterFile | None = VERIFIED.get(key)
    if cached is not None:
        return cached
    raw = archive.read(record["path"])
    chapter = parse_chapter(
        raw.decode("utf-8", errors="replace"),
        where=f"chapter {record['id']} ({record['path']})",
        expect_sha256=record["sha256"],
    )
    if hashlib.sha256(raw).hexdigest() == info.sha256:  # not changed between the stat and the read
        VERIFIED.put(key, chapter)
    return chapter


def verified(
    archive: Archive, records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """The records whose files pass the integrity check, and each that does not with the reason:
    a chapter is verified before it is cited in a table of contents."""
    ok: list[dict[str, Any]] = []
    bad: list[tuple[dict[str, Any], str]] = []
    for record in records:
        try:
            read_verified(archive, record)
        except ArchiveError as exc:
            bad.append((record, str(exc)))
            continue
        ok.append(record)
    return ok, bad

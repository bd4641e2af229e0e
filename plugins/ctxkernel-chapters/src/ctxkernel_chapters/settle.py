"""The chapters of an in-place compaction are written after its commit point.

An in-place compaction makes one durable write: the kernel's commit. Its ``compaction/summary``
event carries the plan (``root``, the defer floor and, per chapter, its number, seq range,
title, summary, planned tokens and time), which is all it takes to render every chapter file
again from the log. :func:`settle` writes the artifacts, the chapter files and the registry
records afterwards: at the next step, before anything reads the archive (the tools,
``project``, ``export``, the CLI through the session it opens) and when the session is opened.
A crash between the commit and those writes loses nothing: the reopened session renders the
missing chapters from its log (the log is the source of truth, the files a rendering of it).

Order, each write durable and idempotent so that an interrupted settle is simply done again:
artifacts and chapter files, the lineage's number allocator, the records, and last the session
state whose ``archived_through`` marks the plan settled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ctxkernel import StoreError, get_logger

from . import archive
from .chapter_file import ChapterFile
from .registry import Registry
from .segment import ChapterPlan
from .storage import Archive, ArchiveError, NotInArchiveError, check_name
from .strategy import registry_of, settings_of, state

if TYPE_CHECKING:
    from ctxkernel import Context

log = get_logger("ctxkernel.chapters")


class PlannedChapter(BaseModel):
    """One chapter as the commit event records it."""

    model_config = ConfigDict(extra="forbid")
    number: int = Field(ge=1)
    start_seq: int = Field(ge=0)
    end_seq: int = Field(ge=0)
    title: str
    summary: str
    tokens: int = Field(ge=0)
    created: str


class CommittedPlan(BaseModel):
    """What :func:`settle` reads back from a chapters ``compaction/summary`` event (checked: the
    log is a file anyone could have edited)."""

    model_config = ConfigDict(extra="ignore")
    compaction_id: str
    plan: str
    root: str
    floor_tokens: int = Field(ge=0)
    records: list[PlannedChapter]


def planned_record(number: int, plan: ChapterPlan, created: str) -> dict[str, Any]:
    """The commit event's entry for one chapter (see :class:`PlannedChapter`)."""
    return {
        "number": number,
        "start_seq": plan.start_seq,
        "end_seq": plan.end_seq,
        "title": plan.title,
        "summary": plan.summary,
        "tokens": plan.tokens,
        "created": created,
    }


def settle(ctx: Context) -> Registry:
    """Write the chapters of every committed, unsettled in-place compaction of ``session``;
    returns the registry. Costs nothing when there are none (the usual case). A plan that
    cannot be written now (a store error) stays unsettled, is logged, and is tried again at the
    next settle; one the log spoils (an edited event) is logged once and skipped."""
    st = state(ctx)
    registry = registry_of(ctx)
    if not st["unsettled"]:
        return registry
    done = registry.archived_through(ctx.id)
    pending = st["unsettled"]
    while pending:
        data = pending[0]
        if data["archive"]["through"] > done:
            try:
                plan = checked(ctx, data)
            except ValueError as exc:  # the log was edited: reported, never rendered
                log.error("a chapters commit in the log cannot be rendered", session=ctx.id, error=str(exc))
            else:
                try:
                    write(ctx, registry, plan)
                except (ArchiveError, StoreError) as exc:
                    log.warning("chapters not written yet", session=ctx.id, plan=plan.plan, error=str(exc))
                    break
        pending.pop(0)
    return registry


def checked(ctx: Context, data: dict[str, Any]) -> CommittedPlan:
    """The commit event's plan, validated (``ValueError`` names what is wrong)."""
    plan = CommittedPlan.model_validate(data)  # pydantic's ValidationError is a ValueError
    try:
        check_name(plan.root)
    except ArchiveError as exc:
        raise ValueError(f"root {plan.root!r}: {exc}") from None
    last = len(ctx.events) - 1
    for r in plan.records:
        if not r.start_seq <= r.end_seq <= last:
            msg = f"chapter {r.number}: seqs {r.start_seq}..{r.end_seq} are not in the log (0..{last})"
            raise ValueError(msg)
    return plan


def rendered(ctx: Context, plan: CommittedPlan, chapters: list[PlannedChapter]) -> list[archive.Prepared]:
    """``chapters`` of a committed plan rendered from the log, exactly as planned."""
    return archive.prepare(
        ctx,
        settings_of(ctx),
        [ChapterPlan(r.start_seq, r.end_seq, r.title, r.summary, r.tokens) for r in chapters],
        [r.number for r in chapters],
        root=plan.root,
        status="final",
        plan_id=plan.plan,
        created=[r.created for r in chapters],
        floor_tokens=plan.floor_tokens,
    )


def write(ctx: Context, registry: Registry, plan: CommittedPlan) -> None:
    """Render one committed plan from the log and store its files, then its records."""
    numbers = [r.number for r in plan.records]
    prepared = rendered(ctx, plan, plan.records)
    records = [p.record for p in prepared]
    for record in records:
        record["compaction_id"] = plan.compaction_id
    archive.publish(Archive.of(ctx), prepared)
    if numbers:
        registry.advance(plan.root, max(numbers) + 1)
    before = registry.archived_through(ctx.id)
    after = registry.add_final(ctx.id, records)["archived_through"]
    cached = state(ctx).get("records")  # own_records(): extended, not listed again
    if cached is not None and cached[0] == before:
        state(ctx)["records"] = (after, [*cached[1], *records])


def restore(ctx: Context, record: dict[str, Any]) -> bool:
    """Render a chapter file that is missing from the archive again from this session's log, and
    store it when it hashes to the record's sha256 (True); False when the record is another
    session's, predates plans in the log, or renders differently (then it stays reported)."""
    seq = state(ctx)["plans"].get(record.get("compaction_id"))
    if seq is None or record.get("author_session") != ctx.id:
        return False
    try:
        plan = checked(ctx, ctx.events[seq].data)
    except ValueError:
        return False
    chapter = next((r for r in plan.records if r.number == record.get("number")), None)
    if chapter is None:
        return False
    (prepared,) = rendered(ctx, plan, [chapter])
    if prepared.record["sha256"] != record.get("sha256") or prepared.record["path"] != record.get("path"):
        log.warning("a lost chapter renders differently from its record", session=ctx.id, chapter=record.get("id"))
        return False
    archive.publish(Archive.of(ctx), [prepared])
    log.info("a lost chapter file was written again from the log", session=ctx.id, chapter=record.get("id"))
    return True


def read_chapter(ctx: Context, record: dict[str, Any], where: Archive | None = None) -> ChapterFile:
    """:func:`archive.read_verified`, after writing the file again from the log when it is
    missing and this session's log holds its plan (a changed file is refused, never replaced)."""
    where = where or Archive.of(ctx)
    try:
        return archive.read_verified(where, record)
    except NotInArchiveError:
        if not restore(ctx, record):
            raise
    return archive.read_verified(where, record)

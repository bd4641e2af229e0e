"""The model-callable tools of the ``chapters`` strategy.

``chapters_continue`` and ``chapters_fork`` create sessions; ``chapters_read``,
``chapters_search`` and ``chapters_artifact`` are read-only and contained in the archive. Every
refusal is an error outcome written before anything is: the log, the archive and the registry
are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import Field

from ctxkernel import MAX_INT_ARG, Message, ToolArgs, ToolOutcome
from ctxkernel.events import random_hex
from ctxkernel.text import attr

from . import archive, artifacts, paging, toc
from . import strategy as chapters
from .registry import Registry, new_state, record_key
from .segment import ChapterPlan, describe, propose_for
from .settle import read_chapter, settle
from .storage import Archive, ArchiveError, check_name

if TYPE_CHECKING:
    from ctxkernel import Context

    from .settings import ChaptersSettings

NAME = "chapters"


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


# -- arguments ------------------------------------------------------------------------------------
def _untitled(node: Any) -> Any:
    """A JSON schema without pydantic's generated titles (they cost tokens on every request)."""
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


class _Args(ToolArgs):
    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        schema: dict[str, Any] = _untitled(super().model_json_schema(*args, **kwargs))
        return schema


#: hard caps of the schema: the continuation budget refuses a long handoff note well inside them
HANDOFF_NOTE_CHARS = 200_000
CHAPTERS_CAP = 1_000
KEEP_INLINE_CAP = 1_000
HANDLE_CHARS = 500

Seq = Annotated[int, Field(ge=0, le=MAX_INT_ARG)]


class ChapterRange(_Args):
    start_seq: Seq
    end_seq: Seq = Field(description="inclusive")
    title: str = Field(min_length=1, max_length=300)
    summary: str = Field(default="", max_length=2000)
    keep_inline: list[Seq] = Field(
        default_factory=list, max_length=KEEP_INLINE_CAP, description="tool result seqs kept inline, not as artifacts"
    )
    defer: list[Seq] = Field(
        default_factory=list, max_length=KEEP_INLINE_CAP, description="tool result seqs made artifacts even if small"
    )


class ContinueArgs(_Args):
    title: str = Field(min_length=1, max_length=300)
    handoff_note: str = Field(
        min_length=1,
        max_length=HANDOFF_NOTE_CHARS,
        description="in progress, decisions held, next step; budget-checked, never truncated",
    )
    chapters: list[ChapterRange] = Field(
        max_length=CHAPTERS_CAP,
        description="event ranges: ascending, contiguous, from the first unarchived event to the last turn/end",
    )


class ForkArgs(_Args):
    title: str = Field(min_length=1, max_length=300)
    handoff_note: str = Field(default="", max_length=HANDOFF_NOTE_CHARS)


class ReadArgs(_Args):
    chapter: str = Field(min_length=1, max_length=HANDLE_CHARS, description="chapter id, number or path")
    offset: int = Field(default=0, ge=0, le=MAX_INT_ARG, description="first line")
    limit: int | None = Field(default=None, ge=1, le=5000)


class SearchArgs(_Args):
    query: str = Field(min_length=1, max_length=500)
    offset: int = Field(default=0, ge=0, le=MAX_INT_ARG)
    limit: int = Field(default=20, ge=1, le=200)


class ArtifactArgs(_Args):
    op: Literal["toc", "search", "read"] = "toc"
    artifact: str | None = Field(default=None, max_length=HANDLE_CHARS, description="handle; omit with op=toc to list")
    query: str | None = Field(default=None, max_length=500)
    offset: int = Field(default=0, ge=0, le=MAX_INT_ARG)
    limit: int | None = Field(default=None, ge=1, le=5000)


# -- session creation -----------------------------------------------------------------------------
def check_ranges(ranges: list[ChapterRange], floor: int, ceiling: int | None) -> str | None:
    """Why ``ranges`` cannot be archived, or None. Every event ``floor..ceiling`` is covered once."""
    top = -1 if ceiling is None else ceiling
    if top < floor:
        if ranges:
            what = (
                "there is no completed turn yet"
                if ceiling is None
                else f"events up to {floor - 1} are already archived and the ceiling is {ceiling}"
            )
            return (
                f"nothing can be archived ({what}); pass chapters=[]: the turn in progress is archived as the "
                "last chapter, and the handoff note says what matters"
            )
        return None
    if not ranges:
        return f"chapters must cover events {floor}..{top} (the archive ceiling is the last turn/end, seq {top})"
    expected = floor
    for i, r in enumerate(ranges):
        if r.end_seq < r.start_seq:
            return f"chapter {i} ends (seq {r.end_seq}) before it starts (seq {r.start_seq})"
        if r.end_seq > top:
            return (
                f"chapter {i} ({r.start_seq}..{r.end_seq}) goes past the archive ceiling {top} (the last turn/end); "
                "the turn in progress is archived after your chapters as the last one; describe it in the handoff note"
            )
        if r.start_seq < expected:
            if i == 0:
                return f"chapter 0 starts at {r.start_seq} but events up to {floor - 1} are already archived; start at {floor}"
            return f"chapter {i} ({r.start_seq}..{r.end_seq}) overlaps chapter {i - 1}, which ends at {expected - 1}"
        if r.start_seq > expected:
            return f"gap: events {expected}..{r.start_seq - 1} are in no chapter; ranges must be contiguous from {floor} to {top}"
        for field, seqs in (("keep_inline", r.keep_inline), ("defer", r.defer)):
            for seq in seqs:
                if not r.start_seq <= seq <= r.end_seq:
                    return f"chapter {i}: {field} seq {seq} is outside the chapter ({r.start_seq}..{r.end_seq})"
        both = sorted(set(r.keep_inline) & set(r.defer))
        if both:
            return f"chapter {i}: seqs {both[:10]} are both in keep_inline and defer; choose one for each result"
        expected = r.end_seq + 1
    if expected <= top:
        return f"gap: events {expected}..{top} are in no chapter; the last chapter must end at the ceiling {top}"
    return None


@dataclass
class ChildPlan:
    """A continuation that passed every check, rendered in memory; nothing written yet."""

    plans: list[ChapterPlan]
    numbers: list[int]
    keep: frozenset[int]
    defer: frozenset[int]
    prepared: list[archive.Prepared]
    seed: Message
    toc_tokens: int
    budget: int


def plan_child(ctx: Context, handoff_note: str, ranges: list[ChapterRange], *, origin: str) -> ChildPlan | str:
    """Check the ranges and the budget and render the chapters and the seed in memory.

    Returns the plan, or the reason for refusing. Writes nothing (the steward uses it as a dry run).
    """
    settings: ChaptersSettings = chapters.settings_of(ctx)
    registry = chapters.registry_of(ctx)
    sstate = registry.ensure(ctx.id)
    root = sstate["root"]
    floor = chapters.archived_through(ctx, registry) + 1
    ceiling = chapters.archive_ceiling(ctx)
    problem = check_ranges(ranges, floor, ceiling)
    if problem:
        return problem
    open_compaction = ctx.open_compaction
    if open_compaction is not None:
        return f"compaction {open_compaction['compaction_id']} is open since seq {open_compaction['seq']}"
    plans = [
        ChapterPlan(
            r.start_seq,
            r.end_seq,
            r.title.strip(),
            r.summary.strip() or describe(ctx.events, r.start_seq, r.end_seq)[1],
            0,
        )
        for r in ranges
    ]
    tail = (
        in_progress_range(ctx, max(floor, (-1 if ceiling is None else ceiling) + 1)) if origin == "continue" else None
    )
    if tail is not None:
        plans += in_progress_plans(ctx, settings, *tail)
    keep = frozenset(s for r in ranges for s in r.keep_inline)
    defer = frozenset(s for r in ranges for s in r.defer)
    # numbers are only peeked here: allocation happens once the preflight passed
    first = max(registry.next_number(root), registry.reserved.get(root, 1), sstate.get("next_chapter", 1))
    numbers = list(range(first, first + len(plans)))
    prepared = archive.prepare(ctx, settings, plans, numbers, root=root, status="final", keep=keep, force_defer=defer)
    seed = Message.user(
        _seed_toc(ctx, settings, registry, [p.record for p in prepared], handoff_note, floor, ceiling),
        chapters.STRATEGY.source("snapshot"),
    )
    # budget preflight: a share of the window left after the system prompt and tool schemas
    effective = ctx.model.effective_window
    # the child's header carries the recall tools from its first request
    head = chapters.header_tokens(ctx) + chapters.STRATEGY.on(ctx).header_growth()
    budget = int(settings.continuation_budget_ratio * max(0, effective - head))
    toc_tokens = ctx.meter.count_message(seed)
    handoff_tokens = ctx.meter.count_text(handoff_note)
    if toc_tokens > budget:
        return (
            f"the table of contents would cost {toc_tokens} tokens ({toc_tokens - handoff_tokens} for the chapter list, "
            f"{handoff_tokens} for the handoff note), over the budget of {budget} (continuation_budget_ratio "
            f"{settings.continuation_budget_ratio} x (effective window {effective} - system prompt and tools {head})). "
            "Shorten the handoff note or use fewer, larger chapters"
        )
    return ChildPlan(plans, numbers, keep, defer, prepared, seed, toc_tokens, budget)


def _create_child(
    ctx: Context, args: ContinueArgs | ForkArgs, ranges: list[ChapterRange], *, origin: str
) -> ToolOutcome:
    st = chapters.state(ctx)
    if origin == "continue" and st["continued_in"] is not None and st.get("continued_at") == (ctx.turn, ctx.step):
        # a second continuation in one reply would make a second child, and the harness follows one
        return ToolOutcome(
            f"chapters_continue refused: this step already continued in session {st['continued_in']}; the turn "
            "ends after this batch and the work goes on there. Nothing was written.",
            is_error=True,
        )
    plan = plan_child(ctx, args.handoff_note, ranges, origin=origin)
    if isinstance(plan, str):
        return ToolOutcome(f"chapters_{origin} refused: {plan}. Nothing was written.", is_error=True)
    settings: ChaptersSettings = chapters.settings_of(ctx)
    registry = settle(ctx)  # an in-place compaction's chapters first: they come before these
    root = registry.root_of(ctx.id)
    prepared, seed = plan.prepared, plan.seed
    # write: chapter files, then the registry, then the child with its one seed event
    if plan.plans:
        allocated = registry.allocate(root, len(plan.plans))
        if allocated != plan.numbers:  # another writer took numbers since the peek: render again
            prepared = archive.prepare(
                ctx,
                settings,
                plan.plans,
                allocated,
                root=root,
                status="final",
                keep=plan.keep,
                force_defer=plan.defer,
            )
            seed = Message.user(
                _seed_toc(
                    ctx,
                    settings,
                    registry,
                    [p.record for p in prepared],
                    args.handoff_note,
                    chapters.archived_through(ctx, registry) + 1,
                    chapters.archive_ceiling(ctx),
                ),
                chapters.STRATEGY.source("snapshot"),
            )
    records = [p.record for p in prepared]
    archive.publish(Archive.of(ctx), prepared)
    child_id = random_hex(32)
    next_chapter = registry.next_number(root)
    for record in records:
        registry.kv.kv_put(record_key(ctx.id, record["number"]), record)
    sstate = registry.ensure(ctx.id)
    if records:
        sstate["archived_through"] = max([sstate.get("archived_through", -1), *(r["end_seq"] for r in records)])
    sstate["children"] = [*sstate.get("children", []), {"session": child_id, "origin": origin, "title": args.title}]
    sstate["next_chapter"] = next_chapter
    registry.put(ctx.id, sstate)
    registry.put(
        child_id,
        new_state(
            child_id,
            parent=ctx.id,
            root=root,
            origin=origin,
            next_chapter=next_chapter,
            title=args.title,
            parent_archived_through=sstate.get("archived_through", -1),
        ),
    )
    # no ``parent`` in the child's header: the registry is the sole authority on ancestry (seed 003)
    # the model selection goes with the work (seed 003): same model, same window (and the harness's tools)
    chapters.STRATEGY.on(ctx).open_continuation(child_id, origin=origin, seed=seed)
    st["continued_in" if origin == "continue" else "forked"] = child_id
    if origin == "continue":
        st["continued_at"] = (ctx.turn, ctx.step)
    ceiling = chapters.archive_ceiling(ctx)
    top = -1 if ceiling is None else ceiling  # chapters past it hold the turn in progress
    result = {
        "session": child_id,
        "origin": origin,
        "title": args.title,
        "chapters": [
            {"id": r["id"], "path": r["path"], "seqs": [r["start_seq"], r["end_seq"]], "tokens": r["tokens"]}
            | ({"in_progress": True} if r["start_seq"] > top else {})
            for r in records
        ],
        "toc_tokens": plan.toc_tokens,
        "budget": plan.budget,
    }
    if origin == "continue":
        return ToolOutcome(
            _json(result | {"note": "continued in the new session; this session is left as it was"}),
            conclude_turn=True,
            continue_in=child_id,
        )
    return ToolOutcome(_json(result | {"note": "forked; this session goes on"}))


#: how an in-progress chapter's title starts (its table-of-contents bullet says what it holds)
IN_PROGRESS_TITLE = "In progress at continuation"


def in_progress_range(ctx: Context, start: int) -> tuple[int, int] | None:
    """Events ``start..end`` of the turn in progress that a continuation archives as the parent's
    last chapter, or None when they hold no message.

    The archive ceiling (the last ``turn/end``) bounds the ranges the caller supplies; what
    follows it is the turn in progress, which the handoff note only quotes in part. Its
    completed steps are archived too, so the child reaches them through ``chapters_read``. The
    pairing rule holds: the chapter ends before the step in flight (the assistant message whose
    calls are still waiting, among them this very ``chapters_continue``), so every call in it has
    its results."""
    events = ctx.events
    end = len(events) - 1
    waiting = set(ctx.surface.pending_calls)
    if waiting:
        for event in reversed(events):
            if event.type == "assistant/message" and (event.surface or {}).get("op") == "append":
                calls = {c.get("id") for c in event.data["message"].get("content", []) if c.get("type") == "tool_call"}
                if calls & waiting:
                    end = event.seq - 1
                    break
    messages = ("user/message", "assistant/message", "tool/result")
    if not any(e.type in messages and (e.surface or {}).get("op") == "append" for e in events[start : end + 1]):
        return None
    return start, end


def in_progress_plans(ctx: Context, settings: ChaptersSettings, start: int, end: int) -> list[ChapterPlan]:
    """The turn in progress segmented like any range (cut only after a completed step), each
    chapter titled as partial."""
    plans = propose_for(ctx, settings, start, end)
    return [
        replace(p, title=f"{IN_PROGRESS_TITLE}: {p.title}"[:120], summary=f"turn in progress, partial; {p.summary}")
        for p in plans
    ]


def _seed_toc(
    ctx: Context,
    settings: ChaptersSettings,
    registry: Registry,
    records: list[dict[str, Any]],
    handoff: str,
    floor: int,
    ceiling: int | None,
) -> str:
    """Every chapter of the lineage (ancestors' from this session's own tables of contents and the
    registry), this session's carried prose, and the handoff note."""
    previous = [n.message.text for n in ctx.surface.nodes if chapters.is_chapters_toc(n)]
    lineage, refused = archive.verified(Archive.of(ctx), registry.lineage_records(ctx.id))
    instructions = chapters.user_instructions(ctx, floor, -1 if ceiling is None else ceiling)
    merged = toc.merged(previous, [*lineage, *records], archive.archive_label(settings), instructions=instructions)
    for record, reason in refused:  # reported in the table of contents, never cited
        merged.bullets.pop(f"{archive.archive_label(settings)}/{record['path']}", None)
        merged.carry(f"Not cited (integrity check failed): {reason}")
    text, _ = toc.render(
        merged,
        handoff=handoff,
        count=ctx.meter.count_text,
        bullet_budget=settings.toc_bullet_budget_tokens,
        instruction_budget=settings.toc_instruction_budget_tokens,
        at_most=chapters.text_bound(ctx),
    )
    return text


def chapters_continue(ctx: Context, args: ContinueArgs) -> ToolOutcome:
    return _create_child(ctx, args, args.chapters, origin="continue")


def chapters_fork(ctx: Context, args: ForkArgs) -> ToolOutcome:
    return _create_child(ctx, args, default_ranges(ctx), origin="fork")


def default_ranges(ctx: Context) -> list[ChapterRange]:
    """The deterministic segmentation of everything archivable, as tool arguments."""
    settings: ChaptersSettings = chapters.settings_of(ctx)
    floor = chapters.archived_through(ctx) + 1
    ceiling = chapters.archive_ceiling(ctx)
    if ceiling is None or ceiling < floor:
        return []
    plans = propose_for(ctx, settings, floor, ceiling)
    return [ChapterRange(start_seq=p.start_seq, end_seq=p.end_seq, title=p.title, summary=p.summary) for p in plans]


#: the longest quote a steward's handoff note takes from what the model sees: a model's own notes
#: are short (docs/simulate.md, "The steward policy": its messages in the shared recordings are
#: 65 characters at the median, 182 at p90)
STEWARD_QUOTE_CHARS = 600


def deterministic_continuation(
    ctx: Context, settings: ChaptersSettings, shown: Sequence[Message] | None = None
) -> dict[str, Any] | None:
    """Arguments for ``chapters_continue``: segmentation ranges and a handoff note quoting the
    in-flight turn's request and latest progress. A steward passes ``shown``, the request's
    messages, and the note quotes only them (at most :data:`STEWARD_QUOTE_CHARS` each), as a model
    writing it could; the manual path reads the log. None when nothing can be archived."""
    ceiling = chapters.archive_ceiling(ctx)
    if ceiling is None:
        return None
    ranges = default_ranges(ctx)
    asked = ""
    latest = ""
    if shown is None:
        messages = [
            Message.from_dict(e.data["message"])
            for e in ctx.events[ceiling + 1 :]
            if e.type in ("user/message", "assistant/message") and (e.surface or {}).get("op") == "append"
        ]
    else:
        messages = list(shown)
    for message in messages:
        if message.role == "user" and message.source.kind == "user" and message.text.strip():
            asked = message.text.strip()
        elif message.role == "assistant" and message.text.strip():
            latest = message.text.strip()
    if not asked and shown is None:  # between turns: the last completed turn's request is the context
        title, summary = describe(ctx.events, max(0, ceiling - 40), ceiling)
        asked = summary
    budget_chars = 2_000 if shown is None else STEWARD_QUOTE_CHARS
    note = f"In progress: {asked[:budget_chars]}" if asked else "In progress: (see the table of contents)"
    history = chapters.STRATEGY.on(ctx).history()  # the task state (goal, todos), seed 001's host state
    goal = history.goal_text()
    todos = [f"- [{t.status}] {t.text[:200]}" for t in history.checklist() if t.open][:20]
    if goal and goal.strip() != asked:
        note = f"Goal: {goal[:budget_chars]}\n{note}"
    if todos:
        note += "\nOpen todos:\n" + "\n".join(todos)
    if latest:
        note += f"\nLatest progress: {latest[-budget_chars:]}"
    note += f"\nThe turn in progress (after seq {ceiling} of ctx {ctx.id}) is archived as its last chapter."
    if isinstance(plan_child(ctx, note, ranges, origin="continue"), str):
        return None  # it would be refused (e.g. over budget): the in-place archive acts instead
    return {
        "title": f"Continuation of {ctx.id[:12]}",
        "handoff_note": note,
        "chapters": [r.model_dump() for r in ranges],
    }


# -- reading --------------------------------------------------------------------------------------
def chapters_read(ctx: Context, args: ReadArgs) -> ToolOutcome:
    settings: ChaptersSettings = chapters.settings_of(ctx)
    registry = settle(ctx)
    record = registry.find(ctx.id, args.chapter.strip())
    if record is None:
        known = [r["id"] for r in registry.lineage_records(ctx.id)]
        return ToolOutcome(
            f"chapters_read: no chapter {args.chapter!r} in this session's lineage; chapters: {known[:50]}",
            is_error=True,
        )
    try:
        chapter = read_chapter(ctx, record)
    except ArchiveError as exc:
        return ToolOutcome(f"chapters_read refused: {exc}", is_error=True)
    lines = paging.pieces(chapter.body, at_space=True)  # a long line in pieces, a page within its budget
    chunk = [line for line, _ in paging.page(lines, args.offset, args.limit or settings.read_page_lines)]
    nxt = args.offset + len(chunk)
    head = (
        f'chapter {record["id"]} "{attr(" ".join(chapter.title.split()))}" · seqs {chapter.seq_range[0]}–{chapter.seq_range[1]} · '
        f"{chapter.tokens} tokens · sha256 verified · artifacts {chapter.artifacts}\n"
    )
    tail = (
        f"\n(lines {args.offset + 1}-{nxt} of {len(lines)}; next page: offset={nxt})"
        if nxt < len(lines)
        else f"\n(end of chapter: {len(lines)} lines)"
    )
    return ToolOutcome(head + "\n".join(chunk) + tail)


def chapters_search(ctx: Context, args: SearchArgs) -> ToolOutcome:
    where = Archive.of(ctx)
    needle = args.query.lower()
    hits: list[str] = []
    refused: list[str] = []
    searched: set[str] = set()  # artifact handles (content-addressed: one search each)
    for record in settle(ctx).lineage_records(ctx.id):
        try:
            chapter = read_chapter(ctx, record, where)
        except ArchiveError as exc:
            refused.append(f"{record['id']}: {exc}")
            continue
        if needle in archive.lowered_body(chapter):  # one scan of the whole chapter; lines split on a hit
            for i, preview in paging.matches(chapter.body, needle, at_space=True):  # numbered as chapters_read pages
                hits.append(f"{record['id']} line {i}: {preview}")
        # the large tool results and arguments the chapter itemises are part of what it holds
        for handle in dict.fromkeys(artifacts.HANDLE_IN_TEXT.findall(chapter.body)):
            if handle in searched:
                continue
            searched.add(handle)
            try:
                text, lowered = artifacts.searchable(where, handle)
            except ArchiveError as exc:
                refused.append(f"{handle}: {exc}")
                continue
            if needle in lowered:  # numbered as chapters_artifact reads them
                for i, preview in paging.matches(text, needle):
                    hits.append(f"{record['id']} artifact {handle} line {i + 1}: {preview}")
    page = hits[args.offset : args.offset + args.limit]
    out = [
        f"{len(hits)} match(es) for {args.query!r}"
        + (f"; showing {args.offset + 1}-{args.offset + len(page)}" if page else "")
    ]
    out += page
    if args.offset + len(page) < len(hits):
        out.append(f"(next page: offset={args.offset + len(page)})")
    if refused:
        out.append("refused (integrity check failed, not searched): " + "; ".join(refused))
    return ToolOutcome("\n".join(out))


def chapters_artifact(ctx: Context, args: ArtifactArgs) -> ToolOutcome:
    settings: ChaptersSettings = chapters.settings_of(ctx)
    where = Archive.of(ctx)
    registry = settle(ctx)
    root = registry.root_of(ctx.id)
    if args.artifact is None:
        if args.op != "toc":
            return ToolOutcome(f"chapters_artifact: op {args.op!r} needs an artifact handle", is_error=True)
        # a lineage's artifacts share one folder: list those this branch has seen, not a fork's
        seen = {h for r in registry.lineage_records(ctx.id) for h in r.get("artifacts", ()) if isinstance(h, str)}
        for node in ctx.surface:  # made on arrival, not archived yet
            seen.update(artifacts.HANDLE_ANYWHERE.findall(node.message.text))
        handles = [h for h in artifacts.list_handles(where, root) if h in seen]
        page = handles[args.offset : args.offset + (args.limit or 100)]
        return ToolOutcome(f"{len(handles)} artifact(s) in this session's lineage:\n" + "\n".join(page))
    handle = args.artifact.strip()
    try:
        check_name(handle)  # '..' and absolute paths are refused before anything else
        if not handle.startswith(f"{root}/"):
            return ToolOutcome(
                f"chapters_artifact refused: {handle!r} is not an artifact of this session's lineage ({root})",
                is_error=True,
            )
        text = artifacts.load(where, handle)
    except ArchiveError as exc:
        return ToolOutcome(f"chapters_artifact refused: {exc}", is_error=True)
    if args.op == "toc":
        return ToolOutcome(artifacts.toc(text))
    if args.op == "search":
        if not args.query:
            return ToolOutcome("chapters_artifact: op 'search' needs a query", is_error=True)
        return ToolOutcome(artifacts.search(text, args.query))
    return ToolOutcome(artifacts.page(text, args.offset, args.limit or settings.read_page_lines))


def _tool(name: str, description: str, params: type[ToolArgs], handler: Any) -> Any:
    return lambda: chapters.STRATEGY.tool(name, description, params, handler)


TOOLS = (
    _tool(
        "chapters_continue",
        "Archive this conversation as chapters and continue in a new session that starts from their table of "
        "contents and your handoff note; this session is left as it is.",
        ContinueArgs,
        chapters_continue,
    ),
    _tool(
        "chapters_fork",
        "Like chapters_continue with automatic chapters, but this session goes on and the new one is a branch.",
        ForkArgs,
        chapters_fork,
    ),
)
#: offered once there is something to read (``[tools] offer``): an archived chapter, an artifact,
#: or a parent's chapters in a continuation or fork
RECALL_TOOLS = (
    _tool("chapters_read", "Read an archived chapter, paged.", ReadArgs, chapters_read),
    _tool("chapters_search", "Search the archived chapters and their artifacts.", SearchArgs, chapters_search),
    _tool(
        "chapters_artifact",
        "Read a large tool output by its handle: toc (overview), search (query), read (lines from offset).",
        ArtifactArgs,
        chapters_artifact,
    ),
)

"""The ``chapters`` strategy: hooks and the automatic paths.

* pre_step: large new tool results become artifacts (before the request is composed); at
  ``compact_at_ratio`` the surface head is archived in place as chapters and replaced by a
  deterministic table of contents; at ``pressure_suggestion_ratio`` the model is told that
  ``chapters_continue`` is available.
* request_error: a context overflow archives in place harder, then asks for a retry.
* Tools (:mod:`ctxkernel_chapters.tools`): ``chapters_continue``, ``chapters_fork``,
  ``chapters_read``, ``chapters_search``, ``chapters_artifact``.

Per-session state lives in the strategy handle's ``state``, rebuilt from the log with a cursor and
restored from the session's snapshot (O(new events) per request and per open;
:mod:`ctxkernel_chapters.strategy`, shared with the tools); chapter records and lineage live in
the store's key-value table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ctxkernel
from ctxkernel import CompactionError, ContextOverflowError, Message, Span, Summary, get_logger, head_region
from ctxkernel.events import random_hex, utc_now

from . import archive, artifacts, cli, settle, toc
from .registry import Registry
from .segment import event_tokens, propose_for
from .settings import ChaptersSettings
from .storage import Archive, ArchiveError, check_name
from .strategy import (
    NAME,
    STRATEGY,
    SUGGEST_MARK,
    archive_ceiling,
    archived_through,
    instruction_of,
    is_chapters_toc,
    own_records,
    registry_of,
    settings_of,
    state,
    text_bound,
)
from .strategy import snapshot_state as folded_state

if TYPE_CHECKING:
    from ctxkernel import Context, ManualCompaction, ModelError, Profile, Request, StepContext

log = get_logger("ctxkernel.chapters")


@ctxkernel.hookimpl
def register_strategy(register: Any) -> None:
    register(STRATEGY.spec)


@ctxkernel.hookimpl
def register_commands(subparsers: Any) -> None:
    """``ctxkernel chapters manifest|segment``."""
    cli.register(subparsers)


@ctxkernel.hookimpl
def session_opened(ctx: Context) -> None:
    registry_of(ctx).ensure(ctx.id)
    settle.settle(ctx)  # chapters a crash left unwritten after their commit
    # the instructions that land from now on have their quotes counted at the step they start
    state(ctx).setdefault("quotes_cursor", len(ctx.events))


@ctxkernel.hookimpl
def snapshot_state(ctx: Context) -> ctxkernel.StrategySnapshot:
    return folded_state(ctx)


@ctxkernel.hookimpl
def register_tools(register: Any, ctx: Context) -> None:
    from .tools import RECALL_TOOLS, TOOLS

    for tool in TOOLS:
        register(tool())
    # composed in full (the header guard, validate, a framework's up-front tool list) the answer
    # does not depend on the archive, which is then not read
    if STRATEGY.on(ctx).offer_tools(ctx.header_in_full or has_archive(ctx)):
        for tool in RECALL_TOOLS:
            register(tool())


def has_archive(ctx: Context) -> bool:
    """Whether the recall tools have something to read: this session archived chapters in place
    or moved a result to an artifact (either hides something), or it continues a parent's
    chapters (its registry record names the parent before its log exists, and never changes).
    A parent that wrote chapters for a continuation or fork still shows all they hold: its
    header stays as it was, so every process composes the same one from the log."""
    if ctx.surface.hides_anything():
        return True
    record = registry_of(ctx).state(ctx.id)  # a read: a probe session gets no record
    return record is not None and record.get("parent") is not None


@ctxkernel.hookimpl
def system_prompt(ctx: Context) -> str | None:
    prompt = (
        "Context management (chapters): earlier parts of this conversation may be archived as Markdown "
        "chapters listed in a table of contents. When told that a continuation is available, you may call "
        "chapters_continue at a good stopping point to go on in a fresh session."
    )
    if STRATEGY.on(ctx).tools_offered:
        prompt += " chapters_read and chapters_search read the chapters; chapters_artifact reads large tool outputs by handle."
    return prompt


# -- pre_step -----------------------------------------------------------------------------------
@ctxkernel.hookimpl
def pre_step(ctx: Context, step: StepContext) -> None:
    settings = settings_of(ctx)
    settle.settle(ctx)  # the last step's in-place compaction: its files and records
    st = state(ctx)
    count_new_quotes(ctx, st)
    if step.attempt == 0:
        # a new request: ``overflow_retries`` counts the attempts of one request, so a streak an
        # earlier request left (its overflow path found nothing to archive) must not refuse this
        # request's first overflow
        st["overflow_streak"] = 0
    move_large_results(ctx, settings, st)
    if ctx.route is None:
        return  # the first step of a fresh session has no routed request to price against
    pressure = ctx.pressure()
    if settings.auto and pressure.ratio >= settings.compact_at_ratio:
        compact_in_place(ctx, int(settings.retain_ratio * pressure.effective_window), reason="pressure")
        pressure = ctx.pressure()
        state(ctx)
    if (
        pressure.ratio >= settings.pressure_suggestion_ratio
        and not st["suggested"]
        and archive_ceiling(ctx) is not None
    ):
        STRATEGY.on(ctx).remind(step, suggestion(ctx, settings, pressure.ratio))
        st["suggested"] = True  # the notice is written right after; state() would see it too


def suggestion(ctx: Context, settings: ChaptersSettings, ratio: float) -> str:
    ceiling = archive_ceiling(ctx)
    floor = archived_through(ctx) + 1
    return (
        f"{SUGGEST_MARK} The context is {ratio:.0%} full. You can continue this work in a fresh session: "
        f"call chapters_continue with a title, a handoff note (what is in progress, decisions held, the next "
        f"step) and chapter ranges covering events {floor}..{ceiling} (ascending, no gaps or overlaps). "
        f"At {settings.compact_at_ratio:.0%} the oldest part is archived in place automatically."
    )


def move_large_results(ctx: Context, settings: ChaptersSettings, st: dict[str, Any]) -> list[int]:
    """Move tool results above the artifact band into the store, replacing each with a handle,
    when they arrive under pressure: the request they would join is at least
    ``pressure_suggestion_ratio`` of the window. Below it nothing is pruned (a result that leaves
    the window roomy stays inline; the in-place archive takes it later if the window fills)."""
    candidates, st["candidates"] = st["candidates"], []
    if not candidates or ctx.pressure().ratio < settings.pressure_suggestion_ratio:
        return []
    threshold = settings.artifact_threshold(ctx.model.effective_window)
    moved = []
    registry = registry_of(ctx)
    at_most = text_bound(ctx)
    for seq in candidates:
        if seq in st["artifact_done"]:
            continue
        node = ctx.surface.node(seq)
        if node is None or node.role != "tool":
            continue
        content = node.message.tool_result.content  # type: ignore[union-attr]
        # the meter's count of the node (cached: it counted the node when it became visible). Not
        # its characters: one character may be several tokens (a rare CJK character is 3-4)
        tokens = ctx.meter.node_tokens(node)
        if tokens <= threshold:
            continue
        root = registry.root_of(ctx.id)
        handle = artifacts.handle_for(root, hashlib.sha256(content.encode("utf-8")).hexdigest())
        # the preview stays well inside the band, and a handle that would not save tokens (a tiny
        # window) leaves the result where it is
        text = artifact_handle_text(handle, content, tokens, min(settings.artifact_preview_chars, threshold // 2))
        fits = at_most is not None and at_most(text) < tokens  # counted only when its bytes do not prove it
        if not fits and ctx.meter.count_text(text) >= tokens:
            continue
        artifacts.store(Archive.of(ctx), root, content)
        STRATEGY.on(ctx).replace_tool_result(seq, text, reason="artifact")
        st["artifact_done"].add(seq)
        moved.append(seq)
    return moved


def artifact_handle_text(handle: str, content: str, tokens: int, preview_chars: int) -> str:
    lines = content.count("\n") + 1
    preview = content[:preview_chars]
    cut = "…" if len(content) > preview_chars else ""
    return (
        f"[artifact {handle}: {tokens} tokens, {lines} lines, {len(content)} chars; moved out of the context. "
        f'Read it with chapters_artifact(artifact="{handle}", op="toc"|"search"|"read").]\n'
        f"Preview:\n{preview}{cut}"
    )


# -- in-place compaction ---------------------------------------------------------------------------
#: planning tokens of a line the renderer writes for an event that carries no message text
#: (``### Turn N``) and of a tool result deferred to an artifact (handle and 200-character preview)
TURN_LINE_TOKENS = 6
ARTIFACT_LINE_TOKENS = 90
#: the events a chapter renders from their message (render.render_event)
PROSE_EVENTS = frozenset({"user/message", "assistant/message", "tool/result"})


def compact_in_place(ctx: Context, keep_tokens: int, *, reason: str) -> bool:
    """Archive the surface head as chapters and replace it with a table of contents.

    Zero model tokens and one durable write: the kernel's commit, whose event carries the
    chapter plan. The chapter files and registry records are rendered from the log and written
    after the commit point (:mod:`ctxkernel_chapters.settle`), so a refused attempt writes
    nothing at all. Retries (a smaller verbatim tail each time) reuse the same chapter numbers,
    reserved in memory and given back unless a commit used them.
    """
    settings = settings_of(ctx)
    registry = registry_of(ctx)
    root = ""
    plan_id = random_hex(16)
    numbers: list[int] = []
    used = 0
    try:
        for attempt in range(settings.compaction_retries + 1):
            region = head_region(ctx.surface, ctx.meter, keep_tokens, min_nodes=2)
            if region is None:
                return False
            stored = registry.ensure(ctx.id)  # one read: the lineage root and the settled chapters' reach
            root, settled = stored["root"], stored.get("archived_through", -1)
            nodes = ctx.surface.span(*region)
            tail = ctx.surface.nodes[len(nodes) :]
            later = [n.seq for n in tail if not is_chapters_toc(n)]
            boundary = (min(later) - 1) if later else len(ctx.events) - 1
            floor = archived_through(ctx, stored=settled) + 1
            view = planning_view(ctx, floor, boundary, settings.tool_result_defer_floor_tokens, nodes)
            plans = propose_for(ctx, settings, floor, boundary, tokens=view.tokens, message_of=view.message_of)
            if len(numbers) < len(plans):
                numbers += registry.reserve(root, len(plans) - len(numbers))
            created = utc_now()
            planned = [settle.planned_record(n, p, created) for n, p in zip(numbers, plans, strict=False)]
            records = [
                {**r, "id": f"{ctx.id}/{r['number']}", "path": archive.chapter_path(root, r["number"], r["title"])}
                for r in planned
            ]
            region_tokens = ctx.meter.nodes_tokens(nodes)
            # the archived events are floor..boundary, the chapters' too: the view's instructions
            text = toc_for_region(
                ctx, settings, nodes, records, boundary, region_tokens, instructions=view.instructions, mark=settled
            )
            message = Message.user(text, STRATEGY.source("toc"))
            try:
                STRATEGY.on(ctx).compact(
                    Span(region[0], region[1], message=message, summary=Summary(text)),
                    kind="chapters",
                    single_batch=True,  # the replacement is given: lock and commit in one write
                    data={
                        "reason": reason,
                        "attempt": attempt,
                        "plan": plan_id,
                        "chapters": [r["id"] for r in records],
                        "archive": {"from": floor, "through": boundary},
                        "root": root,
                        "floor_tokens": settings.tool_result_defer_floor_tokens,
                        "records": planned,
                    },
                )
            except CompactionError as exc:
                log.warning("chapters compaction failed", session=ctx.id, attempt=attempt, error=str(exc))
                keep_tokens //= 2  # a smaller tail leaves more to archive: more likely to shrink
                continue
            used = len(plans)
            return True
        return False
    finally:
        if not used:  # a hook may raise after the commit: the log says whether it happened
            used = committed_chapters(ctx, plan_id)
        if root:
            registry.unreserve(root, numbers[used:])


def committed_records(ctx: Context) -> list[dict[str, Any]]:
    """Records (as a table of contents cites them) of this session's committed, unsettled
    chapters; a plan the log spoils is left out (the settle reports it)."""
    out = []
    for data in state(ctx)["unsettled"]:
        try:
            plan = settle.checked(ctx, data)
        except ValueError:
            continue
        for r in plan.records:
            path = archive.chapter_path(plan.root, r.number, r.title)
            out.append({**r.model_dump(), "id": f"{ctx.id}/{r.number}", "path": path})
    return out


def committed_chapters(ctx: Context, plan_id: str) -> int:
    """How many chapters the commit of plan ``plan_id`` holds (0 when it never committed)."""
    ctx.refresh()
    for event in reversed(ctx.events):
        if event.type == "compaction/summary" and event.data.get("plan") == plan_id:
            return len(event.data.get("chapters", []))
    return 0


@dataclass(frozen=True)
class PlanningView:
    """What segmenting and the table of contents need of events ``start..end``, from one pass."""

    tokens: list[int]  # planning tokens per event
    message_of: Callable[[Any], Message]  # the parsed message of a message event
    instructions: list[str]  # the user's own messages, in order (strategy.user_instructions)


def planning_view(ctx: Context, start: int, end: int, floor_tokens: int, nodes: list[Any]) -> PlanningView:
    """Per-event planning tokens for events ``start..end``, a message lookup and the user's
    instructions, in one pass, from what the surface already holds: a visible message (among
    ``nodes``, the region being archived, which holds every visible message up to ``end``) costs
    what the meter counted for it (cached per node), so segmentation neither renders nor
    tokenizes it; a result above the defer floor costs its artifact line. Replacements and
    events no longer visible are rendered and counted exactly (a replacement renders as a
    one-line note, not as its text)."""
    meter = ctx.meter
    visible = {n.seq: n for n in nodes if start <= n.seq <= end and n.event.surface.get("op") == "append"}
    out: list[int] = []
    instructions = []
    node_of = visible.get
    for event in ctx.events[max(0, start) : end + 1]:
        etype = event.type
        if etype == "user/message":
            instruction = instruction_of(event)
            if instruction is not None:
                instructions.append(instruction)
        node = node_of(event.seq)
        if node is not None:
            n = node.tokens  # counted when the node became visible (counted now when it was not)
            if n is None:
                n = meter.node_tokens(node)
            out.append(ARTIFACT_LINE_TOKENS if n > floor_tokens and etype == "tool/result" else n)
        elif etype == "turn/start":
            out.append(TURN_LINE_TOKENS)
        elif etype not in PROSE_EVENTS:
            out.append(0)  # the renderer writes nothing for it
        else:
            out += event_tokens(ctx.events, event.seq, event.seq, count=meter.count_text, floor_tokens=floor_tokens)

    def message_of(event: Any) -> Message:
        node = visible.get(event.seq)
        return node.message if node is not None else Message.from_dict(event.data["message"])

    return PlanningView(out, message_of, instructions)


def toc_for_region(
    ctx: Context,
    settings: ChaptersSettings,
    nodes: list[Any],
    records: list[dict[str, Any]],
    boundary: int,
    region_tokens: int,
    *,
    instructions: list[str],
    mark: int,
) -> str:
    """Earlier tables of contents in the region merged with this session's chapters up to
    ``boundary``; ``instructions`` are the user's messages among the archived events and
    ``mark`` the registry's ``archived_through`` as just read."""
    region = read_region(ctx, nodes)
    previous, extra = region.tocs, list(region.carried)
    own = [r for r in own_records(ctx, mark=mark) if r.get("status") == "final" and r["start_seq"] <= boundary]
    # committed chapters whose files are not written yet: rendered from the log when they are,
    # so there is nothing to verify
    unwritten = [r for r in committed_records(ctx) if r["start_seq"] <= boundary]
    cited: dict[str, str] = {}
    for text in previous:
        cited.update(toc.parse(text).bullets)
    folds = toc.fold_ranges(cited)
    label = archive.archive_label(settings)

    def listed(record: dict[str, Any]) -> bool:
        # cited by an earlier table of contents, as a bullet or inside a folded line: it was
        # verified when first cited, and a folded one is not cited again (toc.merged skips it),
        # so only new chapters are read back (reading them all made each compaction O(chapters))
        key = f"{label}/{record['path']}"
        return key in cited or toc.in_fold(folds, key, record["number"])

    fresh = [r for r in own if not listed(r)]
    checked, refused = archive.verified(Archive.of(ctx), fresh)
    own = [r for r in own if listed(r)] + checked + unwritten
    extra += [f"Not cited (integrity check failed): {reason}" for _, reason in refused]
    merged = toc.merged(previous, [*own, *records], archive.archive_label(settings), extra, instructions=instructions)
    # the kernel pins the instructions it protects in its own block: quoting them here too showed
    # them twice (the table of contents keeps the older ones the kernel's budget leaves out)
    pinned = {" ".join(text.split()) for text in STRATEGY.on(ctx).pinned_instructions()}
    merged.instructions = [text for text in merged.instructions if " ".join(text.split()) not in pinned]
    # the table of contents must cost less than the region it replaces (the shrink check): in a
    # small window the oldest bullets give up their summaries first (the manifest keeps them)
    budget = min(settings.toc_bullet_budget_tokens, max(50, region_tokens // 3))
    quoted = min(settings.toc_instruction_budget_tokens, region_tokens // 3)
    st = state(ctx)
    kept_pieces: dict[str, str] = st.get("quote_pieces", {})

    def quote(instruction: str) -> str:
        piece = kept_pieces.get(instruction)
        return toc.quote_piece(instruction) if piece is None else piece

    pieces, _ = toc.render_pieces(
        merged, count=region.count, bullet_budget=budget, instruction_budget=quoted, at_most=region.at_most, quote=quote
    )
    if sum(map(len, pieces)) >= TOC_COUNTED_FROM_PIECES_CHARS:
        count_toc(ctx.meter, pieces, st.get("quote_counts", {}))
    return "".join(pieces)


#: a table of contents this long is counted from its pieces before the transaction counts it: the
#: meter remembers a whole it counted from parts from this length on (its memo, 2,000 characters),
#: so the transaction's count is a lookup; a shorter one the transaction tokenises anyway (cheap)
TOC_COUNTED_FROM_PIECES_CHARS = 2_000
#: quoted instructions whose counts a session keeps (:func:`count_new_quotes`), and the longest
#: instruction kept (the user's text is kept as the key: bounded, however much a user pastes); any
#: other quote is counted when a table of contents cites it
QUOTE_COUNTS_KEPT = 1024
QUOTE_KEPT_MAX_CHARS = 4_000


def count_new_quotes(ctx: Context, st: dict[str, Any]) -> None:
    """Count the table-of-contents quote (:func:`toc.quote_piece`) of each user instruction that
    landed since the last step, once, and keep it in this process's state: a table of contents
    quotes every archived instruction, and counting it from these pieces tokenises only its head,
    its last quote and its end (:func:`count_toc`). Instructions from before this process opened
    the session are not counted here (an open stays O(new events)): a compaction counts them."""
    events = ctx.events
    start = st.setdefault("quotes_cursor", len(events))  # session_opened sets it
    if start >= len(events):
        return
    kept: dict[str, int] = st.setdefault("quote_counts", {})
    pieces: dict[str, str] = st.setdefault("quote_pieces", {})  # the instruction (stripped) -> its quote
    count = ctx.meter.count_text
    for event in events[start:]:
        instruction = instruction_of(event)
        if instruction is None or len(instruction) > QUOTE_KEPT_MAX_CHARS:
            continue
        instruction = instruction.strip()  # as a table of contents holds it (toc.Toc.instruct)
        if not instruction:
            continue
        piece = pieces.get(instruction)
        if piece is None:
            if len(pieces) >= QUOTE_COUNTS_KEPT:
                del pieces[next(iter(pieces))]  # the oldest
            piece = pieces[instruction] = toc.quote_piece(instruction)
        if piece not in kept:
            if len(kept) >= QUOTE_COUNTS_KEPT:
                del kept[next(iter(kept))]  # the oldest
            kept[piece] = count(piece)
    st["quotes_cursor"] = len(events)


def count_toc(meter: Any, pieces: list[str], kept: dict[str, int]) -> int:
    """Tokens of ``"".join(pieces)`` (a table of contents from :func:`toc.render_pieces`),
    exactly: a piece whose count ``kept`` holds (a quote counted when its instruction landed,
    :func:`count_new_quotes`) is added, the others are tokenised (adjacent ones together).
    ``count_joined`` adds a count only across a cut it proves exact and remembers the whole, so
    the transaction's count of the same text is a lookup."""
    parts: list[str] = []
    counts: list[int | None] = []
    head = pieces[0] if pieces else ""
    if len(head) > len(toc.FIXED_HEAD) and head.startswith(toc.FIXED_HEAD):
        # the fixed start (the same in every table of contents) is counted once per process; the
        # cut after it, a newline before the first bullet, is exact (count_joined checks it)
        parts.append(toc.FIXED_HEAD)
        counts.append(meter.count_fixed(toc.FIXED_HEAD))
        pieces = [head[len(toc.FIXED_HEAD) :], *pieces[1:]]
    for piece in pieces:
        known = kept.get(piece)
        if known is None and parts and counts[-1] is None:
            parts[-1] += piece  # unknown pieces in a row: one tokenising
            continue
        parts.append(piece)
        counts.append(known)
    return int(meter.count_joined(parts, counts))


@dataclass(frozen=True)
class RegionText:
    """What the table of contents takes from the nodes it replaces, read in one pass."""

    tocs: list[str]  # earlier tables of contents: their bullets are merged
    carried: list[str]  # prose another strategy's checkpoint carried (a summary): never dropped
    count: Callable[[str], int]  # count_text that knows the user's messages among the nodes
    at_most: toc.AtMost | None  # an upper bound of count without tokenising (None: the tokenizer has none)


def read_region(ctx: Context, nodes: list[Any]) -> RegionText:
    """One pass over the region's nodes. ``count`` knows the user's messages already: the meter
    counted each when it became visible, so quoting them in the table of contents costs no
    tokenizing."""
    meter = ctx.meter
    tocs: list[str] = []
    carried: list[str] = []
    users: list[Any] = []  # the user's own messages: counted only when a quote needs their count
    for node in nodes:
        message = node.message
        if message.role != "user":
            continue
        kind = message.source.kind
        if kind == "user":
            users.append(node)
        elif is_chapters_toc(node):
            tocs.append(message.text)
        elif kind == "plugin" and node.event.surface.get("op") == "replace":
            carried.append(message.text)
    known: dict[str, int] | None = None

    def count(text: str) -> int:
        nonlocal known
        if known is None:  # the first quote that does not fit by its bytes
            known = {}
            overhead = meter.count_message(Message.user(""))  # a message's framing, beyond its text
            for node in users:
                content = node.message.content
                if all(b.type == "text" for b in content):
                    whole = "\n".join(b.text for b in content)
                    if whole == whole.strip():  # the table of contents quotes it stripped
                        known[whole] = meter.node_tokens(node) - overhead
        cached = known.get(text)
        return meter.count_text(text) if cached is None else cached

    return RegionText(tocs, carried, count, text_bound(ctx))


@ctxkernel.hookimpl
def compact_now(ctx: Context, request: ManualCompaction) -> ctxkernel.ManualOutcome | None:
    """The seed's manual path: ``compact`` continues in a new session now (the archivable events
    become chapters, the child opens with their table of contents); ``archive`` archives the head
    in place, keeping ``retain_ratio`` of the window verbatim."""
    from .tools import ContinueArgs, chapters_continue, deterministic_continuation

    settings = settings_of(ctx)
    if request.action == "archive":
        keep = int(settings.retain_ratio * ctx.pressure().effective_window)
        if compact_in_place(ctx, keep, reason="manual"):
            return ctxkernel.ManualOutcome(True, f"archived the head as chapters, keeping about {keep} tokens verbatim")
        return ctxkernel.ManualOutcome(False, f"nothing to archive beyond the verbatim tail of {keep} tokens")
    if request.action != "compact":
        return None
    arguments = deterministic_continuation(ctx, settings)
    if arguments is None:
        return ctxkernel.ManualOutcome(
            False,
            "no continuation now: nothing archivable yet (a completed turn is needed), or it would be over budget",
        )
    outcome = chapters_continue(ctx, ContinueArgs.model_validate(arguments))
    if outcome.is_error:
        return ctxkernel.ManualOutcome(False, outcome.content)
    return ctxkernel.ManualOutcome(
        True, f"continued in session {outcome.continue_in}; this session is left as it was", None, outcome.continue_in
    )


@ctxkernel.hookimpl
def request_error(ctx: Context, error: ModelError) -> bool | None:
    if not isinstance(error, ContextOverflowError):
        return None
    settings = settings_of(ctx)
    st = state(ctx)
    if st["overflow_streak"] >= settings.overflow_retries:
        st["overflow_streak"] = 0
        return False
    st["overflow_streak"] += 1
    move_large_results(ctx, settings, st)
    before = ctx.meter.surface_tokens()
    keep = int(settings.retain_ratio * ctx.pressure().effective_window) // 2
    compact_in_place(ctx, keep, reason="overflow")
    return ctx.meter.surface_tokens() < before


@ctxkernel.hookimpl
def commit(ctx: Context, result: Any) -> None:
    if result.strategy == NAME:
        st = state(ctx)
        st["overflow_streak"] = 0


@ctxkernel.hookimpl
def project(ctx: Context) -> dict[str, Any] | None:
    settings = settings_of(ctx)
    registry = settle.settle(ctx)
    sstate = registry.ensure(ctx.id)
    st = state(ctx)
    window = ctx.model.effective_window
    return {
        "root": sstate["root"],
        "parent": sstate["parent"],
        "chapters": len([r for r in registry.records(ctx.id) if r.get("status") == "final"]),
        "lineage_chapters": len(registry.lineage_records(ctx.id)),
        "archived_through": archived_through(ctx, registry),
        "archive_ceiling": archive_ceiling(ctx),
        "artifacts_moved": len(st["artifact_done"]),
        "artifact_threshold_tokens": settings.artifact_threshold(window),
        "compactions": st["compactions"],
        "suggested": st["suggested"],
        "archive": archive.archive_label(settings),
        "toc": _toc(ctx, settings, registry),
    }


#: chapters listed in the ``project`` panel at most (the newest are kept)
PANEL_ROWS = 200


def _toc(ctx: Context, settings: Any, registry: Registry) -> list[dict[str, Any]]:
    """The lineage's final chapters, each with the state of its file against the recorded sha256."""
    records = registry.lineage_records(ctx.id)[-PANEL_ROWS:]
    _, bad = archive.verified(Archive.of(ctx), records)
    problems = {r["id"]: reason for r, reason in bad}
    keys = ("id", "number", "title", "start_seq", "end_seq", "tokens", "path", "author_session")
    return [{**{k: r.get(k) for k in keys}, "hash": problems.get(r["id"], "ok")} for r in records]


@ctxkernel.hookimpl
def export_files(ctx: Context) -> dict[str, bytes] | None:
    """The lineage's chapter files and artifacts as the seed lays them out:
    ``<archive_root>/<root>/chapters/NNN-slug.md`` and ``<archive_root>/<root>/artifacts/<sha256>.txt``."""
    root = settle.settle(ctx).root_of(ctx.id)
    blobs = STRATEGY.on(ctx).blobs
    label = archive.archive_label(settings_of(ctx))
    files = {}
    for info in blobs.list(f"{root}/"):
        data = blobs.get(info.key)
        if data is not None:  # deleted since the listing (a failed compaction's file)
            files[f"{label}/{info.key}"] = data
    return files or None


# -- simulation ------------------------------------------------------------------------------------
@ctxkernel.hookimpl
def steward_actions(ctx: Context, request: Request) -> list[dict[str, Any]] | None:
    """At the suggestion, a steward calls ``chapters_continue`` with the segmentation's ranges and a
    handoff note built from the in-flight turn; the simulator follows ``continue_in`` into the child.
    With ``steward = "compact"`` (or when nothing can be archived yet) it leaves the work to the
    in-place compaction at ``compact_at_ratio``."""
    settings = settings_of(ctx)
    st = state(ctx)
    if settings.steward != "continue" or st["continued_in"] is not None:
        return None
    if request.pressure.ratio < settings.pressure_suggestion_ratio or not st["suggested"]:
        return None
    ceiling = archive_ceiling(ctx)
    if ceiling is None or st.get("steward_tried") == ceiling:
        return None  # one dry run per completed turn: the answer only changes when the ceiling moves
    st["steward_tried"] = ceiling
    from .tools import deterministic_continuation

    arguments = deterministic_continuation(ctx, settings, request.messages)  # what the model sees
    if arguments is None:
        return None
    return [{"name": "chapters_continue", "arguments": arguments}]


# -- profile validation ---------------------------------------------------------------------------
@ctxkernel.hookimpl
def validate_profile(profile: Profile, report: Any) -> None:
    checks = STRATEGY.validating(profile, report)
    if checks is None:
        return
    variants = [(f"{profile.model.provider}/{profile.model.name}", profile.model.provider, profile.model.name)]
    for policy in profile.model_policies:
        provider = policy.match.provider or profile.model.provider
        name = policy.match.name or profile.model.name
        variants.append((f"{provider}/{name}", provider, name))
    problems = 0
    checked_roots = set()
    for label, provider, name in variants:
        try:
            settings = STRATEGY.settings_for(profile, provider, name)
            model = profile.model_for(provider, name)
        except Exception:  # the kernel's settings check reports these
            continue
        effective = model.effective_window
        if settings.archive_root not in checked_roots:
            checked_roots.add(settings.archive_root)
            try:
                check_name(settings.archive_root)
            except ArchiveError as exc:
                problems += 1
                checks.fail(
                    "strategy",
                    f"archive_root {settings.archive_root!r} is not a relative folder name ({exc}). Chapters are "
                    "stored in the store; archive_root names the folder they are shown under and exported to "
                    "(ctxkernel export). Fix: set [strategies.chapters] archive_root to a name such as 'chapters'",
                )
            else:
                checks.ok("strategy", f"chapters are stored in the {profile.store.backend} store's blobs")
        threshold = settings.artifact_threshold(effective)
        retain = int(settings.retain_ratio * effective)
        limits = [
            (
                settings.chapter_token_target >= effective,
                f"chapter_token_target {settings.chapter_token_target} is not below the effective window {effective} of {label}. Fix: lower chapter_token_target in a model policy",
            ),
            (
                settings.toc_bullet_budget_tokens > settings.continuation_budget_ratio * effective,
                f"toc_bullet_budget_tokens {settings.toc_bullet_budget_tokens} exceeds the continuation budget "
                f"({settings.continuation_budget_ratio} x {effective} = {int(settings.continuation_budget_ratio * effective)}) of {label}: "
                "a table of contents could never fit. Fix: lower toc_bullet_budget_tokens or raise continuation_budget_ratio",
            ),
            (
                threshold + retain >= int(settings.compact_at_ratio * effective),
                f"the artifact band ({threshold} tokens) plus the kept tail ({retain}) reach compact_at_ratio of the window "
                f"{effective} of {label}: one result could force a compaction that cannot shrink. Fix: lower tool_result_artifact_tokens or retain_ratio",
            ),
        ]
        for failed, message in limits:
            if failed:
                problems += 1
                checks.fail("budgets", message)
    if not problems:
        checks.ok("budgets", "chapter, table-of-contents, artifact and retain budgets fit every model window")

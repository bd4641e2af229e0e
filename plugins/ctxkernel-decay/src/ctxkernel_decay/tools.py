"""The ``compress`` and ``drop`` tools.

Every check runs before any event is written, so a refusal leaves the log byte-identical:
anchor parsing, resolution by identity, the current-turn rule (with clipping), tool-group
edges, overlaps, count and length limits, the shrink check and the optional cost guard. Only
then do all spans of one call commit in a single kernel compaction transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ctxkernel import MAX_INT_ARG, Message, Span, Tool, ToolArgs, ToolOutcome
from ctxkernel.events import TURN_START

from .anchors import describe_visible, fmt, parse_anchor, strip_anchors
from .state import BLOCK_FORM, Block
from .strategy import STRATEGY, current_state, settings_of

if TYPE_CHECKING:
    from ctxkernel import Context

    from .state import DecayState
    from .strategy import DecaySettings

COMPRESS_DESCRIPTION = (
    "Replace old messages with your summary. Anchors ⟦pN⟧ mark messages (ids, not order); a summary "
    "block shows its left and right anchors. A span covers `from` through `to`. Keep each tool call with "
    "its results; the current turn stays. Summaries must stand alone (paths, decisions, errors, open "
    "tasks). Pass all spans in one call."
)
DROP_DESCRIPTION = "Remove a summary block by its exact left and right anchors."


def _compact_schema(schema: dict[str, Any]) -> None:
    """Tool schemas are sent with every request: drop generated titles and write unions as
    type lists, which says the same in fewer tokens."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
        prop.pop("default", None)
        variants = prop.pop("anyOf", None)
        if variants is not None:
            types = [v["type"] for v in variants if v.get("type") != "null"]
            prop["type"] = types[0] if len(types) == 1 else types
            for variant in variants:  # bounds are type-specific keywords: they merge without clashing
                prop.update({k: v for k, v in variant.items() if k != "type"})


_SCHEMA = ConfigDict(
    extra="forbid", populate_by_name=True, json_schema_extra=lambda schema, _cls: _compact_schema(schema)
)


#: hard caps of the schema; the profile's settings (``summary_max_chars`` ≤ this, ``max_spans``
#: ≤ 64, ``topic_max_chars``) refuse or clip further inside them
SUMMARY_CHARS_CAP = 100_000
TOPIC_CHARS_CAP = 1_000
SPANS_CAP = 64
#: an anchor as text ("⟦p12⟧", "p12", "12") or as a number
Anchor = Annotated[StrictStr, Field(max_length=32)] | Annotated[StrictInt, Field(ge=1, le=MAX_INT_ARG)]


class SpanArg(BaseModel):
    model_config = _SCHEMA

    from_: Anchor = Field(alias="from", description="first anchor, e.g. ⟦p12⟧")
    to: Anchor = Field(description="last anchor, inclusive")
    summary: str = Field(max_length=SUMMARY_CHARS_CAP)
    topic: str | None = Field(default=None, max_length=TOPIC_CHARS_CAP)


class CompressArgs(ToolArgs):
    model_config = _SCHEMA

    spans: list[SpanArg] = Field(max_length=SPANS_CAP)


class DropArgs(ToolArgs):
    model_config = _SCHEMA

    left: Anchor
    right: Anchor


class Refusal(Exception):
    """A tool refusal: the message is returned to the model; nothing was written."""


@dataclass
class Planned:
    start: int  # surface positions, inclusive
    end: int
    summary: str
    topic: str | None
    clipped: bool = False


def protected_start(ctx: Context, *, planning: bool = False) -> int:
    """Surface position where the current turn begins; nothing from there on is compressed
    (seed §7). While a turn is open that is the first node holding anything of it: its user
    instruction, every step since, and a foreign compaction (the guard's ``basic`` summary) that
    summarised part of it (issue #15: after one tool step the turn's own instruction was
    compressible). Otherwise, the assistant turn in progress (the newest assistant message; when
    ``planning`` a call that is not yet appended) plus the user-authored message(s) right before
    it that it answers."""
    nodes = ctx.surface.nodes
    start = len(nodes)
    if not planning:
        for i in range(len(nodes) - 1, -1, -1):
            if nodes[i].role == "assistant":
                start = i
                break
    while start > 0 and nodes[start - 1].role == "user" and nodes[start - 1].message.source.kind == "user":
        start -= 1
    if ctx.turn_open:
        start = min(start, open_turn_start(ctx))
    return start


def open_turn_start(ctx: Context) -> int:
    """First surface position whose node holds content of the open turn: a message appended
    since its ``turn/start``, or a replacement (written since then) of anything that does. The
    turn's own appends are the surface's tail; a replacement of part of them may sit anywhere
    before it."""
    events = ctx.events
    holder = STRATEGY.on(ctx).state
    # [turn, turn/start seq, {replacement seq: holds the open turn}]: one backward scan per turn
    found: list[Any] | None = holder.get("open_turn")
    if found is None or found[0] != ctx.turn:
        turn_start = next((e.seq for e in reversed(events) if e.type == TURN_START), -1)
        found = holder["open_turn"] = [ctx.turn, turn_start, {}]
    turn_start, memo = found[1], found[2]

    def holds(seq: int) -> bool:
        if seq <= turn_start:
            return False  # written before the turn opened: it can only hold earlier content
        if seq not in memo:
            op = events[seq].surface or {}
            memo[seq] = op.get("op") == "append" or any(holds(c) for c in op.get("cites", ()))
        result: bool = memo[seq]
        return result

    nodes = ctx.surface.nodes
    for i, node in enumerate(nodes):
        seq = node.seq
        if seq > turn_start and holds(seq):  # a node written before the turn opened holds none of it
            return i
    return len(nodes)


def compressible_range(state: DecayState, ctx: Context, protect: int) -> tuple[int, int] | None:
    """The first and last anchors a span may name: the anchored nodes before ``protect`` (the
    last one's right edge when it is a block). None when nothing before the turn is anchored."""
    nodes = ctx.surface.nodes[:protect]
    first = next((state.anchor_of[n.seq] for n in nodes if n.seq in state.anchor_of), None)
    last_node = next((n for n in reversed(nodes) if n.seq in state.anchor_of), None)
    if first is None or last_node is None:
        return None
    return first, state.right_of(last_node.seq) or state.anchor_of[last_node.seq]


def describe_compressible(state: DecayState, ctx: Context, protect: int) -> str:
    """The accepted range in words, for refusals and reminders."""
    span = compressible_range(state, ctx, protect)
    turn = first_anchor_at_or_after(state, ctx, protect)
    kept = f"the current turn (from {fmt(turn)}) stays verbatim" if turn else "the current turn stays verbatim"
    if span is None:
        return f"nothing before the current turn is left to compress; {kept}"
    return f"compressible: {fmt(span[0])} through {fmt(span[1])}; {kept}"


def first_anchor_at_or_after(state: DecayState, ctx: Context, position: int) -> int | None:
    for node in ctx.surface.nodes[position:]:
        pid = state.anchor_of.get(node.seq)
        if pid is not None:
            return pid
    return None


def describe_group(state: DecayState, ctx: Context, cut: int) -> str:
    """Name the tool-call group an unbalanced cut falls into, by its edge anchors."""
    nodes = ctx.surface.nodes
    surface = ctx.surface
    node = nodes[cut] if cut < len(nodes) else nodes[-1]
    owner_seq = None
    if node.role == "tool":
        owner_seq = surface.call_owner.get(node.message.content[0].call_id)  # type: ignore[union-attr]
    if owner_seq is None:  # a pending call before the cut
        owner_seq = next(iter(surface.pending_calls.values()), None)
    if owner_seq is None:
        return "a tool-call group"
    a = surface.position(owner_seq) or 0
    b = a
    while b + 1 < len(nodes) and nodes[b + 1].role == "tool":
        b += 1
    owner = nodes[a]
    names = ", ".join(c.name for c in owner.message.tool_calls)
    pid = state.anchor_of.get(owner.seq)
    if pid is not None:
        begin = f"starts at {fmt(pid)}"
    else:
        before = next((state.anchor_of[n.seq] for n in reversed(nodes[:a]) if n.seq in state.anchor_of), None)
        begin = "starts at the unanchored tool-call turn" + (
            f" right after {fmt(before)}" if before else " at the head"
        )
    last = state.anchor_of.get(nodes[b].seq)
    end = f"its last result is {fmt(last)}" if last is not None else "its results are pending"
    after = next(
        (
            state.anchor_of[n.seq]
            for k, n in enumerate(nodes[b + 1 :], b + 1)
            if n.seq in state.anchor_of and surface.is_balanced_cut(k)
        ),
        None,
    )
    hint = f"; the next anchor outside any group is {fmt(after)}" if after is not None else ""
    return f"the tool-call group ({names}) that {begin}; {end}{hint}"


def _resolve(state: DecayState, ctx: Context, value: object, what: str, index: int) -> int:
    """Surface position of the node an anchor argument names (by identity)."""

    def visible() -> str:
        return describe_visible(state, ctx.surface.seqs())

    pid = parse_anchor(value)
    if pid is None:
        msg = f'span {index} `{what}` = {value!r} is not an anchor; write it as "⟦p12⟧", "p12" or 12. Visible anchors: {visible()}'
        raise Refusal(msg)
    seq = state.resolve(pid)
    position = ctx.surface.position(seq) if seq is not None else None
    if position is None:
        msg = (
            f"span {index} `{what}` {fmt(pid)} is stale or unknown (it is not on the current context); "
            f"use the anchors of the latest request. Visible anchors: {visible()}"
        )
        raise Refusal(msg)
    return position


def plan_compress(ctx: Context, state: DecayState, settings: DecaySettings, args: CompressArgs) -> list[Planned]:
    """Validate a compress call; returns the spans to commit or raises :class:`Refusal`."""
    if not 1 <= len(args.spans) <= settings.max_spans:
        msg = f"compress takes 1 to {settings.max_spans} spans, got {len(args.spans)}; merge neighbouring spans"
        raise Refusal(msg)
    protect = protected_start(ctx)
    first_protected = first_anchor_at_or_after(state, ctx, protect)
    planned: list[Planned] = []
    for i, span in enumerate(args.spans):
        summary = strip_anchors(span.summary)
        if not summary:
            msg = f"span {i} has an empty summary; write what the span held that is still needed"
            raise Refusal(msg)
        if len(summary) > settings.summary_max_chars:
            msg = (
                f"span {i} summary has {len(summary)} characters; the limit is {settings.summary_max_chars}: shorten it"
            )
            raise Refusal(msg)
        topic = header_topic(span.topic)[: settings.topic_max_chars] if span.topic else None
        start = _resolve(state, ctx, span.from_, "from", i)
        end = _resolve(state, ctx, span.to, "to", i)
        if start > end:
            msg = (
                f"span {i}: `from` {fmt(parse_anchor(span.from_))} comes after `to` {fmt(parse_anchor(span.to))} "  # type: ignore[arg-type]
                "in the context (anchors are identities, not order); swap them"
            )
            raise Refusal(msg)
        clipped = False
        if end >= protect:
            turn = f"the current turn (from {fmt(first_protected)})" if first_protected else "the current turn"
            if start < protect and parse_anchor(span.to) == first_protected:
                end = protect - 1  # keep the turn's unanchored prefix; clip to the last compressible node
                clipped = True
            else:
                where = "starts inside" if start >= protect else "reaches into"
                msg = (
                    f"span {i} {where} {turn}, which is never compressed: its user instruction and every step "
                    f"since stay verbatim ({describe_compressible(state, ctx, protect)})"
                )
                raise Refusal(msg)
        for cut, side in ((start, "start"), (end + 1, "end")):
            if not ctx.surface.is_balanced_cut(cut):
                msg = (
                    f"span {i}: its {side} falls inside {describe_group(state, ctx, cut)}. A tool call and all "
                    "its results stay in one span: move the edge outside the group"
                )
                raise Refusal(msg)
        planned.append(Planned(start, end, summary, topic, clipped))
    ordered = sorted(range(len(planned)), key=lambda k: planned[k].start)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if planned[b].start <= planned[a].end:
            msg = (
                f"spans {a} and {b} overlap; spans must be disjoint. Split them around what must stay live, "
                "or merge them into one span"
            )
            raise Refusal(msg)
    return planned


def header_topic(topic: str) -> str:
    """A topic as it may stand in a block's ``[compressed · tier N · topic]`` header: one line, no
    anchors, no brackets (a model-written topic cannot end the header and forge a second one)."""
    return " ".join(strip_anchors(topic).translate(_BRACKETS).split())


_BRACKETS = str.maketrans({"[": "(", "]": ")"})


def block_message(summary: str, topic: str | None, tier: int) -> Message:
    head = f"[compressed · tier {tier}" + (f" · {topic}]" if topic else "]")
    return Message.user(f"{head}\n{summary}", STRATEGY.source(BLOCK_FORM))


@dataclass
class Priced:
    """A span ready to commit with its price: ``before`` the tokens it replaces (cached per node),
    ``after`` its block's exact tokens when they were counted (only a refusal or the cost guard
    needs them; the kernel counts the block once at commit anyway)."""

    span: Span
    before: int
    after: int | None


def build_spans(ctx: Context, state: DecayState, planned: list[Planned]) -> list[Priced]:
    """Kernel spans with their block messages, priced without tokenising any summary."""
    nodes = ctx.surface.nodes
    meter = ctx.meter
    out = []
    for p in planned:
        rng = nodes[p.start : p.end + 1]
        tier = 0
        before = 0
        edges = []
        for n in rng:  # one pass: the range's tokens, its highest tier and its edge ids
            before += meter.node_tokens(n)
            pid = state.anchor_of.get(n.seq)
            if pid is not None:
                edges.append(pid)
            block = state.blocks.get(n.seq)
            if block is not None:
                tier = max(tier, block.tier)
                if block.right is not None:
                    edges.append(block.right)
        tier += 1
        message = block_message(p.summary, p.topic, tier)
        data = {
            "block_summary": p.summary,
            "topic": p.topic,
            "tier": tier,
            "left": edges[0] if edges else None,
            "right": edges[-1] if len(edges) > 1 else None,
            "clipped": p.clipped,
        }
        out.append(Priced(Span(rng[0].seq, rng[-1].seq, message=message, data=data), before, None))
    return out


def exact_after(ctx: Context, priced: Priced) -> int:
    if priced.after is None:
        assert priced.span.message is not None  # a compress span always carries its block
        priced.after = ctx.meter.count_message(priced.span.message)
    return priced.after


def check_cost(ctx: Context, settings: DecaySettings, planned: list[Planned], costs: list[Priced]) -> None:
    """Shrink check and optional payback guard, before any event is written. A block whose bound
    without tokenising (``meter.message_at_most``: a byte-level BPE's token covers at least one
    byte) is below what it replaces passes the shrink check uncounted; the transaction counts it."""
    for i, priced in enumerate(costs):
        assert priced.span.message is not None
        bound = ctx.meter.message_at_most(priced.span.message)
        if settings.cost_guard or bound is None or bound >= priced.before:
            after = exact_after(ctx, priced)
            if after >= priced.before:
                msg = (
                    f"span {i}: the summary costs {after} tokens, not fewer than the {priced.before} it replaces; "
                    "choose a larger span or a shorter summary"
                )
                raise Refusal(msg)
    if not settings.cost_guard:
        return
    pressure = ctx.pressure()
    if pressure.ratio >= min(settings.warn_ratios, default=1.0):
        return  # under pressure a compression is needed whatever it costs in cache misses
    saved = sum(p.before - exact_after(ctx, p) for p in costs)
    first = min(p.start for p in planned)
    meter = ctx.meter
    suffix = sum(meter.node_tokens(n) for n in ctx.surface.nodes[first:]) - saved
    rate = settings.cached_input_ratio
    # uncached re-read of everything after the first edge, paid once, against the cached-rate
    # saving of every later request
    payback = suffix * (1 - rate) / max(saved * rate, 1e-9)
    if saved < settings.min_saving_tokens or payback > settings.payback_max_requests:
        msg = (
            f"the cost guard refused: this saves {saved} tokens per request but makes the next request re-read "
            f"{suffix} uncached tokens, paying back after {payback:.0f} requests (limit {settings.payback_max_requests}, "
            f"minimum saving {settings.min_saving_tokens}). Compress a larger span, move `to` later, or drop an "
            "old block first"
        )
        raise Refusal(msg)


def run_compress(ctx: Context, args: CompressArgs) -> ToolOutcome:
    state = current_state(ctx)
    settings = settings_of(ctx)
    try:
        planned = plan_compress(ctx, state, settings, args)
        costs = build_spans(ctx, state, planned)
        check_cost(ctx, settings, planned, costs)
    except Refusal as exc:
        return ToolOutcome(f"compress refused: {exc}. Nothing was changed.", is_error=True)
    # every block is given: the lock and the commit go in one durable batch, and a refusal by the
    # kernel (a span that changed meanwhile) writes nothing
    result = STRATEGY.on(ctx).compact(
        [p.span for p in costs], kind="compress", data={"tool": "compress"}, single_batch=True
    )
    state = current_state(ctx)
    lines = []
    for span in result.spans:
        block = state.blocks.get(span.replacement_seq or -1)
        edge = (
            f"{fmt(block.left)}…{fmt(block.right)}"
            if block and block.right is not None
            else fmt(block.left)
            if block
            else "?"
        )
        lines.append(f"{edge} tier {block.tier if block else '?'}: {span.tokens_before} → {span.tokens_after} tokens")
    clipped = " (clipped before the current turn)" if any(p.clipped for p in planned) else ""
    return ToolOutcome(f"compressed {len(lines)} span(s){clipped}: " + "; ".join(lines))


#: live blocks a refused drop lists, the newest: a long session may hold hundreds
LISTED_BLOCKS = 40


def live_pairs(live: list[Block]) -> str:
    """The left/right pairs of the newest :data:`LISTED_BLOCKS` live blocks, oldest first, and how
    many older ones are not listed."""
    newest = sorted(live, key=lambda b: b.left)[-LISTED_BLOCKS:]
    pairs = " ".join(f"{fmt(b.left)}…{fmt(b.right if b.right is not None else b.left)}" for b in newest)
    older = len(live) - len(newest)
    return (f"({older} older not listed) " if older else "") + (pairs or "(none)")


def run_drop(ctx: Context, args: DropArgs) -> ToolOutcome:
    state = current_state(ctx)
    left, right = parse_anchor(args.left), parse_anchor(args.right)
    live = [b for b in state.blocks.values() if ctx.surface.position(b.seq) is not None]
    match = next((b for b in live if b.left == left and (b.right if b.right is not None else b.left) == right), None)
    if match is None:
        msg = (
            f"drop refused: {args.left!r}…{args.right!r} is not the exact left/right pair of a live block. "
            f"Live blocks: {live_pairs(live)}. Nothing was changed."
        )
        return ToolOutcome(msg, is_error=True)
    node = ctx.surface.node(match.seq)
    assert node is not None  # a live block is a visible node
    tokens = ctx.meter.node_tokens(node)
    STRATEGY.on(ctx).compact(
        Span(match.seq, match.seq, remove=True), kind="drop", data={"tool": "drop"}, single_batch=True
    )
    end = match.right if match.right is not None else match.left  # equals `right`: that is how it matched
    return ToolOutcome(f"dropped block {fmt(match.left)}…{fmt(end)} ({tokens} tokens); its anchors are free again")


def tools_for(ctx: Context) -> list[Tool]:
    return [
        STRATEGY.tool("compress", COMPRESS_DESCRIPTION, CompressArgs, run_compress),
        STRATEGY.tool("drop", DROP_DESCRIPTION, DropArgs, run_drop),
    ]

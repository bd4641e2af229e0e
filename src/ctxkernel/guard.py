"""The kernel's bound on what a request carries: no message larger than a share of the window,
and a fallback when a provider refuses a request as too large and no strategy could shrink it.

A tool result of 50 MB (or a user message, or a reply with huge tool-call arguments) cannot be
summarised away by a strategy that keeps a verbatim tail: without a bound such a session sends
every later request far over the window. Two steps:

1. :func:`excerpt_oversized`, run by :meth:`Session.prepare_request` after every ``pre_step``
   hook (so a strategy's own handling, such as rollover's protective switch, comes first): every
   surface message over :data:`MAX_MESSAGE_SHARE` of the effective window is replaced by an
   excerpt (its head and tail, at most :data:`EXCERPT_SHARE` of the window) with a pointer to the
   full item in the log;
2. :func:`shrink_to_fit`, run by :meth:`Session.request_failed` when the provider reported a
   context overflow and no ``request_error`` hook asked for a retry: the largest messages of more
   than twice the excerpt budget are excerpted the same way, largest first, until the request
   fits, and the harness is told to retry. A profile with no strategies is the unmanaged baseline
   of ``ctxkernel simulate`` and gets step 1 only. When no message is large enough (a surface of
   many small messages) a warning is logged and the error goes to the harness.

Every replacement goes through the compaction transaction (:func:`~ctxkernel.compaction.run_transaction`,
one durable batch, ``strategy="kernel"``, ``kind="excerpt"``): the log keeps every original, the
surface stays a fold of the log (a reopened session sees the same excerpts), a tool result keeps
its call pairing (its content is rewritten in place), and a reply whose tool-call arguments are
oversized is excerpted together with its results (a balanced span) into one message.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .errors import CompactionError, ContextOverflowError
from .events import original_seq
from .logging import get_logger
from .messages import Message, Source
from .meter import LARGE_NODE_TOKENS, message_text_for_count
from .spans import CommitResult, Span

if TYPE_CHECKING:
    from .ports import SessionPort
    from .surface import Node

#: the request header (system prompt and tool schemas, sent with every request) may take at most
#: this share of the effective window: the rest is the room a strategy manages. Over it, no
#: compaction can free enough (a handoff found "no balanced cut leaves anything to replace" behind
#: Claude Code's 28k-token header at a 48k window) and the newest tool result was clipped to fit
HEADER_MAX_SHARE = 0.5


def smallest_window(header_tokens: int, reserved_output_tokens: int) -> int:
    """The smallest ``context_window`` whose effective window leaves room for ``header_tokens``."""
    return math.ceil(header_tokens / HEADER_MAX_SHARE) + reserved_output_tokens


def header_refusal(
    header_tokens: int, context_window: int, reserved_output_tokens: int, tools: int, later: int = 0
) -> str | None:
    """Why a request header of ``header_tokens`` (with ``tools`` tool schemas, ``later`` of them
    offered only once a strategy has something for them to do) leaves no room to manage the
    conversation at this window, naming the smallest window that works; None when it leaves room
    (:data:`HEADER_MAX_SHARE`)."""
    effective = context_window - reserved_output_tokens
    if header_tokens <= HEADER_MAX_SHARE * effective:
        return None
    smallest = smallest_window(header_tokens, reserved_output_tokens)
    schemas = f"{tools} tool schemas" + (f", {later} of them offered once something is hidden" if later else "")
    return (
        f"the request header (system prompt and {schemas}) costs {header_tokens} tokens, more than "
        f"{HEADER_MAX_SHARE:.0%} of the effective window of {effective} (context_window {context_window} - "
        f"reserved_output_tokens {reserved_output_tokens}): it is sent with every request and no compaction can "
        f"free it, so nothing is left to manage. The smallest context_window that works is {smallest}. Fix: "
        f"use a model (or [model] context_window) of at least {smallest}, or shorten [profile] system_prompt or the tools"
    )


log = get_logger("ctxkernel.guard")

#: a message over this share of the effective window is excerpted (the rollover strategy's own
#: protective switch uses the same default, and runs first)
MAX_MESSAGE_SHARE = 0.5
#: an excerpt, pointer included, takes at most this share of the effective window ...
EXCERPT_SHARE = 1 / 16
#: ... and never less than this many tokens (tiny windows)
EXCERPT_MIN_TOKENS = 256
#: the head takes this share of an excerpt's characters, the tail the rest (errors and summaries
#: of a command's output are usually at its end)
EXCERPT_HEAD_SHARE = 2 / 3
#: the strategy name the kernel's own transactions carry
KERNEL = "kernel"
#: history tools a pointer names when the session has one (rollover's and handoff's), with the
#: argument that takes the item id; both page with offset_chars and max_chars
RECALL_TOOLS = {"history_read": "item", "history_read_item": "id"}


class OversizedMarks:
    """What :func:`excerpt_oversized` remembers of one session's passes that found nothing over
    the bound (the session holds one, ``session.oversized``; only this module reads or writes it).

    The surface is a fold of the log, so a pass at the same log length and effective window finds
    nothing again (``clear_at``: basic's ``pre_step`` pass, then the kernel's own); and the
    meter's index of large nodes holds every node that can be over a cap of at least
    ``LARGE_NODE_TOKENS``, so a pass with the same index (``Meter.large_changes``) and cap finds
    nothing either, however many small messages were folded since (``large_clear_at``)."""

    __slots__ = ("clear_at", "large_clear_at")

    def __init__(self) -> None:
        #: (log length, effective window) of the last pass that found nothing
        self.clear_at: tuple[int, int] | None = None
        #: (the meter's large_changes, the cap) of the last pass that found nothing with that index
        self.large_clear_at: tuple[int, int] | None = None


def excerpt_oversized(session: SessionPort) -> CommitResult | None:
    """Step 1: excerpt every surface message over :data:`MAX_MESSAGE_SHARE` of the window.

    Called by ``prepare_request`` after the ``pre_step`` hooks, for every profile; a strategy that
    keeps a verbatim tail (``basic``) calls it before it prices a compaction, so an oversized result
    is excerpted instead of the head being summarised around it. Returns the committed
    transaction, or None when nothing was over the bound (or the transaction was refused)."""
    if not session.kernel.profile.profile.excerpt_oversized:
        return None  # an unmanaged baseline (ctxkernel simulate's none): nothing bounds it
    window = session.pressure().effective_window  # also counts every new node
    # nothing folded and the same window since a pass that found nothing: none now either
    clear_at = (len(session.events), window)
    marks: OversizedMarks = session.oversized
    if marks.clear_at == clear_at:
        return None
    cap = int(MAX_MESSAGE_SHARE * window)
    meter = session.meter
    meter.surface_tokens()  # counts new nodes into the index first (pressure() did: a no-op then)
    # the same nodes in the meter's index of large nodes (the only ones that can be over a cap
    # this large) and the same cap as a pass that found nothing: nothing now either, however
    # many small messages were folded since (a request folds a few)
    large_at = (meter.large_changes, cap) if cap >= LARGE_NODE_TOKENS else None
    if large_at is not None and marks.large_clear_at == large_at:
        marks.clear_at = clear_at
        return None
    chosen = [n for n in _large_nodes(session, cap) if meter.node_tokens(n) > cap]
    if not chosen:
        marks.clear_at = clear_at
        marks.large_clear_at = large_at
        return None
    return _excerpt(session, chosen, window, reason="oversized")


def _large_nodes(session: SessionPort, above: int) -> list[Node]:
    """Visible nodes that may have more than ``above`` tokens: the meter's index of large nodes
    (a few, whatever the surface's length), or the whole surface for a window too small for it."""
    meter = session.meter
    meter.surface_tokens()  # counts new nodes, which keeps the index current
    if above >= LARGE_NODE_TOKENS:
        return list(meter.large.values())
    return list(session.surface.nodes)


def shrink_to_fit(session: SessionPort, excess: int, *, limit: int | None = None) -> CommitResult | None:
    """Step 2: excerpt the largest messages (over twice the excerpt budget), largest first, until
    ``excess`` tokens are saved. ``limit`` is a provider's own window when it is smaller than the
    profile's. Returns the committed transaction, or None when no message was large enough."""
    window = session.pressure().effective_window
    if limit:
        window = min(window, limit)
    budget = excerpt_budget(window)
    meter = session.meter
    candidates = [n for n in _large_nodes(session, 2 * budget) if meter.node_tokens(n) > 2 * budget]
    candidates.sort(key=lambda n: (-meter.node_tokens(n), n.seq))
    chosen: list[Node] = []
    for node in candidates:
        if excess <= 0:
            break
        chosen.append(node)
        excess -= meter.node_tokens(node) - budget
    if not chosen:
        log.warning(
            "the request is over the window and no single message is large enough to excerpt",
            session=session.id,
            effective_window=window,
        )
        return None
    return _excerpt(session, chosen, window, reason="overflow")


def _excerpt(session: SessionPort, chosen: list[Node], window: int, *, reason: str) -> CommitResult | None:
    spans = _spans(session, chosen, excerpt_budget(window), int(MAX_MESSAGE_SHARE * window), window)
    try:
        data = {"reason": reason, "effective_window": window}
        result = session.compact(spans, strategy=KERNEL, kind="excerpt", single_batch=True, data=data)
    except CompactionError as exc:
        error = f"{type(exc).__name__}: {exc}"
        log.warning("messages could not be excerpted", session=session.id, reason=reason, error=error)
        return None
    log.warning(
        "messages excerpted",
        session=session.id,
        reason=reason,
        seqs=result.cites,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        effective_window=window,
    )
    return result


def excerpt_budget(window: int) -> int:
    """Tokens an excerpt may take for a model with this effective window."""
    return max(EXCERPT_MIN_TOKENS, int(EXCERPT_SHARE * window))


def _spans(session: SessionPort, chosen: list[Node], budget: int, cap: int, window: int) -> list[Span]:
    """One span per chosen message (a reply with tool calls takes its results along), in surface
    order, never overlapping."""
    surface = session.surface
    history = next((f"{name}({arg}=" for name, arg in RECALL_TOOLS.items() if session.may_offer_tool(name)), None)
    covered: set[int] = set()
    spans: list[tuple[int, Span]] = []
    for node in sorted(chosen, key=lambda n: surface.position(n.seq) or 0):
        if node.seq in covered:
            continue
        nodes = [node]
        if node.role == "tool":
            call = node.message.tool_result
            assert call is not None
            owner = surface.call_owner.get(call.call_id)
            if owner is not None and owner in covered:
                continue  # excerpted with its reply
        elif node.role == "assistant" and node.message.tool_calls:
            ids = {c.id for c in node.message.tool_calls}
            after = (surface.position(node.seq) or 0) + 1
            while after < len(surface.nodes):  # its results follow it directly
                result = surface.nodes[after].message.tool_result
                if result is None or result.call_id not in ids:
                    break
                nodes.append(surface.nodes[after])
                after += 1
        covered.update(n.seq for n in nodes)
        tokens = sum(session.meter.node_tokens(n) for n in nodes)
        message = excerpt_message(session, nodes, tokens, budget, cap, window, history=history)
        spans.append((surface.position(node.seq) or 0, Span(nodes[0].seq, nodes[-1].seq, message=message)))
    return [span for _, span in sorted(spans, key=lambda pair: pair[0])]


def excerpt_message(
    session: SessionPort, nodes: list[Node], tokens: int, budget: int, cap: int, window: int, *, history: str | None
) -> Message:
    """The head and tail of ``nodes``' text with a pointer, within ``budget`` tokens.

    One tool result stays a tool result (same call id, name and error flag); anything else becomes
    a kernel notice in a user message."""
    text = "\n".join(message_text_for_count(n.message) for n in nodes)
    first = nodes[0]
    if first.role == "tool":
        what = "This tool result"
    else:
        what = "This reply and its tool results" if len(nodes) > 1 else f"This {first.role} message"
    originals = [original_seq(session.events, n.seq) for n in nodes]
    items = ", ".join(f"item_{seq}" for seq in originals)
    where = f"event seq {originals[0]}" if len(nodes) == 1 else f"event seqs {originals[0]}..{originals[-1]}"
    if history:
        recall = f"Read it in pages with {history}'item_{originals[0]}', offset_chars=..., max_chars=...)."
    else:
        recall = "This session has no history tool: if you need more of it, ask for a narrower result."
    chars = max(200, budget * 3)  # about 3 characters per token; checked by counting below
    while True:
        head_chars = int(chars * EXCERPT_HEAD_SHARE)
        tail_chars = chars - head_chars
        if len(text) <= head_chars + tail_chars:
            head_chars, tail_chars = len(text), 0
        head, tail = text[:head_chars], text[len(text) - tail_chars :] if tail_chars else ""
        notice = (
            f"[ctxkernel excerpt] {what} was {len(text):,} characters (about {tokens:,} tokens), more than "
            f"{cap:,} tokens, the most one message may take of this model's {window:,}-token window. Shown: its "
            f"first {len(head):,} and last {len(tail):,} characters. The full text is unchanged in the session log "
            f"as {items} ({where}). {recall}"
        )
        body = (
            f"{notice}\n--- first {len(head):,} characters ---\n{head}\n"
            f"--- last {len(tail):,} characters ---\n{tail}\n[end of excerpt]"
        )
        if first.role == "tool" and len(nodes) == 1:
            result = first.message.tool_result
            assert result is not None
            message = Message.tool(result.call_id, body, is_error=result.is_error, name=result.name)
        else:
            message = Message.user(body, Source.plugin_form(KERNEL, "excerpt"))
        if session.meter.count_message(message) <= budget or chars <= 200:
            return message
        chars //= 2


def fit_composed(session: SessionPort, tokens: int, window: int) -> bool:
    """Step 0, before anything is sent: ``prepare_request`` composed a request of ``tokens``
    (reminders, anchors and tool schemas included) over the effective ``window``. Run the
    profile's overflow path as if the provider had refused it (the ``request_error`` hooks, e.g.
    ``basic``'s summary of the head), and the kernel's excerpts when the strategies did not shrink
    the surface enough. True when the surface shrank; ``prepare_request`` then composes again and refuses
    with :class:`~ctxkernel.RequestTooLargeError` if it still does not fit."""
    before = session.meter.surface_tokens()
    error = ContextOverflowError(
        f"the composed request has {tokens} tokens, over the effective window of {window}",
        prompt_tokens=tokens,
        limit=window,
    )
    log.warning("composed request over the window", session=session.id, tokens=tokens, effective_window=window)
    session.kernel.hooks.request_error(session, error)
    # what the strategy's compaction left over the window (e.g. basic keeps its verbatim tail,
    # which may hold one large tool result): the kernel's excerpts of the largest messages
    excess = tokens - window - (before - session.meter.surface_tokens())
    if excess > 0:
        shrink_to_fit(session, excess, limit=window)
    return session.meter.surface_tokens() < before

"""What a compaction is made of: the spans it replaces, the regions handed to ``summarize``, the
summaries, what a committed transaction reports, and the helpers that choose balanced regions.

Plain values and pure functions over the surface: the transaction that uses them is
:mod:`ctxkernel.compaction`, and the hook specifications, the plugin manager and the text toolkit
read them from here without reaching the transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import CompactionError, SurfaceError, UnbalancedCutError
from .frames import KERNEL_FRAMES, guard
from .messages import Message, Source

if TYPE_CHECKING:
    from .context import MeterView, SurfaceView
    from .surface import Node, Surface

CHECKPOINT_OPEN = "<context-checkpoint>"
CHECKPOINT_CLOSE = "</context-checkpoint>"

#: the eight headings of a summary, in order: the built-in ``basic`` directive and extractive
#: summary and the handoff strategy both use them, so a summary from either reads the same
SUMMARY_SECTIONS: tuple[str, ...] = (
    "Primary Request and Intent",
    "Key Technical Concepts",
    "Files and Code",
    "Errors and Fixes",
    "Pending Jobs",
    "Current Work",
    "Next Step",
    "Critical Context",
)


@dataclass(frozen=True)
class Summary:
    """A summary and, when a model wrote it, who and at what cost."""

    text: str
    provider: str | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Region:
    """A contiguous run of surface nodes handed to ``summarize``."""

    nodes: tuple[Node, ...]
    tokens: int
    strategy: str
    kind: str

    @property
    def seqs(self) -> list[int]:
        return [n.seq for n in self.nodes]

    @property
    def messages(self) -> list[Message]:
        return [n.message for n in self.nodes]


@dataclass
class Span:
    """One range a transaction replaces (``start``..``end`` are surface node seqs).

    Give ``message`` for an exact replacement, or ``summary`` text to be wrapped by the
    transaction's ``render``; with neither, the ``summarize`` hook writes it. A span of one tool
    result whose ``message`` is a tool message rewrites that result's content in place (same call
    id, name and error flag), keeping its pairing. ``remove`` drops
    the range with no replacement (a cited ``surface/drop``).
    """

    start: int
    end: int
    summary: str | Summary | None = None
    message: Message | None = None
    remove: bool = False
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanResult:
    cites: list[int]
    replacement_seq: int | None
    tokens_before: int
    tokens_after: int
    summary: Summary | None


@dataclass(frozen=True)
class CommitResult:
    """What a committed transaction did (passed to the ``commit`` hook)."""

    compaction_id: str
    strategy: str
    kind: str
    spans: list[SpanResult]
    start_seq: int
    end_seq: int
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_before(self) -> int:
        return sum(s.tokens_before for s in self.spans)

    @property
    def tokens_after(self) -> int:
        return sum(s.tokens_after for s in self.spans)

    @property
    def cites(self) -> list[int]:
        return [c for s in self.spans for c in s.cites]


def checkpoint_message(summary: Summary | str, strategy: str, form: str = "checkpoint") -> Message:
    """The default replacement: the summary in a marked block, written as a plugin message."""
    text = summary.text if isinstance(summary, Summary) else summary
    # a summarizer model's text is untrusted: it must not end the block, nor forge the kernel's
    # frames that share its message (the user's pinned instructions, the work ledger)
    text = guard(text.strip(), *KERNEL_FRAMES)
    return Message.user(f"{CHECKPOINT_OPEN}\n{text}\n{CHECKPOINT_CLOSE}", Source.plugin_form(strategy, form))


Render = Callable[[Summary, "Region"], Message]


def validate_spans(surface: Surface, spans: Sequence[Span]) -> list[list[Node]]:
    """Step 1: every span on the surface, balanced, not overlapping. Nothing is written."""
    if not spans:
        msg = "a compaction needs at least one span"
        raise CompactionError(msg)
    taken: list[tuple[int, int, int]] = []  # (first, last position, span index) of each span so far
    resolved = []
    for i, span in enumerate(spans):
        try:
            nodes = surface.span(span.start, span.end)
        except SurfaceError as exc:
            raise CompactionError(f"span {i} ({span.start}..{span.end}): {exc}") from None
        if span.message is not None and span.message.role == "tool" and not _is_result_rewrite(span, nodes):
            msg = f"span {i} ({span.start}..{span.end}): a tool message can replace only one tool result"
            raise CompactionError(msg)
        if _is_result_rewrite(span, nodes):
            # a content-only replacement of one tool result keeps its pairing (the surface checks
            # that the call id, name and error flag are unchanged), so it is not a cut at all
            pass
        else:
            try:
                surface.check_range_closed(nodes)
            except SurfaceError as exc:
                raise UnbalancedCutError(f"span {i} ({span.start}..{span.end}) is not a balanced cut: {exc}") from None
        # a span is a run of positions: two overlap where their runs do (first shared node named)
        first = surface.position(nodes[0].seq)
        assert first is not None  # surface.span found it
        last = first + len(nodes) - 1
        shared = [(max(first, a), j) for a, b, j in taken if a <= last and first <= b]
        if shared:
            position, j = min(shared)
            msg = f"span {i} ({span.start}..{span.end}) overlaps span {j} at seq {surface.nodes[position].seq}"
            raise CompactionError(msg)
        taken.append((first, last, i))
        if span.remove and (span.message is not None or span.summary is not None):
            msg = f"span {i}: a removal carries no summary or message"
            raise CompactionError(msg)
        resolved.append(nodes)
    return resolved


def _is_result_rewrite(span: Span, nodes: list[Node]) -> bool:
    """True for a span that replaces one tool result with a tool message (new content only)."""
    return len(nodes) == 1 and nodes[0].role == "tool" and span.message is not None and span.message.role == "tool"


# -- region selection helpers ---------------------------------------------------------------------
def balanced_cut_at_or_before(surface: SurfaceView, position: int) -> int:
    """The largest balanced cut position ``<= position`` (0 is always balanced)."""
    position = min(max(position, 0), len(surface.nodes))
    while position > 0 and not surface.is_balanced_cut(position):
        position -= 1
    return position


def head_region(
    surface: SurfaceView, meter: MeterView, keep_tokens: int, *, min_nodes: int = 1
) -> tuple[int, int] | None:
    """The range from the surface head up to a balanced cut that keeps at least ``keep_tokens``
    of the newest nodes verbatim (the cut moves toward the head until it is balanced).

    Returns ``(start_seq, end_seq)``, or None when nothing can be compacted.
    """
    nodes = surface.nodes
    kept = 0
    cut = len(nodes)
    while cut > 0 and kept < keep_tokens:
        cut -= 1
        kept += meter.node_tokens(nodes[cut])
    cut = balanced_cut_at_or_before(surface, cut)
    if cut < min_nodes:
        return None
    return nodes[0].seq, nodes[cut - 1].seq


def whole_surface_but_last(surface: SurfaceView, keep_last: int = 1) -> tuple[int, int] | None:
    """Everything but the last ``keep_last`` nodes, moved to a balanced cut."""
    cut = balanced_cut_at_or_before(surface, len(surface.nodes) - keep_last)
    if cut < 1:
        return None
    return surface.nodes[0].seq, surface.nodes[cut - 1].seq


# -- manual compaction (ctxkernel.controls asks the compact_now hook) -------------------------------
#: what ``compact_now`` may be asked to do; a strategy answers only the actions it supports
MANUAL_ACTIONS: dict[str, str] = {
    "compact": "compact now, in the strategy's own terms (summarise, switch windows, continue)",
    "archive": "archive the head in place (chapters)",
}


@dataclass(frozen=True)
class ManualCompaction:
    """A person's request to compact now, handed to the ``compact_now`` hook."""

    action: str = "compact"
    by: str = "api"


@dataclass(frozen=True)
class ManualOutcome:
    """What a strategy did for a :class:`ManualCompaction`.

    ``committed`` is False when there was nothing to do or the strategy could not (``detail``
    says which); ``continued_in`` names the session the work goes on in when the strategy started
    a new one (chapters). The kernel fills in ``strategy`` (the one that answered) and the
    session's prompt tokens before and after.
    """

    committed: bool
    detail: str
    result: CommitResult | None = None
    continued_in: str | None = None
    strategy: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.committed,
            "strategy": self.strategy,
            "detail": self.detail,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }
        if self.continued_in:
            out["continued_in"] = self.continued_in
        return out


__all__ = [
    "MANUAL_ACTIONS",
    "ManualCompaction",
    "ManualOutcome",
    "CHECKPOINT_CLOSE",
    "CHECKPOINT_OPEN",
    "SUMMARY_SECTIONS",
    "CommitResult",
    "Region",
    "Render",
    "Span",
    "SpanResult",
    "Summary",
    "balanced_cut_at_or_before",
    "checkpoint_message",
    "head_region",
    "validate_spans",
    "whole_surface_but_last",
]

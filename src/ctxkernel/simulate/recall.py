"""Measured recall: fetch hidden messages back through the strategy's own tools, as a model would.

After a replay, every replayed message that is not on the final surface is a *target*. The prober
calls the final session's recall tools through ``session.run_tool`` with only what a model could
know from what it sees: item ids printed by a history listing, chapter numbers printed by the
table of contents on the surface, artifact handles printed in a chapter. A target counts as
recovered only when its content comes back: every text block, tool-call argument object and tool
result of the message, whitespace aside, is found in what the tools returned for it.

Tool families measured (the shipped recall tools; another family's targets count as not
recoverable, and the report says which family was used in ``recall_method``):

``history``   ``history_list_items`` + ``history_read_item`` (handoff, and any strategy using
              :mod:`ctxkernel.recall.history` with those names): list every item page by page
              (``next_cursor``), then read each target's ``item_<seq>`` in pages (``next_offset_chars``)
``lookup``    ``history_lookup`` + ``history_read`` (rollover): the same with its argument names
``shown``     ``history_read_item`` without a listing (mask): read each ``item_<seq>`` id the final
              surface prints (its placeholders name them), in pages
``chapters``  ``chapters_read`` + ``chapters_artifact``: read every chapter numbered in the table of
              contents on the surface, in pages, and every artifact a target's rendering points at

The work is bounded per profile: at most :data:`MAX_TARGETS` targets are fetched (an evenly spaced
sample when there are more, the share and the costs scaled to all targets) and at most
:data:`MAX_CALLS` tool calls are made; targets not reached within the calls count as not
recovered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..messages import Message, ToolCallBlock
from .probes import decoded

if TYPE_CHECKING:
    from ..session import Session

#: most hidden messages fetched per profile (an evenly spaced sample beyond it)
MAX_TARGETS = 400
#: most recall tool calls per profile
MAX_CALLS = 2_000
#: most pages read for one item, chapter or artifact
MAX_PAGES = 20

_CHAPTER_NUMBER = re.compile(r"^- \[[^\]]+\] (\d{1,9}) ", re.MULTILINE)
# a long table of contents folds older chapters into one line per folder: "- [fold:<dir>] 001–015: 15 ..."
_CHAPTER_FOLD = re.compile(r"^- \[fold:[^\]]+\] (\d{1,9})–(\d{1,9}): ", re.MULTILINE)
_SEGMENT = re.compile(r"^\*\*(?:User|Assistant|Result|Notice|Table of contents)\*\* #(\d{1,18})\b", re.MULTILINE)
_ARTIFACT = re.compile(r"\[artifact `([^`\s]{1,300})`")
_PAGE_LINE = re.compile(r"^\d{1,9}: ", re.MULTILINE)
_PIECE_BREAK = re.compile(r"\n\d{1,9}\+ ")
_CHAPTER_TAIL = re.compile(r"\n\((?:lines \d+-\d+ of \d+; next page: offset=\d+|end of chapter: \d+ lines)\)$")
_ARTIFACT_TAIL = re.compile(r"\n\((?:lines \d+-(\d+) of \d+; next page: offset=\d+|end: \d+ lines)\)$")
_NEXT_OFFSET = re.compile(r"next page: offset=(\d+)\)$")
_ITEM_ID = re.compile(r"\bitem_(\d{1,18})\b")


def normalize(text: str) -> str:
    return " ".join(text.split())


def fragments(message: Message) -> list[str]:
    """What must come back for ``message`` to count as recovered (normalized, non-empty)."""
    parts: list[str] = []
    for block in message.content:
        if block.type == "text":
            parts.append(block.text)
        elif block.type == "tool_call":
            parts.append(orjson.dumps(block.arguments).decode())
        elif block.type == "tool_result":
            parts.append(block.content)
    return [p for p in (normalize(p) for p in parts) if p]


@dataclass
class RecallResult:
    """What measuring cost and found; ``recovered`` holds the (session id, seq) of recovered targets."""

    method: str | None = None
    calls: int = 0
    tokens: int = 0
    probed: int = 0
    fetched: int = 0  # targets fetched: the sample plus the extra ones
    sampled: set[tuple[str, int]] = field(default_factory=set)  # the evenly spaced sample of targets
    recovered: set[tuple[str, int]] = field(default_factory=set)


class _Prober:
    def __init__(self, session: Session, result: RecallResult) -> None:
        self.session = session
        self.result = result
        self._call_no = 0

    def call(self, name: str, arguments: dict[str, Any]) -> str | None:
        """One tool call as the model would make it; None when refused or over the call cap."""
        if self.result.calls >= MAX_CALLS:
            return None
        self._call_no += 1
        self.result.calls += 1
        block = ToolCallBlock(f"recall_{self._call_no:06d}", name, arguments)
        outcome = self.session.run_tool(block)
        meter = self.session.meter
        self.result.tokens += meter.count_text(name + orjson.dumps(arguments).decode()) + meter.count_text(
            outcome.content
        )
        return None if outcome.is_error else outcome.content


def _json(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _paged_history(
    prober: _Prober,
    targets: list[tuple[int, list[str]]],
    *,
    list_tool: str,
    read_tool: str,
    id_arg: str,
) -> Iterable[int]:
    """Seqs of ``targets`` whose content a history listing and paged reads bring back."""
    listed: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_CALLS):
        args: dict[str, Any] = {"limit": 50, "max_chars": 1}
        if cursor:
            args["cursor"] = cursor
        page = _json(prober.call(list_tool, args))
        listed.update(str(item.get("id")) for item in page.get("items") or () if isinstance(item, dict))
        cursor = page.get("next_cursor") if isinstance(page.get("next_cursor"), str) else None
        if not cursor:
            break
    return _read_items(prober, targets, listed, read_tool=read_tool, id_arg=id_arg)


def _read_items(
    prober: _Prober, targets: list[tuple[int, list[str]]], known: set[str], *, read_tool: str, id_arg: str
) -> Iterable[int]:
    """Seqs of ``targets`` whose content reading their ``item_<seq>`` in pages brings back, for
    the ids in ``known`` (the ones the model saw: listed, or printed on its surface)."""
    for seq, needles in targets:
        ref = f"item_{seq}"
        if ref not in known:
            continue  # the model never saw this id
        body: list[str] = []
        offset = 0
        for _ in range(MAX_PAGES):
            page = _json(prober.call(read_tool, {id_arg: ref, "offset_chars": offset, "max_chars": 20_000}))
            if not isinstance(page.get("content"), str):
                break
            body.append(page["content"])
            nxt = page.get("next_offset_chars")
            if not isinstance(nxt, int) or nxt <= offset:
                break
            offset = nxt
        text = normalize("".join(body))
        if body and all(n in text for n in needles):
            yield seq


def _chapter_pages(prober: _Prober, number: str) -> tuple[str, str] | None:
    """(author session, body) of one chapter read in pages, or None when refused."""
    lines: list[str] = []
    author = ""
    offset = 0
    for _ in range(MAX_PAGES):
        out = prober.call("chapters_read", {"chapter": number, "offset": offset, "limit": 5000})
        if out is None:
            return None
        head, _, rest = out.partition("\n")
        if not author:
            match = re.match(r"chapter (\S+)/\d+ ", head)
            author = match.group(1) if match else ""
        nxt = _NEXT_OFFSET.search(rest)
        lines.append(_CHAPTER_TAIL.sub("", rest))
        if not nxt or int(nxt.group(1)) <= offset:
            break
        offset = int(nxt.group(1))
    return author, "\n".join(lines)


def _artifact_text(prober: _Prober, handle: str) -> str:
    text = ""
    offset = 0
    for _ in range(MAX_PAGES):
        out = prober.call("chapters_artifact", {"op": "read", "artifact": handle, "offset": offset, "limit": 5000})
        if out is None:
            break
        tail = _ARTIFACT_TAIL.search(out)
        # a piece numbered ``N+`` continues the line before it (on this page or the last): joined
        # back without a line break
        body = _PAGE_LINE.sub("", _PIECE_BREAK.sub("", "\n" + _ARTIFACT_TAIL.sub("", out)))
        text += body if text else body[1:]
        if not tail or not tail.group(1) or int(tail.group(1)) <= offset:
            break
        offset = int(tail.group(1))
    return text


def chapter_numbers(surface_text: str) -> list[str]:
    """Chapter numbers a model reads off the table of contents: each bullet's, and every number of a
    folded range (at most :data:`MAX_CALLS` of them)."""
    numbers = list(_CHAPTER_NUMBER.findall(surface_text))
    for low, high in _CHAPTER_FOLD.findall(surface_text):
        numbers += [str(n) for n in range(int(low), min(int(high), int(low) + MAX_CALLS) + 1)]
    return list(dict.fromkeys(str(int(n)) for n in numbers))[:MAX_CALLS]


def _chapters(
    prober: _Prober, surface_text: str, targets: list[tuple[str, int, list[str]]]
) -> Iterable[tuple[str, int]]:
    """Targets whose content the chapters named by the table of contents (and their artifacts) hold."""
    segments: dict[tuple[str, int], str] = {}
    for number in chapter_numbers(surface_text):
        read = _chapter_pages(prober, number)
        if read is None:
            continue
        author, body = read
        marks = list(_SEGMENT.finditer(body))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
            key = (author, int(mark.group(1)))
            segments[key] = segments.get(key, "") + "\n" + body[mark.start() : end]
    for sid, seq, needles in targets:
        segment = segments.get((sid, seq))
        if segment is None:
            continue
        text = normalize(segment)
        if not all(n in text for n in needles):
            # a large tool result is an artifact: the model follows the handle its rendering shows
            extra = [_artifact_text(prober, h) for h in dict.fromkeys(_ARTIFACT.findall(segment))]
            text = normalize(segment + "\n" + "\n".join(extra))
        if all(n in text for n in needles):
            yield sid, seq


def sample(items: list[Any], cap: int) -> list[Any]:
    """At most ``cap`` items, evenly spaced (deterministic)."""
    if len(items) <= cap:
        return list(items)
    step = len(items) / cap
    return [items[int(i * step)] for i in range(cap)]


def measure(
    final: Session, targets: list[tuple[str, int, Message]], also: Iterable[tuple[str, int, Message]] = ()
) -> RecallResult:
    """Fetch ``targets`` (session id, seq, message) back through ``final``'s recall tools: a sample
    of at most :data:`MAX_TARGETS` of them, plus every one of ``also`` (the retention probes' sources)."""
    result = RecallResult()
    if not targets:
        return result
    final.owns_tool("")  # brings the tool registry up to date
    names = set(final.tools.names())
    chosen = sample(targets, MAX_TARGETS)
    result.probed = len(chosen)
    result.sampled = {(sid, seq) for sid, seq, _ in chosen}
    extra: dict[tuple[str, int], tuple[str, int, Message]] = {}
    for sid, seq, message in also:
        if (sid, seq) not in result.sampled:
            extra.setdefault((sid, seq), (sid, seq, message))
    chosen += list(extra.values())[:MAX_TARGETS]
    result.fetched = len(chosen)
    prober = _Prober(final, result)
    own = [(seq, fragments(m)) for sid, seq, m in chosen if sid == final.id]
    if {"history_list_items", "history_read_item"} <= names:
        result.method = "history"
        found = _paged_history(prober, own, list_tool="history_list_items", read_tool="history_read_item", id_arg="id")
        result.recovered.update((final.id, seq) for seq in found)
    elif {"history_lookup", "history_read"} <= names:
        result.method = "lookup"
        found = _paged_history(prober, own, list_tool="history_lookup", read_tool="history_read", id_arg="item")
        result.recovered.update((final.id, seq) for seq in found)
    elif "history_read_item" in names:
        # no listing to page through (mask): a model knows the ids the surface prints, its
        # placeholders' ``item_<seq>``, and reads those
        result.method = "shown"
        surface = "\n".join(n.message.text for n in final.surface.nodes)
        shown = {f"item_{seq}" for seq in _ITEM_ID.findall(surface)}
        found = _read_items(prober, own, shown, read_tool="history_read_item", id_arg="id")
        result.recovered.update((final.id, seq) for seq in found)
    elif "chapters_read" in names:
        result.method = "chapters"
        surface = "\n".join(n.message.text for n in final.surface.nodes)
        result.recovered.update(_chapters(prober, surface, [(sid, seq, fragments(m)) for sid, seq, m in chosen]))
    return result


# -- cued recall: what a model could fetch at the request that needed it ---------------------------------
#: tool calls the prober may make for one need
NEED_CALLS = 3
#: the share of the effective window one need's tool output may fill
NEED_OUTPUT_SHARE = 1 / 8
#: most needs probed per replay (the first ones; later ones are neither counted nor probed)
MAX_NEEDS = 150
_SEARCH_HIT = re.compile(r"^(\S+) (?:artifact (\S+) )?line (\d{1,9}): ", re.MULTILINE)


@dataclass
class CuedRecall:
    """The cued prober's tally over one replay."""

    needs: int = 0
    found: int = 0
    calls: int = 0
    tokens: int = 0
    family: str | None = None
    #: the calls made since the replay last took them: (the call, the output the model read, an
    #: error?), which the replay prices as the extra requests a model would have sent
    exchanges: list[tuple[ToolCallBlock, str, bool]] = field(default_factory=list)


def offered_names(tools: list[dict[str, Any]]) -> set[str]:
    """Tool names of a request's schemas (OpenAI style ``{"function": {"name"}}`` or ``{"name"}``)."""
    names = set()
    for tool in tools:
        inner = tool.get("function")
        function: dict[str, Any] = inner if isinstance(inner, dict) else tool
        if isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def family_of(names: set[str]) -> str | None:
    if "history_search_contents" in names or {"history_list_items", "history_read_item"} <= names:
        return "history"
    if "history_lookup" in names:
        return "lookup"
    if "chapters_search" in names or "chapters_read" in names:
        return "chapters"
    if names & {"history_read_item", "history_read"}:
        return "read-only"
    return None


class _NeedProbe:
    """At most :data:`NEED_CALLS` calls and ``budget`` tokens of tool output, for one need."""

    def __init__(self, session: Session, budget: int, tally: CuedRecall) -> None:
        self.session = session
        self.left = budget
        self.tally = tally
        self.calls = 0
        self.seen: list[str] = []

    def call(self, name: str, arguments: dict[str, Any]) -> str | None:
        if self.calls >= NEED_CALLS or self.left <= 0:
            return None
        self.calls += 1
        self.tally.calls += 1
        block = ToolCallBlock(f"cued_{self.tally.calls:06d}", name, arguments)
        outcome = self.session.run_tool(block)
        text = outcome.content
        tokens = self.session.meter.count_text(text)
        if tokens > self.left:  # the model reads only what its budget holds
            text = text[: len(text) * self.left // max(tokens, 1)]
            tokens = self.left
        self.left -= tokens
        self.tally.tokens += tokens
        self.tally.exchanges.append((block, text, outcome.is_error))
        shown, _ = decoded(text)
        self.seen.append(normalize(shown))
        return None if outcome.is_error else text

    def holds(self, evidence: Sequence[str]) -> bool:
        return any(proof in text for text in self.seen for proof in evidence)


def probe_need(
    session: Session, offered: set[str], shown: str, cue: str, evidence: Sequence[str], budget: int, tally: CuedRecall
) -> bool:
    """Look ``cue`` up with the tools ``offered`` at this request, knowing only the request
    (``shown``) and the cue; True when the output holds ``evidence``."""
    probe = _NeedProbe(session, budget, tally)
    family = family_of(offered)
    if family == "history" and "history_search_contents" in offered:
        _search_then_read(
            probe, evidence, "history_search_contents", {"query": cue, "limit": 5, "max_chars": 400, "order": "desc"}
        )
        read = "history_read_item"
        ids = _ids_of(probe)
        return probe.holds(evidence) or _read_ids(probe, evidence, read, "id", ids, offered)
    if family == "lookup":
        _search_then_read(probe, evidence, "history_lookup", {"query": cue, "limit": 5, "max_chars": 400})
        return probe.holds(evidence) or _read_ids(probe, evidence, "history_read", "item", _ids_of(probe), offered)
    if family == "chapters" and "chapters_search" in offered:
        out = probe.call("chapters_search", {"query": cue, "limit": 10})
        if probe.holds(evidence) or out is None:
            return probe.holds(evidence)
        for chapter, handle, line in _SEARCH_HIT.findall(out)[: NEED_CALLS - 1]:
            offset = max(0, int(line) - 3)
            if handle and "chapters_artifact" in offered:
                probe.call("chapters_artifact", {"op": "read", "artifact": handle, "offset": offset, "limit": 12})
            elif not handle and "chapters_read" in offered:
                probe.call("chapters_read", {"chapter": chapter, "offset": offset, "limit": 12})
            if probe.holds(evidence):
                return True
        return False
    # no search: only the ids the request itself shows can be read
    for read, arg in (("history_read_item", "id"), ("history_read", "item")):
        if read in offered:
            shown_ids = list(dict.fromkeys(f"item_{n}" for n in reversed(_ITEM_ID.findall(shown))))
            return _read_ids(probe, evidence, read, arg, shown_ids, offered)
    return False


def _search_then_read(probe: _NeedProbe, evidence: Sequence[str], tool: str, arguments: dict[str, Any]) -> None:
    """Search, following ``next_cursor`` while a page finds nothing (a page scans a bounded part)."""
    for _ in range(NEED_CALLS - 1):
        page = _json(probe.call(tool, arguments))
        if probe.holds(evidence) or page.get("items") or not isinstance(page.get("next_cursor"), str):
            return
        arguments = {**arguments, "cursor": page["next_cursor"]}


def _ids_of(probe: _NeedProbe) -> list[str]:
    """Item ids the searches printed, in the order shown."""
    ids: list[str] = []
    for text in probe.seen:
        ids += [f"item_{n}" for n in _ITEM_ID.findall(text)]
    return list(dict.fromkeys(ids))


def _read_ids(
    probe: _NeedProbe, evidence: Sequence[str], tool: str, arg: str, ids: list[str], offered: set[str]
) -> bool:
    if tool not in offered:
        return False
    for ref in ids:
        if probe.calls >= NEED_CALLS or probe.left <= 0:
            break
        probe.call(tool, {arg: ref, "max_chars": 20_000})
        if probe.holds(evidence):
            return True
    return False

"""The Claude Code session importer: the main chain, its parallel-call branches, its accounting.

A Claude Code session file holds one JSON object a line, chained through ``uuid``/``parentUuid``.
What is replayed:

* the **main chain**, walked from the last main-chain line back through ``parentUuid``; a
  ``compact_boundary`` continues through its ``logicalParentUuid``, and where a parent is not in
  the file (a boundary whose logical parent was cut off), or is a sidechain line, the walk
  continues from the main-chain line written just before it instead of stopping;
* **parallel calls**: when the model issues several calls in one API message, Claude Code writes
  one line per block and each result's ``parentUuid`` is its own ``tool_use`` line, while the chain
  goes on through ``progress`` lines. Lines of an API message on the chain (same ``message.id``)
  and the result lines answering their calls are replayed with it, wherever they branch off;
* one assistant message per API message (its lines joined, the results of its calls after it),
  ``usage`` carried, the recorded ``compact_boundary`` kept as a marker; the harness's compact
  summary is not replayed (the profile under test compacts on its own), ``isMeta`` lines are
  replayed but are not instructions.

Not replayed, and counted in ``source.accounting`` (:mod:`.accounting`): abandoned branches,
inline sidechains (``isSidechain``, Claude Code 1.x subagents) and the ``subagents/*.jsonl``
files beside a session (``<session>/subagents/agent-*.jsonl``), progress and other bookkeeping
lines, and any line type this importer does not know.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..convert import from_anthropic_message
from ..errors import EventError
from ..jsonbytes import loads
from ..messages import Message, Source
from .accounting import Accounting
from .reading import SHAPE_ERRORS, Lines, check_usage, parse_time, read_lines
from .recording import AssistantItem, Item, MarkerItem, Recording, RecordingError, ToolResultItem, UserItem

#: line types that are the harness's bookkeeping, never part of the conversation
BOOKKEEPING = frozenset({"progress", "file-history-snapshot", "queue-operation", "summary"})
CONVERSATION = frozenset({"user", "assistant", "system"})
TYPES = BOOKKEEPING | CONVERSATION
_CALL_BLOCKS = ("tool_use", "server_tool_use")
#: what a user line opens with when the harness wrote it: a slash command and its output, a caveat
HARNESS_TEXT = ("<command-name>", "<command-message>", "<local-command-stdout>", "<local-command-caveat>")
#: most subagent files read beside one session (each is counted, never replayed)
MAX_SUBAGENT_FILES = 10_000


def import_claude_code(path: Path, run: int | None, lenient: bool, accounting: Accounting) -> Recording:
    lines = Lines(path, lenient)
    entries: list[tuple[int, dict[str, Any]]] = []
    by_uuid: dict[str, tuple[int, dict[str, Any]]] = {}
    for lineno, raw in lines:
        kind = raw.get("type")
        if not isinstance(kind, str):
            lines.bad(lineno, "a Claude Code line with a string 'type'", str(sorted(raw))[:120])
            continue
        uuid = raw.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            lines.bad(lineno, "a string 'uuid'", repr(uuid)[:120])
            continue
        if kind in ("user", "assistant") and not isinstance(raw.get("message"), dict):
            lines.bad(lineno, f"a {kind} line with a 'message' object", str(sorted(raw))[:120])
            continue
        parents = {key: raw.get(key) for key in ("parentUuid", "logicalParentUuid")}
        if not all(value is None or isinstance(value, str) for value in parents.values()):
            lines.bad(lineno, "'parentUuid' and 'logicalParentUuid' as strings or null", repr(parents)[:120])
            continue
        entries.append((lineno, raw))
        if uuid is not None:
            by_uuid[uuid] = (lineno, raw)
    selected = _selection(entries, by_uuid)
    _count(entries, selected, accounting)
    _count_subagents(path, accounting)
    builder = _Builder(lines, accounting)
    for lineno, raw in entries:
        if lineno in selected:
            try:
                builder.line(lineno, raw)
            except SHAPE_ERRORS as exc:
                lines.bad(lineno, f"a well-formed Claude Code {raw['type']} line", str(exc))
    builder.flush()
    return Recording(builder.items, {}, skipped=lines.skipped)


def _main(raw: dict[str, Any]) -> bool:
    return raw.get("type") in CONVERSATION and not raw.get("isSidechain") and isinstance(raw.get("uuid"), str)


def _message_id(raw: dict[str, Any]) -> str | None:
    message = raw.get("message")
    mid = message.get("id") if isinstance(message, dict) else None
    return mid if isinstance(mid, str) else None


def _blocks(raw: dict[str, Any]) -> list[dict[str, Any]]:
    message = raw.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _results_only(raw: dict[str, Any]) -> bool:
    message = raw.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


def _selection(entries: list[tuple[int, dict[str, Any]]], by_uuid: dict[str, tuple[int, dict[str, Any]]]) -> set[int]:
    """Line numbers replayed: the main chain, plus the branches of its parallel calls."""
    main = [(lineno, raw) for lineno, raw in entries if _main(raw)]
    if not main:
        return set()
    position = {raw["uuid"]: i for i, (_, raw) in enumerate(main)}
    chain: set[int] = set()
    seen: set[str] = set()
    jump: dict[int, int] = {}  # a position walked past -> where the search for an earlier line goes on

    def unwalked_before(here: int) -> str | None:
        """The nearest main-chain line before position ``here`` not walked yet (each search skips
        what earlier ones passed over, so a file of such jumps costs linear time, not quadratic)."""
        i, passed = here - 1, []
        while i >= 0 and main[i][1]["uuid"] in seen:
            passed.append(i)
            i = jump.get(i, i - 1)
        for j in passed:
            jump[j] = i
        return main[i][1]["uuid"] if i >= 0 else None

    current: str | None = main[-1][1]["uuid"]
    while current is not None and current not in seen:
        seen.add(current)
        lineno, raw = by_uuid[current]
        chain.add(lineno)
        parent = raw.get("parentUuid") or raw.get("logicalParentUuid")
        if parent is None:
            break  # the session's first line
        if parent in by_uuid and not by_uuid[parent][1].get("isSidechain"):
            current = parent
            continue
        # a parent the file does not hold (a compaction's logical parent cut off), or a subagent's
        # line (never replayed): the conversation goes on from the main-chain line written just before
        here = position.get(current)
        current = unwalked_before(here) if here is not None else None
    on_chain = {_message_id(raw) for lineno, raw in entries if lineno in chain and raw.get("type") == "assistant"}
    on_chain.discard(None)
    selected = set(chain)
    calls: set[str] = set()
    for lineno, raw in entries:
        if raw.get("type") != "assistant" or raw.get("isSidechain"):
            continue
        if lineno in selected or _message_id(raw) in on_chain:
            selected.add(lineno)
            calls.update(str(b.get("id")) for b in _blocks(raw) if b.get("type") in _CALL_BLOCKS)
    for lineno, raw in entries:
        if lineno in selected or raw.get("type") != "user" or raw.get("isSidechain") or not _results_only(raw):
            continue
        if all(b.get("tool_use_id") in calls for b in _blocks(raw)):
            selected.add(lineno)  # the results of a parallel call, on the branch of its tool_use line
    return selected


def _count(entries: list[tuple[int, dict[str, Any]]], selected: set[int], accounting: Accounting) -> None:
    """``raw`` from every line of the file, and the reason of every line not replayed."""
    messages: dict[str, bool] = {}  # message id -> replayed
    # (message id, tool_use id, occurrence in its line) -> replayed: an id a later message reuses
    # is another call (the import renames it), one repeated on a line of its own message is not
    calls: dict[tuple[str, str, int], bool] = {}
    earlier: dict[str, set[str]] = {}  # message id -> tool_use ids of its lines so far
    for lineno, raw in entries:
        kind = raw["type"]
        if kind not in TYPES:
            accounting.skip("unknown_type", "lines")
            continue
        if kind in BOOKKEEPING or (kind == "system" and raw.get("subtype") != "compact_boundary"):
            accounting.skip("harness_bookkeeping", "lines")
            continue
        blocks = _blocks(raw)
        if raw.get("isSidechain"):
            n = sum(1 for b in blocks if b.get("type") in _CALL_BLOCKS)
            accounting.saw("sidechain_calls", n)
            accounting.skip("sidechain", "sidechain_calls", n)
            accounting.skip("sidechain", "lines")
            continue
        kept = lineno in selected
        if kind == "assistant":
            # the id the builder joins a reply's lines by: message.id, else requestId, else the line
            mid = _message_id(raw) or str(raw.get("requestId") or raw.get("uuid") or lineno)
            messages[mid] = messages.get(mid, False) or kept
            # a server tool's call (web search) is replayed as part of its reply, not as a call
            ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            known = earlier.setdefault(mid, set())
            times: dict[str, int] = {}
            for call_id in ids:
                if call_id not in known:
                    times[call_id] = times.get(call_id, 0) + 1
                    key = (mid, call_id, times[call_id])
                    calls[key] = calls.get(key, False) or kept
            known.update(ids)
        elif kind == "user":
            if raw.get("isCompactSummary"):
                accounting.skip("harness_summary", "lines")
                continue
            results = [b for b in blocks if b.get("type") == "tool_result"]
            for block in results:
                accounting.results_in_file.add(str(block.get("tool_use_id")))
            accounting.saw("tool_results", len(results))
            said = int(not _results_only(raw))  # a text (or mixed) user line is one user message
            accounting.saw("user_messages", said)
            if not kept:
                accounting.skip("abandoned_branch", "tool_results", len(results))
                accounting.skip("abandoned_branch", "user_messages", said)
    accounting.saw("assistant_messages", len(messages))
    accounting.skip("abandoned_branch", "assistant_messages", sum(1 for kept in messages.values() if not kept))
    accounting.saw("tool_calls", len(calls))
    accounting.skip("abandoned_branch", "tool_calls", sum(1 for kept in calls.values() if not kept))


def subagent_files(path: Path) -> list[Path]:
    """The subagent transcripts Claude Code keeps beside a session: ``<session>/subagents/*.jsonl``."""
    folder = path.with_suffix("") / "subagents"
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.glob("*.jsonl") if p.is_file())
    if len(files) > MAX_SUBAGENT_FILES:  # the rest would go uncounted: refused, not cut short
        msg = (
            f"{folder}: {len(files):,} subagent files, more than the {MAX_SUBAGENT_FILES:,} read beside "
            "one session; move the session file and its folder somewhere with fewer subagents"
        )
        raise RecordingError(msg)
    return files


def _count_subagents(path: Path, accounting: Accounting) -> None:
    """Subagents run in sessions of their own: their calls are counted, never replayed here."""
    for file in subagent_files(path):
        calls = 0
        for _, raw_line in read_lines(file):  # bounded as the session's own lines are
            try:
                raw = loads(raw_line)
            except orjson.JSONDecodeError:
                accounting.skip("subagent", "lines")
                continue
            if isinstance(raw, dict) and raw.get("type") == "assistant":
                calls += sum(1 for b in _blocks(raw) if b.get("type") in _CALL_BLOCKS)
        accounting.saw("sidechain_calls", calls)
        accounting.skip("subagent", "sidechain_calls", calls)


class _Builder:
    """The replayed lines, in file order, turned into recording items."""

    def __init__(self, lines: Lines, accounting: Accounting) -> None:
        self.lines = lines
        self.accounting = accounting
        self.items: list[Item] = []
        self.group: dict[str, Any] | None = None  # the assistant API message being assembled
        self.deferred: list[tuple[int, ToolResultItem]] = []

    def flush(self) -> None:
        group = self.group
        if group is not None:
            source = Source(kind="model", provider="anthropic", model=group["model"])
            message = Message("assistant", tuple(group["blocks"]), source)
            self.lines.add(self.items, group["line"], AssistantItem(message, group["usage"], group["time"]))
            self.group = None
        for lineno, result in self.deferred:
            self.lines.add(self.items, lineno, result)
        self.deferred.clear()

    def line(self, lineno: int, raw: dict[str, Any]) -> None:
        kind = raw["type"]
        if kind == "system":
            if raw.get("subtype") == "compact_boundary":
                meta = raw.get("compactMetadata") or {}
                if not isinstance(meta, dict):
                    msg = f"compactMetadata must be an object, got {type(meta).__name__}"
                    raise EventError(msg)
                self.flush()
                data = {"trigger": meta.get("trigger"), "pre_tokens": meta.get("preTokens")}
                self.items.append(MarkerItem("compact_boundary", data))
            return
        if kind == "assistant":
            self._assistant(lineno, raw)
        elif kind == "user":
            self._user(lineno, raw)

    def _assistant(self, lineno: int, raw: dict[str, Any]) -> None:
        message = raw["message"]
        mid = message.get("id") or raw.get("requestId") or raw.get("uuid")
        model = message.get("model")
        if not isinstance(mid, str) or not (model is None or isinstance(model, str)):
            msg = f"message.id (or requestId) and message.model must be strings, got {mid!r:.60} and {model!r:.60}"
            raise EventError(msg)
        converted = from_anthropic_message(
            {"role": "assistant", "content": message.get("content") or []}, where="message"
        )
        usage = check_usage(message.get("usage"), "message.usage")
        group = self.group
        if group is not None and group["id"] == mid:
            # one API message is written as one line per content block; results of its earlier
            # tool calls may sit between them, and are committed after the whole message
            known = group["calls"]  # the ids of its earlier lines' calls (kept, not rebuilt per line)
            new = [b for b in converted[0].content if b.type != "tool_call" or b.id not in known]
            group["blocks"].extend(new)
            known.update(b.id for b in new if b.type == "tool_call")
            group["usage"] = usage or group["usage"]
            group["line"] = lineno
            return
        self.flush()
        self.group = {
            "id": mid,
            "blocks": list(converted[0].content),
            "calls": {b.id for b in converted[0].content if b.type == "tool_call"},
            "usage": usage,
            "model": model,
            "line": lineno,
            "time": parse_time(raw.get("timestamp")),
        }

    def _user(self, lineno: int, raw: dict[str, Any]) -> None:
        content = raw["message"].get("content")
        if raw.get("isCompactSummary"):
            self.flush()
            self.items.append(MarkerItem("compact_summary", {"chars": len(content) if isinstance(content, str) else 0}))
            return
        if _results_only(raw):
            # every block is converted before any is kept: a bad line is refused (or skipped) whole
            converted = from_anthropic_message({"role": "user", "content": content}, where="message")
            for m in converted:
                r = m.content[0]
                self.deferred.append((lineno, ToolResultItem(r.call_id, r.content, r.is_error)))  # type: ignore[union-attr]
            if self.group is None:
                self.flush()
            return
        converted = from_anthropic_message(
            {"role": "user", "content": content if content is not None else ""}, where="message"
        )
        self.flush()
        when = parse_time(raw.get("timestamp"))
        said = False
        for m in converted:
            if m.role == "tool":
                r = m.content[0]
                self.lines.add(self.items, lineno, ToolResultItem(r.call_id, r.content, r.is_error))  # type: ignore[union-attr]
            elif m.text.strip() and not said:
                said = True
                instruction = not raw.get("isMeta") and not m.text.lstrip().startswith(HARNESS_TEXT)
                self.lines.add(self.items, lineno, UserItem(m.text, instruction=instruction, time=when))
        if not said:
            self.accounting.skip("empty_message", "user_messages")

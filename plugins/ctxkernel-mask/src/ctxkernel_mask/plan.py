"""What to mask now: a pure function of the surface, the meter, the settings and the window.

The surface splits in three, newest last:

* the **current step**: the newest reply and everything after it (the tool results the model
  asked for and has not read yet, the user's newest message). Never masked.
* the **verbatim tail**: at least ``tail_tokens`` (at most ``tail_ratio`` of the window) of the
  newest surface before it, ending at a balanced cut. Masked only under pressure.
* everything older: its tool results (and replies with large tool-call arguments, together with
  their results) are masked, with or without pressure (observation masking keeps a fixed window
  of recent observations), in batches the prompt cache's break-even rule picks: of the batches
  that start at one of the masks and take every mask after it, the one whose saving over the
  rule's horizon most exceeds the cost of the cached prefix it rewrites, and saves at least
  ``clear_at_least`` tokens. The first batch also brings the history tools, whose schemas every
  later request carries: it is weighed with them, as an edit of the whole prefix.

At ``pressure_ratio`` of the window a batch no longer waits for the rule and may reach into the
verbatim tail, oldest first, until the surface is a tenth of the window below that share.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxkernel import Context, Message, Node, ToolCallBlock, ToolResultBlock, balanced_cut_at_or_before
from ctxkernel.events import original_seq
from ctxkernel.text import COMMAND_KEYS, KERNEL_FRAMES, PATH_KEYS, clip, failed, guard, one_line, tag

from .recall import header_tokens
from .settings import MaskSettings
from .strategy import STRATEGY

#: the history tool a placeholder names (the `history` strategy or `handoff` offers it)
READ_TOOL = "history_read_item"
#: the frame of the notice a reply with large arguments becomes, with its results
REPLY_FRAME = "masked-reply"
#: the file lines of a patch (apply_patch), shown in a digest so the files a patch changed stay visible
PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: .+$", re.MULTILINE)
#: the handle's state keys of the planned masks and the settings they were planned with
CACHE_KEY = "planned"
CACHE_SETTINGS_KEY = "planned_with"
#: the handle's state key of the break-even figures (US dollars) of the batch planned last,
#: which the batch's compaction records; None when no rule weighed it
WEIGHED_KEY = "weighed"
#: characters of one argument value other than paths and commands in a digest
OTHER_VALUE_CHARS = 60
#: a line naming an error: an ...Error/...Exception name, a compiler error code, or a line that
#: starts with FAILED, ERROR, error: or fatal:. Blanks are matched as spaces and tabs, never
#: ``\s``: a match stays on its line (``^\s*`` re-read a run of blank lines from each of its
#: line starts, so 65,000 blank lines took minutes)
ERROR_LINE = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception)\b|^[ \t]*(?:FAILED|ERROR)\b|^[ \t]*(?:error|fatal)(?:\[[\w-]+\])?:"
    r"|\berror[ \t]*\[?[A-Z]{1,4}\d{3,5}\]?|\bsyntax error\b|\bcommand not found\b",
    re.MULTILINE | re.IGNORECASE,
)
#: an exit status a shell output reports in its text ("exit code 2", "exited with code 1")
EXIT_STATUS = re.compile(r"(?:exit(?:ed with)?[ _]code|exit status)[\"': ]*(-?\d+)", re.IGNORECASE)
#: the keys of a JSON-encoded output that carry its exit status
EXIT_KEYS = frozenset({"exit_code", "exitCode", "returncode", "return_code"})
#: an error excerpt reads an output's first and last this many characters (its first lines, and
#: the last line naming an error: a traceback ends with it), so a 50 MB log costs what 64 KB do
ERROR_SCAN_CHARS = 32_768
#: JSON-encoded outputs are decoded up to this size, and this many strings of them
DECODE_MAX_CHARS = 2_000_000
DECODE_MAX_STRINGS = 10_000


@dataclass(frozen=True)
class Masking:
    """One planned mask: surface nodes ``start``..``end`` (seqs) replaced by ``message``."""

    start: int
    end: int
    message: Message
    tokens_before: int
    tokens_after: int
    kind: str  # "result" (one tool result, rewritten in place) or "reply" (a reply with its results)

    @property
    def saved(self) -> int:
        return self.tokens_before - self.tokens_after


def plan(ctx: Context, settings: MaskSettings, window: int, tokens: int) -> list[Masking]:
    """The masks to commit now, oldest first (empty: wait). ``window`` is the effective window,
    ``tokens`` the size of the next request as the kernel counts it."""
    nodes = ctx.surface.nodes
    current = _current_step(nodes)
    if current == 0:
        return []
    meter = ctx.meter
    budget = min(settings.tail_tokens, int(settings.tail_ratio * window))
    tail_start = current
    kept = 0
    while tail_start > 0 and kept < budget:
        tail_start -= 1
        kept += meter.node_tokens(nodes[tail_start])
    boundary = balanced_cut_at_or_before(ctx.surface, tail_start)
    chosen = _candidates(ctx, settings, 0, boundary)
    saved = sum(m.saved for m in chosen)
    limit = int(settings.pressure_ratio * window)
    if tokens < limit:
        return _paying_batch(ctx, settings, chosen, window)
    # under pressure: clear what there is, then reach into the tail until a tenth of the window
    # below the limit (room for several steps before the next rewrite of the cached prefix)
    target = limit - window // 10
    projected = tokens - saved
    if projected > target:
        for mask in _candidates(ctx, settings, boundary, balanced_cut_at_or_before(ctx.surface, current)):
            if projected <= target:
                break
            chosen.append(mask)
            projected -= mask.saved
    return chosen


def _paying_batch(ctx: Context, settings: MaskSettings, chosen: list[Masking], window: int) -> list[Masking]:
    """The newest masks from the start the break-even rule favours (see the module's docstring);
    with no price known or the rule off, all of them once they save ``clear_at_least``."""
    mask = STRATEGY.on(ctx)
    mask.state[WEIGHED_KEY] = None
    if not chosen:
        return []
    tools = 0
    if not mask.tools_offered and window >= settings.recall_min_window:
        tools = header_tokens(ctx, settings)  # the first mask brings the tools: the header changes
    first = ctx.surface.nodes[0].seq
    best: list[Masking] = []
    best_net = 0.0
    weighed = None
    saved = 0
    for start in range(len(chosen) - 1, -1, -1):
        saved += chosen[start].saved
        if saved - tools < settings.clear_at_least:
            continue
        decision = mask.weigh_edit(first if tools else chosen[start].start, saved - tools, clears=True)
        if decision is None:
            return chosen if sum(m.saved for m in chosen) - tools >= settings.clear_at_least else []
        net = decision.saving - decision.cost
        if decision.edits and net > best_net:
            best, best_net = chosen[start:], net
            weighed = {"saving_usd": decision.saving, "cost_usd": decision.cost, "header_tokens": tools}
    mask.state[WEIGHED_KEY] = weighed
    return best


def _current_step(nodes: Sequence[Node]) -> int:
    """Position of the newest reply: it and everything after it are the current step."""
    for position in range(len(nodes) - 1, -1, -1):
        if nodes[position].role == "assistant":
            return position
    return 0


def _candidates(ctx: Context, settings: MaskSettings, start: int, end: int) -> list[Masking]:
    """Every mask worth making among surface positions ``start``..``end`` (a balanced range)."""
    nodes = ctx.surface.nodes
    meter = ctx.meter
    excluded = set(settings.exclude_tools)
    cache = _cache(ctx, settings)
    out: list[Masking] = []
    position = start
    while position < end:
        node = nodes[position]
        position += 1
        if node.role == "assistant" and node.message.tool_calls and settings.args_tokens:
            results = _results_of(nodes, position - 1, end)
            if results is not None:
                key = -node.seq  # replies by their negative seq, beside results
                if key not in cache:
                    cache[key] = _reply_mask(ctx, settings, node, results, excluded)
                mask = cache[key]
                if mask is not None:
                    out.append(mask)
                    position += len(results)
                    continue
        if node.role != "tool":
            continue
        result = node.message.tool_result
        if result is None or (result.name or "") in excluded:
            continue
        before = meter.node_tokens(node)
        if before < max(settings.min_tokens, 1):
            continue
        if node.seq not in cache:
            cache[node.seq] = _result_mask(ctx, settings, node, result, before)
        mask = cache[node.seq]
        if mask is not None:
            out.append(mask)
    return out


def _result_mask(
    ctx: Context, settings: MaskSettings, node: Node, result: ToolResultBlock, before: int
) -> Masking | None:
    call = _call_of(ctx, result)
    text = placeholder(ctx, settings, node, result, call, before)
    if text == result.content:
        return None  # masked already
    message = Message.tool(result.call_id, text, is_error=result.is_error, name=result.name)
    after = ctx.meter.count_message(message)
    return Masking(node.seq, node.seq, message, before, after, "result") if after < before else None


def _cache(ctx: Context, settings: MaskSettings) -> dict[int, Masking | None]:
    """The masks planned so far, by surface seq (a node's mask depends only on the node, its call
    and the settings): kept in the handle's state for this process, emptied when the settings
    change (a re-route) and trimmed to what is still on the surface when it grows large."""
    state = STRATEGY.on(ctx).state
    cache: dict[int, Masking | None] = state.setdefault(CACHE_KEY, {})
    if state.get(CACHE_SETTINGS_KEY) != settings:
        cache.clear()
        state[CACHE_SETTINGS_KEY] = settings
    if len(cache) > 2 * len(ctx.surface.nodes) + 64:
        visible = {n.seq for n in ctx.surface.nodes}
        for key in [k for k in cache if abs(k) not in visible]:
            del cache[key]
    return cache


def _results_of(nodes: Sequence[Node], position: int, end: int) -> list[Node] | None:
    """The results that follow the reply at ``position`` (all of them, before ``end``), or None."""
    calls = {c.id for c in nodes[position].message.tool_calls}
    results: list[Node] = []
    after = position + 1
    while after < end:
        result = nodes[after].message.tool_result
        if result is None or result.call_id not in calls:
            break
        results.append(nodes[after])
        after += 1
    return results if len(results) == len(calls) else None


def _reply_mask(
    ctx: Context, settings: MaskSettings, reply: Node, results: list[Node], excluded: set[str]
) -> Masking | None:
    """A reply whose tool-call arguments are large, masked together with its results into one
    notice: its text verbatim, each call's digest, each result's placeholder."""
    calls = reply.message.tool_calls
    meter = ctx.meter
    if meter.node_tokens(reply) < settings.args_tokens:
        return None  # the whole reply is smaller than the bound: its arguments are too
    arguments = sum(meter.count_text(_compact_json(c.arguments)) for c in calls)
    if arguments < settings.args_tokens:
        return None
    if any((n.message.tool_result.name or "") in excluded for n in results if n.message.tool_result):
        return None  # a kept result cannot move into a notice (it stays a result of its call)
    reply_item = original_seq(ctx.events, reply.seq)
    head = (
        f"{tag(REPLY_FRAME, item=f'item_{reply_item}')}An earlier reply of yours; its tool-call arguments "
        f"({arguments} tokens) and results are masked. {READ_TOOL}(id=...) reads any item in full."
    )
    lines = []
    text = reply.message.text.strip()
    if text:
        lines.append(text)
    by_call = {n.message.tool_result.call_id: n for n in results if n.message.tool_result}
    for call in calls:
        node = by_call[call.id]
        result = node.message.tool_result
        assert result is not None
        tokens = meter.node_tokens(node)
        if tokens < settings.min_tokens:
            lines.append(f"- called {digest(call, settings.digest_chars)} -> {one_line(result.content)}")
        else:
            lines.append(
                f"- called {digest(call, settings.digest_chars)} -> "
                + placeholder(ctx, settings, node, result, None, tokens)
            )
    # the model's text, its arguments and its results' text (tool output) in a user message: none
    # may end the notice or open the kernel's blocks the compaction may append to it
    body = guard("\n".join(lines), REPLY_FRAME, *KERNEL_FRAMES)
    message = Message.user(f"{head}\n{body}\n</{REPLY_FRAME}>", STRATEGY.source("reply"))
    before = sum(meter.node_tokens(n) for n in (reply, *results))
    after = meter.count_message(message)
    if before - after < settings.min_tokens:
        return None
    return Masking(reply.seq, results[-1].seq, message, before, after, "reply")


def placeholder(
    ctx: Context, settings: MaskSettings, node: Node, result: ToolResultBlock, call: ToolCallBlock | None, tokens: int
) -> str:
    """The one line that stands for a masked result (an error keeps its first lines)."""
    original = _original_result(ctx, node) or result
    item = original_seq(ctx.events, node.seq)
    what = f"{result.name or 'tool'} output" if call is None else f"output of {digest(call, settings.digest_chars)}"
    line = f"[masked {what}: {tokens} tokens; {READ_TOOL}(id='item_{item}') reads it in full]"
    kept = error_excerpt(original, settings.error_lines, settings.error_chars)
    return f"{line}\n{kept}" if kept else line


def error_excerpt(result: ToolResultBlock, lines: int, chars: int) -> str:
    """What a masked error keeps: its first ``lines`` lines and the last line naming an error
    (a traceback ends with it), at most ``chars`` characters; '' for a result that is no error.
    Only the output's first and last :data:`ERROR_SCAN_CHARS` characters are read.
    A JSON-encoded output (``{"output": ..., "metadata": {"exit_code": 1}}``) is read as the text
    its strings hold."""
    if not lines or not chars:
        return ""
    text, code = _decoded(result.content)
    if code is None:
        status = EXIT_STATUS.search(text[-2_000:])
        code = int(status.group(1)) if status else None
    text = _scanned(text)
    last = None
    for match in ERROR_LINE.finditer(text):
        last = match  # the last line naming an error (a traceback ends with it)
    if not (failed(result) or last is not None or (code is not None and code != 0)):
        return ""
    shown = []
    for line in text.strip().splitlines():
        if line.strip():
            shown.append(line)
            if len(shown) == lines:
                break
    head = "error, first lines:\n"
    named = ""
    if last is not None:
        start = text.rfind("\n", 0, last.start()) + 1
        end = text.find("\n", last.end())
        named = clip(text[start : end if end >= 0 else len(text)].strip(), chars // 2)
        if any(named in line for line in shown):
            named = ""  # among the first lines already
    # the line naming the error is kept whole; the first lines give way to it
    room = max(0, chars - len(head) - len(named) - 1)
    first = clip("\n".join(shown), room) if room else ""
    return head + "\n".join(part for part in (first, named) if part)


def _scanned(text: str) -> str:
    """What an error excerpt reads of ``text``: all of it up to twice :data:`ERROR_SCAN_CHARS`,
    else its first and its last ERROR_SCAN_CHARS characters (the tail from its first whole line),
    one line break between them."""
    if len(text) <= 2 * ERROR_SCAN_CHARS:
        return text
    tail = text[-ERROR_SCAN_CHARS:]
    return text[:ERROR_SCAN_CHARS] + "\n" + tail[tail.find("\n") + 1 :]


def _decoded(content: str) -> tuple[str, int | None]:
    """The text a JSON-encoded output holds and its exit code, or ``content`` itself."""
    if not content.startswith("{") or len(content) > DECODE_MAX_CHARS:
        return content, None
    try:
        value = json.loads(content)
    except ValueError:
        return content, None
    if not isinstance(value, dict):
        return content, None
    strings: list[str] = []
    code = None
    stack: list[object] = [value]
    while stack and len(strings) < DECODE_MAX_STRINGS:
        item = stack.pop()
        if isinstance(item, str):
            strings.append(item)
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                if key in EXIT_KEYS and type(inner) is int:
                    code = inner
                else:
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return "\n".join(strings), code


def digest(call: ToolCallBlock, limit: int) -> str:
    """``name(key=value, ...)`` of a call, paths and commands first, at most ``limit`` characters;
    a patch's file lines stand for the patch."""
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    first = [k for k in (*PATH_KEYS, *COMMAND_KEYS) if k in arguments]
    parts = []
    for key in [*first, *(k for k in arguments if k not in first)]:
        value = arguments[key]
        text = value if isinstance(value, str) else _compact_json(value)
        files = PATCH_FILE.findall(text)
        if files:
            text = "; ".join(f.removeprefix("*** ") for f in files)
        elif key not in first:
            text = clip(text, OTHER_VALUE_CHARS, single_line=True)
        parts.append(f"{key}={one_line(text)}")
    return clip(f"{call.name}({', '.join(parts)})", limit, single_line=True)


def _original_result(ctx: Context, node: Node) -> ToolResultBlock | None:
    seq = original_seq(ctx.events, node.seq)
    if seq == node.seq:
        return node.message.tool_result
    return Message.from_dict(ctx.events[seq].data["message"]).tool_result


def _call_of(ctx: Context, result: ToolResultBlock) -> ToolCallBlock | None:
    owner = ctx.surface.call_owner.get(result.call_id)
    reply = ctx.surface.node(owner) if owner is not None else None
    if reply is None:
        return None
    return next((c for c in reply.message.tool_calls if c.id == result.call_id), None)


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)

"""Recall needs: where a recorded step names something that only hidden content held.

A *cue* is a concrete name a model uses: a file path, an identifier (``snake_case``,
``camelCase``, ``PascalCase`` of two parts or more), an error code (``TS2345``, ``E0308``) or an
exception name (``KeyError``), or a whole shell command. At each recorded reply, the cues of its
tool-call arguments and its text that appeared earlier in the recording (in a user message, a
tool result, an earlier reply's text or arguments) are *candidates*; a candidate is a *need* at a
request that does not show it anywhere (system prompt, messages, tool calls and results): the
model used a name that, under this strategy, only content hidden from it held.

For each candidate the *evidence* is kept: the text around the cue where it appeared
(:data:`EVIDENCE_CHARS` either side, within its line, whitespace-normalized), for its first and its
last :data:`MAX_EVIDENCE` - 1 appearances. A need is found when a recall tool's output (see
:mod:`.recall`) holds one of them: the cue came back with a context it had, not merely echoed.

The candidates depend on the recording only, so they are computed once per recording and shared
by every profile; at most :data:`MAX_CUES_PER_STEP` candidates a step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from .probes import SHELL_TOOLS, command_of, strings_of
from .recording import AssistantItem, Item, Recording, ToolResultItem, UserItem

#: characters of context kept either side of a cue, within its line
EVIDENCE_CHARS = 40
#: appearances of a cue whose evidence is kept (the first and the latest ones)
MAX_EVIDENCE = 8
#: most candidates one recorded step contributes (the first ones, in the reply's order)
MAX_CUES_PER_STEP = 4
#: the shortest cue (a shorter name is too common to tell a need)
MIN_CUE_CHARS = 5
#: the longest command taken whole as a cue
MAX_COMMAND_CHARS = 160

_PATH = re.compile(
    r"(?<![\w/.@-])(?:\.{1,2}/|/)?(?:[\w.-]+/)+[\w.-]*\w\.\w{1,8}(?![\w/])"
    r"|(?<![\w/.@-])[\w-]+\.(?:py|ts|tsx|js|jsx|mjs|go|rs|java|kt|rb|php|c|h|cc|cpp|hpp|cs|swift|md|json|toml"
    r"|yaml|yml|txt|sh|sql|css|scss|html|lock|cfg|ini|xml|proto)(?![\w.])"
)
_IDENT = re.compile(
    r"(?<![\w.-])(?:[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[a-z][a-z0-9]*(?:[A-Z][a-z0-9]+)+|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+)"
    r"(?![\w-])"
)
_BACKTICKS = re.compile(r"`([^`\n]{5,160})`")
_CODE = re.compile(r"\b(?:[A-Z]{1,4}\d{3,5}|[A-Z][A-Za-z]+(?:Error|Exception))\b")


def cues_in(text: str) -> list[str]:
    """The cues of a text, in order of appearance, each once."""
    found: dict[str, int] = {}
    for pattern in (_PATH, _IDENT, _CODE):
        for match in pattern.finditer(text):
            cue = match.group(0)
            if len(cue) >= MIN_CUE_CHARS:
                found.setdefault(cue, match.start())
    return sorted(found, key=found.__getitem__)


def evidence(text: str, cue: str, at: int) -> str:
    """The line around ``cue`` found at ``at``: up to :data:`EVIDENCE_CHARS` either side, normalized."""
    line_start = text.rfind("\n", 0, at) + 1
    line_end = text.find("\n", at + len(cue))
    line_end = len(text) if line_end == -1 else line_end
    start = max(line_start, at - EVIDENCE_CHARS)
    end = min(line_end, at + len(cue) + EVIDENCE_CHARS)
    return " ".join(text[start:end].split())


@dataclass(frozen=True)
class Candidate:
    """A cue a recorded step uses that appeared before it, with the evidence of its last appearance."""

    cue: str
    evidence: tuple[str, ...]


def _item_texts(item: Item) -> list[str]:
    if isinstance(item, UserItem):
        return [item.text]
    if isinstance(item, ToolResultItem):
        return [item.content]
    if isinstance(item, AssistantItem):
        texts = [item.message.text]
        for call in item.message.tool_calls:
            arguments: Any = call.arguments
            texts += list(strings_of(arguments))
        return texts
    return []


def _step_cues(item: AssistantItem) -> list[str]:
    """The cues a reply uses: its calls' commands and arguments, then its text."""
    cues: list[str] = []
    for call in item.message.tool_calls:
        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        if call.name.lower() in SHELL_TOOLS:
            command = command_of(arguments).strip()
            if MIN_CUE_CHARS <= len(command) <= MAX_COMMAND_CHARS and "\n" not in command:
                cues.append(command)
        for text in strings_of(arguments):
            cues += cues_in(text)
    cues += cues_in(item.message.text)
    return list(dict.fromkeys(cues))


def candidates(recording: Recording) -> dict[int, list[Candidate]]:
    """Per recorded reply (its item index), the cues it uses that earlier items held (kept with
    the recording: every profile replays the same one)."""
    cached: dict[int, list[Candidate]] | None = recording.derived.get("recall_candidates")
    if cached is not None:
        return cached
    seen: dict[str, list[str]] = {}  # cue -> evidence of its first and latest appearances

    def saw(cue: str, proof: str) -> None:
        kept = seen.setdefault(cue, [])
        if proof in kept:
            kept.remove(proof)
        kept.append(proof)
        if len(kept) > MAX_EVIDENCE:
            del kept[1]  # the first appearance stays

    out: dict[int, list[Candidate]] = {}
    for index, item in enumerate(recording.items):
        if isinstance(item, AssistantItem):
            found = [Candidate(cue, tuple(seen[cue])) for cue in _step_cues(item) if cue in seen]
            if found:
                out[index] = found[:MAX_CUES_PER_STEP]
        for text in _item_texts(item):
            for cue in cues_in(text):
                saw(cue, evidence(text, cue, text.find(cue)))
        if isinstance(item, UserItem):
            # a command the user names: `make check`, or a line of its own
            spans = _BACKTICKS.findall(item.text) + [line.strip() for line in item.text.splitlines()]
            for span in spans:
                if MIN_CUE_CHARS <= len(span) <= MAX_COMMAND_CHARS:
                    saw(span, evidence(item.text, span, item.text.find(span)))
    recording.derived["recall_candidates"] = out
    return out


def request_text(system: str, messages: Any, cache: dict[int, tuple[Any, str]]) -> str:
    """Everything a request shows, as one text (``cache`` keeps each message's text by identity)."""
    parts = [system]
    for message in messages:
        held = cache.get(id(message))
        if held is None or held[0] is not message:
            texts = []
            for block in message.content:
                if block.type == "text":
                    texts.append(block.text)
                elif block.type == "tool_result":
                    texts.append(block.content)
                elif block.type == "tool_call":
                    texts.append(block.name + " " + orjson.dumps(block.arguments).decode())
                    texts += list(strings_of(block.arguments))
            held = (message, "\n".join(texts))
            cache[id(message)] = held
        parts.append(held[1])
    return "\n".join(parts)


__all__ = ["EVIDENCE_CHARS", "MAX_CUES_PER_STEP", "Candidate", "candidates", "cues_in", "evidence", "request_text"]

"""Retention probes: the concrete things an agent must not forget, extracted from a recording.

Deterministic rules, one per kind, applied to the recording's tool calls and results and the
user's messages (never to what a strategy wrote). Every probe is a short text and the recording
items it came from:

``files_changed``   the path of every file an editing tool changed: a call named ``edit``, ``write``,
                    ``multiedit``, ``notebookedit``, ``edit_file``, ``write_file``, ``create_file``,
                    ``str_replace_editor`` / ``str_replace_based_edit_tool`` (commands ``create``,
                    ``str_replace``, ``insert``), its ``file_path``, ``path``, ``notebook_path``,
                    ``filename`` or ``target_file`` argument; the ``*** Add|Update|Delete File:``
                    lines of an ``apply_patch`` input, also inside a shell command; the file a shell
                    command's heredoc writes (``cat > PATH <<EOF``, ``cat <<EOF >> PATH``,
                    ``tee [-a] PATH <<EOF``)
``errors_seen``     per tool result (a JSON-encoded result read as the text its strings hold), the
                    last line naming an error: an ``...Error``/``...Exception`` name, a compiler
                    error code (``error TS2345``, ``error[E0308]``, ``TS2345:``), ``syntax error``,
                    ``command not found``, or a line starting ``FAILED``, ``ERROR``, ``error:`` /
                    ``Error:``, ``fatal:``, each in that case; for an error result, or one
                    reporting a non-zero exit code, with no such line, its first non-empty line
``commands_worked`` the command of every shell call (``bash``, ``shell``, ``run``, ``exec_command``,
                    ``execute_bash``, ``run_command``, ``run_terminal_cmd``, ``local_shell``) whose
                    result is not an error, names no error line, and reports no non-zero exit code
                    (in its text or, JSON-encoded, its ``exit_code``)
``decisions``       sentences of the user's instructions that constrain the work: they contain
                    ``don't``, ``do not``, ``never``, ``always``, ``must``, ``instead``, ``make sure``,
                    ``prefer``, ``avoid``, ``from now on`` or ``only``
``open_todos``      entries of the last todo list the model wrote (``TodoWrite``, ``update_plan``,
                    ... as :data:`ctxkernel.recall.history.TODO_TOOLS`) not marked done

Texts are whitespace-normalized and clipped to 200 characters; equal texts of one kind are one
probe (its items are all the places it came from). At most :data:`MAX_PER_KIND` probes per kind
(an evenly spaced sample of them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from ..recall.history_index import TODO_TOOLS
from .recording import AssistantItem, Item, Recording, ToolResultItem, UserItem

KINDS: tuple[str, ...] = ("files_changed", "errors_seen", "commands_worked", "decisions", "open_todos")
MAX_PER_KIND = 200
TEXT_CHARS = 200

_EDIT_TOOLS = frozenset(
    {"edit", "write", "multiedit", "notebookedit", "edit_file", "write_file", "create_file", "replace_in_file"}
)
_EDITOR_TOOLS = frozenset({"str_replace_editor", "str_replace_based_edit_tool"})
_EDITOR_WRITES = frozenset({"create", "str_replace", "insert"})
_PATH_ARGS = ("file_path", "path", "notebook_path", "filename", "target_file")
SHELL_TOOLS = frozenset(
    {"bash", "shell", "run", "exec_command", "execute_bash", "run_command", "run_terminal_cmd", "local_shell"}
)
_SHELLS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh"})
_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", re.MULTILINE)
# a heredoc that writes a file: `cat > f <<EOF`, `cat <<'EOF' >> f`, `tee -a f <<EOF` (on one line)
_HEREDOC_LINE = re.compile(r"^.*<<-?\s*['\"]?\w+['\"]?.*$", re.MULTILINE)
_REDIRECT = re.compile(r"(?<![<>&\d])>>?\s*([^\s;&|<>'\"]+)")
_TEE = re.compile(r"\btee\s+(?:-a\s+)?([^\s;&|<>'\"]+)")
# matched in the case docs/simulate.md gives: in any case, source code a command printed
# (`failed: 0,`, `linkError`, `instanceof Error`) read as an error seen
_ERROR_LINE = re.compile(
    r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b|^\s*(?:FAILED|ERROR)\b|^\s*(?:[Ee]rror|[Ff]atal)(?:\[[\w-]+\])?:"
    r"|\berror\s*\[?[A-Z]{1,4}\d{3,5}\]?|\b[A-Z]{2,4}\d{4}:|\b[Ss]yntax error\b|\bcommand not found\b"
)
#: the keys of a JSON-encoded result that carry its exit status
_EXIT_KEYS = ("exit_code", "exitCode", "returncode", "return_code", "status_code")
_EXIT_CODE = re.compile(r"(?:exit(?:ed with)?[ _]code|exit status)[\"': ]*(-?\d+)", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_DECISION = re.compile(
    r"\b(?:don't|do not|never|always|must|instead|make sure|prefer|avoid|from now on|only)\b", re.IGNORECASE
)
_DONE = frozenset({"completed", "complete", "done", "cancelled", "canceled"})


@dataclass(frozen=True)
class Probe:
    kind: str
    text: str
    items: tuple[int, ...]  # indexes of the recording items it came from


def _clip(text: str) -> str:
    return " ".join(text.split())[:TEXT_CHARS]


def command_of(arguments: dict[str, Any]) -> str:
    command = arguments.get("command", arguments.get("cmd"))
    if isinstance(command, list) and all(isinstance(c, str) for c in command):
        # ["bash", "-lc", "make test"] runs its last element
        if len(command) >= 3 and command[0] in _SHELLS and command[1] in ("-c", "-lc"):
            script: str = command[-1]
            return script
        return " ".join(command)
    return command if isinstance(command, str) else ""


def shell_edits(command: str) -> list[str]:
    """Files a shell command writes: an ``apply_patch`` inside it, or a heredoc into a file."""
    paths = _PATCH_FILE.findall(command)
    for line in _HEREDOC_LINE.findall(command):
        paths += [p for p in _REDIRECT.findall(line) + _TEE.findall(line) if p != "/dev/null"]
    return paths


def _edited_paths(name: str, arguments: dict[str, Any]) -> list[str]:
    lowered = name.lower()
    if lowered == "apply_patch":
        patch = arguments.get("input", arguments.get("patch", ""))
        return _PATCH_FILE.findall(patch) if isinstance(patch, str) else []
    if lowered in SHELL_TOOLS:
        return shell_edits(command_of(arguments))
    command = arguments.get("command")
    if lowered in _EDITOR_TOOLS and not (isinstance(command, str) and command in _EDITOR_WRITES):
        return []  # a view, or arguments a model sent malformed
    if lowered not in _EDIT_TOOLS and lowered not in _EDITOR_TOOLS:
        return []
    return [v for k in _PATH_ARGS if isinstance(v := arguments.get(k), str) and v.strip()][:1]


def decoded(content: str) -> tuple[str, int | None]:
    """A result as the text it holds and its exit code: a JSON-encoded result (``{"output": ...,
    "metadata": {"exit_code": 1}}``) as the text of its strings, one a line, and its ``exit_code``;
    any other result as it is, with the last exit code its text reports (None when none)."""
    stripped = content.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict | list):
            code = _json_exit_code(data)
            return "\n".join(strings_of(data)), code
    codes = _EXIT_CODE.findall(content)
    return content, int(codes[-1]) if codes else None


def _json_exit_code(data: Any, depth: int = 0) -> int | None:
    if depth > 4 or not isinstance(data, dict):
        return None
    for key in _EXIT_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    for value in data.values():
        code = _json_exit_code(value, depth + 1)
        if code is not None:
            return code
    return None


def error_line(content: str, is_error: bool) -> str:
    """The last line of a tool result naming an error ('' when none); see the module docstring."""
    text, code = decoded(content)
    found = ""
    for line in text.splitlines():
        if _ERROR_LINE.search(line):
            found = line
    if not found and (is_error or (code is not None and code != 0)):
        found = next((line for line in text.splitlines() if line.strip()), "")
    return _clip(found)


def _worked(result: ToolResultItem) -> bool:
    if result.is_error or error_line(result.content, False):
        return False
    _, code = decoded(result.content)
    return code is None or code == 0


def _todo_entries(name: str, arguments: dict[str, Any]) -> list[str] | None:
    entries = None
    for key in TODO_TOOLS.get(name, ()):
        if isinstance(arguments.get(key), list):
            entries = arguments[key]
    if entries is None:
        return None
    out = []
    for raw in entries:
        if isinstance(raw, dict):
            text = raw.get("content") or raw.get("step") or raw.get("text") or raw.get("title") or ""
            if str(raw.get("status") or "pending").lower() not in _DONE:
                out.append(str(text))
        else:
            out.append(str(raw))
    return out


def extract(recording: Recording) -> list[Probe]:
    """Every probe of ``recording``, by the rules of the module docstring, in kind order (kept
    with the recording: every profile replays the same one)."""
    cached: tuple[Probe, ...] | None = recording.derived.get("probes")
    if cached is None:
        cached = recording.derived["probes"] = tuple(_extract(recording))
    return list(cached)


def _extract(recording: Recording) -> list[Probe]:
    found: dict[tuple[str, str], list[int]] = {}

    def add(kind: str, text: str, index: int) -> None:
        text = _clip(text)
        if text:
            found.setdefault((kind, text), []).append(index)

    items: list[Item] = recording.items
    shell_calls: dict[str, tuple[int, str]] = {}  # call id -> (item index, command)
    todos: tuple[int, list[str]] | None = None
    for index, item in enumerate(items):
        if isinstance(item, UserItem) and item.instruction:
            for sentence in _SENTENCE.split(item.text):
                if _DECISION.search(sentence) and len(sentence.strip()) >= 10:
                    add("decisions", sentence, index)
        elif isinstance(item, AssistantItem):
            for call in item.message.tool_calls:
                arguments = call.arguments if isinstance(call.arguments, dict) else {}
                for path in _edited_paths(call.name, arguments):
                    add("files_changed", path, index)
                if call.name.lower() in SHELL_TOOLS and (command := command_of(arguments)):
                    shell_calls[call.id] = (index, command)
                entries = _todo_entries(call.name, arguments)
                if entries is not None:
                    todos = (index, entries)
        elif isinstance(item, ToolResultItem):
            if line := error_line(item.content, item.is_error):
                add("errors_seen", line, index)
            shell = shell_calls.pop(item.call_id, None)
            if shell is not None and _worked(item):
                add("commands_worked", shell[1], shell[0])
                found[("commands_worked", _clip(shell[1]))].append(index)
    if todos is not None:
        for entry in todos[1]:
            add("open_todos", entry, todos[0])
    probes = [Probe(kind, text, tuple(dict.fromkeys(where))) for (kind, text), where in found.items()]
    out: list[Probe] = []
    for kind in KINDS:
        of_kind = [p for p in probes if p.kind == kind]
        if len(of_kind) > MAX_PER_KIND:
            step = len(of_kind) / MAX_PER_KIND
            of_kind = [of_kind[int(i * step)] for i in range(MAX_PER_KIND)]
        out += of_kind
    return out


def visible_text(texts: Iterable[str]) -> str:
    """The normalized corpus a probe is looked for in."""
    return " ".join(" ".join(t.split()) for t in texts)


def message_texts(message: Any) -> list[str]:
    """Text blocks, tool results, and every string inside tool-call arguments (a path, a command)."""
    out: list[str] = []
    for block in message.content:
        if block.type == "text":
            out.append(block.text)
        elif block.type == "tool_result":
            out.append(block.content)
            text, _ = decoded(block.content)
            if text is not block.content:  # a JSON-encoded result: the text it holds is what it shows
                out.append(text)
        elif block.type == "tool_call":
            out += list(strings_of(block.arguments))
            out.append(orjson.dumps(block.arguments).decode())
    return out


def strings_of(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_of(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_of(v)


def shown_as_a_whole(text: str, visible: str) -> bool:
    """``text`` appears in ``visible`` not inside a longer word: a command ``ls`` is not shown by
    ``tools``, a path ``a.py`` not by ``data.py`` or ``a.pyc``. A text clipped to
    :data:`TEXT_CHARS` may end inside a word of what it was clipped from."""
    start = visible.find(text)
    clipped = len(text) >= TEXT_CHARS
    while start != -1:
        end = start + len(text)
        before_ok = start == 0 or not (_word(text[0]) and _word(visible[start - 1]))
        after_ok = clipped or end == len(visible) or not (_word(text[-1]) and _word(visible[end]))
        if before_ok and after_ok:
            return True
        start = visible.find(text, start + 1)
    return False


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def score(probes: list[Probe], visible: str, reachable: set[int]) -> dict[str, dict[str, float | int | None]]:
    """Per kind: ``count``, the share ``visible`` at the end and the share ``recoverable`` (visible,
    or one of its items was fetched back through the recall tools); shares are null with no probe."""
    out: dict[str, dict[str, float | int | None]] = {}
    for kind in KINDS:
        of_kind = [p for p in probes if p.kind == kind]
        shown = [p for p in of_kind if shown_as_a_whole(p.text, visible)]
        back = [p for p in of_kind if p in shown or reachable.intersection(p.items)]
        n = len(of_kind)
        out[kind] = {
            "count": n,
            "visible": round(len(shown) / n, 4) if n else None,
            "recoverable": round(len(back) / n, 4) if n else None,
        }
    return out


# -- instructions, at every request ------------------------------------------------------------------
# what opens a line that quotes a message: quote markers, an anchor the strategy decorates it with
_QUOTED = re.compile(r"^[ \t]*(?:>[ \t]?)*(?:⟦[^⟧\n]{1,24}⟧[ \t]*)?")
#: what may follow an instruction shown whole: the end of its line or message, a closing tag, an
#: id pointer (`` [item_12]``, `` (item_12)``, `` ⟦p3⟧``), or the separator of a list of fields
#: or of a summary's items flattened onto one line (``; ``, `` - ``, `` ## ``)
_AFTER = ("\n", "<", " [", " (", "; ", " ⟦", " - ", " #")
#: what may open it on its line: nothing, a tag, a bullet, a short label (``- User: ``, ``Goal: ``,
#: ``...; asked: ``)
_BEFORE = re.compile(
    r"(?:.*>[ \t]?|(?:.*(?:[;·—|]| -)[ \t]*)?(?:[-*•+][ \t]+|\d{1,3}[.)][ \t]+)?(?:[A-Za-z][^:\n]{0,40}:[ \t]?)?)"
)


def canonical(text: str) -> str:
    """Text as instructions are compared: each line without what opens it as a quote or an anchor
    (``> ``, ``⟦p1⟧ ``) and with its whitespace collapsed, blank lines dropped. A bullet or a label
    before an instruction is allowed where it is found (:func:`shown_whole`), not stripped: an
    instruction's own list items are part of it."""
    lines = (" ".join(_QUOTED.sub("", line).split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def shown_whole(instruction: str, text: str) -> bool:
    """``instruction`` (canonical) appears in ``text`` (canonical) whole, as a unit: what comes
    before it on its line is nothing, a tag or a short label, and it ends its line (or a field, or
    comes before a tag or an id pointer). Line breaks count as spaces inside it (a multi-line
    instruction shown on one line is shown). A one-word instruction inside a sentence is not."""
    flat, wanted = text.replace("\n", " "), instruction.replace("\n", " ")  # the same positions
    start = flat.find(wanted)
    while start != -1:
        end = start + len(wanted)
        line_start = text.rfind("\n", 0, start) + 1
        if _BEFORE.fullmatch(text, line_start, start) and (
            end == len(text) or text.startswith(_AFTER, end) or text.endswith(";", 0, end + 1)
        ):
            return True
        start = flat.find(wanted, start + 1)
    return False


class InstructionWatch:
    """The user's instructions given so far, checked against every request as it is sent."""

    def __init__(self) -> None:
        self.given: list[str] = []
        self.shares: list[float] = []
        self._canon: dict[int, tuple[Any, str]] = {}  # id(message) -> (message, canonical text)

    def give(self, text: str) -> None:
        canon = canonical(text)
        if canon and canon not in self.given:
            self.given.append(canon)

    def text_of(self, system: str, messages: Iterable[Any]) -> str:
        parts = [canonical(system)]
        for message in messages:
            held = self._canon.get(id(message))
            if held is None or held[0] is not message:
                held = (message, canonical(message.text))
                self._canon[id(message)] = held
            parts.append(held[1])
        return "\n".join(parts)

    def visible(self, text: str) -> float:
        return sum(1 for i in self.given if shown_whole(i, text)) / len(self.given) if self.given else 1.0

    def check(self, system: str, messages: Iterable[Any]) -> None:
        """One request as sent: the share of the instructions given so far that it shows whole."""
        if self.given:
            self.shares.append(self.visible(self.text_of(system, messages)))

"""The work ledger: what the agent has done so far, carried through every compaction (``[ledger]``).

A deterministic fold of the session's log, with no model call: the files the model changed (path
and operation), the last command that failed with its first error lines, the last commands that
worked, the open entries of the model's last todo list, and the task's stated definition of done.
Every entry is verbatim from the log (clipped, never paraphrased).

Where it goes: into the replacement of every compaction transaction that would take an entry off
the surface (:func:`pin_lost`, called by :func:`ctxkernel.compaction.run_transaction` beside the
instruction block, so every strategy's summary, window switch, archive or drop carries it), and
into a continuation's first request (inherited like the user's instructions). A ``<work-ledger>``
block shows only the entries no message kept on the surface shows already, within the budget
(``[ledger] budget_ratio`` of the routed model's effective window). So it is rendered only when a
compaction changes the surface, it rides in the message the compaction writes anyway, and it
never moves the cached prefix of a request on its own (docs/profiles.md, ``[ledger]``).

Recognised tools (names compared without case):

``files_changed``   ``Edit``/``MultiEdit``/``NotebookEdit`` (edited), ``Write`` (written),
                    ``edit_file``/``replace_in_file`` (edited), ``write_file``/``create_file``
                    (written/created); ``str_replace_editor``, ``str_replace_based_edit_tool``
                    and ``file_editor`` (OpenHands) by their ``command``: ``create`` (created),
                    ``str_replace`` (edited), ``insert`` (inserted), ``undo_edit`` (reverted);
                    ``apply_patch`` (Codex; also inside a shell command) by its ``*** Add|Update|
                    Delete File:`` and ``*** Move to:`` lines; a shell heredoc into a file
                    (``cat > PATH <<EOF``, ``tee [-a] PATH <<EOF``) (written)
``commands``        a shell call (``bash``, ``shell``, ``exec_command``, ``execute_bash``, ``run``,
                    ``run_command``, ``run_terminal_cmd``, ``local_shell``): its ``command`` or
                    ``cmd`` (a ``["bash", "-lc", CMD]`` list runs ``CMD``); it failed when its
                    result is an error or reports a non-zero exit code (``exit_code`` in a JSON
                    result, ``exit code N``/``exit status N`` in its text)
``todos``           the last list a todo tool wrote (``TodoWrite``, ``update_plan``, ...), its
                    entries not marked done
``done_when``       sentences of the user's own messages that state when the task is done
                    (``done when``, ``definition of done``, ``acceptance criteria``, ``must pass``,
                    ...), the newest message that states any; else the goal a harness set
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .events import ASSISTANT_MESSAGE, SESSION_TASK, TOOL_RESULT, USER_MESSAGE, Event, EventSpec, append_op
from .frames import KERNEL_FRAMES, guard
from .messages import Message, Source, TextBlock
from .text import clip

if TYPE_CHECKING:
    from .ports import SessionPort

KERNEL = "kernel"
FORM = "ledger"
BLOCK_FRAME = "work-ledger"
BLOCK_OPEN = f"<{BLOCK_FRAME}>"
BLOCK_CLOSE = f"</{BLOCK_FRAME}>"
BLOCK_INTRO = (
    "The work of this session so far, kept by the kernel from its log (verbatim, newest last; what "
    "the context above still shows is left out). The history tools reach the full record."
)
#: the ignorable event with which a continuation records the ledger it inherited
INHERITED_EVENT = "ledger/inherited"
#: the store's key-value namespace holding a new continuation's inherited ledger until its first request
PENDING_NAMESPACE = "ctxkernel.ledger"

#: bounds on what the ledger keeps: a model's tool calls and results are hostile input
PATH_CHARS = 240
COMMAND_CHARS = 240
LINE_CHARS = 200
TODO_CHARS = 200
DONE_CHARS = 600
MAX_FILES = 200
MAX_WORKED = 5
MAX_ERROR_LINES = 5
MAX_TODOS = 50
MAX_PENDING = 256
#: how much of a tool result is read for its exit status and error lines (its head and its tail)
SCAN_CHARS = 64_000

_EDITED, _WRITTEN, _CREATED = "edited", "written", "created"
_EDIT_TOOLS = {
    "edit": _EDITED,
    "multiedit": _EDITED,
    "notebookedit": _EDITED,
    "edit_file": _EDITED,
    "replace_in_file": _EDITED,
    "write": _WRITTEN,
    "write_file": _WRITTEN,
    "create_file": _CREATED,
}
_EDITOR_TOOLS = frozenset({"str_replace_editor", "str_replace_based_edit_tool", "file_editor"})
_EDITOR_COMMANDS = {"create": _CREATED, "str_replace": _EDITED, "insert": "inserted", "undo_edit": "reverted"}
_PATH_ARGS = ("file_path", "path", "notebook_path", "filename", "target_file")
SHELL_TOOLS = frozenset(
    {"bash", "shell", "run", "exec_command", "execute_bash", "run_command", "run_terminal_cmd", "local_shell"}
)
_SHELLS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/bin/zsh"})
#: tool name -> the arguments that may hold its todo list
TODO_TOOLS: dict[str, tuple[str, ...]] = {
    "todowrite": ("todos",),
    "todo_write": ("todos",),
    "update_plan": ("plan",),
    "update_todos": ("todos",),
    "set_todos": ("todos",),
    "write_todos": ("todos",),
}
_TODO_DONE = frozenset({"completed", "complete", "done", "cancelled", "canceled"})
#: the rest of the line is taken whole and stripped after: a lazy path before ``\s*$`` backtracked
#: over every blank of a padded line at each character, quadratic in a model's argument
_PATCH_LINE = re.compile(r"^\*\*\* (Add|Update|Delete) File: ([^\n]*)|^\*\*\* Move to: ([^\n]*)", re.MULTILINE)
_PATCH_OPS = {"Add": "added", "Update": "updated", "Delete": "deleted"}
_HEREDOC_LINE = re.compile(r"^.*<<-?\s*['\"]?\w+['\"]?.*$", re.MULTILINE)
_REDIRECT = re.compile(r"(?<![<>&\d])>>?\s*([^\s;&|<>'\"]+)")
_TEE = re.compile(r"\btee\s+(?:-a\s+)?([^\s;&|<>'\"]+)")
_EXIT_KEYS = ("exit_code", "exitCode", "returncode", "return_code")
_EXIT_TEXT = re.compile(r"(?:exit(?:ed with)?[ _]code|exit status)[\"': =]*(-?\d{1,6})", re.IGNORECASE)
_ERROR_LINE = re.compile(
    r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b|^\s*(?:FAILED|ERROR|Traceback)\b|^\s*(?:error|fatal)(?:\[[\w-]+\])?:"
    r"|\berror\s*\[?[A-Z]{1,4}\d{3,5}\]?|\bsyntax error\b|\bcommand not found\b|\bNo such file or directory\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_DONE_WHEN = re.compile(
    r"\b(?:done when|(?:is|are|be) done (?:when|once|if)|definition of done|acceptance criteria|success criteria"
    r"|finished when|complete when|must (?:all )?pass|should (?:all )?pass|until (?:\w+ ){0,4}pass(?:es)?)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Command:
    """A shell command and, for one that failed, the first lines of its error."""

    text: str
    error_lines: tuple[str, ...] = ()


@dataclass
class WorkLedger:
    """A session's work so far, folded from its log (a cursor over ``session.events``, like the
    instruction ledger), so it needs no state of its own in the log or a snapshot."""

    cursor: int = 0
    #: path -> its last operation, oldest change first (a path changed again moves to the end)
    files: dict[str, str] = field(default_factory=dict)
    failing: Command | None = None
    worked: list[str] = field(default_factory=list)  # newest last, distinct
    todos: list[str] | None = None  # open entries of the last todo list (None: no list written)
    done_when: str = ""
    goal: str = ""  # the goal a harness set (session/task), shown when no message states when it is done
    #: shell calls waiting for their results: call id -> command
    pending: dict[str, str] = field(default_factory=dict)
    #: (text, tokenizer name) -> tokens of one of its lines
    line_costs: dict[tuple[str, str], int] = field(default_factory=dict)

    def sync(self, events: Sequence[Event]) -> WorkLedger:
        for seq in range(self.cursor, len(events)):
            self.fold(events[seq])
        return self

    def fold(self, event: Event) -> None:
        self.cursor = event.seq + 1
        if event.type == INHERITED_EVENT:
            self.adopt(event.data.get("ledger"))
            return
        if event.type == SESSION_TASK:
            goal = event.data.get("goal")
            if isinstance(goal, str):
                self.goal = _clip(goal, DONE_CHARS)
            return
        if event.type not in (ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE):
            return
        if (event.surface or {}).get("op") != "append":
            return  # a compaction's replacement: the kernel's or a strategy's words, not the work
        message = event.data.get("message")
        if not isinstance(message, dict):
            return
        content = message.get("content")
        if not isinstance(content, list):
            return
        if event.type == USER_MESSAGE:
            if (message.get("source") or {}).get("kind", "user") == "user":
                self._user_text(
                    "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
                )
            return
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_call":
                self._call(block)
            elif block.get("type") == "tool_result":
                self._result(block)

    # -- extractors ------------------------------------------------------------------------------------
    def _user_text(self, text: str) -> None:
        found = [s for s in _SENTENCE.split(text[:SCAN_CHARS]) if _DONE_WHEN.search(s)]
        if found:
            self.done_when = _clip(" ".join(found), DONE_CHARS)

    def _call(self, block: dict[str, Any]) -> None:
        name = block.get("name")
        arguments = block.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return
        for path, operation in edits_of(name, arguments):
            self._changed(path, operation)
        lowered = name.lower()
        if lowered in SHELL_TOOLS:
            command = command_of(arguments)
            call_id = block.get("id")
            if command.strip() and isinstance(call_id, str):
                if len(self.pending) >= MAX_PENDING:
                    self.pending.pop(next(iter(self.pending)))
                self.pending[call_id] = _clip(command, COMMAND_CHARS)
        todos = todos_of(lowered, arguments)
        if todos is not None:
            self.todos = todos

    def _changed(self, path: str, operation: str) -> None:
        path = _clip(path, PATH_CHARS)
        if not path:
            return
        self.files.pop(path, None)
        self.files[path] = operation
        if len(self.files) > MAX_FILES:
            self.files.pop(next(iter(self.files)))

    def _result(self, block: dict[str, Any]) -> None:
        call_id = block.get("call_id")
        command = self.pending.pop(call_id, None) if isinstance(call_id, str) else None
        if command is None:
            return
        content = block.get("content")
        text, code = decoded(content if isinstance(content, str) else "")
        if block.get("is_error") is True or (code is not None and code != 0):
            self.failing = Command(command, error_lines(text))
            return
        if self.failing is not None and self.failing.text == command:
            self.failing = None  # the command that failed works now
        if command in self.worked:
            self.worked.remove(command)
        self.worked.append(command)
        del self.worked[:-MAX_WORKED]

    # -- inheritance -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "files": [[p, o] for p, o in self.files.items()],
            "failing": None
            if self.failing is None
            else {"command": self.failing.text, "errors": list(self.failing.error_lines)},
            "worked": list(self.worked),
            "todos": self.todos,
            "done_when": self.done_when,
            "goal": self.goal,
        }

    def adopt(self, raw: Any) -> None:
        """Take an inherited ledger (``to_dict``'s shape; anything malformed is left out, bounded)."""
        if not isinstance(raw, dict):
            return
        for item in _list(raw.get("files")):
            if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
                self._changed(item[0], _clip(item[1], 40))
        failing = raw.get("failing")
        if isinstance(failing, dict) and isinstance(failing.get("command"), str):
            errors = [_clip(e, LINE_CHARS) for e in _list(failing.get("errors")) if isinstance(e, str)]
            self.failing = Command(_clip(failing["command"], COMMAND_CHARS), tuple(errors[:MAX_ERROR_LINES]))
        worked = [_clip(c, COMMAND_CHARS) for c in _list(raw.get("worked")) if isinstance(c, str)]
        self.worked = worked[-MAX_WORKED:]
        todos = raw.get("todos")
        if isinstance(todos, list):
            self.todos = [_clip(t, TODO_CHARS) for t in todos if isinstance(t, str)][:MAX_TODOS]
        for key in ("done_when", "goal"):
            if isinstance(raw.get(key), str):
                setattr(self, key, _clip(raw[key], DONE_CHARS))

    # -- rendering -------------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every entry, in the block's order, each with its priority for the budget (lower first)."""
        out: list[Entry] = []
        done = self.done_when or (f"(the task's goal) {self.goal}" if self.goal else "")
        if done:
            out.append(Entry("Done when:", f"- {done}", (self.done_when or self.goal,), None, 0))
        if self.failing is not None:
            lines = [f"- `{self.failing.text}`", *(f"    {line}" for line in self.failing.error_lines)]
            failing = self.failing
            out.append(Entry("Last failing command:", "\n".join(lines), failing.error_lines[:1], failing.text, 1))
        if self.todos:
            out.extend(Entry("Open todos:", f"- {t}", (t,), None, 2) for t in self.todos)
        count = len(self.files)
        out.extend(
            Entry("Files changed (path: operation):", f"- {p}: {o}", (p,), None, 3 + (count - i) / (count + 1))
            for i, (p, o) in enumerate(self.files.items())
        )
        count = len(self.worked)
        out.extend(
            Entry("Last commands that worked:", f"- `{c}`", (), c, 4 + (count - i) / (count + 1))
            for i, c in enumerate(self.worked)
        )
        return out


@dataclass(frozen=True)
class Entry:
    """One line (or, for the failing command, lines) of the block under its section heading.
    The surface shows it when a text shows its line (an earlier block), or when texts show each
    of ``needs`` (a path, a todo, an error line) and, for a command, a call runs exactly ``call``."""

    section: str
    text: str
    needs: tuple[str, ...]
    call: str | None
    priority: float


def render(entries: Sequence[Entry]) -> str:
    """The block: its frame, then each section's entries in ledger order (the same entries always
    give the same bytes). The text of every entry is guarded so it cannot close the block, nor open
    or close the checkpoint or the user's instructions that share its message (tool output is
    hostile: a failing ``curl``'s first lines are kept verbatim)."""
    lines = [BLOCK_OPEN, BLOCK_INTRO]
    section = None
    for entry in entries:
        if entry.section != section:
            section = entry.section
            lines.append(section)
        lines.append(guard(entry.text, *KERNEL_FRAMES))
    lines.append(BLOCK_CLOSE)
    return "\n".join(lines)


# -- extractors, shared by the fold and its tests ---------------------------------------------------------
def _list(value: Any) -> list[Any]:
    """``value`` when it is a list, else no items (an inherited ledger read back from the store
    or a ``ledger/inherited`` event may hold anything)."""
    return value if isinstance(value, list) else []


def _clip(text: str, limit: int) -> str:
    return clip(" ".join(text[: limit * 4].split()), limit)


def command_of(arguments: dict[str, Any]) -> str:
    """The command a shell call runs (``["bash", "-lc", CMD]`` runs ``CMD``)."""
    command = arguments.get("command", arguments.get("cmd"))
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        if len(command) >= 3 and command[0] in _SHELLS and command[1] in ("-c", "-lc"):
            script: str = command[-1]
            return script
        return " ".join(command)
    return command if isinstance(command, str) else ""


def patch_edits(patch: str) -> list[tuple[str, str]]:
    """The files an ``apply_patch`` input changes, with their operations."""
    out: list[tuple[str, str]] = []
    for op, path, moved in _PATCH_LINE.findall(patch):
        if op:
            path = path.rstrip()
            if path:
                out.append((path, _PATCH_OPS[op]))
        elif moved.rstrip():
            out.append((moved.rstrip(), "moved here"))
    return out


def shell_edits(command: str) -> list[tuple[str, str]]:
    """Files a shell command writes: an ``apply_patch`` inside it, or a heredoc into a file."""
    out = patch_edits(command) if "*** " in command else []
    for line in _HEREDOC_LINE.findall(command):
        out += [(p, _WRITTEN) for p in _REDIRECT.findall(line) + _TEE.findall(line) if p != "/dev/null"]
    return out


def edits_of(name: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """The files one tool call changes, with their operations (the module docstring's rules)."""
    lowered = name.lower()
    if lowered == "apply_patch":
        patch = arguments.get("input", arguments.get("patch", ""))
        return patch_edits(patch) if isinstance(patch, str) else []
    if lowered in SHELL_TOOLS:
        return shell_edits(command_of(arguments)[:SCAN_CHARS])
    if lowered in _EDITOR_TOOLS:
        command = arguments.get("command")
        operation = _EDITOR_COMMANDS.get(command) if isinstance(command, str) else None
        if operation is None:
            return []  # a view, or arguments a model sent malformed
    else:
        operation = _EDIT_TOOLS.get(lowered)
        if operation is None:
            return []
    for key in _PATH_ARGS:
        value = arguments.get(key)
        if isinstance(value, str) and value.strip():
            return [(value, operation)]
    return []


def todos_of(lowered_name: str, arguments: dict[str, Any]) -> list[str] | None:
    """The open entries of a todo tool's list (None: not a todo tool, or no list in its arguments)."""
    entries = None
    for key in TODO_TOOLS.get(lowered_name, ()):
        if isinstance(arguments.get(key), list):
            entries = arguments[key]
    if entries is None:
        return None
    out = []
    for raw in entries[: MAX_TODOS * 4]:
        if isinstance(raw, dict):
            text = raw.get("content") or raw.get("step") or raw.get("text") or raw.get("title") or ""
            status = raw.get("status") or "pending"
            if isinstance(text, str) and text.strip() and str(status).lower() not in _TODO_DONE:
                shown = _clip(text, TODO_CHARS)
                out.append(f"[{_clip(str(status), 20)}] {shown}" if str(status) != "pending" else shown)
        elif isinstance(raw, str) and raw.strip():
            out.append(_clip(raw, TODO_CHARS))
    return out[:MAX_TODOS]


def decoded(content: str) -> tuple[str, int | None]:
    """A result as the text it holds and its exit code: a JSON-encoded result as the text of its
    strings, one a line, and its exit code key; any other as it is, with the last exit code its
    text reports. Only the head and tail of a long result are read."""
    if len(content) > SCAN_CHARS:
        content = content[: SCAN_CHARS // 2] + "\n" + content[-SCAN_CHARS // 2 :]
    stripped = content.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict | list):
            return "\n".join(_strings(data, 0)), _json_exit_code(data, 0)
    codes = _EXIT_TEXT.findall(content)
    return content, int(codes[-1]) if codes else None


def _strings(value: Any, depth: int) -> Iterable[str]:
    if depth > 8:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, depth + 1)


def _json_exit_code(data: Any, depth: int) -> int | None:
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


def error_lines(text: str) -> tuple[str, ...]:
    """The first lines of a failed command's output that name an error, else its first non-empty
    lines: at most :data:`MAX_ERROR_LINES`, each clipped."""
    lines = [line for line in text.splitlines() if line.strip()]
    named = [line for line in lines if _ERROR_LINE.search(line)]
    chosen = named or lines
    out: list[str] = []
    for line in chosen:
        clipped = _clip(line, LINE_CHARS)
        if clipped not in out:
            out.append(clipped)
        if len(out) == MAX_ERROR_LINES:
            break
    return tuple(out)


# -- the block on the surface ---------------------------------------------------------------------------
def budget_tokens(session: SessionPort) -> int:
    """The budget of the routed model: ``[ledger] budget_ratio`` x its effective window."""
    ratio = session.kernel.profile.ledger.budget_ratio
    return int(ratio * session.model_settings().effective_window)


@dataclass
class Shown:
    """What messages show of the work: their texts (tool results and call arguments included)
    and the commands their shell calls run."""

    texts: list[str] = field(default_factory=list)
    calls: set[str] = field(default_factory=set)

    def add(self, message: Message) -> None:
        for block in message.content:
            if block.type == "text":
                self.texts.append(block.text)
            elif block.type == "tool_result":
                self.texts.append(block.content[: SCAN_CHARS * 4])
            elif block.type == "tool_call":
                self.texts.extend(_strings(block.arguments, 0))
                if block.name.lower() in SHELL_TOOLS:
                    self.calls.add(_clip(command_of(block.arguments), COMMAND_CHARS))


def _flat(text: str) -> str:
    return " ".join(text.split())


def missing(entries: Sequence[Entry], shown: Shown) -> list[Entry]:
    """The ``entries`` ``shown`` does not show (whitespace aside; see :class:`Entry`)."""
    if not entries:
        return []
    visible = "\n".join(_flat(t) for t in shown.texts)

    def seen(entry: Entry) -> bool:
        if _flat(entry.text) in visible:
            return True
        return all(_flat(n) in visible for n in entry.needs) and (entry.call is None or entry.call in shown.calls)

    return [e for e in entries if not seen(e)]


def within(session: SessionPort, entries: Sequence[Entry], budget: int) -> list[Entry]:
    """The ``entries`` whose block fits ``budget`` tokens, most important first (the definition of
    done, the failing command, the todos, then files and commands, newest first); in ledger order."""
    if budget <= 0 or not entries:
        return []
    meter = session.meter
    name = meter.tokenizer.name
    costs = session.work_ledger.line_costs
    if len(costs) > 4 * MAX_FILES:
        costs.clear()

    def cost(text: str) -> int:
        key = (text, name)
        hit: int | None = costs.get(key)
        if hit is None:
            hit = costs[key] = meter.count_text(text + "\n")
        return hit

    left = budget - cost(BLOCK_OPEN + "\n" + BLOCK_INTRO) - cost(BLOCK_CLOSE)
    chosen: set[int] = set()
    sections: set[str] = set()
    for index in sorted(range(len(entries)), key=lambda i: entries[i].priority):
        entry = entries[index]
        # the line as the block shows it: the guard lengthens a text holding the kernel's tags
        need = cost(guard(entry.text, *KERNEL_FRAMES)) + (0 if entry.section in sections else cost(entry.section))
        if need <= left:
            chosen.add(index)
            sections.add(entry.section)
            left -= need
    picked = [e for i, e in enumerate(entries) if i in chosen]
    # the lines were counted apart: the block is counted whole, and trimmed while it is over
    while picked and meter.count_text(render(picked)) > budget:
        picked.remove(max(picked, key=lambda e: e.priority))
    return picked


def lost_block(session: SessionPort, kept: Shown) -> tuple[str, int] | None:
    """The block of the ledger's entries that ``kept`` (what stays on the surface) does not
    show, within the budget, and how many entries it shows; None when nothing is lost or the
    budget is 0."""
    budget = budget_tokens(session)
    if budget <= 0:
        return None
    entries = session.work_ledger.entries()
    lost = missing(entries, kept)
    picked = within(session, lost, budget)
    return (render(picked), len(picked)) if picked else None


def pin_lost(
    session: SessionPort, cited: set[int], replacements: list[Message | None], carrier: int
) -> tuple[list[Message | None], int, int]:
    """Step 5c of the transaction: carry into ``replacements`` the ledger's entries the commit
    would leave no message showing. ``carrier``: the replacement that already carries the
    instruction block (-1: none). Returns the new replacements, the index of the one that carries
    the ledger (-1 when none) and how many entries it shows."""
    if not any(m is None or m.role != "tool" for m in replacements):
        return replacements, -1, 0  # only tool-result rewrites: every call stays on the surface
    kept = Shown()
    for node in session.surface.nodes:
        if node.seq not in cited:
            kept.add(node.message)
    for message in replacements:
        if message is not None:
            kept.add(message)
    lost = lost_block(session, kept)
    if lost is None:
        return replacements, -1, 0
    block, shown = lost
    out = list(replacements)
    order = ([carrier] if carrier >= 0 else []) + list(range(len(out)))
    for i in order:
        message = out[i]
        if message is not None and message.role != "tool":
            out[i] = Message(message.role, (*message.content, TextBlock(block)), message.source)
            return out, i, shown
    for i, message in enumerate(out):
        if message is None:  # a transaction of removals only: the first becomes the block
            out[i] = block_message(block)
            return out, i, shown
    return replacements, -1, 0


def block_message(block: str) -> Message:
    return Message.user(block, Source.plugin_form(KERNEL, FORM))


def pending_of(raw: Any) -> dict[str, Any] | None:
    return raw if isinstance(raw, dict) else None


def inheritance_batch(session: SessionPort, inherited: dict[str, Any]) -> list[EventSpec]:
    """The events that record an inherited ledger and pin what the continuation's seed does not show."""
    batch = [EventSpec(INHERITED_EVENT, {"ledger": inherited}, ignorable=True)]
    adopted = WorkLedger()
    adopted.adopt(inherited)
    budget = budget_tokens(session)
    kept = Shown()
    for node in session.surface.nodes:
        kept.add(node.message)
    picked = within(session, missing(adopted.entries(), kept), budget)
    if picked:
        batch.append(EventSpec(USER_MESSAGE, {"message": block_message(render(picked)).to_dict()}, append_op()))
    return batch


def ledger_of(events: Sequence[Event]) -> WorkLedger:
    """A session's ledger read from its events (for a parent not open in this process)."""
    return WorkLedger().sync(events)


__all__ = [
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "Entry",
    "WorkLedger",
    "budget_tokens",
    "edits_of",
    "pin_lost",
    "render",
]

"""The session's task state: the goal and the todo list a harness sets through the API.

Handoff, rollover and chapters carry "the active goal and the open todos" across a context
switch (seed 001 reads them from the host's state). A harness that knows them says so with
:meth:`Session.set_task`, written to the log as ``session/task`` so every process and every
restart sees the same state; a TodoWrite-style tool call of the model updates the todo list too
(the newer of the two wins, see :class:`ctxkernel.recall.History`). Without a goal set, the goal is
the session's first *substantive* user instruction: a trivial opener ("hi", "thanks") is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .errors import EventError

GOAL_CHARS = 8_000
TODO_ENTRIES = 200
TODO_CHARS = 2_000
TODO_STATUSES = ("pending", "in_progress", "completed")
REQUESTERS = ("api", "cli", "ui", "proxy")

#: an opener that is no task: greetings, thanks, acknowledgements, "continue"
_TRIVIAL = re.compile(
    r"(hi|hello|hey|yo|hiya|good (morning|afternoon|evening)|thanks?( you)?|thx|ok(ay)?|yes|no|sure|"
    r"continue|go on|go ahead|proceed|next|test(ing)?|ping)[\s!.?,:;)(]*(there|again|all)?[\s!.?]*",
    re.IGNORECASE,
)


def substantive(text: str) -> bool:
    """True for an instruction that can stand as a session's goal (not an empty or trivial opener)."""
    stripped = text.strip()
    if not stripped or _TRIVIAL.fullmatch(stripped):
        return False
    return len(stripped.split()) >= 3 or len(stripped) >= 16


def task_data(goal: str | None, todos: Sequence[Any] | None, by: str) -> dict[str, Any]:
    """The ``session/task`` event data for a change, validated (raises :class:`EventError` naming
    what was wrong and what is accepted). ``None`` leaves a part unchanged; ``""`` clears the goal
    and ``[]`` the todos."""
    if by not in REQUESTERS:
        msg = f"by must be one of {list(REQUESTERS)}, got {by!r}"
        raise EventError(msg)
    if goal is None and todos is None:
        msg = "set_task needs a goal (a string, '' to clear it) or todos (a list, [] to clear them)"
        raise EventError(msg)
    data: dict[str, Any] = {"by": by}
    if goal is not None:
        if not isinstance(goal, str) or len(goal) > GOAL_CHARS:
            msg = f"goal must be a string of at most {GOAL_CHARS} characters, got {type(goal).__name__} of {len(str(goal))}"
            raise EventError(msg)
        data["goal"] = goal.strip()
    if todos is not None:
        if isinstance(todos, (str, bytes)) or not isinstance(todos, Sequence) or len(todos) > TODO_ENTRIES:
            msg = f"todos must be a list of at most {TODO_ENTRIES} entries"
            raise EventError(msg)
        data["todos"] = [_todo(i, entry) for i, entry in enumerate(todos)]
    return data


def _todo(index: int, entry: Any) -> dict[str, str]:
    if isinstance(entry, str):
        entry = {"text": entry}
    if not isinstance(entry, dict):
        msg = f"todos[{index}] must be a string or {{'text': ..., 'status': ...}}, got {type(entry).__name__}"
        raise EventError(msg)
    text = entry.get("text", entry.get("content"))
    status = entry.get("status", "pending")
    if not isinstance(text, str) or not text.strip() or len(text) > TODO_CHARS:
        msg = f"todos[{index}].text must be a non-empty string of at most {TODO_CHARS} characters"
        raise EventError(msg)
    if status not in TODO_STATUSES:
        msg = f"todos[{index}].status must be one of {list(TODO_STATUSES)}, got {status!r}"
        raise EventError(msg)
    return {"text": text.strip(), "status": status}


__all__ = ["GOAL_CHARS", "TODO_CHARS", "TODO_ENTRIES", "TODO_STATUSES", "substantive", "task_data"]

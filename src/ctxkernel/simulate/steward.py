"""The steward policy: who plays the model's context-management role in open-loop replay.

Recorded assistant turns never call a strategy's tools (the recording's model did not know them),
so before each recorded request the simulator asks a *steward* which context-management tool calls
a model would make now. A steward is any callable::

    def steward(session: ctxkernel.Session, request: ctxkernel.Request) -> list[dict] | None:
        return [{"name": "compress", "arguments": {...}}]

The default, :func:`default_steward`, asks every strategy of the profile through the
``steward_actions`` hook: each strategy answers for its own tools (write a note, ``compress`` when
reminded, ``new_context``, ``chapters_continue`` when it suggested it). Replace it with
``ctxkernel simulate --steward module:function`` to test another policy; the calls it returns run
as a separate model step, an assistant message holding those calls whose results come from
``session.run_tool``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .recording import RecordingError

if TYPE_CHECKING:
    from ..session import Request, Session

Steward = Callable[["Session", "Request"], "list[dict[str, Any]] | None"]


def default_steward(session: Session, request: Request) -> list[dict[str, Any]]:
    """Every strategy's own deterministic policy (the ``steward_actions`` hook), in profile order."""
    actions: list[dict[str, Any]] = session.kernel.hooks.steward_actions(session, request)
    return actions


def no_steward(session: Session, request: Request) -> list[dict[str, Any]]:
    """A model that never manages its context: strategies act only through their automatic hooks."""
    return []


def load_steward(spec: str | None) -> Steward:
    """``None``/``default``, ``none``, or ``module:function`` naming a steward callable."""
    if spec in (None, "", "default"):
        return default_steward
    if spec == "none":
        return no_steward
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        msg = f"--steward {spec!r}: expected 'default', 'none' or 'module:function'"
        raise RecordingError(msg)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        msg = f"--steward {spec!r} could not be loaded ({exc}); give an importable 'module:function'"
        raise RecordingError(msg) from None
    if not callable(obj):
        msg = f"--steward {spec!r} is not callable; it must be a function (session, request) -> list of calls"
        raise RecordingError(msg)
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        msg = f"--steward {spec!r} does not take (session, request); it must be a function (session, request) -> list of calls"
        raise RecordingError(msg) from None
    except ValueError:
        pass  # no signature to check (some builtins): the call itself will tell
    steward: Steward = obj
    return steward

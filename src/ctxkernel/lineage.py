"""Where a session comes from, as the inspector shows it: what made it, and what it continues.

A session's header names its ``origin`` (``ctxkernel simulate`` writes which profile and which
recording) and, for a child the kernel opened, its ``parent``. A strategy that keeps ancestry in
its own registry (``chapters``: the registry is the authority, its children's headers carry no
parent) says so in its panel (``project``): the first panel's ``parent`` names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .session import Session


def lineage(session: Session, panels: dict[str, Any] | None = None) -> dict[str, str | None]:
    """``{"origin", "parent"}`` of ``session``; ``panels`` is its ``project()["strategies"]``."""
    header = session.header
    parent = header.parent
    if parent is None:
        for panel in (panels or {}).values():
            found = panel.get("parent") if isinstance(panel, dict) else None
            if isinstance(found, str) and found:
                parent = found
                break
    return {"origin": header.origin, "parent": parent}


__all__ = ["lineage"]

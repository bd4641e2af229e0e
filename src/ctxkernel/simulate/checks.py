"""Checks the simulator runs on every request, independently of the kernel's own checks.

The kernel refuses bad appends before they are written; these checks do not trust that. They
re-fold the log with their own code and look at each request exactly as it would be sent:

``orphan_call``     an assistant tool call with no result right after it in the request
``orphan_result``   a tool result whose call is not right before it in the request
``split_group``     a tool result inside another call's group (a cut through a tool group)
``citation``        a replacement that does not cite exactly the nodes it shadows
``projection``      the request's messages are not the fold of the log
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..pairing import pairing_problems

if TYPE_CHECKING:
    from ..session import Request, Session


class InvariantChecker:
    """Folds one session's log with its own code and checks each request against it."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cursor = 0
        self.seqs: list[int] = []
        self.violations: list[dict[str, Any]] = []

    def _violation(self, kind: str, detail: str) -> None:
        self.violations.append({"kind": kind, "session": self.session_id, "detail": detail})

    def fold(self, session: Session) -> None:
        """Apply the surface operations of events appended since the last call."""
        events = session.events
        for event in events[self.cursor :]:
            op = event.surface
            if op is None:
                continue
            if op.get("op") == "append":
                self.seqs.append(event.seq)
                continue
            try:
                a, b = self.seqs.index(op["start"]), self.seqs.index(op["end"])
            except ValueError:
                self._violation(
                    "citation", f"seq {event.seq} replaces {op['start']}..{op['end']}, which is not on the surface"
                )
                continue
            shadowed = self.seqs[a : b + 1]
            if sorted(op.get("cites") or []) != sorted(shadowed):
                self._violation(
                    "citation",
                    f"seq {event.seq} shadows {shadowed} but cites {op.get('cites')}: every shadowed node must be cited",
                )
            self.seqs[a : b + 1] = [event.seq] if op.get("op") == "replace" else []
        self.cursor = len(events)

    def check_request(self, session: Session, request: Request) -> None:
        self.fold(session)
        if list(request.seqs) != self.seqs:
            self._violation(
                "projection",
                f"request shows {len(request.seqs)} nodes that differ from the log's fold ({len(self.seqs)} nodes)",
            )
        for problem in pairing_problems(request.messages):
            if problem.kind == "orphan_result":
                call_id = "?" if problem.call_ids[0] is None else problem.call_ids[0]
                self._violation(
                    "orphan_result", f"tool result for {call_id} at request index {problem.index} has no call before it"
                )
            elif problem.kind == "split_group":
                call_id = "" if problem.call_ids[0] is None else problem.call_ids[0]
                self._violation(
                    "split_group",
                    f"tool result for {call_id} at request index {problem.index} sits in the group of calls {list(problem.group)}",
                )
            else:
                for missing in problem.call_ids:
                    self._violation("orphan_call", f"tool call {missing} has no result in the request")

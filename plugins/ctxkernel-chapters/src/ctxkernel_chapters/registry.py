"""Chapter records and lineage in the kernel store's key-value table (namespace ``chapters``).

Keys: ``sessions/<id>`` holds one session's small state (parent, root, origin, title, next
chapter number, children, how far its final chapters reach and, for a child, how far its parent's
reached when it was created); ``records/<id>/<nnnnnn>`` holds
one chapter record each (``<id>`` is the author session, ``<nnnnnn>`` the zero-padded chapter
number, so a listing comes back in chapter order); ``roots/<root>`` holds the lineage's
chapter-number allocator (chapter files of a whole lineage share one folder, so numbers are
unique per root). A compaction therefore writes bytes in proportion to the chapters it creates,
never to the chapters archived before. A shared backend (sqlite, postgres) shares the registry.
The registry is the only authority on ancestry: the session header's ``parent`` is
informative, never read back.

A record: ``id`` (``<authorSession>/<n>``), ``number``, ``author_session``, ``path`` (relative to
the archive root), ``start_seq``, ``end_seq``, ``sha256``, ``tokens``, ``title``, ``summary``,
``artifacts``, ``created``, ``status`` (``final``: an in-place compaction's records are written
only once it committed, so a record is never rewritten).

Every entry is checked as it is read back (:func:`checked`): one of another shape (a field
missing or of another type, changed outside the plugin) is :class:`ArchiveError` naming its key,
so a tool answers an error and writes nothing, instead of a ``KeyError`` deep inside it.
"""

from __future__ import annotations

from typing import Any, Protocol

from ctxkernel.events import utc_now

from .errors import ArchiveError

#: the strategy's key-value namespace (the handle keys its table by the strategy name)
NAMESPACE = "chapters"

_STR, _INT, _LIST, _OPT_STR = (str,), (int,), (list,), (str, type(None))
#: per kind of entry, the fields it must hold and those it may hold, with the types accepted
#: (exact: a bool is not a number); a record's are those the plugin reads with ``record[...]``
_FIELDS: dict[str, tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]] = {
    "session state": (
        {"root": _STR, "parent": _OPT_STR},
        {"session": _STR, "origin": _STR, "title": _STR, "created": _OPT_STR, "next_chapter": _INT}
        | {"archived_through": _INT, "parent_archived_through": _INT, "children": _LIST, "chapters": _LIST},
    ),
    "chapter record": (
        {"id": _STR, "number": _INT, "path": _STR, "start_seq": _INT, "end_seq": _INT, "sha256": _STR, "tokens": _INT},
        {"title": _STR, "summary": _STR, "status": _STR, "author_session": _STR, "artifacts": _LIST},
    ),
    "chapter-number allocator": ({"next_chapter": _INT}, {}),
}
_NAMES = {str: "a string", int: "an integer", list: "a list", type(None): "null"}


def checked(key: str, value: Any, kind: str | None = None) -> Any:
    """``value`` as read back from the key-value table under ``key`` (None: absent), once its
    shape is the one the plugin writes; :class:`ArchiveError` naming the key, the field and what
    is accepted otherwise. An old layout's ``chapters`` are checked as records."""
    if value is None:
        return None
    if kind is None:
        kind = "chapter record" if key.startswith("records/") else "session state"
        kind = "chapter-number allocator" if key.startswith("roots/") else kind
    required, optional = _FIELDS[kind]
    problem = None if type(value) is dict else f"is {type(value).__name__}, not an object"
    for name, types in (*required.items(), *optional.items()):
        if problem is not None:
            break
        if name not in value:
            problem = f"has no {name!r}" if name in required else None
        elif type(value[name]) not in types:
            accepted = " or ".join(_NAMES[t] for t in types)
            problem = f"holds {name!r} = {value[name]!r:.60}; accepted: {accepted}"
    if problem is not None:
        msg = (
            f"the chapters registry's {kind} {key!r} {problem}. The entry was changed outside the plugin and "
            "is not used (repair or delete it in the store's chapters namespace)"
        )
        raise ArchiveError(msg)
    for i, record in enumerate(value.get("chapters", ()) if kind == "session state" else ()):
        checked(f"{key} chapters[{i}]", record, "chapter record")
    return value


class KeyValue(Protocol):
    """The strategy handle's key-value table (:class:`ctxkernel.StrategyHandle`), already in the
    strategy's namespace."""

    def kv_get(self, key: str) -> Any | None: ...

    def kv_put(self, key: str, value: Any) -> None: ...

    def kv_list(self, prefix: str = "") -> dict[str, Any]: ...


def record_key(session_id: str, number: int) -> str:
    return f"records/{session_id}/{number:06d}"


class Registry:
    """The lineage registry on the strategy handle's key-value table: ``Registry(STRATEGY.on(ctx))``.

    ``reserved`` is the process's in-memory allocator beside the stored one (root -> next free
    number): an in-place compaction takes its numbers there, since its one durable write is the
    log's commit (the stored allocator catches up when the chapters are settled, see
    :mod:`ctxkernel_chapters.settle`); every allocation, stored or not, starts above both."""

    def __init__(self, kv: KeyValue, reserved: dict[str, int] | None = None) -> None:
        self.kv = kv
        self.reserved = reserved if reserved is not None else {}

    def _get(self, key: str) -> Any | None:
        """The entry under ``key``, its shape checked (:func:`checked`)."""
        return checked(key, self.kv.kv_get(key))

    # -- sessions -------------------------------------------------------------------------------
    def state(self, session_id: str) -> dict[str, Any] | None:
        """The small per-session state (no chapter records); an old single-record layout is
        split into per-chapter keys the first time it is read."""
        state = self._get(f"sessions/{session_id}")
        if state is not None and "chapters" in state:
            legacy = state.pop("chapters")
            for record in legacy:
                self.kv.kv_put(record_key(session_id, record["number"]), record)
            final = [r for r in legacy if r.get("status") == "final"]
            state["archived_through"] = max((r["end_seq"] for r in final), default=-1)
            self.put(session_id, state)
        return state

    def get(self, session_id: str) -> dict[str, Any] | None:
        """The session's state with its chapter records listed under ``chapters`` (a read view:
        costs one read per record; the compaction path uses :meth:`state`)."""
        state = self.state(session_id)
        if state is None:
            return None
        return {**state, "chapters": self.records(session_id)}

    def put(self, session_id: str, state: dict[str, Any]) -> None:
        small = {k: v for k, v in state.items() if k != "chapters"}
        self.kv.kv_put(f"sessions/{session_id}", small)

    def ensure(self, session_id: str) -> dict[str, Any]:
        """This session's state; a session the registry never saw is the root of its own lineage."""
        state = self.state(session_id)
        if state is None:
            state = new_state(session_id, parent=None, root=session_id, origin="root", next_chapter=1)
            self.put(session_id, state)
        return state

    def root_of(self, session_id: str) -> str:
        root: str = self.ensure(session_id)["root"]
        return root

    def lineage(self, session_id: str) -> list[str]:
        """Session ids from the root down to ``session_id`` (ancestors first)."""
        return [sid for sid, _ in self._chain(session_id)]

    def _chain(self, session_id: str) -> list[tuple[str, dict[str, Any] | None]]:
        """Each session from the root down to ``session_id`` with its state."""
        chain = []
        seen = set()
        current: str | None = session_id
        while current is not None and current not in seen:
            seen.add(current)
            state = self.state(current)
            chain.append((current, state))
            current = state.get("parent") if state else None
        return list(reversed(chain))

    # -- records --------------------------------------------------------------------------------
    def records(self, session_id: str) -> list[dict[str, Any]]:
        """The chapter records this session authored, in chapter order."""
        # sorted by number, not key: the padding orders keys only up to 999,999 chapters
        listed = self.kv.kv_list(f"records/{session_id}/")
        return sorted((checked(key, record) for key, record in listed.items()), key=lambda r: r["number"])

    def add_final(
        self, session_id: str, records: list[dict[str, Any]], *, next_chapter: int | None = None
    ) -> dict[str, Any]:
        """Write final records (one write each), then the session state that counts them (read
        first: a damaged one refuses before anything is written)."""
        state = self.ensure(session_id)
        for record in records:
            self.kv.kv_put(record_key(session_id, record["number"]), record)
        if records:
            state["archived_through"] = max([state.get("archived_through", -1), *(r["end_seq"] for r in records)])
        state["next_chapter"] = max(
            [state.get("next_chapter", 1), *(r["number"] + 1 for r in records)]
            + ([next_chapter] if next_chapter is not None else [])
        )
        self.put(session_id, state)
        return state

    def archived_through(self, session_id: str) -> int:
        """The last log seq covered by this session's final chapters (-1 when none)."""
        through: int = self.ensure(session_id).get("archived_through", -1)
        return through

    def lineage_records(self, session_id: str) -> list[dict[str, Any]]:
        """Final chapter records of every session in the lineage, ancestors first: of an ancestor,
        those it had when the next session down was created (``parent_archived_through``); what
        it archived later belongs to its own branch (a forked parent goes on)."""
        out: list[dict[str, Any]] = []
        chain = self._chain(session_id)
        for (sid, _), (_, below) in zip(chain, [*chain[1:], (session_id, None)], strict=True):
            through = (below or {}).get("parent_archived_through")  # absent: written before it was kept
            out.extend(
                r
                for r in self.records(sid)
                if r.get("status") == "final" and (through is None or r["end_seq"] <= through)
            )
        return out

    def find(self, session_id: str, chapter: str) -> dict[str, Any] | None:
        """A final record of the lineage by id (``<author>/<n>``), number, ``NNN`` or path."""
        for record in self.lineage_records(session_id):
            if chapter in (record["id"], record["path"], str(record["number"]), f"{record['number']:03d}") or (
                chapter.endswith(".md") and record["path"].endswith(chapter)
            ):
                return record
        return None

    # -- chapter numbers ------------------------------------------------------------------------
    def allocate(self, root: str, count: int) -> list[int]:
        key = f"roots/{root}"
        state = self._get(key) or {"next_chapter": 1}
        first = max(state["next_chapter"], self.reserved.get(root, 1))
        state["next_chapter"] = first + count
        self.kv.kv_put(key, state)
        self.reserved[root] = first + count
        return list(range(first, first + count))

    def reserve(self, root: str, count: int) -> list[int]:
        """Numbers taken in memory only (no write): the stored allocator is moved past them by
        :meth:`advance` once they are committed, and :meth:`unreserve` gives back unused ones."""
        first = max(self.next_number(root), self.reserved.get(root, 1))
        self.reserved[root] = first + count
        return list(range(first, first + count))

    def unreserve(self, root: str, numbers: list[int]) -> None:
        """Give back reserved numbers nobody used, when they are the newest reserved."""
        if numbers and self.reserved.get(root) == max(numbers) + 1:
            self.reserved[root] = min(numbers)

    def advance(self, root: str, next_chapter: int) -> None:
        """Move the stored allocator to at least ``next_chapter`` (one write, only when behind)."""
        key = f"roots/{root}"
        state = self._get(key) or {"next_chapter": 1}
        if state["next_chapter"] < next_chapter:
            state["next_chapter"] = next_chapter
            self.kv.kv_put(key, state)
        self.reserved[root] = max(self.reserved.get(root, 1), next_chapter)

    def next_number(self, root: str) -> int:
        """The next number the stored allocator gives out (this process may have reserved more)."""
        number: int = (self._get(f"roots/{root}") or {"next_chapter": 1})["next_chapter"]
        return number


def new_state(
    session_id: str,
    *,
    parent: str | None,
    root: str,
    origin: str,
    next_chapter: int,
    title: str = "",
    parent_archived_through: int | None = None,
) -> dict[str, Any]:
    """A session's state; a child's ``parent_archived_through`` is how far its parent's final
    chapters reached when it was created: the parent's chapters it may read."""
    state: dict[str, Any] = {
        "session": session_id,
        "parent": parent,
        "root": root,
        "origin": origin,
        "title": title,
        "created": utc_now(),
        "next_chapter": next_chapter,
        "children": [],
        "archived_through": -1,
    }
    if parent_archived_through is not None:
        state["parent_archived_through"] = parent_archived_through
    return state


def manifest(kv: KeyValue, session_id: str) -> dict[str, Any]:
    """The chain from the root to ``session_id``: each session with its chapters and children.

    This is the ``ctxkernel chapters manifest`` view; the web of forks is in ``children``.
    """
    registry = Registry(kv)
    chain = []
    for sid in registry.lineage(session_id):
        state = registry.state(sid) or {}
        chain.append(
            {
                "session": sid,
                "parent": state.get("parent"),
                "origin": state.get("origin"),
                "title": state.get("title", ""),
                "created": state.get("created"),
                "children": state.get("children", []),
                "chapters": [
                    {
                        k: r.get(k)
                        for k in (
                            "id",
                            "title",
                            "path",
                            "start_seq",
                            "end_seq",
                            "tokens",
                            "sha256",
                            "status",
                            "summary",
                        )
                    }
                    for r in registry.records(sid)
                ],
            }
        )
    root = chain[0]["session"] if chain else session_id
    return {"session": session_id, "root": root, "next_chapter": registry.next_number(root), "chain": chain}

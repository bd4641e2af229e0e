"""Every stored byte of the plugin: chapter files and artifacts in the strategy's blobs.

The archive is the strategy handle's blob table (:attr:`ctxkernel.StrategyHandle.blobs`), so it
lives on the store's backend: files under ``<home>/blobs/chapters/`` on jsonl, rows on sqlite and
postgres, and every worker of a fleet reads the same chapters. A name in the archive is what a
record's ``path`` or an artifact handle says (``<root>/chapters/001-x.md``,
``<root>/artifacts/<sha256>.txt``); ``ctxkernel export`` writes them out as files.

Names coming from the model are checked before anything is read: absolute paths, ``..`` parts and
anything else that is not a blob key are refused with :class:`PathEscapeError`. A blob put is
durable and atomic (the store's contract), so a reader sees a whole chapter or none.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from ctxkernel import CorruptionError, StoreError, check_blob_key

# the errors live in their own module (see there) and are the archive's to name: re-exported
from .errors import ArchiveError as ArchiveError
from .errors import IntegrityError as IntegrityError
from .errors import NotInArchiveError as NotInArchiveError
from .errors import PathEscapeError as PathEscapeError

if TYPE_CHECKING:
    from ctxkernel import BlobInfo, Context, StrategyBlobs

T = TypeVar("T")


def check_name(name: str) -> str:
    """``name`` when it is a name inside the archive; :class:`PathEscapeError` otherwise."""
    if not isinstance(name, str) or not name or "\x00" in name:
        msg = f"{name!r} is not a name inside the archive"
        raise PathEscapeError(msg)
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        msg = f"{name!r} is an absolute path; give a name relative to the archive (e.g. a chapter id or an artifact handle)"
        raise PathEscapeError(msg)
    if any(part == ".." for part in pure.parts):
        msg = f"{name!r} contains '..'; names are relative to the archive and cannot leave it"
        raise PathEscapeError(msg)
    try:
        return check_blob_key(name.rstrip("/"))
    except StoreError:
        msg = (
            f"{name!r} is not a name inside the archive: '/'-separated parts of letters, digits, '.', '_' "
            "and '-', each starting with a letter or digit"
        )
        raise PathEscapeError(msg) from None


class Archive:
    """The lineage archive of one session's kernel: chapter files and artifacts by name."""

    def __init__(self, blobs: StrategyBlobs) -> None:
        self.blobs = blobs

    @classmethod
    def of(cls, ctx: Context) -> Archive:
        from .strategy import STRATEGY

        return cls(STRATEGY.on(ctx).blobs)

    def write(self, name: str, data: bytes) -> None:
        try:
            self.blobs.put(check_name(name), data)
        except StoreError as exc:
            msg = f"cannot store {name!r} in the archive: {exc}"
            raise ArchiveError(msg) from None

    def read(self, name: str) -> bytes:
        """The bytes stored under ``name``; :class:`ArchiveError` when missing,
        :class:`IntegrityError` when the store finds them changed."""
        data = self._ask(name, self.blobs.get)
        if data is None:
            msg = f"{name!r} is not in the archive"
            raise NotInArchiveError(msg)
        return data

    def stat(self, name: str) -> BlobInfo | None:
        """Size and sha256 of the stored bytes (cheap: the store keeps the digest)."""
        return self._ask(name, self.blobs.stat)

    def exists(self, name: str) -> bool:
        return self.stat(name) is not None

    def remove(self, name: str) -> None:
        self._ask(name, self.blobs.delete)

    def list(self, folder: str, suffix: str) -> list[str]:
        """Names under ``folder`` ending in ``suffix``, sorted."""
        prefix = check_name(folder).rstrip("/") + "/"
        return [info.key for info in self._ask(prefix, self.blobs.list) if info.key.endswith(suffix)]

    @staticmethod
    def _ask(name: str, call: Callable[[str], T]) -> T:
        check_name(name)
        try:
            return call(name)
        except CorruptionError as exc:
            msg = f"{name!r} was changed after it was stored ({exc}); refused"
            raise IntegrityError(msg) from None
        except StoreError as exc:
            msg = f"{name!r}: {exc}"
            raise ArchiveError(msg) from None


class VerifiedCache:
    """Results keyed by content hashes, e.g. verified reads by ``(name, sha256 of the stored
    bytes, sha256 the registry expects)``: the same bytes verify the same way, so a search reads
    and re-hashes a chapter only when its stored digest changed. Bounded, least recently used out
    first."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable) -> Any | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

"""Writing a session's strategy files out of the store into a folder (``ctxkernel export``).

Strategies keep their persisted bytes in the store's blob table; people still want files. The
export writes each file a strategy hands over (hook ``export_files``) under the target folder,
atomically (temporary file, fsync, rename), then reads it back and checks its sha256. Nothing is
written outside the folder: every path is checked like a blob key (relative, no '..', no hidden
parts) and folders are made one level at a time without following a link (a link planted in
the target is refused; a link in place of a file is replaced, never written through). A refusal names the path and what is accepted.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import StoreError
from .base import MAX_BLOB_BYTES, check_blob_key
from .files import write_temp


@dataclass(frozen=True, slots=True)
class ExportedFile:
    """One written file: its path relative to the target, who wrote it, its size and sha256."""

    path: str
    strategy: str
    size: int
    sha256: str


def plan_export(files_by_strategy: Mapping[str, Mapping[str, bytes]]) -> dict[str, tuple[str, bytes]]:
    """``{path: (strategy, bytes)}`` after checking every path and size; raises :class:`StoreError`
    naming the first bad path (nothing is written then)."""
    out: dict[str, tuple[str, bytes]] = {}
    for strategy, files in files_by_strategy.items():
        for path, data in files.items():
            try:
                check_blob_key(path)
            except StoreError:
                msg = (
                    f"strategy {strategy!r} exported the path {path!r:.200}; accepted: a relative path of "
                    "'/'-separated parts of letters, digits, '.', '_' and '-', each starting with a letter or "
                    "digit (no '..', no absolute path). Nothing was written"
                )
                raise StoreError(msg) from None
            if not isinstance(data, bytes) or len(data) > MAX_BLOB_BYTES:
                what = f"{len(data)} bytes" if isinstance(data, bytes) else type(data).__name__
                msg = f"strategy {strategy!r} exported {path}: {what}; accepted: bytes, at most {MAX_BLOB_BYTES}"
                raise StoreError(msg)
            if path in out:
                msg = f"strategies {out[path][0]!r} and {strategy!r} both export {path}; nothing was written"
                raise StoreError(msg)
            out[path] = (strategy, data)
    return out


def write_export(target: Path, files_by_strategy: Mapping[str, Mapping[str, bytes]]) -> list[ExportedFile]:
    """Write every file under ``target`` (created if missing), each verified by its sha256."""
    plan = plan_export(files_by_strategy)
    try:
        target.mkdir(parents=True, exist_ok=True)
        root = target.resolve(strict=True)
    except OSError as exc:
        msg = f"cannot create the export folder {target}: {exc.strerror or exc}"
        raise StoreError(msg) from None
    if not root.is_dir():
        msg = f"the export target {target} is not a folder"
        raise StoreError(msg)
    written = []
    for path, (strategy, data) in sorted(plan.items()):
        written.append(_write_one(root, path, strategy, data))
    return written


def _folder_inside(root: Path, parts: list[str], path: str) -> Path:
    """The folder ``root/parts...``, made one level at a time without following a link: a link
    planted in the export folder must not carry a write (or a new folder) outside it."""
    folder = root
    for part in parts:
        folder = folder / part
        try:
            if folder.is_symlink():
                msg = f"{path}: {folder} is a link; it could lead outside the export folder {root}; refused"
                raise StoreError(msg)
            if not folder.exists():
                folder.mkdir()
            elif not folder.is_dir():
                msg = f"{path}: {folder} is a file where a folder is needed; remove it or export elsewhere"
                raise StoreError(msg)
        except OSError as exc:
            msg = f"cannot create the folder of {path} in {root}: {exc.strerror or exc}"
            raise StoreError(msg) from None
    return folder


def _write_one(root: Path, path: str, strategy: str, data: bytes) -> ExportedFile:
    parts = path.split("/")
    full = _folder_inside(root, parts[:-1], path) / parts[-1]
    if full.is_dir() and not full.is_symlink():
        msg = f"{path}: a folder of that name is in the way in {root}; remove it or export elsewhere"
        raise StoreError(msg)
    digest = hashlib.sha256(data).hexdigest()
    tmp = None
    try:
        tmp = write_temp(full, data, fsync=True)  # never through a link planted at its name
        os.replace(tmp, full)  # replaces a link of that name itself, never what it points at
        back = full.read_bytes()
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        msg = f"cannot write {path} in {root}: {exc.strerror or exc}"
        raise StoreError(msg) from None
    if hashlib.sha256(back).hexdigest() != digest:
        msg = f"{path}: the file read back from {root} does not match the sha256 of the stored bytes ({digest})"
        raise StoreError(msg)
    return ExportedFile(path, strategy, len(data), digest)

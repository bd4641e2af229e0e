"""Every disk access of the plugin: atomic writes and contained reads under the archive root.

Writes go to a temporary file in the target folder, are fsynced, then renamed into place (and
the folder fsynced), so a reader sees either the old file or the whole new one. Reads resolve a
relative name under a root and refuse anything that escapes it: absolute paths, ``..`` parts
and symlinks pointing outside.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path, PurePosixPath

from ctxkernel import CtxKernelError


class ArchiveError(CtxKernelError):
    """A chapter file or artifact could not be written, found, or trusted."""


class PathEscapeError(ArchiveError):
    """A name given to a read tool would leave the archive."""


class IntegrityError(ArchiveError):
    """A stored file's sha256 does not match the registry: it was changed after it was written."""


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_atomic(path: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write ``data`` to ``path`` atomically (temp + fsync + rename).

    With ``exclusive`` the file is published with ``link`` so an existing file is never
    replaced; returns False then (nothing written). Returns True when written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_for(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return True


def contained(root: Path, name: str) -> Path:
    """``root / name`` when it stays inside ``root``; raise :class:`PathEscapeError` otherwise."""
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
    base = root.resolve()
    target = (base / Path(*pure.parts)).resolve()
    if target != base and base not in target.parents:
        msg = f"{name!r} resolves outside the archive (through a link); refused"
        raise PathEscapeError(msg)
    return target


def read_bytes(root: Path, name: str) -> bytes:
    """Read a file inside ``root`` (contained); :class:`ArchiveError` when it is missing."""
    path = contained(root, name)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        msg = f"{name!r} is not in the archive at {root}"
        raise ArchiveError(msg) from None
    except IsADirectoryError:
        msg = f"{name!r} is a folder, not a file"
        raise ArchiveError(msg) from None


def exists(root: Path, name: str) -> bool:
    return contained(root, name).is_file()


def list_files(root: Path, folder: str, suffix: str) -> list[str]:
    """Names (relative to ``root``) of the files with ``suffix`` in ``folder``, sorted."""
    path = contained(root, folder)
    if not path.is_dir():
        return []
    base = root.resolve()
    return sorted(str(p.relative_to(base)) for p in path.rglob(f"*{suffix}") if not p.name.startswith("."))


def check_writable(folder: Path) -> str | None:
    """None when files can be created in ``folder`` (created if missing); else the reason."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = _temp_for(folder / "write-probe")
        with open(probe, "wb") as f:
            f.write(b"ok")
        probe.unlink()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

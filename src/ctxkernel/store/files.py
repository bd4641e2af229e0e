"""Temporary files for atomic replaces, made so that nothing planted beside them is written
through.

A file replaced atomically is written to a temporary file in its folder first, then renamed (or
linked) over the real name. That temporary file is created here with a random name and
``O_CREAT | O_EXCL | O_NOFOLLOW``: an existing file of that name, or a symbolic link someone
planted there (a predictable name made that easy: the process id and thread id), is never opened,
so the bytes cannot be redirected to wherever the link points.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

#: how often a new random name is tried when one is taken (each is 64 random bits)
ATTEMPTS = 8
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def new_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside ``path`` (``.<name>.<random>.tmp``), open for writing:
    its descriptor and its path. Raises ``FileExistsError`` when every name tried was taken."""
    for _ in range(ATTEMPTS):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    msg = f"no free temporary name beside {path} after {ATTEMPTS} tries"
    raise FileExistsError(msg)


def write_temp(path: Path, data: bytes, *, fsync: bool) -> Path:
    """``data`` in a new temporary file beside ``path`` (:func:`new_temp`), flushed and, with
    ``fsync``, on disk; its path, for the caller to rename or link over ``path``. On an error the
    temporary file is removed and the error raised."""
    fd, tmp = new_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp

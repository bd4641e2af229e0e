"""Links planted at the temporary names a store or exporter writes through (tests/store/test_export.py,
tests/store/test_store_jsonl_hardening.py): a writer must replace such a link, never follow it."""

from __future__ import annotations

import itertools
import os
import secrets
import threading
from pathlib import Path
from typing import Any


def plant_temporary_links(folder: Path, name: str, victim: Path, monkeypatch: Any) -> None:
    """Links to ``victim`` at the temporary names a writer of ``folder/name`` picks: the one it
    used to (process and thread id) and its next random one (fixed here, then a free one)."""
    names = itertools.chain(["0" * 16], (f"{n:016x}" for n in itertools.count(1)))
    monkeypatch.setattr(secrets, "token_hex", lambda nbytes=None: next(names))
    folder.mkdir(parents=True, exist_ok=True)
    for tmp in (f".{name}.{os.getpid()}.{threading.get_ident()}.tmp", f".{name}.{'0' * 16}.tmp"):
        (folder / tmp).symlink_to(victim)

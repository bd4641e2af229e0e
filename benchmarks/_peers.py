"""The proxies ``serve`` is measured against, each installed into a virtual environment of its own.

    python benchmarks/_peers.py install     # what ``make bench`` runs before the benchmarks

A peer lives under ``.cache/bench-peers/<name>`` (never in the project's ``.venv``: its
dependencies would pin or upgrade the project's own). The version is pinned: a row's ratio is
against that exact release. An install that fails leaves ``install-error.txt`` in the peer's
folder with pip's last lines, and the benchmark prints that reason in its skip line; it never
measures anything in the peer's place.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".cache" / "bench-peers"

#: LiteLLM's proxy, pinned (its 1.108 line is what issue 40 first measured)
LITELLM_VERSION = "1.108.0"
LITELLM_REQUIREMENT = f"litellm[proxy]=={LITELLM_VERSION}"


def litellm_home() -> Path:
    return PEERS / "litellm"


def litellm_executable() -> Path:
    return litellm_home() / "bin" / "litellm"


def installed_version(home: Path) -> str | None:
    stamp = home / "installed.txt"
    return stamp.read_text().strip() if stamp.exists() else None


def why_not_installed() -> str | None:
    """None when the pinned LiteLLM proxy is installed, else the reason it is not."""
    home = litellm_home()
    if installed_version(home) == LITELLM_REQUIREMENT and litellm_executable().exists():
        return None
    error = home / "install-error.txt"
    if error.exists():
        return f"installing {LITELLM_REQUIREMENT} failed: {error.read_text().strip()[-600:]}"
    return f"{LITELLM_REQUIREMENT} is not installed under {home} (run `make bench` or `{sys.executable} benchmarks/_peers.py install`)"


def install_litellm() -> str | None:
    """Install the pinned LiteLLM proxy (once); None on success, else the reason it failed."""
    home = litellm_home()
    if installed_version(home) == LITELLM_REQUIREMENT and litellm_executable().exists():
        return None
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    steps = (
        [sys.executable, "-m", "venv", str(home)],
        [str(home / "bin" / "python"), "-m", "pip", "install", "-q", LITELLM_REQUIREMENT],
    )
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            reason = f"`{' '.join(step[-3:])}` exited {done.returncode}: " + (done.stderr or done.stdout)[-2000:]
            (home / "install-error.txt").write_text(reason)
            return reason
    (home / "installed.txt").write_text(LITELLM_REQUIREMENT + "\n")
    return None


def main(argv: list[str]) -> int:
    if argv != ["install"]:
        print(__doc__, file=sys.stderr)
        return 2
    reason = install_litellm()
    if reason:
        # not fatal: the peer rows are skipped with this reason, every other row still runs
        print(f"bench peers: LiteLLM not installed, its rows will be skipped: {reason}", file=sys.stderr)
    else:
        print(f"bench peers: {LITELLM_REQUIREMENT} in {litellm_home()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

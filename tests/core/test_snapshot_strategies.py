"""Every shipped strategy's state is part of the session snapshot (issue 21): a session opened from
a snapshot at any point of a real recorded session, and run on, folds to the state a full replay
builds, and the open reads no event before the snapshot.

The transcripts in ../shared/transcripts are read at run time, never copied into the project.
Each is replayed by ``ctxkernel simulate`` (its steward playing the model's part) through every
plugin profile with a window well below its peak, so the strategies act; the kept sessions are
then cut at random points (a fixed seed per case) and checked with
:func:`ctxkernel.testing.check_snapshot_equivalence`.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest

from ctxkernel import Kernel
from ctxkernel.profile import override_window
from ctxkernel.simulate import Options, Recording, load_recording, run_profile
from ctxkernel.store.jsonl import JsonlStore
from ctxkernel.testing import check_snapshot_equivalence, make_profile

REPO = Path(__file__).resolve().parents[2]
TRANSCRIPTS = REPO.parent / "shared" / "transcripts"
PROFILES = ("decay", "handoff", "rollover", "chapters", "mask", "mask-summary")
#: (folder, window): well below each recording's peak (about 90K, 70K and 5.6K at a 128K window);
#: openai-chat's is just above the smallest window its largest header (handoff's, ~2,700 tokens)
#: leaves room to manage in (guard.py HEADER_MAX_SHARE), where every strategy still compacts
CASES = [("claude-code", 16_000), ("codex", 10_000), ("openai-chat", 6_400)]
CUTS = 4  # random cut points per kept session

pytestmark = pytest.mark.transcripts


def transcript(folder: str) -> Path:
    path = TRANSCRIPTS / folder
    files = (
        sorted(p for p in path.glob("*") if p.is_file() and p.suffix in (".json", ".jsonl")) if path.is_dir() else []
    )
    if not files:
        pytest.skip(f"no transcript in {path} (the shared transcripts are not part of the project)")
    return files[0]


@functools.cache
def recording_of(folder: str) -> Recording:
    """One recording per folder for the file's tests: each profile replays the same one, so what a
    replay derives from it (recall candidates, probes) is derived once."""
    return load_recording(transcript(folder))


def unwritten_chapters(event) -> bool:
    """A chapters in-place commit (its plan in the log, its files written after the commit)."""
    return event.type == "compaction/summary" and event.data.get("strategy") == "chapters" and "records" in event.data


def kernel_on(profile: str, home: Path, window: int, snapshots: bool) -> Kernel:
    """A new kernel (and store object) on the simulation's kept sessions, as simulate ran them."""
    loaded = make_profile(REPO / "profiles" / f"{profile}.toml")
    override_window(loaded, window)
    loaded.store = loaded.store.model_copy(
        update={"backend": "jsonl", "path": str(home), "dsn": None, "snapshot_every": 1000 if snapshots else 0}
    )
    return Kernel(loaded, store=JsonlStore(home, fsync=False), home=home)


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("folder", "window"), CASES, ids=[c[0] for c in CASES])
def test_open_from_a_snapshot_at_random_cuts_of_a_real_session_equals_a_full_replay(tmp_path, profile, folder, window):
    recording = recording_of(folder)
    home = tmp_path / "kept"
    home.mkdir()
    row = run_profile(profile, recording, Options(window=window, keep_sessions=home))
    assert row["status"] == "ok", row["error"]
    assert row["compactions"], "the window is not below the peak: the strategy never acted"
    rng = random.Random(f"{profile}/{folder}")
    checked = 0
    for session_id in row["session_ids"]:
        length = JsonlStore(home).next_seq(session_id)
        cuts = []
        for _ in range(CUTS):
            cut = rng.randint(1, length)
            cuts.append((cut, rng.randint(cut, min(length, cut + 400))))
        cases = check_snapshot_equivalence(lambda on: kernel_on(profile, home, window, on), session_id, cuts)
        events = list(JsonlStore(home).read(session_id))
        for case in cases:
            # the tail was appended as it is, so a chapters commit in it has no files yet: the open
            # settles it (crash recovery), rendering its chapters from the events they cover
            settles = any(unwritten_chapters(e) for e in events[case.cut : case.end])
            assert settles or case.loaded_before_snapshot == 0, (profile, session_id, case)
        checked += len(cases)
    assert checked >= CUTS

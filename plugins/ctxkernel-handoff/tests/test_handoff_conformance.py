"""The kernel's conformance suite, run against the shipped handoff profile."""

from pathlib import Path

from ctxkernel import load_profile
from ctxkernel.testing import check_conformance

PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "handoff.toml"


def test_handoff_profile_passes_the_conformance_suite(tmp_path):
    profile = load_profile(PROFILE)
    report = check_conformance(tmp_path, profile.profile.strategies, settings=profile.strategies, profile=profile)
    assert report.compactions > 0  # the workload needed management, and got it
    assert "effective window never exceeded" in report.checks


def test_open_from_a_snapshot_at_seeded_random_cuts_equals_the_full_fold(tmp_path):
    """The conformance workload's session (window switches, notes, reminders), snapshotted at
    random points and run on: opened from the snapshot it folds to the full replay's handoff state,
    history windows and notes, and reads no event before the snapshot."""
    import random

    from ctxkernel import Kernel
    from ctxkernel.store.jsonl import JsonlStore
    from ctxkernel.testing import check_snapshot_equivalence

    profile = load_profile(PROFILE)
    check_conformance(tmp_path, profile.profile.strategies, settings=profile.strategies, profile=profile, turns=16)
    (session_id,) = JsonlStore(tmp_path).list_sessions()

    def new_kernel(snapshots):
        profile.store = profile.store.model_copy(update={"snapshot_every": 1000 if snapshots else 0})
        profile.model = profile.model.model_copy(update={"context_window": 24_000, "reserved_output_tokens": 2_000})
        return Kernel(profile, store=JsonlStore(tmp_path, fsync=False), home=tmp_path)

    events = list(JsonlStore(tmp_path).read(session_id))
    assert any(e.type == "compaction/summary" and e.data.get("kind") == "window" for e in events)
    length = len(events)
    rng = random.Random(21)
    cuts = [(cut, rng.randint(cut, length)) for cut in sorted(rng.sample(range(1, length + 1), 6))]
    checked = check_snapshot_equivalence(new_kernel, session_id, cuts)
    assert [c.loaded_before_snapshot for c in checked] == [0] * len(cuts)

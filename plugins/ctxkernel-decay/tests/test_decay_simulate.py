"""``ctxkernel simulate`` on the real transcripts: with a window well below each session's peak,
the decay profile (its steward answering reminders with ``compress``, the request guard's
``basic`` summary for a turn that outgrows the window on its own: the current turn is never
compressed) has 0 overflows and 0 invariant violations. A file of many runs (tau-bench) is sampled:
its first run and its longest. Reads ../shared/transcripts at run time; skipped when it is absent."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[3]
TRANSCRIPTS = REPO.parent / "shared" / "transcripts"
FILES = (
    sorted(p for p in TRANSCRIPTS.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
    if TRANSCRIPTS.is_dir()
    else []
)


def _runs(path: Path) -> list[int | None]:
    """None for a file of one session; else the first run and the longest (the index of runs)."""
    if path.suffix != ".json":
        return [None]
    data = orjson.loads(path.read_bytes())
    if not (isinstance(data, list) and data and all(isinstance(r, dict) and "traj" in r for r in data)):
        return [None]
    longest = max(range(len(data)), key=lambda i: len(data[i]["traj"] or []))
    return sorted({0, longest})


CASES = [(path, run) for path in FILES for run in _runs(path)]

pytestmark = [
    pytest.mark.transcripts,
    pytest.mark.skipif(not FILES, reason=f"no transcripts in {TRANSCRIPTS} (they are not part of the repository)"),
]


def _window_well_below_peak(recording) -> tuple[int, int, int]:
    """A quarter of the unmanaged peak, but never less than the request header plus half of the
    conversation: below that, sessions whose header dominates (tau-bench's long policy prompt)
    cannot fit even one exchange, whatever the strategy. With the smallest window the request
    header leaves room to manage in (the header at most half of it: guard.py HEADER_MAX_SHARE)."""
    from ctxkernel.simulate.replay import Options, run_profile
    from ctxkernel.simulate.steward import no_steward

    unmanaged = run_profile("decay", recording, Options(steward=no_steward))
    assert unmanaged["status"] == "ok", unmanaged["error"]
    peak, first = unmanaged["peak_prompt_tokens"], unmanaged["prompt_tokens"][0]
    # the simulator reserves an eighth of a small window for the reply
    header_window = -(-2 * unmanaged["header_tokens"] * 8 // 7)
    return peak, max(peak // 4, int((first + (peak - first) / 2) * 8 / 7)), header_window


def _turns(recording) -> int:
    """Turns as the replay opens them: a user message after a final reply starts the next."""
    from ctxkernel.simulate.recording import AssistantItem, UserItem

    turns, replied = 1, False
    for item in recording.items:
        if isinstance(item, UserItem) and replied:
            turns += 1
        if isinstance(item, AssistantItem | UserItem):
            replied = isinstance(item, AssistantItem) and not item.message.tool_calls
    return turns


@pytest.mark.parametrize(
    ("path", "run"), CASES, ids=[p.name[:24] + ("" if r is None else f"-run{r}") for p, r in CASES]
)
def test_decay_simulates_every_transcript_without_overflow_or_violation(path, run, monkeypatch, tmp_path):
    from ctxkernel.simulate.importers import load_recording
    from ctxkernel.simulate.replay import Options, run_profile

    monkeypatch.chdir(REPO)  # the decay profile is found in ./profiles
    recording = load_recording(path, run=run)
    peak, window, header_window = _window_well_below_peak(recording)
    if header_window >= peak * 0.85:
        # a session whose header dominates (tau-bench's first run: ~2,400 tokens of policy prompt
        # and tools in a peak of ~5,600): no window both leaves the header room and needs
        # management. Below the smallest that does, the kernel refuses decay up front, naming it
        out = run_profile("decay", recording, Options(window=window, workdir=tmp_path))
        assert out["status"] == "refused", out["error"]
        assert out["header_tokens"] > out["effective_window"] / 2 and "smallest context_window" in out["error"]
        return
    window = max(window, header_window)
    chosen = window
    first = run_profile("decay", recording, Options(window=window, workdir=tmp_path))
    if first["status"] == "refused" and "request header" in first["error"]:
        # the header with the history tools, which come only once something is compressed (the
        # unmanaged run never sent them), leaves no room: the smallest window that holds it
        window = max(window, -(-2 * first["header_tokens"] * 8 // 7))
        first = run_profile("decay", recording, Options(window=window, workdir=tmp_path))
    if first["status"] == "refused":
        # a recording whose largest message is larger than this window (an OpenHands tool result
        # of 5,000 tokens): simulate refuses every profile there, naming the smallest window that
        # holds it, and that window must then replay
        named = re.search(r"largest message .* smallest context_window that works is (\d+)", first["error"])
        assert named, first["error"]
        window = int(named.group(1))
    if window != chosen and window >= peak * 0.85:
        return  # no window both holds the header and that message and needs management
    # below the peak, so the strategy must act (a header-heavy session such as tau-bench's, whose
    # request also carries the history tools' schemas, leaves little room below it)
    assert window < peak * 0.85
    windows = sorted({window, 8_000} if peak > 32_000 else {window})
    for w in windows:
        out = run_profile("decay", recording, Options(window=w, workdir=tmp_path))
        summary = {
            k: out[k]
            for k in (
                "status",
                "error",
                "requests",
                "peak_prompt_tokens",
                "overflows",
                "compactions",
                "invariant_violations",
                "steward_errors",
            )
        }
        assert out["status"] == "ok", summary
        assert out["overflows"] == 0, (w, peak, summary)
        assert out["invariant_violations"] == 0, out["invariant_details"][:3]
        assert out["steward_errors"] == 0, summary
        if w == window and _turns(recording) > 1:
            # earlier turns were there to compress: decay, not only the guard, did work. (The Codex
            # rollout is one instruction and one turn, and at 8,000 tokens every Claude Code turn
            # outgrows the window before a reminder is due: the guard carries those.)
            assert out["compactions"].get("compress", 0) > 0, summary

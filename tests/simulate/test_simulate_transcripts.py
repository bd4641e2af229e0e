"""Every shipped profile on every real transcript in ../shared/transcripts (read at run time).

The transcripts are never copied into the project. Each file is replayed once without any
strategy to find its peak; then every profile runs with a window below that peak, so management
is needed: the strategy's own fixed overhead (system prompt section and tool schemas, measured on
its first request) plus 60% of the conversation the unmanaged replay had to carry at its peak.
Every profile must keep the invariants, and every profile that manages context must not overflow.
On a short session that window can be too small for a profile's request header (over half of it,
guard.py HEADER_MAX_SHARE): the kernel refuses the profile up front (status ``refused``), which is
the correct outcome there; the profile then runs at the smallest window its header allows, when
that is still below its unmanaged peak, and must manage it as well. The same holds for a window
that cannot hold the recording's largest message, or whose instruction budget cannot hold its
largest instruction (simulate refuses every profile there alike).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ctxkernel.guard import HEADER_MAX_SHARE
from ctxkernel.simulate import AssistantItem, Options, Recording, load_recording, profile_names, run_profile, sniff

REPO = Path(__file__).resolve().parents[2]
TRANSCRIPTS = REPO.parent / "shared" / "transcripts"
SHARE = 0.6  # of the unmanaged conversation kept within the window

pytestmark = pytest.mark.transcripts


def run_sizes(path: Path) -> list[int]:
    """How long each run of a file holding several is (one entry: a single session)."""
    if path.suffix == ".json":
        data = orjson.loads(path.read_bytes())
        if (
            isinstance(data, list)
            and data
            and all(isinstance(r, dict) and ("traj" in r or "messages" in r) for r in data)
        ):
            return [len(r.get("traj") or r.get("messages") or []) for r in data]
        return [1]
    if sniff(path) != "openhands":
        return [1]
    return [len(orjson.loads(line).get("history") or []) for line in path.read_bytes().splitlines() if line.strip()]


def transcript_cases() -> list[tuple[Path, int | None]]:
    if not TRANSCRIPTS.is_dir():
        return []
    cases: list[tuple[Path, int | None]] = []
    for path in sorted(p for p in TRANSCRIPTS.glob("*/*") if p.suffix in (".json", ".jsonl", ".traj")):
        sizes = run_sizes(path)
        if len(sizes) == 1:
            cases.append((path, None))
            continue
        # the first run and the longest one: a file of many runs is sampled, not replayed whole
        longest = max(range(len(sizes)), key=sizes.__getitem__)
        cases += [(path, 0), (path, longest)] if longest else [(path, 0)]
    return cases


CASES = transcript_cases()


def window_for(effective: int) -> int:
    """The --window whose effective window is ``effective`` (simulate keeps 8192 or 1/8 in reserve)."""
    return effective + 8192 if effective > 8192 else -(-effective * 8 // 7)


def first_request_tokens(profile: str, recording: Recording) -> int:
    """The profile's first request: its system prompt and tools plus the opening messages."""
    first = next(i for i, item in enumerate(recording.items) if isinstance(item, AssistantItem))
    opening = Recording(recording.items[: first + 1], recording.source, recording.system)
    return run_profile(profile, opening, Options())["prompt_tokens"][0]


@pytest.mark.skipif(not CASES, reason=f"no real transcripts at {TRANSCRIPTS} (they are not part of the project)")
@pytest.mark.parametrize(
    ("path", "run"),
    CASES,
    ids=[f"{p.stem}-run{r}" if r is not None else p.stem for p, r in CASES] or None,
)
def test_every_profile_on_real_transcript(path, run, tmp_path):
    recording = load_recording(path, run=run)
    baseline = run_profile("none", recording, Options(window=10_000_000))
    assert baseline["status"] == "ok" and baseline["invariant_violations"] == 0
    conversation = baseline["peak_prompt_tokens"] - baseline["prompt_tokens"][0]
    failures = []
    for name in profile_names("all"):
        first = first_request_tokens(name, recording)
        effective = first + int(SHARE * conversation)
        metrics = run_profile(name, recording, Options(window=window_for(effective)))
        if metrics["status"] == "unavailable":
            continue  # reported by the CLI; a profile whose strategy is not installed is not run
        assert abs(metrics["effective_window"] - effective) <= 1
        needs_management = True
        for _ in range(3):  # refused for its header, or for the recording's largest message or instruction
            if metrics["status"] != "refused":
                break
            if "largest message" in metrics["error"] or "largest instruction" in metrics["error"]:
                # the window cannot hold the recording's largest message (or its instruction budget
                # its largest instruction): refused alike, naming the smallest effective window that can
                smallest = int(metrics["error"].split("(an effective window of ")[1].split(")")[0])
                assert smallest > effective, (name, metrics["error"])
                effective = smallest
            else:
                # a header over half the window leaves nothing to manage: refusing it is correct, and
                # only then (the refusal names the header's size and the smallest window that works)
                header = metrics["header_tokens"]
                assert header > HEADER_MAX_SHARE * effective, (name, metrics["error"])
                assert f"costs {header} tokens" in metrics["error"] and "smallest context_window" in metrics["error"]
                effective = int(header / HEADER_MAX_SHARE) + 1
            if effective >= first + conversation:
                needs_management = False  # no window both admits the session and needs management
                break
            metrics = run_profile(name, recording, Options(window=window_for(effective)))
        if not needs_management:
            continue
        problems = []
        if metrics["status"] != "ok":
            problems.append(f"status {metrics['status']}: {metrics['error']}")
        else:
            if metrics["invariant_violations"]:
                problems.append(
                    f"{metrics['invariant_violations']} invariant violations: {metrics['invariant_details'][:3]}"
                )
            if metrics["strategies"] and metrics["overflows"]:
                problems.append(f"{metrics['overflows']} overflows at effective window {effective}")
        if problems:
            failures.append(f"{name}: " + "; ".join(problems))
    assert not failures, f"{path.parent.name} run {run}:\n" + "\n".join(failures)

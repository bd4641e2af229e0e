#!/usr/bin/env python3
"""The commit-msg check (.pre-commit-config.yaml): a subject of at most 72 characters, and a
blank line between it and the body.

A subject is what `git log --oneline`, a shortlog and a review list show; past 72 characters they
cut it. The detail belongs in the body, after the blank line that tells git where the subject ends.

Usage: check_commit_msg.py MESSAGE_FILE   (git and pre-commit pass .git/COMMIT_EDITMSG)
Exit 0 when the message is accepted, 1 with the reasons on stderr when it is not.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72
#: `git commit -v` appends the diff below this line; git drops it and everything after
SCISSORS = "# ------------------------ >8 ------------------------"


def message_lines(text: str) -> list[str]:
    """The lines git keeps: comment lines and the verbose diff dropped, leading blank lines too."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(SCISSORS):
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def problems(text: str) -> list[str]:
    """What is wrong with a commit message, each naming what is accepted; empty when it is fine."""
    lines = message_lines(text)
    if not lines:
        return []  # git refuses an empty message itself
    found = []
    subject = lines[0]
    if len(subject) > MAX_SUBJECT:
        found.append(
            f"the subject has {len(subject)} characters; at most {MAX_SUBJECT} are accepted. "
            "Shorten it and put the detail in the body"
        )
    if len(lines) > 1 and lines[1]:
        found.append("the second line is not blank: leave one blank line between the subject and the body")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_commit_msg.py MESSAGE_FILE", file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(encoding="utf-8", errors="replace")
    found = problems(text)
    for problem in found:
        print(f"commit message: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""docs/writing-a-strategy.md quotes the example strategy's real code: keep them in sync."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- from: (?P<path>\S+) -->\n```\w*\n(?P<code>.*?)```", re.DOTALL)


def test_tutorial_code_blocks_are_the_example_code():
    text = (REPO / "docs" / "writing-a-strategy.md").read_text()
    blocks = list(BLOCK.finditer(text))
    assert len(blocks) >= 5
    for match in blocks:
        source = (REPO / match["path"]).read_text()
        assert match["code"] in source, f"docs block from {match['path']} no longer matches the file"

import json
import subprocess
import sys

from ctxkernel import Message, ToolCallBlock
from ctxkernel.testing import build_kernel, check_conformance


def test_listed_by_ctxkernel_plugins():
    out = subprocess.run([sys.executable, "-m", "ctxkernel.cli", "plugins"], capture_output=True, text=True, check=True)
    names = [row["name"] for row in json.loads(out.stdout)]
    assert "observation-mask" in names


def test_old_results_are_masked_and_pairing_kept(tmp_path):
    kernel = build_kernel(tmp_path, strategies=["observation-mask"], entry_points=True)
    kernel.profile.strategies = {}
    session = kernel.open_session()
    session.user("read everything")
    for i in range(8):
        session.prepare_request()
        session.commit_reply(Message.assistant("", [ToolCallBlock(f"c{i}", "read", {"path": f"f{i}"})]))
        session.tool_result(f"c{i}", f"line {i}\n" * 200)
    request = session.prepare_request()
    tool_texts = [m.text for m in request.messages if m.role == "tool"]
    assert sum(t.startswith("[output of read omitted") for t in tool_texts) == 3
    assert all(t.startswith("line") for t in tool_texts[-5:])
    # masking is durable and replays identically
    again = kernel.open_session(session.id)
    assert [n.message for n in again.surface] == [n.message for n in session.surface]


def test_conformance(tmp_path):
    report = check_conformance(tmp_path, ["observation-mask"], settings={"observation-mask": {"keep_last": 3}})
    assert report.restarts_checked >= 3

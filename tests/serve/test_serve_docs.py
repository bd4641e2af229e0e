"""docs/serve.md stays in step with the code: every flag and every metric is documented."""

from __future__ import annotations

import argparse
from pathlib import Path

from ctxkernel.cli import build_parser
from ctxkernel.serve.metrics import Metrics

DOC = (Path(__file__).parents[2] / "docs" / "serve.md").read_text()


def test_every_serve_flag_is_documented():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = [o for a in sub.choices["serve"]._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    assert flags
    missing = [f for f in flags if f"`{f}" not in DOC]
    assert not missing, f"docs/serve.md does not document {missing}"


def test_every_metric_is_documented():
    names = {m.name for m in Metrics().registry.collect()}
    missing = [n for n in names if n.removesuffix("_total") not in DOC]
    assert names and not missing, f"docs/serve.md does not document {missing}"

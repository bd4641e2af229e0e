"""docs/serve.md stays in step with the code: every flag and every metric is documented."""

from __future__ import annotations

import argparse
import re
import tomllib
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


def recipe_blocks(language: str) -> list[str]:
    recipes = DOC[DOC.index("## Recipes") : DOC.index("## Endpoints")]
    return re.findall(rf"```{language}\n(.*?)```", recipes, re.S)


def test_the_sdk_recipes_run_as_written(fake, serve_factory, capsys):
    from serve_fake_upstream import Reply

    upstream, _ = fake
    serve = serve_factory()
    upstream.script = lambda api, body: Reply("hello from the provider")
    blocks = recipe_blocks("python")
    assert len(blocks) == 2
    for code in blocks:
        assert "http://127.0.0.1:8787" in code
        exec(compile(code.replace("http://127.0.0.1:8787", serve.url), "docs/serve.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.count("hello from the provider") == 3
    assert {r.api for r in upstream.received} == {"openai", "anthropic"}


def test_the_cli_recipes_match_what_the_agent_tests_run():
    codex = tomllib.loads(recipe_blocks("toml")[0])
    provider = codex["model_providers"][codex["model_provider"]]
    assert provider["wire_api"] == "responses" and provider["base_url"].endswith("/v1")
    agent_tests = (Path(__file__).parent / "test_serve_agent_clis.py").read_text()
    assert 'wire_api="responses"' in agent_tests and "ANTHROPIC_BASE_URL" in agent_tests
    assert '"OPENAI_API_BASE": f"{serve.url}/v1"' in agent_tests and '"openai/fake-model"' in agent_tests
    consoles = "\n".join(recipe_blocks("console"))
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude -p" in consoles
    assert "codex exec" in consoles and "OPENAI_API_BASE=http://127.0.0.1:8787/v1 aider" in consoles

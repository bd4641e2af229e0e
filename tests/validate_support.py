"""Fake installed distributions for validation and CLI tests.

Each fake is a real ``*.dist-info`` folder on ``sys.path`` with an ``entry_points.txt``, so
``importlib.metadata`` discovers it exactly as it discovers an installed strategy: the tests run
the kernel's real discovery path, conflicts included.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

TEMPLATE = """
import ctxkernel
from pydantic import BaseModel, ConfigDict


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    budget_tokens: int = 1000
    mode: str = "on"


class Args(ctxkernel.ToolArgs):
    text: str = ""


@ctxkernel.hookimpl
def register_strategy(register):
    register(ctxkernel.StrategySpec({name!r}, settings=Settings, capabilities={capabilities!r}))


@ctxkernel.hookimpl
def register_tools(register, ctx):
    for tool in {tools!r}:
        register(ctxkernel.Tool(tool, "a test tool", Args, lambda s, a: "ok", strategy={name!r}))
"""


class FakeSite:
    """A folder on sys.path where tests install fake strategy distributions."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        monkeypatch.syspath_prepend(str(root))
        self._count = 0

    def install(
        self,
        name: str,
        *,
        dist: str | None = None,
        version: str = "1.0",
        capabilities: tuple[str, ...] = (),
        tools: tuple[str, ...] = (),
        extra: str = "",
        source: str | None = None,
    ) -> str:
        """Install a distribution offering strategy ``name``; returns the module name."""
        self._count += 1
        dist = dist or f"ctxkernel-{name}"
        # module names are unique per test folder so that sys.modules never serves a stale one
        module = f"fake_{name.replace('-', '_')}_{self._count}_{abs(hash(str(self.root))) % 10**8}"
        code = (
            source
            if source is not None
            else TEMPLATE.format(name=name, capabilities=set(capabilities), tools=list(tools))
        )
        (self.root / f"{module}.py").write_text(code + textwrap.dedent(extra))
        # the folder name is what importlib.metadata.version() looks a distribution up by
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[ctxkernel.strategies]\n{name} = {module}\n")
        return module

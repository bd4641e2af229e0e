"""The import contracts of pyproject.toml stay complete (issue 37): every private kernel module is
forbidden to the plugins, the built-in strategies and the example (a module is private unless the
public API names it), and the contracts count imports made for type checking only, so a
``TYPE_CHECKING`` import of the Session is a broken contract like any other."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import ctxkernel
import ctxkernel.testing

REPO = Path(__file__).resolve().parents[2]
#: docs/architecture.md, "The public API and the wall behind it"
PUBLIC = {
    "ctxkernel",
    "ctxkernel.events",
    "ctxkernel.recall",
    "ctxkernel.text",
    "ctxkernel.redact",
    "ctxkernel.testing",
}


def importlinter() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_type_checking_imports_count():
    assert importlinter()["exclude_type_checking_imports"] is False


def test_every_private_module_is_forbidden_to_plugins():
    contract = next(c for c in importlinter()["contracts"] if c["name"].startswith("plugins, the built-in"))
    forbidden = set(contract["forbidden_modules"])
    modules = {f"ctxkernel.{m.name}" for m in pkgutil.iter_modules(ctxkernel.__path__)}
    modules |= {f"ctxkernel.testing.{m.name}" for m in pkgutil.iter_modules(ctxkernel.testing.__path__)}
    private = {m for m in modules if m not in PUBLIC and not m.startswith("ctxkernel.recall")}
    uncovered = sorted(m for m in private if not any(m == f or m.startswith(f + ".") for f in forbidden))
    assert uncovered == [], f"add these private modules to the plugins' forbidden_modules: {uncovered}"
    assert "ctxkernel.session" in forbidden and "ctxkernel.context" in forbidden


def test_the_kernel_packages_are_checked_for_cycles():
    contract = next(c for c in importlinter()["contracts"] if c["type"] == "acyclic_siblings")
    packages = {f"ctxkernel.{m.name}" for m in pkgutil.iter_modules(ctxkernel.__path__) if m.ispkg}
    unchecked = sorted(packages - set(contract["ancestors"]))
    assert unchecked == [], f"add these packages to the acyclic_siblings ancestors: {unchecked}"

"""The distributions work outside the checkout, installed (not editable) into fresh virtual
environments and run from folders that hold no checkout.

The wheels are built once for the module, each from its own sdist (so both carry the profiles), and
go into two environments:

- **every distribution** (issue #14, item 5): the kernel, its plugins and the example find and
  validate every shipped profile and simulate through them;
- **the kernel alone, for third parties** (the strategy author kit, issue 22 item 8): the kernel
  with its ``test`` extra, the example third-party strategy, which passes the conformance suite
  there, and a strategy written by ``ctxkernel new-strategy``, whose profile validates and whose
  own tests pass unchanged, run from its folder.

The two environments share the wheels, so the kernel is built once rather than three times; every
pip install resolves the kernel's dependencies from scratch, which is most of this module's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ctxkernel-observation-mask"
DISTRIBUTIONS = [
    REPO,
    *sorted((REPO / "plugins").glob("ctxkernel-*")),
    *sorted((REPO / "examples").glob("ctxkernel-*")),
]
SHIPPED = sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))
NAME = "pin-and-trim"  # the strategy `new-strategy` writes

CONFORMANCE = """
import json, sys, tempfile
from ctxkernel.testing import check_conformance
from ctxkernel.plugins import discover
available, conflicts = discover()
assert "observation-mask" in available and not conflicts, (sorted(available), conflicts)
report = check_conformance(tempfile.mkdtemp(), ["observation-mask"], turns=12)
print(json.dumps({"requests": report.requests, "checks": report.checks}))
"""

# building seven distributions and two fresh venvs takes two minutes on a quiet machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class FreshVenv:
    root: Path
    outside: Path  # a folder that holds no checkout, to run from
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def ctxkernel(self) -> str:
        return str(self.root / "bin" / "ctxkernel")

    def run(self, *cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return _run(list(cmd), cwd or self.outside, self.env)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=600, check=False)


def _fresh_venv(tmp_path: Path, requirements: list[str]) -> FreshVenv:
    root = tmp_path / "venv"
    venv.create(root, with_pip=True)
    # nothing may lead back to the checkout: no PYTHONPATH, no profile path, a fresh home
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXKERNEL_", "PYTHON"))}
    env |= {"CTXKERNEL_HOME": str(tmp_path / "home"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    install = _run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", *requirements], tmp_path, env)
    if install.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pip install into a fresh venv failed in CI:\n{install.stderr[-3000:]}")
        pytest.skip(f"cannot install into a fresh venv here (no package index?): {install.stderr[-500:]}")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    return FreshVenv(root, outside, env)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    """Each distribution's folder -> its wheel, built from its sdist."""
    dist = tmp_path_factory.mktemp("dist")
    for project in DISTRIBUTIONS:
        # sdist first, then the wheel from the unpacked sdist: proves both carry the profiles
        built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(project)], dist)
        assert built.returncode == 0, f"python -m build {project.name}:\n{built.stdout[-2000:]}\n{built.stderr[-3000:]}"
    built_wheels = sorted(dist.glob("*.whl"))
    assert len(built_wheels) == len(DISTRIBUTIONS), [w.name for w in built_wheels]
    by_name = {w.name.split("-")[0].replace("_", "-"): w for w in built_wheels}
    return {
        project: by_name[tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]]
        for project in DISTRIBUTIONS
    }


@pytest.fixture(scope="module")
def everything(wheels, tmp_path_factory) -> FreshVenv:
    return _fresh_venv(tmp_path_factory.mktemp("everything"), [str(w) for w in wheels.values()])


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The distribution ``ctxkernel new-strategy`` writes, unchanged."""
    where = tmp_path_factory.mktemp("generated")
    made = _run([sys.executable, "-m", "ctxkernel.cli", "new-strategy", NAME, "--to", str(where)], where)
    assert made.returncode == 0, made.stderr
    return where / f"ctxkernel-{NAME}"


@pytest.fixture(scope="module")
def kernel_alone(wheels, generated, tmp_path_factory) -> FreshVenv:
    """The kernel and two third-party strategies; none of the shipped plugins."""
    requirements = [f"{wheels[REPO]}[test]", str(wheels[EXAMPLE]), f"{generated}[test]"]
    return _fresh_venv(tmp_path_factory.mktemp("kernel-alone"), requirements)


def test_every_distribution_is_versioned_alike_and_pins_a_compatible_kernel():
    kernel = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    major, minor, _ = kernel["version"].split(".")
    compatible = f"ctxkernel>={major}.{minor},<{major}.{int(minor) + 1}"
    for project in DISTRIBUTIONS[1:]:
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        assert meta["version"] == kernel["version"], project.name
        assert compatible in meta["dependencies"], (project.name, meta["dependencies"])
    assert f"## {kernel['version']}" in (REPO / "CHANGELOG.md").read_text()


# -- every distribution ---------------------------------------------------------------------------


def test_wheels_install_outside_the_checkout(everything):
    where = everything.run(
        everything.python,
        "-c",
        "import ctxkernel, ctxkernel_decay; print(ctxkernel.__file__); print(ctxkernel_decay.__file__)",
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert Path(line).resolve().is_relative_to(everything.root.resolve()), line  # not editable, not the checkout


def test_plugins_lists_every_strategy(everything):
    listed = everything.run(everything.ctxkernel, "plugins")
    assert listed.returncode == 0, listed.stderr
    names = {row["name"] for row in json.loads(listed.stdout)}
    assert {"basic", "decay", "handoff", "rollover", "chapters", "mask", "observation-mask"} <= names


def test_every_shipped_profile_is_found_and_valid(everything):
    found = everything.run(everything.ctxkernel, "profiles", "--json")
    assert found.returncode == 0, found.stderr
    rows = {row["name"]: row for row in json.loads(found.stdout)}
    assert sorted(rows) == SHIPPED
    for row in rows.values():
        assert Path(row["path"]).resolve().is_relative_to(everything.root.resolve()), row
    checked = everything.run(everything.ctxkernel, "validate", "--strict", *SHIPPED)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    opened = everything.run(
        everything.python, "-c", "import ctxkernel; print(ctxkernel.Kernel.from_profile('handoff').profile.name)"
    )
    assert opened.returncode == 0 and opened.stdout.strip() == "handoff", opened.stderr


def test_a_short_simulation_runs_through_every_shipped_profile(everything):
    ran = everything.run(
        everything.ctxkernel,
        "simulate",
        "--workload",
        "chat-short",
        "--profile",
        "all",
        "--format",
        "json",
        "--no-progress",
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip(), "simulate printed nothing"
    for name in SHIPPED:
        assert name in ran.stdout


# -- the kernel alone, for third parties ----------------------------------------------------------


def test_example_in_fresh_venv_passes_conformance(kernel_alone):
    listed = kernel_alone.run(kernel_alone.python, "-m", "pip", "list", "--format=freeze")
    assert listed.returncode == 0, listed.stderr
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "ctxkernel-decay" not in names and "ctxkernel-observation-mask" in names
    result = kernel_alone.run(kernel_alone.python, "-c", CONFORMANCE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "effective window never exceeded" not in result.stdout  # the example claims no pressure capability
    assert "restart equivalence" in result.stdout


def test_generated_strategy_installs_validates_and_passes_its_tests(kernel_alone, generated):
    where = kernel_alone.run(
        kernel_alone.python,
        "-c",
        "import ctxkernel, ctxkernel_pin_and_trim as p; print(ctxkernel.__file__, p.__file__)",
    )
    assert where.returncode == 0, where.stderr
    assert str(REPO) not in where.stdout and str(generated) not in where.stdout, where.stdout  # installed copies

    validate = kernel_alone.run(kernel_alone.ctxkernel, "validate", NAME)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert f"ctxkernel_pin_and_trim/profiles/{NAME}.toml" in validate.stdout

    tests = kernel_alone.run(kernel_alone.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=generated)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert "4 passed" in tests.stdout

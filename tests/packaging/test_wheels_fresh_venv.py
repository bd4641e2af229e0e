"""The distributions work outside the checkout (issue #14, item 5): wheels built with
``python -m build`` for the kernel, the four plugins and the example, installed (not editable)
into a fresh virtual environment and run from a folder that holds no checkout, find and validate
every shipped profile and simulate through them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = [
    REPO,
    *sorted((REPO / "plugins").glob("ctxkernel-*")),
    *sorted((REPO / "examples").glob("ctxkernel-*")),
]
SHIPPED = sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))

# building six distributions and a fresh venv takes a minute on a quiet machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def _clean_env(tmp_path: Path) -> dict[str, str]:
    # nothing may lead back to the checkout: no PYTHONPATH, no profile path, a fresh home
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXKERNEL_", "PYTHON"))}
    return env | {"CTXKERNEL_HOME": str(tmp_path / "home"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    tmp_path = tmp_path_factory.mktemp("wheels")
    dist = tmp_path / "dist"
    for project in DISTRIBUTIONS:
        # sdist first, then the wheel from the unpacked sdist: proves both carry the profiles
        built = _run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(project)], cwd=tmp_path
        )
        assert built.returncode == 0, f"python -m build {project.name}:\n{built.stdout[-2000:]}\n{built.stderr[-3000:]}"
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == len(DISTRIBUTIONS), [w.name for w in wheels]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    env = _clean_env(tmp_path)
    install = _run([str(python), "-m", "pip", "install", "-q", *map(str, wheels)], cwd=tmp_path, env=env)
    if install.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pip install of the wheels into a fresh venv failed in CI:\n{install.stderr[-3000:]}")
        pytest.skip(f"cannot install into a fresh venv here (no package index?): {install.stderr[-500:]}")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    return env_dir, outside, env


def test_every_distribution_is_versioned_alike_and_pins_a_compatible_kernel():
    kernel = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    major, minor, _ = kernel["version"].split(".")
    compatible = f"ctxkernel>={major}.{minor},<{major}.{int(minor) + 1}"
    for project in DISTRIBUTIONS[1:]:
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        assert meta["version"] == kernel["version"], project.name
        assert compatible in meta["dependencies"], (project.name, meta["dependencies"])
    assert f"## {kernel['version']}" in (REPO / "CHANGELOG.md").read_text()


def test_wheels_install_outside_the_checkout(installed):
    env_dir, outside, env = installed
    where = _run(
        [
            str(env_dir / "bin" / "python"),
            "-c",
            "import ctxkernel, ctxkernel_decay; print(ctxkernel.__file__); print(ctxkernel_decay.__file__)",
        ],
        outside,
        env,
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert Path(line).resolve().is_relative_to(env_dir.resolve()), line  # not editable, not the checkout


def test_plugins_lists_every_strategy(installed):
    env_dir, outside, env = installed
    listed = _run([str(env_dir / "bin" / "ctxkernel"), "plugins"], outside, env)
    assert listed.returncode == 0, listed.stderr
    names = {row["name"] for row in json.loads(listed.stdout)}
    assert {"basic", "decay", "handoff", "rollover", "chapters", "mask", "observation-mask"} <= names


def test_every_shipped_profile_is_found_and_valid(installed):
    env_dir, outside, env = installed
    found = _run([str(env_dir / "bin" / "ctxkernel"), "profiles", "--json"], outside, env)
    assert found.returncode == 0, found.stderr
    rows = {row["name"]: row for row in json.loads(found.stdout)}
    assert sorted(rows) == SHIPPED
    for row in rows.values():
        assert Path(row["path"]).resolve().is_relative_to(env_dir.resolve()), row
    checked = _run([str(env_dir / "bin" / "ctxkernel"), "validate", "--strict", *SHIPPED], outside, env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    opened = _run(
        [
            str(env_dir / "bin" / "python"),
            "-c",
            "import ctxkernel; print(ctxkernel.Kernel.from_profile('handoff').profile.name)",
        ],
        outside,
        env,
    )
    assert opened.returncode == 0 and opened.stdout.strip() == "handoff", opened.stderr


def test_a_short_simulation_runs_through_every_shipped_profile(installed):
    env_dir, outside, env = installed
    ran = _run(
        [
            str(env_dir / "bin" / "ctxkernel"),
            "simulate",
            "--workload",
            "chat-short",
            "--profile",
            "all",
            "--format",
            "json",
            "--no-progress",
        ],
        outside,
        env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip(), "simulate printed nothing"
    for name in SHIPPED:
        assert name in ran.stdout

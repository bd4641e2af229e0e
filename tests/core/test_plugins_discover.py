"""Strategy discovery (``plugins.discover``): entry points of installed distributions, conflicts
named, and only the distributions that offer a strategy read beyond their entry points."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from ctxkernel.errors import PluginConflictError
from ctxkernel.plugins import ENTRY_POINT_GROUP, StrategyManager, discover


def _distribution(site: Path, name: str, version: str, strategies: dict[str, str]) -> None:
    """A minimal installed distribution (a ``.dist-info`` folder) on ``site``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if strategies:
        lines = "".join(f"{key} = {target}\n" for key, target in strategies.items())
        (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def test_a_strategy_of_one_distribution_is_available_with_its_name_and_version(site: Path) -> None:
    _distribution(site, "ctxkernel-zz-alpha", "1.2.3", {"zz-alpha": "zz_alpha.plugin"})
    available, conflicts = discover()
    found = available["zz-alpha"]
    assert (found.distribution, found.version, found.target) == ("ctxkernel-zz-alpha", "1.2.3", "zz_alpha.plugin")
    assert "zz-alpha" not in conflicts
    assert {"basic", "history"} <= set(available)  # the kernel's own, listed the same way
    assert discover(entry_points=False)[0].keys() == {"basic", "history"}


def test_two_distributions_offering_one_name_are_a_conflict_naming_both(site: Path) -> None:
    _distribution(site, "ctxkernel-zz-one", "0.1.0", {"zz-twin": "zz_one.plugin"})
    _distribution(site, "ctxkernel-zz-two", "0.2.0", {"zz-twin": "zz_two.plugin"})
    available, conflicts = discover()
    assert "zz-twin" not in available
    assert sorted(a.distribution for a in conflicts["zz-twin"]) == ["ctxkernel-zz-one", "ctxkernel-zz-two"]
    with pytest.raises(PluginConflictError, match="more than one distribution") as info:
        StrategyManager().resolve("zz-twin")
    assert "ctxkernel-zz-one 0.1.0" in str(info.value) and "ctxkernel-zz-two 0.2.0" in str(info.value)


def test_only_distributions_that_offer_a_strategy_have_their_metadata_read(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # parsing every installed distribution's metadata was most of a kernel's start-up
    _distribution(site, "ctxkernel-zz-offers", "1.0.0", {"zz-offers": "zz_offers.plugin"})
    _distribution(site, "zz-offers-nothing", "1.0.0", {})
    read: list[str] = []
    original = importlib.metadata.PathDistribution.read_text

    def recorded(self: importlib.metadata.PathDistribution, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            read.append(Path(str(self._path)).name)  # type: ignore[attr-defined]
        return original(self, filename)

    monkeypatch.setattr(importlib.metadata.PathDistribution, "read_text", recorded)
    available, _ = discover()
    by_discovery = set(read)  # the checks below read more
    assert available["zz-offers"].distribution == "ctxkernel-zz-offers"
    assert "ctxkernel_zz_offers-1.0.0.dist-info" in by_discovery
    assert "zz_offers_nothing-1.0.0.dist-info" not in by_discovery
    # besides the kernel's own (its version), only the distributions that offer one
    offering = {
        Path(str(dist._path)).name  # type: ignore[attr-defined]
        for dist in importlib.metadata.distributions()
        if dist.name == "ctxkernel" or any(ep.group == ENTRY_POINT_GROUP for ep in dist.entry_points)
    }
    assert by_discovery <= offering

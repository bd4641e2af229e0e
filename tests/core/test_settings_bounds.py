"""Every number a profile can set is bounded and finite: ``ctxkernel validate`` refuses inf, nan,
a negative and an absurd value, and a boolean (which Python counts as 1 or 0), for every int and
float field of every settings model (the kernel's and each installed strategy's), naming the key."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from ctxkernel.plugins import StrategyManager
from ctxkernel.profile import (
    CacheSettings,
    InstructionSettings,
    LedgerSettings,
    ModelSettings,
    Prices,
    StoreSettings,
    SummarizerSettings,
)
from ctxkernel.validate import validate_profile

#: every strategy shipped in this repository (the plugins and the example are installed by make install)
SHIPPED = {"basic", "decay", "handoff", "rollover", "chapters", "mask", "observation-mask"}
#: TOML literals refused for every numeric field: non-finite, negative, absurdly large, a boolean
BAD = {
    float: ["inf", "-inf", "nan", "-1.0", "1e15", "true", "false"],
    int: ["inf", "nan", "-1", "1000000000000000", "true", "false"],
}


def _numeric(annotation: typing.Any) -> tuple[type, bool] | None:
    """(int or float, inside a list?) for a numeric field annotation, else None."""
    if annotation in (int, float):
        return annotation, False
    origin = typing.get_origin(annotation)
    if origin is list and typing.get_args(annotation)[0] in (int, float):
        return typing.get_args(annotation)[0], True
    if origin in (typing.Union, types.UnionType):
        numeric = [a for a in typing.get_args(annotation) if a in (int, float)]
        if numeric:
            return numeric[0], False
    return None


def _fields(model: type[BaseModel]) -> list[tuple[str, type, bool]]:
    out = []
    for key, info in model.model_fields.items():
        found = _numeric(info.annotation)
        if found:
            out.append((key, *found))
    return out


def _strategy_models() -> dict[str, type[BaseModel]]:
    manager = StrategyManager()
    models = {}
    for name in sorted(manager.available):
        manager.load([name])
        models[name] = manager.specs[name].settings
    return models


STRATEGIES = _strategy_models()
KERNEL_TABLES: dict[str, tuple[type[BaseModel], str]] = {
    "model": (ModelSettings, ""),
    "summarizer": (SummarizerSettings, ""),
    "prices": (Prices, "input = 1.0\ncached_input = 0.5\noutput = 2.0\n"),
    "store": (StoreSettings, ""),
    "cache": (CacheSettings, ""),
    "instructions": (InstructionSettings, ""),
    "ledger": (LedgerSettings, ""),
}


def _cases() -> list[tuple[str, str, str, str, str]]:
    """(profile strategies, table, key, literal, other lines of the table)."""
    cases = []
    for table, (model, base) in KERNEL_TABLES.items():
        for key, kind, in_list in _fields(model):
            for literal in BAD[kind]:
                cases.append(("basic", table, key, f"[{literal}]" if in_list else literal, base))
    for name, model in STRATEGIES.items():
        for key, kind, in_list in _fields(model):
            for literal in BAD[kind]:
                cases.append((name, f"strategies.{name}", key, f"[{literal}]" if in_list else literal, ""))
    return cases


CASES = _cases()


def test_the_walk_covers_every_shipped_settings_model():
    assert SHIPPED <= set(STRATEGIES)
    assert all(_fields(model) for name, model in STRATEGIES.items() if name in SHIPPED - {"handoff"})
    assert len(CASES) > 200


@pytest.mark.parametrize(
    ("strategy", "table", "key", "literal", "base"), CASES, ids=[f"{c[1]}.{c[2]}={c[3]}" for c in CASES]
)
def test_validate_refuses_the_value_naming_the_key(tmp_path, monkeypatch, strategy, table, key, literal, base):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    lines = base.splitlines()
    lines = [line for line in lines if not line.startswith(f"{key} =")]
    body = "\n".join([*lines, f"{key} = {literal}"])
    path = Path(tmp_path / "p.toml")
    path.write_text(f'[profile]\nstrategies = ["{strategy}"]\n\n[{table}]\n{body}\n')
    report = validate_profile(path)
    assert not report.valid
    named = [c.message for c in report.failures if f"{table}.{key}" in c.message]
    assert named, [c.message for c in report.failures]


def test_a_third_party_model_that_allows_inf_is_still_refused(tmp_path):
    """The kernel checks finiteness itself, whatever the strategy's model allows."""
    from ctxkernel.errors import ProfileError
    from ctxkernel.settings_check import strategy_settings_from

    class Loose(BaseModel):
        ratio: float = 0.5
        nested: list[float] = [1.0]

    assert strategy_settings_from(Loose, {"ratio": 0.25}, "p.toml", "strategies.x").ratio == 0.25
    with pytest.raises(ProfileError, match=r"p\.toml: strategies\.x\.ratio: must be a finite number \(got inf\)"):
        strategy_settings_from(Loose, {"ratio": float("inf")}, "p.toml", "strategies.x")
    with pytest.raises(ProfileError, match=r"strategies\.x\.nested\[0\]: must be a finite number"):
        strategy_settings_from(Loose, {"nested": [float("nan")]}, "p.toml", "strategies.x")


def test_a_boolean_is_not_taken_for_a_number(tmp_path):
    """``pool_size = true`` used to load as 1 and ``snapshot_every = true`` as a snapshot at
    every event: Python counts a bool as an int, and pydantic let it through."""
    from ctxkernel.errors import ProfileError
    from ctxkernel.profile import load_profile
    from ctxkernel.settings_check import strategy_settings_from

    path = tmp_path / "p.toml"
    path.write_text("[store]\nsnapshot_every = true\n")
    with pytest.raises(ProfileError, match=r"store\.snapshot_every: .*not a boolean"):
        load_profile(path)
    path.write_text("[[model_policies]]\nmatch = { name = 'm' }\nmodel = { context_window = false }\n")
    with pytest.raises(ProfileError, match=r"context_window: .*not a boolean"):
        load_profile(path).model_for("openai", "m")

    class Loose(BaseModel):
        retries: int = 1
        ratios: list[float] = [0.5]
        flag: bool = False
        either: int | bool = 0

    kept = strategy_settings_from(Loose, {"flag": True, "either": True}, "p.toml", "strategies.x")
    assert kept.flag is True and kept.either is True  # a field that takes a bool keeps it
    with pytest.raises(ProfileError, match=r"p\.toml: strategies\.x\.retries: must be a number, not a boolean"):
        strategy_settings_from(Loose, {"retries": True}, "p.toml", "strategies.x")
    with pytest.raises(ProfileError, match=r"strategies\.x\.ratios\[1\]: must be a number, not a boolean"):
        strategy_settings_from(Loose, {"ratios": [0.5, False]}, "p.toml", "strategies.x")


def test_timeout_inf_is_refused_before_it_reaches_a_request(tmp_path, monkeypatch):
    """The reported case: ``summarizer.timeout_seconds = inf`` used to pass and then overflow."""
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    path = tmp_path / "p.toml"
    path.write_text(
        '[summarizer]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\ntimeout_seconds = inf\n'
    )
    report = validate_profile(path)
    assert any("summarizer.timeout_seconds" in c.message and "finite" in c.message for c in report.failures)

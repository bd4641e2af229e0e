"""Profiles: unknown keys, environment overrides (deep-merged), per-model policies."""

from __future__ import annotations

import pytest

from ctxkernel import Kernel, ProfileError, load_profile
from ctxkernel.store.jsonl import JsonlStore


@pytest.fixture(autouse=True)
def clean_env(tmp_path, monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("CTXKERNEL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))


def write(tmp_path, text, name="p.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_misspelt_key_is_refused_naming_file_key_and_accepted_keys(tmp_path):
    path = write(tmp_path, "[store]\nbackend = 'jsonl'\nbakend = 'sqlite'\n")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and "'store.bakend'" in message and "backend" in message


def test_misspelt_table_is_refused(tmp_path):
    path = write(tmp_path, "[modle]\nname = 'x'\n")
    with pytest.raises(ProfileError, match="'modle'"):
        load_profile(path)


def test_misspelt_strategy_key_is_refused_when_the_kernel_loads(tmp_path):
    path = write(tmp_path, "[strategies.basic]\nretain = 0.1\n")
    with pytest.raises(ProfileError) as info:
        Kernel.from_profile(path, store=JsonlStore(tmp_path / "s"), entry_points=False)
    assert "'strategies.basic.retain'" in str(info.value) and "retain_ratio" in str(info.value)


def test_env_overrides_deep_merge_into_the_file(tmp_path, monkeypatch):
    path = write(
        tmp_path,
        "[model]\nprovider = 'deepseek'\nname = 'deepseek-chat'\ncontext_window = 128000\n"
        "[strategies.basic]\nretain_ratio = 0.1\nauto = true\n",
    )
    monkeypatch.setenv("CTXKERNEL_MODEL__CONTEXT_WINDOW", "64000")
    monkeypatch.setenv("CTXKERNEL_STRATEGIES__BASIC__THRESHOLD_RATIO", "0.7")
    profile = load_profile(path)
    # the overridden keys change, their siblings from the file stay
    assert profile.model.context_window == 64000
    assert profile.model.provider == "deepseek" and profile.model.name == "deepseek-chat"
    assert profile.strategies["basic"]["retain_ratio"] == 0.1
    assert profile.strategies["basic"]["auto"] is True
    kernel = Kernel(profile, store=JsonlStore(tmp_path / "s"), entry_points=False)
    settings = kernel.strategy_settings("basic")
    assert settings.threshold_ratio == 0.7 and settings.retain_ratio == 0.1


def test_env_override_with_an_unknown_key_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path, "[model]\nname = 'x'\n")
    monkeypatch.setenv("CTXKERNEL_MODEL__WINDOW", "64000")
    with pytest.raises(ProfileError, match="'model.window'"):
        load_profile(path)


def test_variables_choosing_profile_and_home_are_not_profile_keys(tmp_path, monkeypatch):
    path = write(tmp_path, "[model]\nname = 'x'\n")
    monkeypatch.setenv("CTXKERNEL_PROFILE", str(path))
    assert load_profile().model.name == "x"


POLICIES = """
[model]
provider = "deepseek"
name = "deepseek-chat"
context_window = 128000
reserved_output_tokens = 8192

[strategies.basic]
threshold_ratio = 0.8

[[model_policies]]
match = { provider = "deepseek", name = "deepseek-reasoner" }
model = { reserved_output_tokens = 32000 }
strategies.basic = { threshold_ratio = 0.6 }

[[model_policies]]
match = { provider = "deepseek" }
strategies.basic = { threshold_ratio = 0.7 }

[[model_policies]]
match = { provider = "deepseek", name = "deepseek-chat" }
strategies.basic = { threshold_ratio = 0.5 }
"""


def test_per_model_policy_first_match_wins(tmp_path):
    profile = load_profile(write(tmp_path, POLICIES))
    # the exact policy comes first for the reasoner
    assert profile.policy_for("deepseek", "deepseek-reasoner") is profile.model_policies[0]
    assert profile.model_for("deepseek", "deepseek-reasoner").reserved_output_tokens == 32000
    assert profile.strategy_settings("basic", "deepseek", "deepseek-reasoner")["threshold_ratio"] == 0.6
    # for deepseek-chat the provider-wide policy matches before the exact third one
    assert profile.policy_for("deepseek", "deepseek-chat") is profile.model_policies[1]
    assert profile.strategy_settings("basic", "deepseek", "deepseek-chat")["threshold_ratio"] == 0.7
    # no policy: the profile's own tables
    assert profile.policy_for("openai", "gpt-4o") is None
    assert profile.strategy_settings("basic", "openai", "gpt-4o")["threshold_ratio"] == 0.8
    assert profile.model_for("openai", "gpt-4o").reserved_output_tokens == 8192


def test_session_routed_to_another_model_uses_its_policy(tmp_path):
    profile = load_profile(write(tmp_path, POLICIES))
    kernel = Kernel(profile, store=JsonlStore(tmp_path / "s"), entry_points=False)
    session = kernel.open_session()
    assert session.settings("basic").threshold_ratio == 0.7  # deepseek-chat: provider-wide policy
    session.set_route("deepseek", "deepseek-reasoner")
    assert session.settings("basic").threshold_ratio == 0.6
    assert session.pressure().reserved_output_tokens == 32000

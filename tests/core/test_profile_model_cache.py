"""Profile.model_for keeps what it validated: the answer is the one validation gives, and an input
changed since (an assigned or edited [model], an edited policy, a caller's assignment to the
object it was handed) is never served stale."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ctxkernel import ProfileError, load_profile
from ctxkernel.profile import _MODELS as KEPT
from ctxkernel.profile import (
    MODEL_CACHE_SIZE,
    ModelPolicy,
    ModelSettings,
    Profile,
    format_validation_error,
    override_window,
)

#: profiles read only this test's files: no CTXKERNEL_* override of the environment applies
pytestmark = pytest.mark.usefixtures("no_ctxkernel_env")


def validated(profile: Profile, provider: str | None, name: str | None) -> ModelSettings | str:
    """What model_for answered before it kept anything: the merge validated afresh (or the error)."""
    base = profile.model.model_dump()
    if provider:
        base["provider"] = provider
    if name:
        base["name"] = name
    policy = profile.policy_for(provider, name)
    if policy and policy.model:
        base.update(policy.model)
    try:
        return ModelSettings(**base)
    except ValidationError as exc:
        table = f"model_policies[{profile.model_policies.index(policy)}].model" if policy else "model"
        return format_validation_error(exc, profile.where, ModelSettings, table)


def answer(profile: Profile, provider: str | None, name: str | None) -> ModelSettings | str:
    try:
        return profile.model_for(provider, name)
    except ProfileError as exc:
        return str(exc)


def policy(provider: str | None, name: str | None, **model: Any) -> ModelPolicy:
    return ModelPolicy.model_validate({"match": {"provider": provider, "name": name}, "model": model})


names = st.sampled_from([None, "a", "b"])
overrides = st.dictionaries(
    st.sampled_from(["context_window", "reserved_output_tokens", "tokenizer"]),
    st.one_of(
        st.integers(-1, 300_000),
        st.booleans(),
        st.floats(0, 300_000, allow_nan=False),
        st.sampled_from(["4000", "o200k_base", "x", [1]]),
    ),
    max_size=2,
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ask", "assign_model", "edit_model", "edit_policy", "replace_policies", "poke"]),
            names,
            names,
            overrides,
        ),
        min_size=1,
        max_size=12,
    )
)
def test_every_answer_is_the_one_validation_gives_through_any_edits(steps):
    """Asks interleaved with every way the inputs change; each answer equals the fresh validation."""
    profile = Profile()
    profile.model_policies = [policy(None, "a", context_window=32_000), policy("p", None, reserved_output_tokens=100)]
    handed: list[ModelSettings] = []
    for kind, provider, name, override in steps:
        if kind == "assign_model":
            window = override.get("context_window")
            if isinstance(window, int) and not isinstance(window, bool) and 9_000 <= window <= 300_000:
                profile.model = profile.model.model_copy(update={"context_window": window})
        elif kind == "edit_model":  # in place: validate_assignment checks it
            with contextlib.suppress(Exception):
                profile.model.context_window = override.get("context_window", 64_000)
        elif kind == "edit_policy":  # the policy's dict, in place
            profile.model_policies[0].model.update(override)
        elif kind == "replace_policies":
            profile.model_policies = [policy(provider, name, **override)]
        elif kind == "poke" and handed:  # a caller assigns to the object it was handed
            with contextlib.suppress(Exception):
                handed[-1].reserved_output_tokens = 7
        got = answer(profile, provider, name)
        expected = validated(profile, provider, name)
        if isinstance(expected, str):
            assert got == expected
        else:
            assert isinstance(got, ModelSettings)
            assert got.model_dump() == expected.model_dump()
            assert [type(v) for v in got.__dict__.values()] == [type(v) for v in expected.__dict__.values()]
            handed.append(got)


def test_a_repeated_ask_is_validated_once(monkeypatch):
    profile = Profile()
    calls = 0
    real = ModelSettings.__init__

    def counting(self, **data):
        nonlocal calls
        calls += 1
        real(self, **data)

    monkeypatch.setattr(ModelSettings, "__init__", counting)
    first = profile.model_for("openai", "kept-once")
    for _ in range(5):
        assert profile.model_for("openai", "kept-once") is first
    assert calls == 1


def test_an_edited_window_and_policy_are_not_served_stale(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        "[model]\nprovider = 'deepseek'\nname = 'deepseek-chat'\ncontext_window = 64000\n"
        "[[model_policies]]\nmatch = { name = 'deepseek-reasoner' }\nmodel = { context_window = 128000 }\n"
    )
    profile = load_profile(path)
    assert profile.model_for().context_window == 64000
    assert profile.model_for("deepseek", "deepseek-reasoner").context_window == 128000
    override_window(profile, 20_000)  # rewrites [model] and each policy's table in place
    assert profile.model_for().context_window == 20_000
    assert profile.model_for("deepseek", "deepseek-reasoner").context_window == 20_000
    profile.model.reserved_output_tokens = 1000
    assert profile.model_for().reserved_output_tokens == 1000


def test_a_refused_override_is_refused_every_time():
    profile = Profile()
    profile.model_policies = [policy(None, "bad", context_window=10)]
    for _ in range(2):
        with pytest.raises(ProfileError, match="context_window"):
            profile.model_for("openai", "bad")


def test_the_kept_answers_are_bounded():
    profile = Profile()
    for index in range(3 * MODEL_CACHE_SIZE):  # a client may name any number of models
        assert profile.model_for("openai", f"model-{index}").name == f"model-{index}"
        assert len(KEPT) <= MODEL_CACHE_SIZE

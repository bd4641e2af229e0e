"""Credentials never reach a message, a log line, a report or the session log (issue #13, items 5, 16).

The redaction module's invariants are property tests; the sinks (``ctxkernel validate`` on both
its pass and fail paths, the CLI's error lines, structlog output, stored events) are each shown
with a real secret that must not come out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ctxkernel import ModelError
from ctxkernel.cli import main
from ctxkernel.redact import redact, redact_headers, redact_url, structlog_processor, url_origin
from ctxkernel.testing import build_kernel
from ctxkernel.testing.store import postgres_dsn
from ctxkernel.validate import validate_profile

PASSWORD = "Pg-s3cret-Pw"


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CTXKERNEL_") and key != "CTXKERNEL_TEST_PG_DSN":
            monkeypatch.delenv(key)
    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))


@pytest.fixture(autouse=True)
def reset_logging():
    # configure_logging sets up structlog and a stderr handler; leave the library defaults behind
    from ctxkernel.logging import reset_logging

    yield
    reset_logging()


# -- the redaction module --------------------------------------------------------------------------
token = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=12, max_size=40)
password = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!$%^*()_-+~.", min_size=8, max_size=30
)
noise = st.text(max_size=60)
SECRET_FORMS = [
    "Bearer {s}",
    "Authorization: Bearer {s}",
    "authorization: {s}",
    '{{"x-api-key": "{s}"}}',
    "X-Api-Key: {s}",
    "sk-{s}",
    "sk-proj-{s}",
    "sk-ant-api03-{s}",
    "gsk_{s}",
    "api_key={s}",
    '"api_key": "{s}"',
    "https://api.example/v1?key=1&api_key={s}&x=2",
    "?token={s}",
    "https://generativelanguage.example/v1beta/models/m:generateContent?key={s}",
    "https://h/v1?alt=sse&key={s}",
]
PASSWORD_FORMS = [
    "postgresql://app:{s}@db.internal:5432/app",
    "https://user:{s}@api.example/v1",
    "host=db user=app password={s} dbname=app",
    "host=db password='{s}' dbname=app",
    '{{"password": "{s}"}}',
    "postgresql://app@db/app?password={s}",
]


@given(form=st.sampled_from(SECRET_FORMS), secret=token, before=noise, after=noise)
def test_a_key_never_survives_redaction(form: str, secret: str, before: str, after: str) -> None:
    # a "secret" that is part of the form's own words (``Authorizatio``) survives as those words
    assume(secret not in before and secret not in after and secret not in form.format(s=""))
    text = f"{before} {form.format(s=secret)} {after}"
    assert secret not in redact(text)


@given(form=st.sampled_from(PASSWORD_FORMS), secret=password, before=noise, after=noise)
def test_a_password_never_survives_redaction(form: str, secret: str, before: str, after: str) -> None:
    assume(secret not in before and secret not in after and secret not in form.format(s=""))
    text = f"{before}\n{form.format(s=secret)}\n{after}"
    assert secret not in redact(text)


@given(st.text(max_size=300))
def test_redaction_is_idempotent_and_never_raises(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


@pytest.mark.parametrize(
    "text",
    [
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
        "prompt is too long: 210000 tokens > 200000 maximum",
        "risk-assessment task-manager basket-items",
        "the bearer of bad news; Basic authentication required",
        "postgresql://app@db.internal:5432/app",
        "https://api.deepseek.com/v1/chat/completions",
        "password_hash stays; max_tokens=5",
    ],
)
def test_text_without_a_secret_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_what_is_kept_names_the_place() -> None:
    assert redact("postgresql://app:pw-123@db:5432/app") == "postgresql://app:***@db:5432/app"
    assert redact("host=db password='a b\\' c' user=x") == "host=db password='***' user=x"
    assert redact("key sk-ant-api03-abcdefghijklmnop here") == "key sk-ant-api03-*** here"
    assert redact_url("https://u:p@h.example/v1?api_key=1#frag") == "https://u:***@h.example/v1"
    assert url_origin("HTTPS://u:p@Other.Example:8443/x?y") == "https://other.example:8443"
    assert url_origin("/relative/path") == ""
    assert redact_headers({"Authorization": "Bearer abc", "X-Api-Key": "k", "Accept": "application/json"}) == {
        "Authorization": "***",
        "X-Api-Key": "***",
        "Accept": "application/json",
    }


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "hostile",
    [
        "1" * 200_000,
        "://a:" + "b" * 200_000,
        "password=" * 20_000,
        "a://b:" * 30_000,
        "password='" + "\\x" * 100_000,
        "sk-" * 60_000,
    ],
)
def test_redaction_of_hostile_text_returns(hostile: str) -> None:
    assert isinstance(redact(hostile), str)


# -- log lines -----------------------------------------------------------------------------------------
def test_log_lines_are_redacted_including_tracebacks(capsys) -> None:
    import structlog

    from ctxkernel.logging import configure_logging

    configure_logging("info")
    log = structlog.get_logger("test")
    log.warning("calling", url=f"https://u:{PASSWORD}@h/v1", headers={"Authorization": f"Bearer {PASSWORD}"})
    try:
        raise RuntimeError(f"connect failed for postgresql://app:{PASSWORD}@db/app")
    except RuntimeError:
        log.exception("store failed")
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert "connect failed for postgresql://app:***@db/app" in err and "Traceback" in err


def test_the_processor_walks_nested_values() -> None:
    out = structlog_processor(
        None, "info", {"event": "x", "data": {"list": [f"password={PASSWORD}", 3, None]}, "n": 1.5}
    )
    assert out == {"event": "x", "data": {"list": ["password=***", 3, None]}, "n": 1.5}


# -- ctxkernel validate (item 5) ---------------------------------------------------------------------
def _profile(tmp_path: Path, dsn: str | None) -> Path:
    path = tmp_path / "pg.toml"
    table = '[store]\nbackend = "postgres"\n' + (f"dsn = {json.dumps(dsn)}\n" if dsn is not None else "")
    path.write_text(table)
    return path


def _validate_everywhere(capsys, path: Path) -> tuple[str, list[str]]:
    """The report's messages and everything `ctxkernel validate` prints (table and JSON)."""
    report = validate_profile(path)
    messages = [c.message for c in report.checks]
    printed = ""
    for argv in (["validate", str(path)], ["validate", "--json", str(path)]):
        capsys.readouterr()
        main(argv)
        out, err = capsys.readouterr()
        printed += out + err
    return printed, messages


# an unreachable server, a port no one listens on, a malformed option: each a different libpq error
UNREACHABLE = [
    f"postgresql://app:{PASSWORD}@127.0.0.1:1/app?connect_timeout=2",
    f"host=127.0.0.1 port=1 user=app password={PASSWORD} connect_timeout=2",
    f"postgresql://app:{PASSWORD}@127.0.0.1:1/app?no_such_option=1",
    f"host=127.0.0.1 password='{PASSWORD}' port=notaport",
]


@pytest.mark.parametrize("dsn", UNREACHABLE)
def test_validate_fail_path_never_prints_the_password_from_the_profile(tmp_path, capsys, dsn: str) -> None:
    printed, messages = _validate_everywhere(capsys, _profile(tmp_path, dsn))
    store = [m for m in messages if "store" in m and "not reachable" in m]
    assert store, messages  # the failure is reported...
    assert PASSWORD not in printed and not any(PASSWORD in m for m in messages)  # ...without the password
    assert "***" in store[0]


@pytest.mark.parametrize("dsn", UNREACHABLE[:2])
def test_validate_fail_path_never_prints_the_password_from_the_environment(
    tmp_path, capsys, monkeypatch, dsn: str
) -> None:
    monkeypatch.setenv("CTXKERNEL_STORE__DSN", dsn)
    printed, messages = _validate_everywhere(capsys, _profile(tmp_path, None))
    assert any("not reachable" in m for m in messages), messages
    assert PASSWORD not in printed and not any(PASSWORD in m for m in messages)


def _with_password(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    return make_conninfo(**{**conninfo_to_dict(dsn), "password": PASSWORD})


@pytest.mark.postgres
@pytest.mark.parametrize("source", ["profile", "environment"])
def test_validate_pass_path_never_prints_the_password(tmp_path, capsys, monkeypatch, source: str) -> None:
    # the test server trusts 127.0.0.1, so the password is sent and ignored: the store check passes
    dsn = _with_password(postgres_dsn())
    if source == "environment":
        monkeypatch.setenv("CTXKERNEL_STORE__DSN", dsn)
    path = _profile(tmp_path, dsn if source == "profile" else None)
    printed, messages = _validate_everywhere(capsys, path)
    assert any("postgres store at" in m and "is writable" in m for m in messages), messages
    assert PASSWORD not in printed and not any(PASSWORD in m for m in messages)


def test_store_copy_never_prints_the_password(capsys, tmp_path) -> None:
    capsys.readouterr()
    code = main(
        ["store", "copy", f"postgresql://app:{PASSWORD}@127.0.0.1:1/app?connect_timeout=2", f"jsonl:{tmp_path}/x"]
    )
    out, err = capsys.readouterr()
    assert code != 0 and "127.0.0.1" in err
    assert PASSWORD not in out + err


# -- the session log (item 16) -----------------------------------------------------------------------
def test_a_model_error_echoing_a_key_is_stored_redacted_whatever_the_adapter(tmp_path) -> None:
    """A harness's own adapter (not ours) raises with a key in its text: the step/end event
    written to the permanent log carries the error, redacted."""
    from ctxkernel import AgentLoop

    key = "sk-proj-harnesskey0123456789"

    class LeakyModel:
        provider, model = "leaky", "m"

        def complete(self, *args, **kwargs):
            raise ModelError(
                f"401 from https://svc:{PASSWORD}@api.example/v1: invalid key {key} (Authorization: Bearer {key})"
            )

    session = build_kernel(tmp_path).open_session()
    with pytest.raises(ModelError):
        AgentLoop(session, LeakyModel()).run("hello")
    (error,) = [e.data["error"] for e in session.events if e.type == "step/end" and "error" in e.data]
    assert "401 from https://svc:***@api.example/v1" in error
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert key.encode() not in stored and PASSWORD.encode() not in stored


def test_a_dsn_misplaced_in_a_profile_key_is_echoed_redacted(tmp_path, capsys) -> None:
    path = tmp_path / "misplaced.toml"
    path.write_text(f'[store]\nbackend = "postgresql://app:{PASSWORD}@db/app"\n')
    printed, messages = _validate_everywhere(capsys, path)
    assert any("store.backend" in m and "postgresql://app:***@db/app" in m for m in messages), messages
    assert PASSWORD not in printed

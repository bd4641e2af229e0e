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

import pytest

from textkit import format_duration, parse_duration


def test_parse_compound():
    assert parse_duration("1h30m") == 5400


def test_parse_bare_seconds():
    assert parse_duration("42") == 42


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_parse_days_and_weeks():
    assert parse_duration("1w 2d") == 9 * 86400


def test_format_zero():
    assert format_duration(0) == "0s"


def test_format_largest_unit_first():
    assert format_duration(5400) == "1h30m"
    assert format_duration(90061) == "1d1h1m1s"

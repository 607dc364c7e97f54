import pytest

from textkit import bump, compare, parse_version


def test_parse():
    assert parse_version("v1.2.3-rc.1") == (1, 2, 3, "rc.1")


def test_parse_rejects_two_parts():
    with pytest.raises(ValueError):
        parse_version("1.2")


def test_compare_equal():
    assert compare("1.2.3", "1.2.3") == 0


def test_compare_numeric_not_lexical():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("2.0.0", "10.0.0") == -1


def test_prerelease_sorts_before_release():
    assert compare("1.0.0-rc.1", "1.0.0") == -1


def test_bump_patch():
    assert bump("1.2.3") == "1.2.4"


def test_bump_minor_resets_patch():
    assert bump("1.2.3", "minor") == "1.3.0"

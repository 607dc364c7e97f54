import pytest

from textkit import from_roman, to_roman


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"


def test_to_roman_range():
    with pytest.raises(ValueError):
        to_roman(0)


def test_from_roman_additive():
    assert from_roman("XVIII") == 18


def test_from_roman_subtractive():
    assert from_roman("XIV") == 14
    assert from_roman("MCMXCIV") == 1994


def test_from_roman_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 400))

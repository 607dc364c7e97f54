import pytest

from textkit import join_row, split_row


def test_split_plain():
    assert split_row("a,b,c\n") == ["a", "b", "c"]


def test_split_quoted_delimiter():
    assert split_row('a,"b,c",d') == ["a", "b,c", "d"]


def test_split_escaped_quote():
    assert split_row('"say ""hi""",x') == ['say "hi"', "x"]


def test_unterminated_quote():
    with pytest.raises(ValueError):
        split_row('"abc')


def test_round_trip():
    fields = ["plain", "with,comma", 'with "quote"', " padded "]
    assert split_row(join_row(fields)) == fields

from textkit import wrap


def test_wrap_words():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    assert wrap("abc def", 7) == ["abc def"]


def test_long_word_is_split():
    assert wrap("a abcdefghij b", 4) == ["a", "abcd", "efgh", "ij b"]

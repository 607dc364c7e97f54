from textkit import slugify


def test_simple_words():
    assert slugify("Hello World") == "hello-world"


def test_accents_are_stripped():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_custom_separator():
    assert slugify("a b c", sep="_") == "a_b_c"


def test_runs_of_punctuation_become_one_separator():
    assert slugify("Hello,  World!!  again") == "hello-world-again"


def test_no_leading_or_trailing_separator():
    assert slugify("  --Hello--  ") == "hello"


def test_max_len_cuts_at_a_word_boundary():
    assert slugify("the quick brown fox", max_len=12) == "the-quick"

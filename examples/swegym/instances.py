"""The injected bugs of the textkit example repository (examples/swegym/repo), one SWE-Gym-shaped
instance each: `bug` turns the library's correct source into the buggy base (the gold patch is
its reverse), `fail_to_pass` names the tests the instance's test_patch adds (they fail on the base
and pass once fixed). PASS_TO_PASS is measured by make_rows.py, not written here."""

INSTANCES = [
    {
        "number": 1,
        "problem_statement": (
            "slugify() leaves several separators in a row\n\n"
            "`slugify(\"Hello,  World!!  again\")` returns `hello---world----again`; every run of "
            "characters that are not letters or digits should become a single `-`, so the result should "
            "be `hello-world-again`."),
        "bug": [("textkit/slug.py", 're.compile(r"[^a-z0-9]+")', 're.compile(r"[^a-z0-9]")')],
        "fail_to_pass": ["tests/test_slug.py::test_runs_of_punctuation_become_one_separator"],
    },
    {
        "number": 2,
        "problem_statement": (
            "format_duration() puts the smallest unit first\n\n"
            "`format_duration(5400)` returns `5400s` and `format_duration(90061)` returns `90061s`. The "
            "docstring promises the largest unit first: `1h30m` and `1d1h1m1s`."),
        "bug": [("textkit/durations.py", "for unit, size in UNITS.items():",
                 "for unit, size in sorted(UNITS.items(), key=lambda kv: kv[1]):")],
        "fail_to_pass": ["tests/test_durations.py::test_format_largest_unit_first"],
    },
    {
        "number": 3,
        "problem_statement": (
            "from_roman() rejects numerals with subtractive pairs\n\n"
            "`from_roman(\"XIV\")` raises `ValueError: not a canonical roman numeral: 'XIV'` and "
            "`from_roman(\"MCMXCIV\")` fails the same way, although `to_roman(14)` returns `XIV`. "
            "A smaller digit before a larger one must be subtracted."),
        "bug": [("textkit/roman.py", "            total -= value\n", "            total += value\n")],
        "fail_to_pass": ["tests/test_roman.py::test_from_roman_subtractive",
                         "tests/test_roman.py::test_from_roman_round_trip"],
    },
    {
        "number": 4,
        "problem_statement": (
            "compare() orders versions as text\n\n"
            "`compare(\"1.10.0\", \"1.9.0\")` returns -1 (1.10.0 older than 1.9.0) and "
            "`compare(\"2.0.0\", \"10.0.0\")` returns 1. Major, minor and patch must compare as numbers."),
        "bug": [("textkit/versions.py", "    return (v[0], v[1], v[2], _pre_key(v[3]))",
                 "    return (str(v[0]), str(v[1]), str(v[2]), _pre_key(v[3]))")],
        "fail_to_pass": ["tests/test_versions.py::test_compare_numeric_not_lexical"],
    },
    {
        "number": 5,
        "problem_statement": (
            "split_row() mangles doubled quotes inside a quoted field\n\n"
            "`split_row('\"say \"\"hi\"\"\",x')` should give `['say \"hi\"', 'x']` (a doubled quote inside a "
            "quoted field is one quote character), but the field is cut at the first quote. As a result "
            "`split_row(join_row(fields))` does not give `fields` back when a field contains a quote."),
        "bug": [("textkit/csvrow.py",
                 "            if c == '\"':\n"
                 "                if i + 1 < len(line) and line[i + 1] == '\"':\n"
                 "                    field.append('\"')\n"
                 "                    i += 1\n"
                 "                else:\n"
                 "                    quoted = False\n",
                 "            if c == '\"':\n"
                 "                quoted = False\n")],
        "fail_to_pass": ["tests/test_csvrow.py::test_split_escaped_quote", "tests/test_csvrow.py::test_round_trip"],
    },
    {
        "number": 6,
        "problem_statement": (
            "wrap() breaks lines that fit exactly\n\n"
            "`wrap(\"abc def\", 7)` returns `['abc', 'def']` although `abc def` is 7 characters long; "
            "a line may be exactly `width` characters."),
        "bug": [("textkit/wrap.py", "len(line) + 1 + len(word) <= width", "len(line) + 1 + len(word) < width")],
        "fail_to_pass": ["tests/test_wrap.py::test_wrap_exact_width", "tests/test_wrap.py::test_long_word_is_split"],
    },
]

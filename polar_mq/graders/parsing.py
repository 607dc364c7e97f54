"""Test-result parsers and scoring for the test-runner grader.

Statuses are pytest's words: PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS. PASSED, XFAIL and XPASS
count as passing; SKIPPED is left out of the denominator; FAILED and ERROR fail.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
PASSING = {"PASSED", "XFAIL", "XPASS"}
FAILING = {"FAILED", "ERROR"}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STATUS_WORD = "|".join(STATUSES)
# `PASSED name` (pytest -rA summary, and the plain PASSED/FAILED line format); FAILED lines may
# carry ` - message`.
_LEADING = re.compile(rf"^\s*({_STATUS_WORD})\s+(\S+)")
# `path::test PASSED [ 50%]` (pytest -v)
_TRAILING = re.compile(rf"^(\S+::\S+)\s+({_STATUS_WORD})\b")
# `name ... ok|FAIL|ERROR|skipped` (unittest -v)
_UNITTEST = re.compile(r"^(\w+) \(([\w.]+)\) \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$")
_UNITTEST_MAP = {"ok": "PASSED", "FAIL": "FAILED", "ERROR": "ERROR", "expected failure": "XFAIL",
                 "unexpected success": "XPASS"}
_SUMMARY = re.compile(r"=+ (.*?(?:passed|failed|error|errors|skipped|xfailed|xpassed|no tests ran).*?) in [\d.]+\s*s")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")


def parse_lines(text: str) -> dict[str, str]:
    """Per-test statuses from pytest output (-v lines and/or the -rA summary), plain
    `PASSED|FAILED name` lines and unittest -v lines. A later line for the same test wins,
    except that a failure is never overwritten by a pass (pytest prints `PASSED` then
    `ERROR` for a teardown error)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        name = status = None
        m = _TRAILING.match(line)
        if m:
            name, status = m.group(1), m.group(2)
        else:
            m = _LEADING.match(line)
            if m:
                status, name = m.group(1), m.group(2)
                if status == "SKIPPED" and re.fullmatch(r"\[\d+\]", name):
                    continue  # `SKIPPED [1] file:line: reason` summary
            else:
                m = _UNITTEST.match(line)
                if m:
                    where = m.group(2)
                    name = where if where.endswith("." + m.group(1)) else f"{where}.{m.group(1)}"
                    word = m.group(3)
                    status = "SKIPPED" if word.startswith("skipped") else _UNITTEST_MAP[word]
        if name is None or status is None:
            continue
        name = name.rstrip(":")
        if out.get(name) in FAILING and status in PASSING:
            continue
        out[name] = status
    return out


def parse_summary(text: str) -> dict[str, int] | None:
    """Counts from pytest's final `== 3 passed, 1 failed in 0.12s ==` line (the last one)."""
    found = None
    for line in _ANSI.sub("", text).splitlines():
        m = _SUMMARY.search(line)
        if m:
            found = m.group(1)
    if found is None:
        return None
    counts: dict[str, int] = {}
    for n, word in _COUNT.findall(found):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[word] = counts.get(word, 0) + int(n)
    return counts


def parse_junit(xml_text: str) -> dict[str, str]:
    """Per-test statuses from JUnit XML (pytest --junitxml, and most other runners). The test
    name is `classname.name` (just `name` without a classname)."""
    root = ET.fromstring(xml_text)
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name") or ""
        cls = case.get("classname") or ""
        key = f"{cls}.{name}" if cls else name
        tags = {child.tag for child in case}
        if "failure" in tags:
            status = "FAILED"
        elif "error" in tags:
            status = "ERROR"
        elif "skipped" in tags:
            skipped = case.find("skipped")
            kind = (skipped.get("type") or "") if skipped is not None else ""
            status = "XFAIL" if "xfail" in kind else "SKIPPED"
        else:
            status = "PASSED"
        if out.get(key) in FAILING and status in PASSING:
            continue
        out[key] = status
    return out


def _parts(name: str) -> list[str]:
    head, bracket, params = name.partition("[")
    head = head.replace(".py::", "::").replace(".py", "")
    parts = [p for p in re.split(r"::|/|\.", head) if p]
    if bracket:
        parts[-1:] = [(parts[-1] if parts else "") + "[" + params]
    return parts


def find_test(name: str, statuses: dict[str, str]) -> str | None:
    """The key in `statuses` for `name`: exact, else the unique key whose path components end with
    (or are the tail of) the name's (`tests/test_a.py::test_x` ≈ `tests.test_a.test_x` ≈ `test_x`)."""
    if name in statuses:
        return name
    want = _parts(name)
    if not want:
        return None
    matches = []
    for key in statuses:
        have = _parts(key)
        n = min(len(want), len(have))
        if n and have[-n:] == want[-n:]:
            matches.append(key)
    return matches[0] if len(matches) == 1 else None


def category(status: str | None) -> str:
    if status is None:
        return "MISSING"
    status = status.upper()
    if status in PASSING:
        return "PASS"
    if status in FAILING:
        return "FAIL"
    return status


def score(statuses: dict[str, str], *, expected: dict[str, str] | list[str] | None = None,
          mode: str = "binary", exit_code: int | None = None,
          summary: dict[str, int] | None = None) -> tuple[float, dict[str, Any]]:
    """Reward from parsed statuses.

    Without `expected`: every test that ran (skips left out) must pass; `fraction` gives the share
    that passed. With `expected` (name → PASSED/FAILED, or a list of names that must pass): each
    listed test must end in the expected category (a missing test never matches); `fraction`
    gives the share that did. A non-zero exit code with no failing test parsed means the output
    does not describe the run (crash, or an agent printing PASSED lines): reward 0."""
    details: dict[str, Any] = {"mode": mode, "exit_code": exit_code}
    if isinstance(expected, list):
        expected = {name: "PASSED" for name in expected}
    if not statuses and summary:
        # No per-test lines (pytest without -v/-rA): fall back to the counts.
        passed = summary.get("passed", 0) + summary.get("xfailed", 0) + summary.get("xpassed", 0)
        failed = summary.get("failed", 0) + summary.get("errors", 0)
        details.update({"passed": passed, "failed": failed, "total": passed + failed, "source": "summary"})
        if expected:
            details["error"] = "expected tests given but the output has no per-test lines"
            return 0.0, details
        total = passed + failed
        if total == 0:
            return 0.0, {**details, "no_tests": True}
        if exit_code not in (None, 0) and failed == 0:
            return 0.0, {**details, "untrusted_output": True}
        return (passed / total if mode == "fraction" else float(failed == 0)), details
    if expected:
        results = {}
        for name, want in expected.items():
            key = find_test(name, statuses)
            got = statuses.get(key) if key else None
            results[name] = {"expected": want.upper(), "actual": got or "MISSING",
                             "ok": got is not None and category(got) == category(want)}
        matched = sum(1 for r in results.values() if r["ok"])
        details.update({"expected": results, "matched": matched, "total": len(results)})
        any_fail = any(category(s) == "FAIL" for s in statuses.values())
        if exit_code not in (None, 0) and not any_fail:
            return 0.0, {**details, "untrusted_output": True}
        return (matched / len(results) if mode == "fraction" else float(matched == len(results))), details
    ran = {k: v for k, v in statuses.items() if category(v) in ("PASS", "FAIL")}
    passed = sum(1 for v in ran.values() if category(v) == "PASS")
    details.update({"passed": passed, "failed": len(ran) - passed, "total": len(ran),
                    "skipped": len(statuses) - len(ran)})
    if not ran:
        return 0.0, {**details, "no_tests": True}
    if exit_code not in (None, 0) and passed == len(ran):
        return 0.0, {**details, "untrusted_output": True}
    return (passed / len(ran) if mode == "fraction" else float(passed == len(ran))), details

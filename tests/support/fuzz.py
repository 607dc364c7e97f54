"""Shared bounds for the fuzz suites, and a tally of the cases they ran.

FUZZ_EXAMPLES (env POLAR_FUZZ_EXAMPLES, default 10) bounds hypothesis per test so CI stays within
its time; raise it locally for a deeper run. Every case is counted; the totals are written to
$POLAR_FUZZ_REPORT (when set) at the end of the run, for the closing notes.
"""

from __future__ import annotations

import atexit
import json
import os
from collections import Counter

FUZZ_EXAMPLES = int(os.environ.get("POLAR_FUZZ_EXAMPLES") or 10)
CASES: Counter = Counter()


def count_case(suite: str, status: int | None = None) -> None:
    CASES[suite] += 1
    if status is not None:
        CASES[f"{suite} {status // 100}xx"] += 1


def _report() -> None:
    path = os.environ.get("POLAR_FUZZ_REPORT")
    if path and CASES:
        with open(path, "w") as fh:
            json.dump(dict(CASES), fh)


atexit.register(_report)

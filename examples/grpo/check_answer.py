"""The Codex task's test: does ``answer.txt`` in the cwd name the instruction's direction? (run by test_runner)

Prints ``PASSED name`` / ``FAILED name`` lines (the plain-lines format the test_runner grader
parses). ``TARGET`` (env): the row's direction. The file is what the model's ``exec_command``
(``echo <direction> > answer.txt``, codex_task.py) wrote through the real Codex CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ANSWER_FILE = "answer.txt"  # codex_task.ANSWER_FILE (this script runs alone, in the session's runtime)


def main() -> int:
    want = os.environ["TARGET"].strip()
    path = Path(ANSWER_FILE)
    words = path.read_text(errors="replace").split() if path.is_file() else []
    checks = {
        "test_answer_written": bool(words),
        "test_answer_is_target": words == [want],
    }
    for name, ok in checks.items():
        print(f"{'PASSED' if ok else 'FAILED'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The GRPO example's test: did the cursor end where the instruction said? (run by test_runner)

Prints one ``PASSED name`` / ``FAILED name`` line per check (the plain-lines format the
test_runner grader parses: the status word first).
``TARGET`` (env) is the direction of the task (comma-joined directions of a multi-turn task: every
move, in order); the world state is ``cursor.json`` in the cwd.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task import CURSOR_FILE, target_path, targets  # noqa: E402


def main() -> int:
    want = targets(os.environ["TARGET"])
    path = Path(CURSOR_FILE)
    state = json.loads(path.read_text()) if path.exists() else None
    checks = {
        "test_cursor_moved": bool(state and state.get("moves")),
        "test_cursor_at_target": bool(state) and (state["x"], state["y"]) == target_path(",".join(want)),
        "test_moves_in_order": bool(state) and state.get("moves") == want,
    }
    for name, ok in checks.items():
        print(f"{'PASSED' if ok else 'FAILED'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

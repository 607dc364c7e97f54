"""Session state machine: the one place that says which state may follow which.

Every stage moves a session with `PipelineStore.transition`, which checks the move against
`ALLOWED` atomically in Redis, so a redelivered or duplicate stage task cannot move a session
backwards or finish it twice.
"""

from __future__ import annotations

from polar_mq.model import TERMINAL_STATES, SessionState

# The states by the names the stages use (members of model.SessionState, which lists them).
REGISTERED = SessionState.REGISTERED
INITIALIZING = SessionState.INITIALIZING
READY = SessionState.READY
RUNNING = SessionState.RUNNING
POST_RUN = SessionState.POST_RUN
BUILDING = SessionState.BUILDING
EVALUATING = SessionState.EVALUATING
COMPLETED = SessionState.COMPLETED
ERROR = SessionState.ERROR
TIMEOUT = SessionState.TIMEOUT

TERMINAL = frozenset(TERMINAL_STATES)
ORDER = (REGISTERED, INITIALIZING, READY, RUNNING, POST_RUN, BUILDING, EVALUATING)

ALLOWED: dict[str, frozenset[str]] = {
    REGISTERED: frozenset({INITIALIZING, ERROR}),
    # INITIALIZING → INITIALIZING: a new init worker takes over after the first one died.
    INITIALIZING: frozenset({INITIALIZING, READY, POST_RUN, ERROR, TIMEOUT}),
    # READY/RUNNING → INITIALIZING: the runtime's host is gone; the session is prepared again on
    # another host (a new attempt), never run against a runtime that no longer exists.
    READY: frozenset({RUNNING, INITIALIZING, POST_RUN, ERROR, TIMEOUT}),
    RUNNING: frozenset({RUNNING, INITIALIZING, POST_RUN, ERROR, TIMEOUT}),
    # Postrun never goes back to POST_RUN: a late write of a stale run attempt cannot restart it.
    POST_RUN: frozenset({POST_RUN, BUILDING, ERROR}),
    BUILDING: frozenset({BUILDING, EVALUATING, ERROR}),
    EVALUATING: frozenset({EVALUATING, COMPLETED, ERROR, TIMEOUT}),
    COMPLETED: frozenset(),
    ERROR: frozenset(),
    TIMEOUT: frozenset(),
}


def can_move(current: str, new: str) -> bool:
    return new in ALLOWED.get(current, frozenset())


def is_terminal(state: str) -> bool:
    return state in TERMINAL

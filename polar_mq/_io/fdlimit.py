"""The open-files limit of a process that holds many connections or slots at once.

A common soft RLIMIT_NOFILE is 1024 (login shells, systemd services) while the hard limit is far
higher; a process that holds more descriptors than its soft limit fails at accept/socket/pipe with
EMFILE. The run pool (cli/slots.py), the gateway and the API (serving.py) and the stand-in model
server raise their soft limit toward the hard one at start to fit what they are configured to hold.
Children inherit the raised limit. tests/gateway/test_fd_limit.py and
tests/pipeline/test_run_slots.py::test_fd_limit_is_raised_for_the_slots guard it.
"""

from __future__ import annotations


def raise_nofile(want: int) -> tuple[int, int]:
    """Raise the soft open-files limit toward the hard limit so `want` descriptors fit; never
    lowers it. Returns (soft before, soft after); `after < want` means the hard limit is short."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, soft
    new = want if hard == resource.RLIM_INFINITY else min(hard, want)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return soft, new
    return soft, soft

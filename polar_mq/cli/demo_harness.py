"""`polar-mq demo --harness NAME`: one real agent CLI, end to end, on the demo's own deployment.

The pinned CLI is installed on demand (polar_mq/harnesses/install.py; a spinner shows what npm
has written so far), then one session runs it through the pipeline exactly as a user's task
would: no runtime named (the default sandbox), the built-in stand-in as the model (its default
window fits every shipped CLI: polar_mq/dev/model_server/__init__.py). Shown afterwards: the
session's model calls, its prefix-merged traces and the viewer link of the session.
Guarded by tests/cli/test_demo_keep.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from polar_mq.harnesses import install

FILE = "polar.txt"
# The stand-in answers an instruction with `polar:path=P` by calling the CLI's file-writing tool
# (or its shell) for P, then ends the turn once the tool result is back (model_server/script.py).
INSTRUCTION = f"Create the file {FILE} polar:path={FILE}"


def _written_mb(cache: Path, dirname: str) -> float:
    total = 0
    for tmp in cache.glob(f".{dirname}.*"):
        for p in tmp.rglob("*"):
            try:
                total += p.stat().st_size if p.is_file() else 0
            except OSError:
                pass
    return total / 1e6


def ensure_installed(console: Any, name: str, timeout: float = 1800.0) -> Path:
    """The CLI's executable, installed from npm first when missing (with a live progress line)."""
    if install.is_installed(name):
        return install.bin_path(name)
    pkg = install.PACKAGES[name]
    cache = install.default_cache_dir()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["path"] = install.install([name], cache, timeout=timeout)[name]
        except Exception as exc:  # reported below, in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=work, name=f"install-{name}", daemon=True)
    start = time.monotonic()
    thread.start()
    with console.status(f"installing {pkg.spec} from npm (once, into {cache})") as status:
        while thread.is_alive():
            thread.join(0.5)
            status.update(f"installing {pkg.spec} from npm (once, into {cache}): "
                          f"{_written_mb(cache, pkg.dirname):.0f} MB, {time.monotonic() - start:.0f} s")
    if "error" in result:
        raise RuntimeError(f"could not install {name}: {result['error']}") from result["error"]
    console.print(f"installed {pkg.spec} in {time.monotonic() - start:.0f} s: {result['path']}")
    return Path(result["path"])


def harness_task(name: str) -> dict[str, Any]:
    """The task a user would submit: the harness and the model, nothing else (default sandbox)."""
    return {"instruction": INSTRUCTION, "num_samples": 1, "timeout_seconds": 240,
            "agent": {"harness": name, "model": "stand-in"},
            "builder": {"strategy": "prefix_merging"}, "metadata": {"demo": f"harness {name}"}}


def run_harness(console: Any, name: str, stack: Any, keep: bool = False) -> int:
    """Run the CLI for one session; print its calls, traces and viewer link; failures (0 or 1)."""
    import requests
    from rich.table import Table

    from polar_mq.client import Client
    from polar_mq.cli.common import viewer_link

    client = Client(stack.api_url, token=stack.token)
    sub = client.submit(harness_task(name))
    with console.status(f"{name}: one session through init → run → postrun (the real CLI)…"):
        status = client.wait(sub["task_id"], timeout=420, poll=0.5)
    [sess] = status["sessions"]
    sid = sess["session_id"]
    page = requests.get(f"{stack.api_url}/ui/api/sessions/{sid}", headers=stack.api_headers, timeout=30).json()
    calls = page.get("calls") or []
    table = Table(title=f"{name}: the session's model calls (through the gateway)")
    for col in ("call", "provider", "stream", "prompt tokens", "sampled tokens", "finish reason", "status"):
        table.add_column(col, justify="right" if "tokens" in col or col == "call" else "left")
    for c in calls:
        table.add_row(str(c["index"] + 1), str(c.get("provider")), "yes" if c.get("stream") else "no",
                      str(c.get("tokens_in")), str(c.get("tokens_out")), str(c.get("finish_reason") or "-"),
                      str(c.get("status") if not c.get("error") else c.get("error")))
    console.print(table)
    traces = Table(title=f"{name}: prefix-merged traces ({(page.get('trajectory') or {}).get('builder', '-')})")
    for col in ("trace", "role", "calls merged", "prompt ids", "response ids", "trained ids", "finish reason"):
        traces.add_column(col, justify="left" if col in ("role", "finish reason") else "right")
    for tr in page.get("traces") or []:
        traces.add_row(str(tr["index"]), str((tr.get("metadata") or {}).get("role", "-")), str(len(tr["call_ids"])),
                       str(len(tr["prompt_ids"])), str(len(tr["response_ids"])), str(sum(tr["loss_mask"])),
                       str(tr.get("finish_reason") or "-"))
    console.print(traces)
    link = viewer_link(stack.api_url, stack.token).replace("/ui/", f"/ui/sessions/{sid}", 1)
    print(f"{name}: session {sid} {sess['state']}" + (f" ({sess['error']})" if sess.get("error") else "")
          + f"; {len(calls)} calls, {len(page.get('traces') or [])} traces\n"
          f"{name}: viewer {link}" + ("" if keep else "  (served while the demo runs: add --keep to explore it)"),
          flush=True)
    return 0 if sess["state"] == "COMPLETED" else 1

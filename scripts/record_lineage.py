#!/usr/bin/env python3
"""Record the real CLIs using sub-agents and compacting, as lineage replay fixtures.

Each (harness, scenario) runs the real CLI headless through a gateway against the stand-in model
*scripted* (``--scripted``, polar_mq/dev/model_server/script.py) to:
- ``subagent``: call the harness's sub-agent tool with a prompt; the child answers; the parent ends;
- ``compaction``: read a large file with the shell tool turn after turn on a small window until the
  CLI compacts; the summary request is answered by a ``when`` rule with a recognisable summary.

Every HTTP request the CLI made is kept exactly as sent (scripts/record_replays.py's recording
proxy and format), together with the stand-in's script and window, so a replay into a fresh
gateway in front of the same stand-in gets the same answers token for token
(tests/merge/test_lineage_replays.py, bench/bench_lineage.py). Files:
``tests/replays/lineage/<harness>/<scenario>.json``.

    .venv/bin/python scripts/record_lineage.py                     # every harness and scenario
    .venv/bin/python scripts/record_lineage.py opencode:compaction qwen_code
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from record_replays import (MODEL, RecordingProxy, scrub, start_stack,  # noqa: E402
                            stop_stack, to_fixture_entry)

from polar_mq import harnesses  # noqa: E402
from polar_mq.auth import auth_headers  # noqa: E402
from polar_mq.harnesses import install  # noqa: E402
from polar_mq.harnesses.limits import ModelLimits, resolve  # noqa: E402

OUT = ROOT / "tests" / "replays" / "lineage"
SUB_PROMPT = "Report the number of lines in polar.txt and nothing else, please."
SUMMARY_MARK = "POLAR-SUMMARY"
SUMMARY = (f"{SUMMARY_MARK}: the user asked to read big.txt part by part with the shell tool and "
           "report when done; parts one and two were read and were plain filler text.")
DONE = "All parts are read; nothing else is left to do."
# The harnesses' compaction prompts (polar_mq/merge/agents.py COMPACTION_REQUESTS): a summary
# request is answered with SUMMARY, a request whose latest user text carries it with DONE.
COMPACTION_RULES = [
    {"when": w, "text": SUMMARY} for w in (
        "Your task is to create a detailed summary of the conversation so far",
        "Create a new anchored summary", "Construct a new summary that combines both",
        "First, reason in your scratchpad", "Critically evaluate the <state_snapshot>", "CONTEXT CHECKPOINT COMPACTION",
        "conversation to summarize", "NEW conversation messages to incorporate",
        "This is the PREFIX of a turn that was too large to keep")
] + [{"when": w, "text": DONE} for w in (
    SUMMARY_MARK,
    "Continue if you have next steps",  # opencode's user turn after its summary
    "Continue with the prior task using the context above",  # Qwen Code's
)]
# distinct commands: Gemini CLI stops a loop of identical tool calls
READS = ("cat big.txt", "cat -n big.txt", "head -n 200 big.txt", "tail -n 200 big.txt",
         "sed -n 1,200p big.txt", "awk 1 big.txt")
BIG_LINES = 200  # big.txt: ~5k tokens per read (the stand-in's tokenizer)


@dataclass
class Spec:
    """How one harness is driven: its sub-agent tool call, its shell tool, its window."""

    subagent: dict[str, Any] | None  # {"tool", "arguments"} or None (pi has no sub-agent tool)
    shell: tuple[str, str, dict[str, Any]]  # (tool, command key, other arguments)
    window: int  # the context window the CLI is told for the compaction scenario
    output: int
    # compaction scenario: (prompt, extra argv) per invocation of the CLI; None: the instruction
    runs: list[tuple[str | None, list[str]]] = field(default_factory=lambda: [(None, [])])
    reads: int = 6  # shell reads scripted before the final answer
    instruction: str = "Read big.txt with the shell tool, part by part, then report."
    tweak: Callable[[Any, Path], None] | None = None


def _pi_compaction(launch: Any, home: Path) -> None:
    """pi compacts at contextWindow - reserveTokens (settings.compaction) and keeps
    keepRecentTokens; small values so the stand-in's short turns reach them."""
    path = home / ".pi" / "agent" / "settings.json"
    settings = json.loads(path.read_text())
    settings["compaction"] = {"enabled": True, "reserveTokens": 2048, "keepRecentTokens": 1000}
    path.write_text(json.dumps(settings, indent=2))
    launch.argv.remove("--no-session")  # the second run continues the session (`-c`)


SPECS: dict[str, Spec] = {
    "claude_code": Spec({"tool": "Agent", "arguments": {"description": "Count lines", "prompt": SUB_PROMPT,
                                                        "subagent_type": "general-purpose"}},
                        ("Bash", "command", {"description": "read big.txt"}), 200000, 8000),
    "opencode": Spec({"tool": "task", "arguments": {"description": "Count lines", "prompt": SUB_PROMPT,
                                                    "subagent_type": "general"}},
                     ("bash", "command", {"description": "read big.txt"}), 24000, 2000),
    "qwen_code": Spec({"tool": "agent", "arguments": {"description": "Count lines", "prompt": SUB_PROMPT,
                                                      "subagent_type": "general-purpose"}},
                      # compresses at 0.7 x window; its first prompt is ~26k stand-in tokens
                      ("run_shell_command", "command", {}), 40000, 2000),
    # Gemini CLI splits history for compression only before a user message that is not a tool
    # result: within one headless prompt there is none, so a resumed second prompt reads again.
    "gemini_cli": Spec({"tool": "invoke_agent", "arguments": {"agent_name": "generalist", "prompt": SUB_PROMPT}},
                       ("run_shell_command", "command", {}), 60000, 2000,
                       runs=[(None, []), ("Read big.txt once more.", ["--resume", "latest"])], reads=2),
    "codex": Spec({"tool": "multi_agent_v1.spawn_agent", "arguments": {"message": SUB_PROMPT}},
                  ("exec_command", "cmd", {}), 24000, 2000),
    # pi compacts when an agent run ends past the threshold; the next prompt continues from it
    "pi": Spec(None, ("bash", "command", {}), 24000, 2000, tweak=_pi_compaction,
               runs=[(None, []), ("Thanks. polar:say=Noted, nothing left.", ["-c"])]),
}
SCENARIOS = ("subagent", "compaction")


def script_for(harness: str, scenario: str) -> list[dict[str, Any]]:
    spec = SPECS[harness]
    if scenario == "subagent":
        assert spec.subagent is not None
        return [dict(spec.subagent), {"text": "1 line."}]
    if harness == "claude_code":  # plain answers around `/compact` (claude_compaction_runs)
        return list(COMPACTION_RULES)
    tool, key, extra = spec.shell
    reads = [{"tool": tool, "arguments": {key: READS[i % len(READS)], **extra}} for i in range(spec.reads)]
    return COMPACTION_RULES + reads + [{"text": DONE}]


def big_text() -> str:
    return "".join(f"line {i:04d}: polar bears read filler text so that the window fills up\n"
                   for i in range(BIG_LINES))


def record(harness: str, scenario: str, timeout: float, out_dir: Path) -> dict[str, Any]:
    spec = SPECS[harness]
    steps = script_for(harness, scenario)
    max_model_len = 131072
    logdir = Path(tempfile.mkdtemp(prefix=f"polar-lineage-{harness}-"))
    script = logdir / "script.json"
    script.write_text(json.dumps(steps))
    gateway, procs = start_stack(logdir, max_model_len=max_model_len,
                                  model_server_args=("--scripted", str(script)))
    proxy = RecordingProxy(gateway)
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-lineage-run-{harness}-"))
    outs = []
    try:
        sess = requests.post(f"{gateway}/sessions", headers=auth_headers(),
                             json={"metadata": {"recording": harness, "scenario": scenario}}, timeout=10).json()
        key = sess["key"]
        base_urls = {k: v.replace(gateway, proxy.url) for k, v in sess["base_urls"].items()}
        home, work = tmp / "home", tmp / "work"
        work.mkdir(parents=True)
        (work / "polar.txt").write_text("polar\n")
        (work / "big.txt").write_text(big_text())
        # compaction: a small window; otherwise the served one, as a task's session gets it
        limits = ModelLimits(spec.window, spec.output, "task") if scenario == "compaction" else \
            resolve(max_model_len)
        instruction = spec.instruction if scenario == "compaction" else "Delegate: count the lines of polar.txt"
        runs = claude_compaction_runs() if (harness, scenario) == ("claude_code", "compaction") else \
            [(prompt or instruction, extra) for prompt, extra in spec.runs] if scenario == "compaction" else \
            [(instruction, [])]
        bin_path = install.install([harness])[harness]
        for prompt, extra in runs:
            launch = harnesses.build(harness, home, base_urls, key, MODEL, prompt, bin=bin_path, limits=limits)
            if scenario == "compaction" and spec.tweak:
                spec.tweak(launch, home)
            t0 = time.time()
            try:
                proc = subprocess.run(launch.argv + extra, env={**os.environ, **launch.env}, cwd=work,
                                      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
                rc, out, err = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as exc:
                rc, out, err = None, str(exc.stdout or "")[-400:], str(exc.stderr or "")[-1500:]
            outs.append({"argv_extra": extra, "exit_code": rc, "seconds": round(time.time() - t0, 1),
                         "stdout_tail": scrub(out[-300:], key), "stderr_tail": scrub(err[-600:], key)})
        time.sleep(0.5)
        entries = proxy.take()
        calls = requests.get(f"{gateway}/sessions/{sess['session_id']}/calls", headers=auth_headers(),
                             timeout=30).json()["calls"]
    finally:
        proxy.close()
        stop_stack(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    fixture = {
        "harness": harness, "package": install.PACKAGES[harness].spec,
        "version": install.PACKAGES[harness].version, "scenario": scenario, "model": MODEL,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "stand_in": {"max_model_len": max_model_len, "script": steps},
        "limits": {"context_window": spec.window, "max_output": spec.output} if scenario == "compaction" else None,
        "runs": outs,
        "capture_records": len(calls),
        "requests": [to_fixture_entry(e, key) for e in entries],
    }
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    assert key not in text
    dest = out_dir / harness / f"{scenario}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text + "\n")
    last_users = []
    for c in calls:
        msgs = c.get("messages") or []
        users = [m for m in msgs if m.get("role") == "user"]
        last = str(users[-1].get("content"))[:70] if users else ""
        last_users.append((len(c.get("prompt_token_ids") or []), len(msgs), last))
    return {"harness": harness, "scenario": scenario, "file": str(dest), "runs": outs, "calls": len(calls),
            "per_call": last_users}


def claude_compaction_runs() -> list[tuple[str, list[str]]]:
    """Claude Code compacts on `/compact` (its auto-compact window is its own table's); turns of
    one conversation around it, as tests/harnesses/test_lineage_real_cli.py does."""
    turns = [("Say hello polar:notool", [])] + [(f"Say hello {n} polar:notool", ["--continue"]) for n in range(2)]
    return turns + [("/compact", ["--continue"]), ("Say goodbye polar:notool", ["--continue"])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("targets", nargs="*", help="HARNESS or HARNESS:SCENARIO (default: all)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per CLI run")
    args = ap.parse_args(argv)
    targets = []
    for t in args.targets or list(SPECS):
        h, _, sc = t.partition(":")
        for s in ([sc] if sc else SCENARIOS):
            if s == "subagent" and SPECS[h].subagent is None:
                continue
            targets.append((h, s))
    for h, s in targets:
        try:
            summary = record(h, s, args.timeout, Path(args.out))
        except Exception as exc:  # keep going; report at the end
            summary = {"harness": h, "scenario": s, "error": repr(exc)}
        print(json.dumps(summary, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

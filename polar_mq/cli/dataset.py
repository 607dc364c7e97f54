"""`polar-mq submit --dataset FILE`: one TaskRequest per row (polar_mq.rl.datasets), one task id a
line on stdout in row order; per-row errors (with the row number) and a progress bar on stderr.
Exit 0 when every row was submitted (or already was), 1 when some rows failed, 2 when the
dataset or template cannot be read."""

from __future__ import annotations

import argparse
import sys


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", help="JSONL, JSON, Parquet or a local Hugging Face datasets directory: "
                                     "one task per row; or a Harbor task directory (or a directory of "
                                     "them): its image built with the local Docker engine, grader harbor")
    p.add_argument("--template", help="with --dataset: TaskRequest YAML/JSON the rows are merged into")
    p.add_argument("--samples", type=int, help="with --dataset: num_samples of every task (the group size)")
    p.add_argument("--limit", type=int, help="with --dataset: only the first N rows (after --shuffle)")
    p.add_argument("--shuffle", action="store_true", help="with --dataset: shuffle the rows (see --seed)")
    p.add_argument("--seed", type=int, help="with --shuffle: the shuffle's seed")
    p.add_argument("--policy-version", type=int, help="with --dataset: metadata.policy_version of every task")
    p.add_argument("--image-template", help="with --dataset: runtime.image per row, e.g. "
                                            "'sweb.eval.x86_64.{instance_id}:latest' ({instance_id} in swebench's "
                                            "image form: lower case, __ → _1776_; {instance_id_lower} lower case, as `polar-mq image "
                                            "build` names images; {instance_id_raw} as written)")
    p.add_argument("--split", help="with a DatasetDict directory: the split (default train)")
    p.add_argument("--early-stop", type=int, metavar="N", dest="early_stop",
                   help="early_stop_min_usable_sessions of every task: once N sessions are graded "
                        "without ERROR the others are cancelled")
    p.add_argument("--priority", type=int, metavar="P", dest="priority",
                   help="dispatch_priority of every task (higher first; default 0)")


def submit_dataset(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from polar_mq.client import Client
    from polar_mq.rl.datasets import DatasetError
    from polar_mq.rl.datasets import TaskOptions
    from polar_mq.rl.datasets import build_tasks
    from polar_mq.rl.datasets import load_rows
    from polar_mq.rl.datasets import load_template
    from polar_mq.rl.datasets.submit import submit_built

    if args.samples is not None and args.samples < 1:
        print("error: --samples must be at least 1", file=sys.stderr)
        return 2
    from polar_mq.rl.datasets import harbor

    try:
        if harbor.is_harbor(args.dataset):  # a Harbor task dir, or a dir of them: images built here
            rows = harbor.load_rows(args.dataset, args.policy_version)
        else:
            rows = load_rows(args.dataset, split=args.split)
        template = load_template(args.template)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    opts = TaskOptions(samples=args.samples, policy_version=args.policy_version,
                       image_template=args.image_template, limit=args.limit, shuffle=args.shuffle, seed=args.seed,
                       early_stop=args.early_stop, priority=args.priority)
    built = build_tasks(rows, template, opts)
    console = Console(stderr=True)
    client = Client(url=args.api, token=args.token)
    with Progress(TextColumn("submitting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task("rows", total=len(built))
        outcomes = submit_built(client, built, on_done=lambda _o: progress.advance(bar))
    counts = {"created": 0, "existing": 0, "error": 0}
    for out in outcomes:
        counts[out.status] += 1
        if out.status == "error":
            print(f"row {out.row}: {out.error}", file=sys.stderr)
        else:
            print(out.task_id, flush=True)
    print(f"{len(outcomes)} row(s): {counts['created']} created, {counts['existing']} already submitted, "
          f"{counts['error']} failed", file=sys.stderr)
    return 1 if counts["error"] else 0

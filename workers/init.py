"""Entry point of the `init` stage pool: `python workers/init.py` (see workers/README.md)."""

from workers_common import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("init"))

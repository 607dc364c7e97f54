"""Entry point of the `run` stage pool: `python workers/run.py` (see workers/README.md)."""

from workers_common import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("run"))

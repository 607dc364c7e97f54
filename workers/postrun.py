"""Entry point of the `postrun` stage pool: `python workers/postrun.py` (see workers/README.md)."""

from workers_common import run_stage

if __name__ == "__main__":
    raise SystemExit(run_stage("postrun"))

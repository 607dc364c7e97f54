"""Export trajectories for training: token-level JSONL / Parquet rows and SFT chat JSONL.

Token-level rows (one per trace) carry `prompt_ids`, `response_ids`, `loss_mask`, `logprobs`,
`reward`, ids, the trace role and the metadata as a JSON string, so the files load with
`datasets.load_dataset("json" | "parquet", data_files=...)`. SFT rows are OpenAI-chat
`{"messages", "tools"}` records. Filters: status, minimum reward, harness, trace role.

Tests: tests/rl/test_export.py.
"""

from polar_mq.rl.export.core import FORMATS
from polar_mq.rl.export.core import as_trajectory
from polar_mq.rl.export.core import export
from polar_mq.rl.export.core import harness_of
from polar_mq.rl.export.core import select
from polar_mq.rl.export.core import sft_rows
from polar_mq.rl.export.core import token_rows
from polar_mq.rl.export.core import write_jsonl
from polar_mq.rl.export.core import write_parquet

__all__ = ["FORMATS", "as_trajectory", "export", "harness_of", "select", "sft_rows", "token_rows",
           "write_jsonl", "write_parquet"]

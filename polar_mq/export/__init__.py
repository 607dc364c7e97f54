"""Export trajectories for training: token-level JSONL / Parquet rows and SFT chat JSONL.

Token-level rows (one per trace) carry `prompt_ids`, `response_ids`, `loss_mask`, `logprobs`,
`reward`, ids, the trace role and the metadata as a JSON string, so the files load with
`datasets.load_dataset("json" | "parquet", data_files=...)`. SFT rows are OpenAI-chat
`{"messages", "tools"}` records. Filters: status, minimum reward, harness, trace role.
"""

from .core import (FORMATS, as_trajectory, export, harness_of, select, sft_rows, token_rows, write_jsonl,
                   write_parquet)

__all__ = ["FORMATS", "as_trajectory", "export", "harness_of", "select", "sft_rows", "token_rows",
           "write_jsonl", "write_parquet"]

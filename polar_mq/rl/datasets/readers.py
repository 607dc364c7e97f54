"""Read a local dataset into rows: JSONL, JSON (a list, or an object holding one), Parquet, or a
directory written by Hugging Face `datasets` (`save_to_disk`; a DatasetDict takes `split`).
Local files only: nothing is downloaded. A JSONL line that is not a JSON object becomes a row
carrying its error, so one bad line never hides the others."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


class DatasetError(ValueError):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


@dataclass
class Row:
    number: int  # 1-based, in file order (the line number for JSONL)
    data: dict[str, Any] | None
    error: str | None = None


def load_rows(path: str | Path, *, split: str | None = None) -> list[Row]:
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"dataset {str(p)!r} does not exist (only local files and directories are read)")
    if p.is_dir():
        return list(_hf_dir(p, split))
    suffix = "".join(p.suffixes[-2:]).lower() if p.suffix.lower() == ".gz" else p.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".jsonl.gz"):
        return list(_jsonl(p))
    if suffix == ".json":
        return _json(p)
    if suffix in (".parquet", ".pq"):
        return _table_rows(_parquet(p))
    raise DatasetError(f"unknown dataset format {p.suffix!r}: use .jsonl, .json, .parquet or a "
                       "Hugging Face datasets directory")


def _jsonl(p: Path) -> Iterator[Row]:
    import gzip

    opener = gzip.open if p.suffix.lower() == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield Row(n, None, f"invalid JSON: {exc.msg} at column {exc.colno}")
                continue
            yield Row(n, value, None) if isinstance(value, dict) else \
                Row(n, None, f"expected a JSON object, got {type(value).__name__}")


def _json(p: Path) -> list[Row]:
    try:
        value = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{p}: invalid JSON: {exc.msg} at line {exc.lineno}") from exc
    if isinstance(value, dict):
        lists = [v for k, v in value.items() if isinstance(v, list) and k in ("data", "rows", "instances", "train")]
        if not lists:
            raise DatasetError(f"{p}: expected a JSON list of rows (or an object with 'data' / 'rows')")
        value = lists[0]
    if not isinstance(value, list):
        raise DatasetError(f"{p}: expected a JSON list of rows")
    return [Row(n, v, None) if isinstance(v, dict) else Row(n, None, f"expected an object, got {type(v).__name__}")
            for n, v in enumerate(value, 1)]


def _parquet(p: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError("reading Parquet needs pyarrow (pip install 'polar_mq[export]')") from exc
    return pq.read_table(p)


def _table_rows(table) -> list[Row]:
    return [Row(n, dict(r), None) for n, r in enumerate(table.to_pylist(), 1)]


def _hf_dir(p: Path, split: str | None) -> Iterator[Row]:
    try:
        import datasets
    except ImportError as exc:
        raise DatasetError("reading a Hugging Face datasets directory needs `datasets` (pip install datasets)") from exc
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as exc:
        raise DatasetError(f"{p}: not a Hugging Face datasets directory: {exc}") from exc
    if isinstance(ds, datasets.DatasetDict):
        name = split or ("train" if "train" in ds else next(iter(ds)))
        if name not in ds:
            raise DatasetError(f"{p}: no split {name!r} (has {', '.join(ds)})")
        ds = ds[name]
    for n, row in enumerate(ds, 1):
        yield Row(n, dict(row), None)

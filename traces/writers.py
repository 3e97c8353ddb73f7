"""Write a trace frame in its normalized form (what ``convert`` produces).

- ``.parquet``: the frame with its metadata (pandas stores ``df.attrs``);
  ``prefix_hashes`` as a list<int64> column.
- ``.csv``: the schema columns (extras too); ``prefix_hashes`` as
  space-separated ids (``"0 14 15"``); metadata in ``<file>.meta.json``.
- ``.jsonl``: one object per row with the schema's field names
  (``prefix_hashes`` as a JSON list); metadata in ``<file>.meta.json``.

All three load back with :func:`traces.load`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from unikv.traces.loaders import sidecar
from unikv.traces.schema import HASHES, TraceFormatError, validate

SUFFIXES = (".parquet", ".csv", ".jsonl")


def save(df: pd.DataFrame, path: str | Path) -> list[Path]:
    """Write ``df`` to ``path``; the suffix picks the format.

    Returns:
        The files written (the table, and the metadata sidecar for CSV/JSONL).

    Raises:
        TraceFormatError: for an unsupported suffix or a frame that breaks
            the schema (the violations are listed).
    """
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise TraceFormatError(f"{path}: cannot write '{path.suffix}'; use one of {list(SUFFIXES)}")
    problems = validate(df)
    if problems:
        raise TraceFormatError(f"refusing to write a frame that breaks the schema: {'; '.join(problems)}")
    if path.suffix == ".parquet":
        df.to_parquet(path, index=False)
        return [path]
    if path.suffix == ".csv":
        _flat(df).to_csv(path, index=False)
    else:
        df.to_json(path, orient="records", lines=True)
    side = sidecar(path)
    side.write_text(json.dumps(df.attrs, indent=1, default=str) + "\n", encoding="utf-8")
    return [path, side]


def _flat(df: pd.DataFrame) -> pd.DataFrame:
    """Copy with ``prefix_hashes`` joined into space-separated text."""
    if HASHES not in df.columns:
        return df
    out = df.copy()
    out[HASHES] = [" ".join(str(int(x)) for x in h) for h in df[HASHES]]
    return out

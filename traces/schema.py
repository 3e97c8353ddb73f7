"""The one trace schema every loader, transform and generator returns.

A trace is a pandas DataFrame, one row per request, in arrival order:

- ``arrival_s`` (float64): arrival time in seconds, non-decreasing, >= 0.
- ``prompt_tokens`` (int64): prompt length in tokens, >= 1.
- ``output_tokens`` (int64): output length in tokens, >= 1.
- ``prefix_hashes`` (object, optional): one list of ints per row, one id per
  ``block_tokens``-token block of the prompt (``ceil(prompt_tokens /
  block_tokens)`` ids). Equal ids at equal positions mean an identical,
  reusable KV block.

Extra columns (``conversation_id``, ``turn``...) are allowed and ignored.
Metadata lives in ``df.attrs`` as plain JSON-able values; :class:`TraceMeta`
is the typed view of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

ARRIVAL = "arrival_s"
PROMPT = "prompt_tokens"
OUTPUT = "output_tokens"
HASHES = "prefix_hashes"
REQUIRED_COLUMNS = (ARRIVAL, PROMPT, OUTPUT)

_MAX_LISTED = 5  # offending rows named per violation message


class TraceFormatError(ValueError):
    """A trace file or frame does not fit the expected format or schema."""


class TraceWarning(UserWarning):
    """A trace was repaired on load (rows dropped, rows re-sorted)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TraceMeta:
    """Typed view of a trace frame's ``df.attrs``.

    Attributes:
        source: where the rows came from (a file path, or ``synthetic:...``).
        format: the format name the rows were parsed as (``azure_2023``...).
        block_tokens: tokens per ``prefix_hashes`` block, or None when the
            trace has no hashes.
        rows_read: data rows read from the source, before any drop.
        dropped: reason -> number of rows dropped on load.
        history: transforms and slices applied since loading, in order.
        time_origin: the source's timestamp that became ``arrival_s == 0``
            (raw text), or None when the source has no absolute time.
        resorted: True when the source was out of time order and was sorted.
    """

    source: str
    format: str
    block_tokens: int | None = None
    rows_read: int = 0
    dropped: Mapping[str, int] = dataclasses.field(default_factory=dict)
    history: tuple[str, ...] = ()
    time_origin: str | None = None
    resorted: bool = False

    def __post_init__(self) -> None:
        bt = self.block_tokens
        if bt is not None and (not isinstance(bt, int) or bt < 1):
            raise TraceFormatError(f"TraceMeta.block_tokens={bt!r}: expected a positive int or None")
        object.__setattr__(self, "dropped", dict(self.dropped))
        object.__setattr__(self, "history", tuple(self.history))

    def to_attrs(self) -> dict[str, Any]:
        """Return the metadata as a plain dict for ``df.attrs`` (JSON-able)."""
        out = dataclasses.asdict(self)
        out["history"] = list(self.history)
        return out

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TraceMeta:
        """Build from ``df.attrs``; missing keys take defaults, unknown keys are ignored.

        Raises:
            TraceFormatError: when ``source`` or ``format`` is missing.
        """
        missing = [k for k in ("source", "format") if k not in attrs]
        if missing:
            raise TraceFormatError(f"trace attrs lack {missing}; found keys {sorted(attrs)}")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in attrs.items() if k in names}
        if kwargs.get("block_tokens") is not None:
            kwargs["block_tokens"] = int(kwargs["block_tokens"])
        return cls(**kwargs)

    def with_step(self, step: str, **changes: Any) -> TraceMeta:
        """Return a copy with ``step`` appended to ``history`` and fields changed."""
        return dataclasses.replace(self, history=(*self.history, step), **changes)


def meta_of(df: pd.DataFrame) -> TraceMeta:
    """Return the :class:`TraceMeta` stored in ``df.attrs``.

    Raises:
        TraceFormatError: when the attrs lack ``source`` or ``format``.
    """
    return TraceMeta.from_attrs(df.attrs)


def with_meta(df: pd.DataFrame, meta: TraceMeta) -> pd.DataFrame:
    """Replace ``df.attrs`` by ``meta`` (in place) and return ``df``."""
    df.attrs.clear()
    df.attrs.update(meta.to_attrs())
    return df


def make_frame(
    arrival_s: Sequence[float] | np.ndarray,
    prompt_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    prefix_hashes: Sequence[Sequence[int]] | None = None,
    *,
    meta: TraceMeta,
    extra: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Build a trace frame with the schema's column order and dtypes.

    Args:
        arrival_s: arrival times in seconds.
        prompt_tokens: prompt lengths in tokens.
        output_tokens: output lengths in tokens.
        prefix_hashes: one list of block ids per row, or None for no column.
        meta: metadata stored into ``df.attrs``.
        extra: further columns (name -> values), appended after the schema's.

    Returns:
        A new DataFrame with a fresh RangeIndex. Values are not validated;
        call :func:`validate`.
    """
    cols: dict[str, Any] = {
        ARRIVAL: np.asarray(arrival_s, dtype=np.float64),
        PROMPT: np.asarray(prompt_tokens, dtype=np.int64),
        OUTPUT: np.asarray(output_tokens, dtype=np.int64),
    }
    if prefix_hashes is not None:
        cols[HASHES] = hash_column(prefix_hashes).to_numpy()
    cols.update(extra or {})
    return with_meta(pd.DataFrame(cols), meta)


def hash_column(values: Sequence[Sequence[int]], index: pd.Index | None = None) -> pd.Series:
    """Wrap per-row block-id lists as an object column (never a 2-D array)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = list(v)
    return pd.Series(arr, index=index, dtype=object)


def expected_blocks(prompt_tokens: int, block_tokens: int) -> int:
    """Return the number of prefix blocks of a prompt: ``ceil(prompt / block)``."""
    return -(-int(prompt_tokens) // int(block_tokens))


def validate(df: pd.DataFrame) -> list[str]:
    """Check a frame against the trace schema.

    Args:
        df: the frame to check.

    Returns:
        One human-readable string per violation; an empty list means valid.
    """
    if not isinstance(df, pd.DataFrame):
        return [f"expected a pandas DataFrame, got {type(df).__name__}"]
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        return [f"missing column(s) {missing}; found {list(df.columns)}; expected {list(REQUIRED_COLUMNS)}"]
    out = _check_attrs(df.attrs)
    out += _check_arrivals(df[ARRIVAL])
    out += _check_lengths(df[PROMPT]) + _check_lengths(df[OUTPUT])
    if HASHES in df.columns:
        out += _check_hashes(df[HASHES], df[PROMPT], df.attrs.get("block_tokens"))
    return out


def _rows(mask: np.ndarray) -> str:
    """Name the first few row positions where ``mask`` is true."""
    idx = np.flatnonzero(mask)
    shown = ", ".join(str(i) for i in idx[:_MAX_LISTED])
    more = f" (+{len(idx) - _MAX_LISTED} more)" if len(idx) > _MAX_LISTED else ""
    return f"rows {shown}{more}"


def _check_attrs(attrs: Mapping[str, Any]) -> list[str]:
    return [f"df.attrs lacks {k!r} (the trace's {k})" for k in ("source", "format") if k not in attrs]


def _check_arrivals(col: pd.Series) -> list[str]:
    if not pd.api.types.is_float_dtype(col.dtype):
        return [f"{ARRIVAL} has dtype {col.dtype}; expected float64 seconds"]
    t = col.to_numpy()
    out = []
    if not np.isfinite(t).all():
        out.append(f"{ARRIVAL} not finite at {_rows(~np.isfinite(t))}")
    elif (t < 0).any():
        out.append(f"{ARRIVAL} negative at {_rows(t < 0)}")
    if len(t) > 1 and (np.diff(t) < 0).any():
        out.append(f"{ARRIVAL} decreases at {_rows(np.r_[False, np.diff(t) < 0])}")
    return out


def _check_lengths(col: pd.Series) -> list[str]:
    if not pd.api.types.is_integer_dtype(col.dtype):
        return [f"{col.name} has dtype {col.dtype}; expected int64 tokens"]
    v = col.to_numpy()
    return [f"{col.name} < 1 at {_rows(v < 1)}"] if (v < 1).any() else []


def _check_hashes(col: pd.Series, prompt: pd.Series, block_tokens: Any) -> list[str]:
    if not isinstance(block_tokens, (int, np.integer)) or block_tokens < 1:
        return [f"{HASHES} present but df.attrs['block_tokens']={block_tokens!r}; expected a positive int"]
    bad_type, bad_len = [], []
    for i, (h, p) in enumerate(zip(col.to_numpy(), prompt.to_numpy(), strict=True)):
        if not _is_int_list(h):
            bad_type.append(i)
        elif len(h) != expected_blocks(p, block_tokens):
            bad_len.append(i)
    out = []
    if bad_type:
        out.append(f"{HASHES} not a list of ints at {_rows(_mask(bad_type, len(col)))}")
    if bad_len:
        out.append(
            f"{HASHES} length != ceil({PROMPT}/{block_tokens}) at {_rows(_mask(bad_len, len(col)))}"
        )
    return out


def _is_int_list(h: Any) -> bool:
    if isinstance(h, np.ndarray):
        return h.ndim == 1 and (h.size == 0 or np.issubdtype(h.dtype, np.integer))
    if not isinstance(h, (list, tuple)):
        return False
    return all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in h)


def _mask(positions: list[int], n: int) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    m[positions] = True
    return m


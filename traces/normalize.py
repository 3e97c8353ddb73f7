"""Turn a file's raw rows into a schema frame: parse, drop bad rows, sort.

Every error names the file and the line of the offending row. Rows that are
well-formed but unusable (failed responses, lengths <= 0) are dropped and
counted; out-of-order rows are sorted. Both are reported with a
:class:`~traces.schema.TraceWarning` and in the frame's metadata.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from unikv.traces.formats import TIME_UNITS, Format
from unikv.traces.readers import RawTable
from unikv.traces.schema import (
    HASHES,
    TraceFormatError,
    TraceMeta,
    TraceWarning,
    expected_blocks,
    make_frame,
    with_meta,
)

FAILED = "failed_responses"
NONPOSITIVE = "nonpositive_lengths"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parsed:
    """Parsed columns of a raw table (one entry per data row).

    Attributes:
        arrival_s: seconds; after the earliest row read when the format
            re-zeroes, else as in the file; None without timestamps.
        prompt: prompt tokens as read (may be <= 0).
        output: output tokens as read (may be <= 0).
        hashes: one list of ids per row, or None.
        lines: 1-based file line of each row.
        origin: raw text of the earliest arrival when re-zeroed, else None.
    """

    arrival_s: np.ndarray | None
    prompt: np.ndarray
    output: np.ndarray
    hashes: list[list[int]] | None
    lines: np.ndarray
    origin: str | None


def parse(path: Path, fmt: Format, raw: RawTable) -> Parsed:
    """Convert raw values to numbers (one table; see :func:`parse_chunks`)."""
    return parse_chunks(path, fmt, [raw])


def parse_chunks(path: Path, fmt: Format, tables: Iterable[RawTable]) -> Parsed:
    """Convert raw values to numbers, one table at a time (the raw text of a
    table is dropped once parsed, so memory follows the parsed columns).

    Raises:
        TraceFormatError: on a value that is not a non-negative integer
            length, an unparsable timestamp, timestamps with and without a
            UTC offset in one file, or malformed hash ids (names the line).
    """
    cols: dict[str, list[Any]] = {k: [] for k in ("arrival_s", "prompt", "output", "hashes", "lines")}
    clock = _Clock(path)
    text = fmt.container == "csv"
    for raw in tables:
        lines = np.asarray(raw.lines, dtype=np.int64)
        cols["arrival_s"].append(_arrival_keys(path, fmt, raw, lines, clock))
        cols["prompt"].append(_ints(path, raw.columns[fmt.prompt], fmt.prompt, lines, text=text))
        cols["output"].append(_ints(path, raw.columns[fmt.output], fmt.output, lines, text=text))
        cols["hashes"].append(_hashes(path, raw.columns[fmt.hashes], fmt.hashes, lines) if fmt.hashes else None)
        cols["lines"].append(lines)
    return _joined(path, fmt, cols, clock)


def _bad_value(path: Path, line: int, column: str, value: Any, expected: str) -> TraceFormatError:
    return TraceFormatError(f"{path} line {line}: column {column!r} = {value!r}, expected {expected}")


_MAX_TOKENS = 2**53  # beyond this a float64 no longer holds every integer


def _ints(path: Path, values: list[Any], column: str, lines: np.ndarray, *, text: bool) -> np.ndarray:
    """Token counts: integers >= 0 (CSV text, or JSON numbers: a JSON string is refused)."""
    nums = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(nums) | (nums != np.floor(nums)) | (np.abs(nums) > _MAX_TOKENS) | (nums < 0)
    wrong_type = (bool,) if text else (bool, str)
    bad |= np.fromiter((isinstance(v, wrong_type) for v in values), dtype=bool, count=len(values))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _bad_value(path, int(lines[i]), column, values[i], "an integer token count >= 0")
    return nums.astype(np.int64)


class _Clock:
    """What the rows read so far say about their clock: the earliest
    arrival (its key and raw text) and, for timestamps, whether they carry
    a UTC offset (a file mixing both cannot be put on one clock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.first: tuple[Any, str] | None = None
        self.aware: tuple[bool, int, str] | None = None  # (has an offset, line, text) of the first stamp

    def see_min(self, keys: np.ndarray, values: list[Any]) -> None:
        if not len(keys):
            return
        i = int(np.argmin(keys))
        if self.first is None or keys[i] < self.first[0]:
            self.first = (keys[i], str(values[i]).strip())

    def see_offsets(self, aware: np.ndarray, values: list[Any], lines: np.ndarray) -> None:
        if not len(aware):
            return
        if self.aware is None:
            self.aware = (bool(aware[0]), int(lines[0]), str(values[0]).strip())
        other = np.flatnonzero(aware != self.aware[0])
        if len(other):
            i = int(other[0])
            has, line, stamp = self.aware
            raise TraceFormatError(
                f"{self.path} line {int(lines[i])}: timestamp {str(values[i]).strip()!r} "
                f"{'has' if aware[i] else 'has no'} UTC offset, but line {line}'s {stamp!r} "
                f"{'has' if has else 'has no'}: rows without an offset have no known clock; "
                "give every timestamp an offset (or none)")


def _arrival_keys(path: Path, fmt: Format, raw: RawTable, lines: np.ndarray, clock: _Clock) -> np.ndarray | None:
    """Arrival keys of one table: UTC nanoseconds for timestamps, else seconds."""
    if fmt.arrival is None:
        return None
    values = raw.columns[fmt.arrival]
    if TIME_UNITS[fmt.time_unit] is None:
        keys = _datetimes(path, values, fmt.arrival, lines, clock)
    else:
        keys = _numbers(path, values, fmt.arrival, lines) / TIME_UNITS[fmt.time_unit]
    clock.see_min(keys, values)
    return keys


def _joined(path: Path, fmt: Format, cols: dict[str, list[Any]], clock: _Clock) -> Parsed:
    """One Parsed from the tables' columns (each column's parts are released
    as soon as it is joined); arrivals in seconds, re-zeroed as the format says."""
    hashes = _joined_hashes(path, fmt, cols.pop("hashes"), cols["lines"])
    out = Parsed(
        arrival_s=None, prompt=_cat(cols.pop("prompt"), np.int64), output=_cat(cols.pop("output"), np.int64),
        hashes=hashes, lines=_cat(cols.pop("lines"), np.int64), origin=None,
    )
    if fmt.arrival is None:
        return out
    keys = _cat(cols.pop("arrival_s"), np.int64 if TIME_UNITS[fmt.time_unit] is None else np.float64)
    if TIME_UNITS[fmt.time_unit] is None:  # timestamps: seconds after the earliest, as pandas divides
        keys = ((keys - keys.min()) / 1e9) if len(keys) else np.zeros(0)
    if not fmt.rezero or not len(keys):
        return dataclasses.replace(out, arrival_s=keys)
    first = int(np.argmin(keys))
    assert clock.first is not None
    return dataclasses.replace(out, arrival_s=keys - keys[first], origin=clock.first[1])


def _joined_hashes(
    path: Path, fmt: Format, parts: list[list[list[int]] | None], lines: list[np.ndarray]
) -> list[list[int]] | None:
    """The tables' hash lists; None when no row has any (a table without them
    beside one with them is a row without hashes: refused, as within a table)."""
    if fmt.hashes is None or all(h is None for h in parts):
        return None
    bare = next((ln for h, ln in zip(parts, lines, strict=True) if h is None and len(ln)), None)
    if bare is not None:
        raise _bad_value(path, int(bare[0]), fmt.hashes, None, "a list of integer block ids")
    return [ids for h in parts for ids in (h or [])]


def _cat(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)


def _numbers(path: Path, values: list[Any], column: str, lines: np.ndarray) -> np.ndarray:
    nums = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(nums)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _bad_value(path, int(lines[i]), column, values[i], "a finite number")
    return nums


_OFFSET = r"(?:Z|[+-]\d\d:?\d\d)\s*$"  # an ISO-8601 UTC offset at the end of a timestamp


def _datetimes(path: Path, values: list[Any], column: str, lines: np.ndarray, clock: _Clock) -> np.ndarray:
    """Parse ISO-8601 text into UTC nanoseconds (offsets converted to UTC).

    Rows with an offset and rows without one are refused together (via
    ``clock``): reading the naive ones as UTC would shift them silently.
    """
    series = pd.Series(values, dtype=object)
    aware = series.astype(str).str.contains(_OFFSET, regex=True).to_numpy(dtype=bool)
    clock.see_offsets(aware, values, lines)
    try:
        stamps = pd.to_datetime(series, format="ISO8601", utc=True, errors="coerce")
    except (ValueError, TypeError, OverflowError) as exc:
        raise TraceFormatError(f"{path}: column {column!r}: cannot parse timestamps: {exc}") from exc
    bad = stamps.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _bad_value(path, int(lines[i]), column, values[i], "a timestamp 'YYYY-MM-DD HH:MM:SS[.f]'")
    return pd.DatetimeIndex(stamps).as_unit("ns").asi8


def _hashes(path: Path, values: list[Any], column: str, lines: np.ndarray) -> list[list[int]] | None:
    if all(v is None for v in values):
        return None
    out = []
    for v, line in zip(values, lines, strict=True):
        ids = _hash_list(v)
        if ids is None:
            raise _bad_value(path, int(line), column, v, "a list of integer block ids")
        out.append(ids)
    return out


def _hash_list(v: Any) -> list[int] | None:
    """Parse one row's ids from a JSON list or space-separated text; None if malformed."""
    if isinstance(v, str):
        text = v.strip()
        try:
            v = json.loads(text) if text.startswith("[") else [int(x) for x in text.split()]
        except ValueError:
            return None
    if not isinstance(v, (list, tuple)):
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return None
    return list(v)


def drop_unusable(path: Path, fmt: Format, p: Parsed) -> tuple[Parsed, dict[str, int]]:
    """Drop failed responses and rows with a length <= 0; warn with the counts.

    Returns:
        The kept rows and a dict reason -> rows dropped.
    """
    failed = (p.output == 0) if fmt.failed_if_zero_output else np.zeros(len(p.lines), dtype=bool)
    nonpos = ~failed & ((p.prompt <= 0) | (p.output <= 0))
    dropped = {FAILED: int(failed.sum()), NONPOSITIVE: int(nonpos.sum())}
    if not (failed | nonpos).any():
        return p, dropped
    first = int(p.lines[np.flatnonzero(failed | nonpos)[0]])
    warnings.warn(
        f"{path}: dropped {dropped[FAILED]} failed response(s) (0 output tokens) and {dropped[NONPOSITIVE]} "
        f"row(s) with prompt or output tokens <= 0 (first at line {first})",
        TraceWarning, stacklevel=4,
    )
    keep = ~(failed | nonpos)
    return _take(p, np.flatnonzero(keep)), dropped


def _take(p: Parsed, idx: np.ndarray) -> Parsed:
    return dataclasses.replace(
        p,
        arrival_s=None if p.arrival_s is None else p.arrival_s[idx],
        prompt=p.prompt[idx], output=p.output[idx], lines=p.lines[idx],
        hashes=None if p.hashes is None else [p.hashes[i] for i in idx],
    )


def check_hash_lengths(path: Path, p: Parsed, block_tokens: int | None) -> None:
    """Require ``ceil(prompt / block_tokens)`` ids per row.

    Raises:
        TraceFormatError: naming the first row's line whose count differs.
    """
    if p.hashes is None:
        return
    if block_tokens is None:
        raise TraceFormatError(f"{path}: the file has prefix hash ids but no block size; pass block_tokens=...")
    for ids, n, line in zip(p.hashes, p.prompt, p.lines, strict=True):
        want = expected_blocks(n, block_tokens)
        if len(ids) != want:
            raise TraceFormatError(
                f"{path} line {line}: {len(ids)} hash ids for {n} prompt tokens; "
                f"expected ceil({n}/{block_tokens}) = {want}"
            )


def sort_by_arrival(path: Path, p: Parsed) -> tuple[Parsed, bool]:
    """Stable-sort rows by arrival, warning when the source was out of order.

    Returns:
        The rows in time order, and whether any row moved.
    """
    t = p.arrival_s
    if t is None or len(t) < 2 or not (np.diff(t) < 0).any():
        return p, False
    back = np.flatnonzero(np.diff(t) < 0)
    warnings.warn(
        f"{path}: {len(back)} row(s) arrive earlier than the row before them (first at line "
        f"{int(p.lines[back[0] + 1])}); rows sorted by arrival time (stable)",
        TraceWarning, stacklevel=4,
    )
    return _take(p, np.argsort(t, kind="stable")), True


def to_frame(p: Parsed, *, arrival_s: np.ndarray, meta: TraceMeta) -> pd.DataFrame:
    """Assemble the schema frame from parsed rows and final arrival times.

    The parsed hash lists go into the frame as they are (they are fresh
    lists, owned by nobody else): a copy would double the largest part of a
    hashed trace's memory while loading.
    """
    df = make_frame(arrival_s, p.prompt, p.output, None, meta=meta)
    if p.hashes is not None:
        column = np.empty(len(p.hashes), dtype=object)
        for i, ids in enumerate(p.hashes):  # item by item: never read as a 2-D array
            column[i] = ids
        df[HASHES] = column
        with_meta(df, meta)
    return df

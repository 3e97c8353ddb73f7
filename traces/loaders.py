"""``traces.load``: read any known trace file into the schema frame.

The format is detected from the file's header (CSV) or first record (JSON
Lines); gzip is detected by its magic bytes, Parquet by its own. See
``docs/traces.md`` for the table of formats.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from unikv.traces import formats
from unikv.traces.formats import Format
from unikv.traces.normalize import (
    Parsed,
    check_hash_lengths,
    drop_unusable,
    parse_chunks,
    sort_by_arrival,
    to_frame,
)
from unikv.traces.readers import Peek, RawTable, check_file, csv_chunks, jsonl_chunks, peek
from unikv.traces.schema import (
    ARRIVAL,
    HASHES,
    TraceFormatError,
    TraceMeta,
    hash_column,
    meta_of,
    validate,
    with_meta,
)
from unikv.traces.synthetic import poisson_arrivals
from unikv.traces.transforms import spread_buckets

HEAD_MIN_ROWS = 4096  # the fewest rows `load_head` reads first: small heads cost one read


def sidecar(path: str | Path) -> Path:
    """Return the metadata file written beside a normalized CSV/JSONL: ``<path>.meta.json``."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def load(
    path: str | Path,
    *,
    format: str | None = None,
    columns: Mapping[str, str] | None = None,
    time_unit: str = "s",
    block_tokens: int | None = None,
    rate_rps: float | None = None,
    spread_s: float | None = None,
    seed: int = 0,
    max_rows: int | None = None,
) -> pd.DataFrame:
    """Load a trace file into the schema frame (see :mod:`traces.schema`).

    Args:
        path: a CSV, JSON Lines (plain or gzip) or Parquet file.
        format: a name from :func:`traces.formats.known_formats`, or None to
            detect it from the file's header / first record.
        columns: for the generic ``csv`` / ``jsonl`` formats (implied when
            given): schema column -> the file's column name.
        time_unit: generic formats only: ``s``, ``ms``, ``us``, ``ns`` or
            ``datetime`` (ISO-8601 text).
        block_tokens: tokens per prefix-hash block, for generic formats or to
            override a format's own (Mooncake: 512).
        rate_rps: formats without timestamps only: space arrivals as a
            Poisson process of this rate (requests/s); None puts all at 0 s.
        spread_s: spread requests sharing one timestamp uniformly over the
            next ``spread_s`` seconds, keeping file order (for the Mooncake
            conversation trace's 3 s buckets: 3.0). None fires each bucket
            as a burst.
        seed: seed of the Poisson spacing and of the spread.
        max_rows: read only the first ``max_rows`` data rows.

    Returns:
        The frame, arrivals in seconds after the source's earliest row
        (normalized files keep their times), sorted by arrival.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        TraceFormatError: for a path that is not a regular file (a directory,
            a FIFO...: never opened), an unknown format, a missing column, a malformed
            row (the message names its line) or bad options.
    """
    path = Path(path)
    check_file(path)
    _check_block_tokens(block_tokens)
    pk = peek(path)
    if pk.container == "parquet" or format == "parquet":
        return _load_parquet(path, block_tokens)
    fmt = _resolve(path, pk, format, columns, time_unit, block_tokens)
    df, _ = _load_rows(path, fmt, rate_rps=rate_rps, seed=seed, max_rows=max_rows)
    return df if spread_s is None else spread_buckets(df, width_s=spread_s, seed=seed)


def load_head(
    path: str | Path, n: int, *, start_s: float = 0.0, end_s: float | None = None, **opts: Any
) -> pd.DataFrame:
    """The trace's first ``n`` requests in ``[start_s, end_s)``, reading the file only as far as they need.

    Reads the first rows (``4 n``, at least 4,096; four times more each
    retry) of a format whose source is in arrival order (``Format.ordered``)
    until the window holds ``n`` rows or has ended. Drops, Poisson spacing
    and the time origin of those rows are those of the full read, so the
    first ``n`` rows in the window are the same. It reads the whole file
    (:func:`load`) when that cannot be known from a head: a format with no
    order promise, Parquet, ``spread_s`` (a bucket's spread depends on the
    rows after it), or a head whose rows are out of order.

    Args:
        path: the trace file.
        n: requests wanted (>= 1).
        start_s, end_s: the window, seconds after the trace's start.
        **opts: as for :func:`load` (not ``max_rows``).

    Returns:
        A frame whose rows in the window begin with the full read's first
        ``n`` (all of them when it holds fewer); a head's ``rows_read`` and
        ``dropped`` count the rows read, and its history says how many.

    Raises:
        TraceFormatError: for ``n < 1``; otherwise as :func:`load`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TraceFormatError(f"load_head(n={n!r}): expected a positive integer (requests wanted)")
    path = Path(path)
    check_file(path)
    pk = peek(path)
    fmt = None if pk.container == "parquet" or opts.get("format") == "parquet" else _resolve(
        path, pk, opts.get("format"), opts.get("columns"), opts.get("time_unit", "s"), opts.get("block_tokens"))
    if fmt is None or not fmt.ordered or opts.get("spread_s") is not None:
        return load(path, **opts)
    rows = max(4 * n, HEAD_MIN_ROWS)
    while True:
        df, read = _load_rows(path, fmt, rate_rps=opts.get("rate_rps"), seed=opts.get("seed", 0), max_rows=rows)
        if read < rows:  # the whole file
            return df
        meta = meta_of(df)
        if meta.resorted:
            return load(path, **opts)
        t = df[ARRIVAL].to_numpy()
        inside = int(((t >= start_s) & (t < end_s if end_s is not None else True)).sum())
        # A timed trace whose head is all at 0 s would look untimed (the replay warns): read on.
        ended = inside >= n or (end_s is not None and len(t) and t[-1] >= end_s)
        if ended and (fmt.arrival is None or t.any()):
            return with_meta(df, meta.with_step(f"load_head: first {rows} rows of the file (its first {n} "
                                                f"requests in [{start_s}, {end_s}) need no more)"))
        rows *= 4


def _resolve(
    path: Path, pk: Peek, name: str | None, columns: Mapping[str, str] | None, time_unit: str, block_tokens: int | None
) -> Format:
    if columns is not None:
        container = name or pk.container
        if container not in formats.GENERIC:
            raise TraceFormatError(f"columns=... needs format 'csv' or 'jsonl'; got format={name!r} ({pk.container})")
        return formats.generic(container, columns, time_unit=time_unit, block_tokens=block_tokens)
    if name in formats.GENERIC:
        raise TraceFormatError(f"format={name!r} needs columns={{'prompt_tokens': ..., 'output_tokens': ...}}")
    if pk.container == "empty" and name is None:
        raise TraceFormatError(f"{path}: empty file; cannot detect its format")
    fmt = formats.by_name(name, pk, path) if name else formats.detect(path, pk)
    if block_tokens is not None:
        fmt = dataclasses.replace(fmt, block_tokens=block_tokens)
    return fmt


def _load_rows(
    path: Path, fmt: Format, *, rate_rps: float | None, seed: int, max_rows: int | None
) -> tuple[pd.DataFrame, int]:
    """The frame of the file's rows (the first ``max_rows``), and how many data rows were read."""
    if rate_rps is not None and fmt.arrival is not None:
        raise TraceFormatError(f"rate_rps applies to formats without timestamps; {fmt.name} has {fmt.arrival!r}")
    parsed = parse_chunks(path, fmt, _read(path, fmt, max_rows))
    rows_read = len(parsed.lines)
    parsed, dropped = drop_unusable(path, fmt, parsed)
    base = _base_meta(path, fmt)
    check_hash_lengths(path, parsed, base.block_tokens)
    parsed, resorted = sort_by_arrival(path, parsed)
    arrival = _final_arrivals(parsed, rate_rps, seed)
    saved = not fmt.rezero and sidecar(path).is_file()
    meta = _final_meta(base, fmt, rows_read, dropped, parsed, resorted, saved=saved)
    if rate_rps is not None:
        meta = meta.with_step(f"poisson_arrivals(rate_rps={rate_rps}, seed={seed})")
    df = to_frame(parsed, arrival_s=arrival, meta=meta)
    _check(path, df)
    return df, rows_read


def _read(path: Path, fmt: Format, max_rows: int | None) -> Iterator[RawTable]:
    """The file's raw rows, one chunk at a time (see :mod:`traces.readers`)."""
    wanted = fmt.required
    if fmt.container == "csv":
        return csv_chunks(path, wanted, max_rows=max_rows)
    optional = (fmt.hashes,) if fmt.hashes else ()
    return jsonl_chunks(path, wanted, optional=optional, max_rows=max_rows)


def _check_block_tokens(block_tokens: int | None) -> None:
    if block_tokens is not None and (isinstance(block_tokens, bool) or not isinstance(block_tokens, int)
                                     or block_tokens < 1):
        raise TraceFormatError(f"block_tokens={block_tokens!r}: expected a positive integer (tokens per "
                               "prefix-hash block) or None")


def _base_meta(path: Path, fmt: Format) -> TraceMeta:
    """The source, block size and history, from the sidecar for normalized files."""
    plain = TraceMeta(source=str(path), format=fmt.name, block_tokens=fmt.block_tokens)
    side = sidecar(path)
    if fmt.rezero or not side.is_file():
        return plain
    try:
        saved = TraceMeta.from_attrs(json.loads(side.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as exc:
        raise TraceFormatError(f"{side}: unreadable metadata sidecar: {exc}") from exc
    block = fmt.block_tokens if fmt.block_tokens is not None else saved.block_tokens
    return saved.with_step(f"reloaded from {path}", block_tokens=block)


def _final_meta(
    base: TraceMeta, fmt: Format, rows_read: int, dropped: dict[str, int], p: Parsed, resorted: bool, *, saved: bool
) -> TraceMeta:
    """Metadata of a fresh load; a reloaded normalized file keeps its saved counts."""
    block = base.block_tokens if p.hashes is not None else None
    if saved:  # from a sidecar: the original source's metadata
        merged = {k: base.dropped.get(k, 0) + dropped.get(k, 0) for k in {*base.dropped, *dropped}}
        return dataclasses.replace(base, block_tokens=block, dropped=merged, resorted=base.resorted or resorted)
    return TraceMeta(
        source=base.source, format=fmt.name, block_tokens=block, rows_read=rows_read, dropped=dropped,
        time_origin=p.origin, resorted=resorted,
    )


def _final_arrivals(p: Parsed, rate_rps: float | None, seed: int) -> np.ndarray:
    if p.arrival_s is not None:
        return p.arrival_s
    n = len(p.prompt)
    if rate_rps is None:
        return np.zeros(n)
    return poisson_arrivals(n, rate_rps=rate_rps, rng=np.random.default_rng(seed))


def _check(path: Path, df: pd.DataFrame) -> None:
    problems = validate(df)
    if problems:
        raise TraceFormatError(f"{path}: loaded rows break the schema: {'; '.join(problems)}")


def _load_parquet(path: Path, block_tokens: int | None) -> pd.DataFrame:
    """Read a frame written by :func:`traces.writers.save` (or any schema Parquet)."""
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises many types; report them as one
        raise TraceFormatError(f"{path}: cannot read as Parquet: {exc}") from exc
    attrs = dict(df.attrs)
    attrs.setdefault("source", str(path))
    attrs.setdefault("format", "parquet")
    if block_tokens is not None:
        attrs["block_tokens"] = block_tokens
    if HASHES in df.columns:
        df[HASHES] = hash_column([[int(x) for x in h] for h in df[HASHES]], df.index)
    df = with_meta(df, TraceMeta.from_attrs(attrs).with_step(f"reloaded from {path}"))
    _check(path, df)
    return df


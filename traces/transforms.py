"""Pure transforms of trace frames: each returns a new frame, the input untouched.

Every transform keeps the metadata (``df.attrs``) and appends one line to its
``history``, so a frame says how it was cut from its source.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from unikv.traces.schema import (
    ARRIVAL,
    HASHES,
    OUTPUT,
    PROMPT,
    TraceFormatError,
    TraceMeta,
    expected_blocks,
    hash_column,
    meta_of,
    with_meta,
)


def _derive(df: pd.DataFrame, rows: pd.DataFrame, step: str, **changes) -> pd.DataFrame:
    """Give ``rows`` (a new frame) the metadata of ``df`` plus ``step``."""
    out = rows.reset_index(drop=True)
    return with_meta(out, meta_of(df).with_step(step, **changes))


def window(df: pd.DataFrame, *, start_s: float = 0.0, end_s: float | None = None) -> pd.DataFrame:
    """Keep requests arriving in ``[start_s, end_s)`` and re-zero time at ``start_s``.

    Args:
        df: a trace frame.
        start_s: window start in seconds (inclusive).
        end_s: window end in seconds (exclusive); None means no end.

    Returns:
        The rows in the window, with ``arrival_s - start_s``.

    Raises:
        TraceFormatError: when ``end_s < start_s`` or ``start_s < 0``.
    """
    if start_s < 0 or (end_s is not None and end_s < start_s):
        raise TraceFormatError(f"window(start_s={start_s}, end_s={end_s}): need 0 <= start_s <= end_s")
    t = df[ARRIVAL]
    keep = (t >= start_s) & (t < end_s if end_s is not None else True)
    rows = df.loc[keep].copy()
    rows[ARRIVAL] = rows[ARRIVAL] - float(start_s)
    return _derive(df, rows, f"window(start_s={start_s}, end_s={end_s})")


def scale_rate(df: pd.DataFrame, *, factor: float) -> pd.DataFrame:
    """Replay ``factor`` times faster (``factor > 1``) or slower (``< 1``).

    Arrival times are divided by ``factor``; lengths are unchanged.

    Raises:
        TraceFormatError: when ``factor`` is not a positive finite number.
    """
    if not np.isfinite(factor) or factor <= 0:
        raise TraceFormatError(f"scale_rate(factor={factor}): expected a positive finite number")
    rows = df.copy()
    rows[ARRIVAL] = rows[ARRIVAL] / float(factor)
    return _derive(df, rows, f"scale_rate(factor={factor})")


def subsample(
    df: pd.DataFrame, *, fraction: float | None = None, n: int | None = None, seed: int = 0
) -> pd.DataFrame:
    """Keep a seeded random subset of requests, in their original order.

    Args:
        df: a trace frame.
        fraction: keep ``round(fraction * len(df))`` requests; ``0 <= fraction
            <= 1``. Give this or ``n``.
        n: keep exactly ``n`` requests (``0 <= n <= len(df)``).
        seed: seed of the choice.

    Raises:
        TraceFormatError: unless exactly one of ``fraction`` / ``n`` is given
            and in range.
    """
    if (fraction is None) == (n is None):
        raise TraceFormatError("subsample: give exactly one of fraction=... or n=...")
    if fraction is not None:
        if not 0.0 <= fraction <= 1.0:
            raise TraceFormatError(f"subsample(fraction={fraction}): expected 0 <= fraction <= 1")
        n = round(fraction * len(df))
    if not 0 <= n <= len(df):
        raise TraceFormatError(f"subsample(n={n}): expected 0 <= n <= {len(df)} (the trace's rows)")
    pick = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return _derive(df, df.iloc[pick].copy(), f"subsample(n={n}, seed={seed})")


def clip_to_context(df: pd.DataFrame, *, max_context_tokens: int, mode: str = "truncate") -> pd.DataFrame:
    """Make every request fit ``prompt_tokens + output_tokens <= max_context_tokens``.

    Args:
        df: a trace frame.
        max_context_tokens: the model's context length in tokens (>= 2).
        mode: ``"truncate"`` shortens the prompt to at most
            ``max_context_tokens - 1`` (keeping its start, and the matching
            leading ``prefix_hashes``), then the output to what remains;
            ``"drop"`` removes requests that do not fit (counted in
            ``dropped['over_context']``).

    Raises:
        TraceFormatError: for ``max_context_tokens < 2`` or an unknown mode.
    """
    if max_context_tokens < 2:
        raise TraceFormatError(f"clip_to_context(max_context_tokens={max_context_tokens}): expected >= 2")
    step = f"clip_to_context(max_context_tokens={max_context_tokens}, mode={mode!r})"
    fits = (df[PROMPT] + df[OUTPUT]) <= max_context_tokens
    if mode == "drop":
        meta = meta_of(df)
        dropped = {**meta.dropped, "over_context": meta.dropped.get("over_context", 0) + int((~fits).sum())}
        return _derive(df, df.loc[fits].copy(), step, dropped=dropped)
    if mode != "truncate":
        raise TraceFormatError(f"clip_to_context(mode={mode!r}): expected 'truncate' or 'drop'")
    rows = df.copy()
    rows[PROMPT] = np.minimum(rows[PROMPT].to_numpy(), max_context_tokens - 1)
    rows[OUTPUT] = np.minimum(rows[OUTPUT].to_numpy(), max_context_tokens - rows[PROMPT].to_numpy())
    if HASHES in rows.columns:
        block = int(df.attrs["block_tokens"])
        cut = [list(h[: expected_blocks(p, block)]) for h, p in zip(rows[HASHES], rows[PROMPT], strict=True)]
        rows[HASHES] = hash_column(cut, rows.index)
    return _derive(df, rows, step)


def spread_buckets(df: pd.DataFrame, *, width_s: float, seed: int = 0) -> pd.DataFrame:
    """Spread requests that share one arrival time over the next ``width_s`` seconds.

    Each group of equal timestamps ``t`` (a bucket, like the Mooncake
    conversation trace's 3 s buckets) gets sorted uniform offsets in
    ``[0, width_s)``, assigned in row order, so the order inside a bucket is
    kept. Requests alone at their timestamp move too.

    Raises:
        TraceFormatError: when ``width_s`` is negative or not finite.
    """
    if not np.isfinite(width_s) or width_s < 0:
        raise TraceFormatError(f"spread_buckets(width_s={width_s}): expected a finite number >= 0")
    t = df[ARRIVAL].to_numpy()
    offsets = np.random.default_rng(seed).uniform(0.0, width_s, size=len(t))
    # Rows are in time order, so each bucket is a run; sorting the offsets
    # inside each run keeps the row order inside the bucket.
    new = t + offsets[np.lexsort((offsets, t))]
    rows = df.copy()
    rows[ARRIVAL] = new
    rows = rows.iloc[np.argsort(new, kind="stable")]
    return _derive(df, rows, f"spread_buckets(width_s={width_s}, seed={seed})")


def concat(frames: Sequence[pd.DataFrame], *, gap_s: float = 0.0, disjoint_hashes: bool = True) -> pd.DataFrame:
    """Play traces one after another.

    Each trace's time 0 is put ``gap_s`` seconds after the previous trace's
    last arrival.

    Args:
        frames: trace frames, played in order (at least one).
        gap_s: idle seconds between one trace's last arrival and the next's 0.
        disjoint_hashes: shift each later trace's ``prefix_hashes`` ids past
            every earlier id, so traces never share a cached block; False
            keeps the ids (identical ids then hit each other's cache).

    Raises:
        TraceFormatError: for no frames, a negative gap, or frames that
            disagree on having ``prefix_hashes`` or on ``block_tokens``.
    """
    if not frames:
        raise TraceFormatError("concat: expected at least one frame")
    if gap_s < 0:
        raise TraceFormatError(f"concat(gap_s={gap_s}): expected >= 0")
    block = _common_block(frames)
    parts, offset_s, next_id = [], 0.0, 0
    for df in frames:
        part = df.copy()
        part[ARRIVAL] = part[ARRIVAL] + offset_s
        if block is not None and disjoint_hashes:
            part[HASHES] = hash_column([[x + next_id for x in h] for h in part[HASHES]], part.index)
            next_id = 1 + max((max(h) for h in part[HASHES] if len(h)), default=next_id - 1)
        parts.append(part)
        offset_s = (float(part[ARRIVAL].iloc[-1]) if len(part) else offset_s) + gap_s
    return with_meta(pd.concat(parts, ignore_index=True), _concat_meta(frames, gap_s, disjoint_hashes))


def _common_block(frames: Sequence[pd.DataFrame]) -> int | None:
    has = {HASHES in df.columns for df in frames}
    if len(has) > 1:
        raise TraceFormatError("concat: some frames have prefix_hashes and some do not")
    if not has.pop():
        return None
    blocks = {df.attrs.get("block_tokens") for df in frames}
    if len(blocks) > 1:
        raise TraceFormatError(f"concat: frames disagree on block_tokens {sorted(map(str, blocks))}")
    return int(blocks.pop())


def _concat_meta(frames: Sequence[pd.DataFrame], gap_s: float, disjoint: bool) -> TraceMeta:
    metas = [meta_of(df) for df in frames]
    dropped: dict[str, int] = {}
    for m in metas:
        for k, v in m.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
    sources = list(dict.fromkeys(m.source for m in metas))
    fmts = list(dict.fromkeys(m.format for m in metas))
    return TraceMeta(
        source=" + ".join(sources), format=fmts[0] if len(fmts) == 1 else "mixed",
        block_tokens=metas[0].block_tokens, rows_read=sum(m.rows_read for m in metas), dropped=dropped,
        history=(f"concat({len(frames)} traces, gap_s={gap_s}, disjoint_hashes={disjoint})",),
        time_origin=metas[0].time_origin, resorted=any(m.resorted for m in metas),
    )


def repeat(df: pd.DataFrame, *, times: int, gap_s: float = 0.0, disjoint_hashes: bool = True) -> pd.DataFrame:
    """Play one trace ``times`` times back to back (see :func:`concat`).

    Raises:
        TraceFormatError: when ``times < 1``.
    """
    if times < 1:
        raise TraceFormatError(f"repeat(times={times}): expected >= 1")
    out = concat([df] * times, gap_s=gap_s, disjoint_hashes=disjoint_hashes)
    meta = meta_of(df).with_step(f"repeat(times={times}, gap_s={gap_s}, disjoint_hashes={disjoint_hashes})")
    return with_meta(out, meta)

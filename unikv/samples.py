"""The pool's state sampled every engine step, read back as columns.

A simulator records the pool's bytes and capacity after every step. Asking
`usage()` and `available_size()` each time costs a few microseconds of
Python per step; a `sample()` is only the numbers they are computed from
(each band's frontiers, holes, live and pending pages: a flat tuple of
ints). `columns` turns a whole run's samples into the same quantities at
once, as numpy columns: the bytes of `usage()` and the tokens of
`available_size()`, with the same arithmetic vectorised over the samples
(the capacity's and the gap's closed forms over columns,
`extent.joint_pages_columns` / `chain_gap_bytes_columns`, sit beside their
scalar forms; any other chain falls back to the scalar search, sample by
sample). Tests hold every column equal to the live calls, sample by sample,
and each column twin equal to its scalar form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unikv.extent import (
    BUDGET,
    FLOAT,
    REGION,
    Extent,
    chain_gap_bytes_columns,
    joint_pages,
    joint_pages_columns,
    new_extent,
)

FIELDS = ("low", "high", "holes", "live", "pending")  # per band, in a sample


def sample(pool) -> tuple[int, ...]:
    """The pool's state as `FIELDS` per band, chain order (a flat tuple)."""
    out: list[int] = []
    for b, e in zip(pool.chain.bands, pool.chain.extents()):
        out += (e.low, e.high, e.holes, e.live, b.pending_pages())
    return tuple(out)


def columns(pool, samples: Sequence[tuple[int, ...]]) -> dict[str, np.ndarray]:
    """`usage()` and `available_size()` of every sample of `pool`, as int64
    columns: "free_bytes", "gap_bytes", "available_tokens", and per band
    "<band>_<live|hole|pending|occupied>_bytes", "<band>_<low|high>_byte"."""
    chain = pool.chain
    ext0 = chain.extents()  # the per-band constants: kind, page bytes, grid, cap
    width = len(FIELDS) * len(ext0)
    table = np.array(samples, dtype=np.int64).reshape(-1, width)
    bands = [{f: table[:, k * len(FIELDS) + i] for i, f in enumerate(FIELDS)} for k in range(len(ext0))]
    out: dict[str, np.ndarray] = {}
    live_total = 0
    for b, e, s in zip(chain.bands, ext0, bands):
        pb, kind = e.page_bytes, e.kind
        live = s["live"] * pb
        live_total = live_total + live
        if kind is BUDGET:
            low = high = np.zeros(len(table), dtype=np.int64)
        else:
            low = s["low"] * pb
            high = (np.full(len(table), e.cap) if kind is REGION else s["high"]) * pb
            if kind is FLOAT:  # transparent while empty
                low, high = np.where(s["live"] == 0, 0, low), np.where(s["live"] == 0, 0, high)
        out.update({f"{b.name}_live_bytes": live, f"{b.name}_hole_bytes": s["holes"] * pb,
                    f"{b.name}_pending_bytes": s["pending"] * pb,
                    f"{b.name}_occupied_bytes": high - low,
                    f"{b.name}_low_byte": low, f"{b.name}_high_byte": high})
    out["free_bytes"] = chain.total_bytes - chain.sink_bytes - live_total
    out["gap_bytes"] = chain_gap_bytes_columns(ext0, bands, chain.sink_bytes, chain.total_bytes)
    out["available_tokens"] = _joint_pages(pool, ext0, bands, table) * pool.page_size
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def _joint_pages(pool, ext0, bands, table) -> np.ndarray:
    """`chain.joint_pages(pool.token_order)`: in closed form over the
    columns where `extent.joint_pages_columns` has one; else sample by
    sample."""
    order = list(pool.token_order)
    n = len(table)
    if not order:
        return np.zeros(n, dtype=np.int64)
    closed = joint_pages_columns(ext0, bands, order)
    if closed is not None:
        return closed
    total = pool.chain.total_bytes
    out = np.empty(n, dtype=np.int64)
    prev, pages = None, 0
    for r, row in enumerate(table.tolist()):
        if row != prev:  # consecutive samples often repeat; the last answer seeds the search
            ext = [_with_fields(e, row[k * 5: k * 5 + 4]) for k, e in enumerate(ext0)]
            pages, prev = joint_pages(ext, order, total, pages), row
        out[r] = pages
    return out


def _with_fields(e: Extent, fields: Sequence[int]) -> Extent:
    """`e` with the sampled `(low, high, holes, live)`."""
    low, high, holes, live = fields
    # positional, without NamedTuple.__new__'s frame (one per sampled row and band)
    return new_extent(Extent, (e.kind, e.page_bytes, e.min_page, e.num_pages, low, high, holes, live, e.cap))

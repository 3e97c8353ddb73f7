"""The pool's state sampled every engine step, read back as columns.

A simulator records the pool's bytes and capacity after every step. Asking
`usage()` and `available_size()` each time costs a few microseconds of
Python per step; a `sample()` is only the numbers they are computed from
(each band's frontiers, holes, live and pending pages: a flat tuple of
ints). `columns` turns a whole run's samples into the same quantities at
once, as numpy columns: the bytes of `usage()` and the tokens of
`available_size()`, with the same arithmetic vectorised over the samples
(the capacity's closed forms for the common chains; any other chain falls
back to the scalar search, sample by sample). Tests hold every column
equal to the live calls, sample by sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unikv.extent import BUDGET, DOWN, FLOAT, REGION, UP, Extent, joint_pages

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
    out["gap_bytes"] = _gap_bytes(ext0, bands, chain.sink_bytes, chain.total_bytes)
    out["available_tokens"] = _joint_pages(pool, ext0, bands, table) * pool.page_size
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def _gap_bytes(ext0, bands, sink_bytes: int, total_bytes: int) -> np.ndarray:
    """`extent.chain_gap_bytes`, vectorised."""
    n = len(bands[0]["low"])
    if ext0[0].kind is REGION:
        return sum((e.cap - s["high"]) * e.page_bytes for e, s in zip(ext0, bands))
    gap = np.zeros(n, dtype=np.int64)
    top = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=bool)  # a non-transparent band came before
    for e, s in zip(ext0, bands):
        if e.kind is BUDGET:
            continue
        solid = s["live"] > 0 if e.kind is FLOAT else np.ones(n, dtype=bool)
        low = s["low"] * e.page_bytes
        first = low if ext0[0].kind is UP else sink_bytes
        start = np.where(seen, top, first)
        gap += np.where(solid, np.maximum(0, low - start), 0)
        top = np.where(solid, s["high"] * e.page_bytes, top)
        seen |= solid
    if ext0[-1].kind is not DOWN:
        gap += np.where(seen, np.maximum(0, total_bytes - top), 0)
    return gap


def _joint_pages(pool, ext0, bands, table) -> np.ndarray:
    """`chain.joint_pages(pool.token_order)`, vectorised for an adjacent UP /
    DOWN pair, budget bands and static regions; else sample by sample."""
    order = list(pool.token_order)
    n = len(table)
    if not order:
        return np.zeros(n, dtype=np.int64)
    kinds = [ext0[i].kind for i in order]
    if len(order) == 2 and kinds == [UP, DOWN] and order[1] == order[0] + 1:
        return _facing_pair(ext0[order[0]], bands[order[0]], ext0[order[1]], bands[order[1]])
    if all(k is BUDGET for k in kinds):
        return _budget(ext0, bands, order)
    if all(k is REGION for k in kinds):
        return np.min([bands[i]["holes"] + ext0[i].cap - bands[i]["high"] for i in order], axis=0)
    total = pool.chain.total_bytes
    out = np.empty(n, dtype=np.int64)
    prev, pages = None, 0
    for r, row in enumerate(table.tolist()):
        if row != prev:  # consecutive samples often repeat; the last answer seeds the search
            ext = [Extent(e.kind, e.page_bytes, e.min_page, e.num_pages, *row[k * 5: k * 5 + 4], e.cap)
                   for k, e in enumerate(ext0)]
            pages, prev = joint_pages(ext, order, total, pages), row
        out[r] = pages
    return out


def _facing_pair(u: Extent, su, d: Extent, sd) -> np.ndarray:
    """`extent.facing_pair_pages`, vectorised."""
    pu, pd = u.page_bytes, d.page_bytes
    room_u = np.maximum(0, np.minimum(u.num_pages, sd["low"] * pd // pu) - su["high"])
    room_d = np.maximum(0, sd["low"] - np.maximum(d.min_page, -(-su["high"] * pu // pd)))
    hi = np.minimum(su["holes"] + room_u, sd["holes"] + room_d)
    meet = ((sd["low"] + sd["holes"]) * pd - (su["high"] - su["holes"]) * pu) // (pu + pd)
    return np.minimum(hi, np.maximum(np.maximum(su["holes"], sd["holes"]), meet))


def _budget(ext0, bands, order) -> np.ndarray:
    """`extent.budget_pages`, vectorised."""
    bytes_per_n = sum(ext0[i].page_bytes for i in order)
    grid = np.min([ext0[i].num_pages - ext0[i].min_page - bands[i]["live"] for i in order], axis=0)
    free = ext0[order[0]].cap - sum(s["live"] * e.page_bytes for e, s in zip(ext0, bands))
    return np.maximum(0, np.minimum(free // bytes_per_n, grid))

"""Public checkers of a pool against the reference model; each returns a list
of violations (empty = healthy), computed from the public surface
(translate, buffer_view, occupancy, capacity views) and the model, not from
the pool's own bookkeeping where that can be avoided.

`pool_violations` is the invariant both the state machine and the random
driver run after every step; the others are its parts, and `paged_violations`
/ `fresh_violations` are the checks of single calls.
"""

from __future__ import annotations

import numpy as np

from unikv.testing.device import host_ids
from unikv.testing.model import ChainModel
from unikv.testing.shadow import ShadowBytes


def _ids(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64)


def pool_violations(pool, model: ChainModel, shadow: ShadowBytes, overlap: bool = True) -> list[str]:
    """Every check of the pool's state: `verify()`, tables, kernel-facing
    ids, bytes, overlap (skip it for a pool whose physical ids are
    bookkeeping only, the oracle) and capacity views."""
    out = list(pool.verify())
    out += table_violations(pool, model)
    out += kernel_id_violations(pool, model)
    out += byte_violations(pool, model, shadow)
    if overlap:
        out += overlap_violations(pool, model)
    out += capacity_violations(pool)
    return out


def paged_violations(prefix, seq, last, out, ps: int, taken: set[int]):
    """Paged-alloc ids against tail-page reuse; also returns the fresh pages
    each request got, in position order.

    Positions inside a request's partly filled last page follow `last`;
    later positions take fresh pages (not in `taken`, one per page of
    positions, `ceil(seq/ps) - ceil(prefix/ps)` per request).
    """
    ids = host_ids(out).tolist()
    if len(ids) != sum(s - p for p, s in zip(prefix, seq)):
        return [f"paged alloc returned {len(ids)} ids for {list(zip(prefix, seq))}"], []
    errs: list[str] = []
    fresh_all: list[list[int]] = []
    seen: set[int] = set()
    k = 0
    for p0, s0, l0 in zip(prefix, seq, last):
        tail_end = -(-p0 // ps) * ps
        pages: list[int] = []
        for pos, t in zip(range(p0, s0), ids[k:k + s0 - p0]):
            if t % ps != pos % ps:
                errs.append(f"position {pos} got id {t}: offset {t % ps} != {pos % ps}")
            if pos < tail_end:
                if t != l0 + pos - p0 + 1:
                    errs.append(f"tail position {pos} got {t}, expected last_loc {l0} + {pos - p0 + 1}")
                continue
            v, idx = t // ps, pos // ps - tail_end // ps
            if idx == len(pages):
                if v <= 0 or v in taken or v in seen:
                    errs.append(f"fresh page {v} (position {pos}) is not a free page")
                pages.append(v)
                seen.add(v)
            elif pages[idx] != v:
                errs.append(f"position {pos} is on page {v}, its page-mates on {pages[idx]}")
        k += s0 - p0
        if len(pages) != -(-s0 // ps) - -(-p0 // ps):
            errs.append(f"request {p0}->{s0} got {len(pages)} fresh pages")
        fresh_all.append(pages)
    return errs, fresh_all


def table_violations(pool, model: ChainModel) -> list[str]:
    """Per band, the pages / slots translate reports bound equal the
    model's; free id counts and live bytes (the byte budget) agree."""
    out, ps = [], pool.page_size
    occ = pool.occupancy()["bands"]
    every_page = np.arange(1, pool.vids.size, dtype=np.int64)
    for band in model.token_bands:
        got = set(every_page[host_ids(pool.translate(every_page * ps, band)) != 0].tolist())
        out += _set_violations(band, "bound pages", got, model.bound(band))
        want = len(model.bound(band)) * pool.layout.geometry(band).page_bytes
        if occ[band]["live_bytes"] != want:
            out.append(f"[{band}] live_bytes {occ[band]['live_bytes']} != model {want}")
    live_bytes = sum(len(model.bound(b)) * pool.layout.geometry(b).page_bytes for b in model.token_bands)
    live_bytes += sum(len(model.states[b]) * pool.layout.geometry(b).page_bytes for b in model.state_bands)
    free = pool.layout.total_bytes - pool.layout.sink_bytes - live_bytes
    if pool.occupancy()["free_bytes"] != free:
        out.append(f"occupancy free_bytes {pool.occupancy()['free_bytes']} != model {free}")
    if model.token_bands and pool.vids.free_count != pool.vids.size - 1 - len(model.pages):
        out.append(f"free virtual ids {pool.vids.free_count} != {pool.vids.size - 1} - "
                   f"{len(model.pages)} live")
    for band in model.state_bands:
        space = pool.state_ids[band]
        every = np.arange(1, space.size, dtype=np.int64)
        got = set(every[host_ids(pool.translate(every, band)) != 0].tolist())
        out += _set_violations(band, "live slots", got, set(model.states[band]))
        want = len(model.states[band]) * pool.layout.geometry(band).page_bytes
        if occ[band]["live_bytes"] != want:
            out.append(f"[{band}] live_bytes {occ[band]['live_bytes']} != model {want}")
        if space.free_count != space.size - 1 - len(model.states[band]):
            out.append(f"[{band}] free slot ids {space.free_count} do not match the model")
    return out


def kernel_id_violations(pool, model: ChainModel) -> list[str]:
    """Kernel-facing ids: physical page x (page_size x blocks_per_page) +
    offset on bound pages, the sink (0) on tombstoned ones."""
    out, ps = [], pool.page_size
    pages = _ids(sorted(model.pages))
    tokens = (pages[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)
    for band in model.token_bands:
        bpp = pool.layout.geometry(band).band.blocks_per_page
        slots = host_ids(pool.translate(tokens, band))
        want = np.where(slots == 0, slots, slots // ps * (ps * bpp) + slots % ps)
        if not np.array_equal(host_ids(pool.translate(tokens, band, kernel=True)), want):
            out.append(f"[{band}] kernel-facing ids differ from page x {ps * bpp} + offset")
    return out


def _set_violations(band: str, what: str, got: set, want: set) -> list[str]:
    if got == want:
        return []
    return [f"[{band}] {what} differ from the model: pool-only {sorted(got - want)[:8]}, "
            f"model-only {sorted(want - got)[:8]}"]


def byte_violations(pool, model: ChainModel, shadow: ShadowBytes) -> list[str]:
    """Every written live slot reads back the bytes last written to it."""
    if not shadow.materialized:
        return []
    out = []
    for band in model.token_bands + model.state_bands:
        src = model.states[band] if band in model.states else model.stamps[band]
        if not src:
            continue
        ids = _ids(sorted(src))
        phys = host_ids(pool.translate(ids, band))
        got, want = shadow.read(band, phys), shadow.expected(band, ids)
        if not np.array_equal(got, want):
            bad = (got != want).any(1)
            out.append(f"[{band}] {int(bad.sum())} live slots hold wrong bytes: virtual "
                       f"{ids[bad][:8].tolist()} at physical {phys[bad][:8].tolist()}")
    return out


def overlap_violations(pool, model: ChainModel) -> list[str]:
    """No two live slots of any bands share a byte and all lie inside
    `[sink, total_bytes)`: byte intervals `[slot * entry, (slot + 1) * entry)`
    from translate (every slot of every live page)."""
    starts, sizes = [], []
    ps = pool.page_size
    offsets = np.arange(ps, dtype=np.int64)
    for band in model.token_bands + model.state_bands:
        entry = pool.layout.geometry(band).band.entry_bytes
        if band in model.states:
            ids = _ids(sorted(model.states[band]))
        else:
            ids = (_ids(sorted(model.bound(band)))[:, None] * ps + offsets).reshape(-1)
        slots = host_ids(pool.translate(ids, band))
        starts.append(slots * entry)
        sizes.append(np.full_like(slots, entry))
    s, size = np.concatenate(starts), np.concatenate(sizes)
    if s.size == 0:
        return []
    e, out = s + size, []
    lo, hi = pool.layout.sink_bytes, pool.layout.total_bytes
    if bool((s < lo).any() or (e > hi).any()):
        out.append(f"live slots outside [{lo}, {hi}): starts {s[(s < lo) | (e > hi)][:8].tolist()}")
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    clash = np.flatnonzero(e[:-1] > s[1:])
    if clash.size:
        i = int(clash[0])
        out.append(f"{clash.size} live slot pairs overlap, e.g. [{int(s[i])}, {int(e[i])}) and "
                   f"[{int(s[i + 1])}, {int(e[i + 1])})")
    return out


def capacity_views(pool) -> list[int]:
    """available_size() plain and schedulable, then every band's
    available_state()."""
    states = [b.name for b in pool.layout.state_bands]
    return ([pool.available_size(), pool.available_size(schedulable=True)]
            + [pool.available_state(b) for b in states])


def capacity_violations(pool) -> list[str]:
    """Views are page multiples, schedulable >= plain, and the memoised
    answers equal a recompute after the chain forgets its memos."""
    out = []
    cached = capacity_views(pool)
    pool.chain.forget_memos()
    fresh = capacity_views(pool)
    if cached != fresh:
        out.append(f"capacity memo is stale: cached {cached}, recomputed {fresh}")
    if fresh[0] % pool.page_size:
        out.append(f"available_size() {fresh[0]} is not a multiple of {pool.page_size}")
    if fresh[1] < fresh[0]:
        out.append(f"available_size(schedulable=True) {fresh[1]} < available_size() {fresh[0]}")
    bound = pool.available_size_bound()
    if bound < fresh[1]:
        out.append(f"available_size_bound() {bound} < available_size(schedulable=True) {fresh[1]}")
    return out


def fresh_violations(pool, fresh) -> list[str]:
    """Differences between `pool` and `fresh`, a new pool of its layout:
    occupancy, capacity views, page tables, free virtual ids."""
    out = []
    if pool.occupancy() != fresh.occupancy():
        out.append(f"occupancy {pool.occupancy()} != fresh {fresh.occupancy()}")
    if capacity_views(pool) != capacity_views(fresh):
        out.append(f"capacity views {capacity_views(pool)} != fresh {capacity_views(fresh)}")
    for name in pool.bands:
        a, b = pool.bands[name], fresh.bands[name]
        if not ((a.v2p == b.v2p).all() and (a.p2v == b.p2v).all()):
            out.append(f"[{name}] page tables differ from a fresh pool's")
    if sorted(host_ids(pool.vids.free).tolist()) != sorted(host_ids(fresh.vids.free).tolist()):
        out.append("free virtual ids differ from a fresh pool's")
    return out

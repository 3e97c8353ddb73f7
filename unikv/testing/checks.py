"""`Driver.check()`: the pool against the driver's model (a mixin of `Driver`)."""

from __future__ import annotations

import torch

from unikv.testing.patterns import _same


class Checks:
    """Violation checks (lists of strings; empty = healthy)."""


    def check(self, pool=None) -> list[str]:
        """Violations of the pool against the model (empty = healthy)."""
        pool = pool if pool is not None else self.pool
        out, self.pending_violations = self.pending_violations, []
        out += pool.verify()
        snap = self._snapshot(pool)
        out += self._count_violations(pool, snap)
        out += self._tombstone_violations(pool)
        if self.bytes:
            out += self._byte_violations(pool, snap)
        if self.check_overlap:
            out += self._overlap_violations(pool, snap)
        n = pool.available_size()
        if n % self.ps:
            out.append(f"available_size() {n} is not a multiple of page_size {self.ps}")
        if pool.available_size(schedulable=True) < n:
            out.append(f"schedulable available_size {pool.available_size(schedulable=True)} < {n}")
        return out

    def _snapshot(self, pool) -> dict:
        """Per band: live ids (ascending), their physical slots, and a mask
        of each virtual page's first live id."""
        snap = {}
        for band in self.token_bands + self.state_bands:
            ids = torch.nonzero(self.live[band]).flatten()
            phys = pool.translate(ids, band) if ids.numel() else ids
            first = torch.ones(ids.numel(), dtype=torch.bool)
            if band in self.token_bands and ids.numel() > 1:
                vp = ids // self.ps
                first[1:] = vp[1:] != vp[:-1]
            snap[band] = (ids, phys, first)
        return snap

    def _count_violations(self, pool, snap: dict) -> list[str]:
        out = []
        occ = pool.occupancy()["bands"]
        for band, (_, _, first) in snap.items():
            want, got = int(first.sum()), occ[band]["live_pages"]
            if got != want:
                out.append(f"[{band}] pool reports {got} live pages, the engine holds {want}")
        return out

    def _tombstone_violations(self, pool) -> list[str]:
        band = self.window_band
        if band is None:
            return []
        others = torch.zeros_like(self.live[band])
        for b in self.token_bands:
            if b != band:
                others |= self.live[b]
        dead = torch.nonzero(others & ~self.live[band]).flatten()
        if dead.numel() and bool((pool.translate(dead, band) != 0).any()):
            return [f"[{band}] released ids do not translate to the sink"]
        return []

    def _byte_violations(self, pool, snap: dict) -> list[str]:
        out = []
        for band, (ids, phys, _) in snap.items():
            if ids.numel() == 0:
                continue
            got = pool.buffer_view(band).index_select(0, phys)
            want = self.shadow[band].index_select(0, ids)
            if _same(got, want):
                continue
            bad = (got != want).any(1)
            out.append(f"[{band}] {int(bad.sum())} live slots hold wrong bytes: virtual "
                       f"{ids[bad][:8].tolist()} at physical {phys[bad][:8].tolist()}")
        return out

    def _overlap_violations(self, pool, snap: dict) -> list[str]:
        """Byte ranges of every live page (one per virtual page) must be
        disjoint and inside `[sink, total_bytes)`."""
        starts, sizes, which = [], [], []
        for i, (band, (ids, phys, first)) in enumerate(snap.items()):
            if ids.numel() == 0:
                continue
            ps = self.ps if band in self.token_bands else 1
            size = self.entry[band] * ps
            starts.append(phys[first] // ps * size)
            sizes.append(torch.full((int(first.sum()),), size, dtype=torch.int64))
            which.append(torch.full((int(first.sum()),), i, dtype=torch.int64))
        if not starts:
            return []
        s, size, which = torch.cat(starts), torch.cat(sizes), torch.cat(which)
        e = s + size
        out = []
        lo, hi = pool.layout.sink_bytes, pool.layout.total_bytes
        if bool((s < lo).any()) or bool((e > hi).any()):
            out.append(f"a live page lies outside [{lo}, {hi}): starts {s[(s < lo) | (e > hi)][:8].tolist()}")
        order = torch.argsort(s)
        s, e, which = s[order], e[order], which[order]
        clash = torch.nonzero(e[:-1] > s[1:]).flatten()
        if clash.numel():
            i = int(clash[0])
            names = list(snap)
            a, b = names[int(which[i])], names[int(which[i + 1])]
            out.append(f"{clash.numel()} live pages overlap, e.g. {a} [{int(s[i])}, {int(e[i])}) "
                       f"and {b} [{int(s[i + 1])}, {int(e[i + 1])})")
        return out

"""Page tables: host arrays the allocator decides on, a device mirror kernels read.

Every table of a pool (`v2p` and `p2v` of each band) lives in one int64
arena. The host arena (numpy) is the truth: the core reads and writes it
with no device round trip, so no allocator decision ever waits on the
device. The device arena mirrors it for the kernels that translate ids
during a forward. Writes mark their entries dirty; `commit()` ships the
dirty entries' current values in one upload and one scatter. On a
backend whose device memory is the host's (the sim backend), the two
arenas are one array and a commit has nothing to do.

The device arena is whatever the backend's `mirror` returns: the host
numpy array itself on the sim backend, a torch tensor on the CUDA backend.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class TableView(NamedTuple):
    """One band's tables: host arrays and their device mirrors."""

    v2p: np.ndarray
    p2v: np.ndarray
    v2p_dev: Any  # the backend's device array (`Backend.mirror`)
    p2v_dev: Any
    v2p_at: int  # offset of v2p in the arena
    p2v_at: int


class PageTables:
    """The arena of all page tables of one pool.

    Args:
        backend: supplies `mirror(host)` (the device arena) and
            `scatter(device, idx, values)`.
        sizes: (name, virtual entries, physical entries) per band.
    """

    def __init__(self, backend, sizes) -> None:
        self.backend = backend
        total = sum(v + p for _, v, p in sizes)
        self.host = np.full(total, -1, dtype=np.int64)
        self.device = backend.mirror(self.host)
        self.shared = bool(backend.shares_host_memory)
        self._dirty: list[np.ndarray] = []
        self.views: dict[str, TableView] = {}
        at = 0
        for name, nv, np_ in sizes:
            self.views[name] = TableView(self.host[at:at + nv], self.host[at + nv:at + nv + np_],
                                         self.device[at:at + nv], self.device[at + nv:at + nv + np_],
                                         at, at + nv)
            at += nv + np_
        self.reset()

    def reset(self) -> None:
        """Every entry unbound except entry 0 of each table (the sink)."""
        self.host.fill(-1)
        for view in self.views.values():
            view.v2p[0] = 0
            view.p2v[0] = 0
        self._dirty = []
        if not self.shared:  # a separate device arena: a torch tensor
            self.device.copy_(self.backend.upload(self.host))

    MAX_PENDING = 4096  # dirty batches kept before a commit is forced

    def touch(self, at: int, idx: np.ndarray) -> None:
        """Mark entries `at + idx` written (the device mirror is stale there).

        An engine that never reads the device tables would let the dirty
        list grow without bound, so past `MAX_PENDING` batches it commits.
        """
        if not self.shared and len(idx):
            self._dirty.append(idx + at)
            if len(self._dirty) >= self.MAX_PENDING:
                self.commit()

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def commit(self) -> None:
        """Bring the device mirror up to date: one upload, one scatter."""
        if not self._dirty:
            return
        # No dedup: a repeated entry ships the same (current) value twice,
        # cheaper than sorting the index list.
        idx = self._dirty[0] if len(self._dirty) == 1 else np.concatenate(self._dirty)
        self._dirty = []
        self.backend.scatter(self.device, idx, self.host[idx])

    def mirror_violations(self) -> list[str]:
        """The device mirror must equal the host tables (reads the device)."""
        if self.shared or self._dirty:
            return []
        if not np.array_equal(self.device.cpu().numpy(), self.host):
            return ["[tables] device page tables differ from the host tables"]
        return []

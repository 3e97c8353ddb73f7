"""The bytes every written slot must read back: distinct patterns, written
through the pool's buffer and kept in a host shadow indexed by virtual id."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from unikv.testing.device import host_ids, read_rows, write_rows

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool
    from unikv.testing.model import ChainModel


def pattern(stamps, entry_bytes: int) -> np.ndarray:
    """`[n, entry_bytes]` uint8 rows, distinct per stamp: its little-endian
    bytes (the first 8, or all of a shorter entry), then a stamp-dependent mix."""
    s = np.asarray(stamps, dtype=np.int64).reshape(-1, 1)
    j = np.arange(entry_bytes, dtype=np.int64).reshape(1, -1)
    rows = (((s * 2654435761) ^ (j * 40503) ^ (s * j * 97)) >> 5 & 0xFF).astype(np.uint8)
    k = min(8, entry_bytes)
    rows[:, :k] = s.astype("<i8").view(np.uint8).reshape(-1, 8)[:, :k]
    return rows


class ShadowBytes:
    """The expected bytes of every slot the engine wrote, indexed by virtual
    id (`pattern(stamp)` rows, so a check is one gather).

    Writes go through `write`: the pattern lands in the pool's buffer at the
    given physical slots and in the shadow at the virtual ids. Inactive
    (`materialized` False) when the pool keeps no bytes or `enabled` is
    False (a pool whose physical ids are bookkeeping only, the oracle).

    Args:
        pool: the pool under test.
        sizes: band -> ids of its id space (virtual token ids or state slots).
        enabled: whether to keep bytes at all.
    """

    def __init__(self, pool, sizes: dict[str, int], enabled: bool = True) -> None:
        self.materialized = enabled and pool.buffer is not None
        self.entry = {b.name: b.entry_bytes for b in pool.layout.bands}
        self.views = {n: pool.buffer_view(n) for n in sizes} if self.materialized else {}
        self.rows = ({n: np.zeros((s, self.entry[n]), dtype=np.uint8) for n, s in sizes.items()}
                     if self.materialized else {})

    def write(self, band: str, ids: np.ndarray, phys: np.ndarray | None, stamps) -> None:
        """Write `pattern(stamps)` at physical slots `phys` (buffer) and
        virtual ids `ids` (shadow); `phys` may be None only when the shadow
        is not materialised (nothing is written then).

        Raises:
            ValueError: `phys` is None on a materialised shadow.
        """
        if self.materialized and len(ids):
            if phys is None:
                raise ValueError(f"ShadowBytes.write: phys=None for band {band!r}; a materialised "
                                 "shadow needs the physical slots")
            rows = pattern(stamps, self.entry[band])
            write_rows(self.views[band], phys, rows)
            self.rows[band][ids] = rows

    def expected(self, band: str, ids: np.ndarray) -> np.ndarray:
        return self.rows[band][ids]

    def read(self, band: str, phys: np.ndarray) -> np.ndarray:
        return read_rows(self.views[band], phys)


def write_fresh(pool: UnifiedPool, shadow: ShadowBytes, model: ChainModel, band: str,
                ids: list[int]) -> None:
    """Write fresh patterns into `ids` of `band` through `pool.translate`
    (when the shadow keeps bytes) and mark them live in the model: the one
    write both drivers (the machine and the seeded driver) make."""
    if not ids:
        return
    t, stamps = host_ids(ids), model.new_stamps(len(ids))
    phys = host_ids(pool.translate(t, band)) if shadow.materialized else None
    shadow.write(band, t, phys, stamps)
    model.write(band, ids, stamps)

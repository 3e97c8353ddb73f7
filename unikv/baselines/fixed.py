"""A fixed byte split: each band owns a region sized at start-up."""

from __future__ import annotations

from collections.abc import Mapping

from unikv.bands import RegionBand
from unikv.layout import Layout
from unikv.pool import UnifiedPool


class StaticPartitionPool(UnifiedPool):
    """Each band owns a fixed byte region, sized by `fractions`.

    What serving engines do today: a ratio fixed at start-up. Freed pages
    are reused inside their region; nothing moves; a region's unused pages
    are stranded for every other band.

    Args:
        layout: the buffer and its bands (grow directions are ignored).
        backend: as for `UnifiedPool`.
        fractions: band name -> share of the bytes past the sink, in chain
            order; default an equal share each. Shares must be positive and
            sum to at most 1.
        ids: as for `UnifiedPool`.
    """

    band_classes = {"region": RegionBand}

    def __init__(self, layout: Layout, backend=None, fractions: Mapping[str, float] | None = None,
                 ids: str | None = None, **_ignored) -> None:
        if not isinstance(layout, Layout):
            raise ValueError(f"layout={layout!r} must be a unikv.Layout")
        self.fractions = self._check_fractions(layout, fractions)
        self._region_pages = self._split(layout, self.fractions)
        super().__init__(layout, backend, ids=ids)

    @staticmethod
    def _check_fractions(layout: Layout, fractions) -> dict[str, float]:
        if fractions is None:
            return {n: 1.0 / len(layout.bands) for n in layout.names}
        fractions = dict(fractions)
        if set(fractions) != set(layout.names):
            raise ValueError(f"fractions names {sorted(fractions)}; expected exactly {sorted(layout.names)}")
        bad = {n: f for n, f in fractions.items() if not isinstance(f, (int, float)) or not f > 0}
        if bad:
            raise ValueError(f"fractions {bad} must be positive numbers")
        if sum(fractions.values()) > 1 + 1e-9:
            raise ValueError(f"fractions sum to {sum(fractions.values()):.6g}; expected <= 1")
        return {n: float(f) for n, f in fractions.items()}

    @staticmethod
    def _split(layout: Layout, fractions: dict[str, float]) -> dict[str, tuple[int, int]]:
        usable = layout.total_bytes - layout.sink_bytes
        start = layout.sink_bytes
        regions = {}
        for g in layout:
            end = start + int(usable * fractions[g.band.name])
            lo = max(g.min_page, -(-start // g.page_bytes))
            hi = min(g.num_pages, end // g.page_bytes)
            if hi <= lo:
                raise ValueError(
                    f"fractions[{g.band.name!r}]={fractions[g.band.name]:.6g} gives band "
                    f"{g.band.name!r} {max(0, end - start)} bytes, less than one "
                    f"{g.page_bytes}-byte page"
                )
            regions[g.band.name] = (lo, hi)
            start = end
        return regions

    def _band_kind(self, band):
        return "region"

    def _regions(self):
        return self._region_pages

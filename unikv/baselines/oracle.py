"""The byte-budget oracle: any free byte serves any band."""

from __future__ import annotations

from unikv.bands import BudgetBand
from unikv.layout import Layout
from unikv.pool import UnifiedPool


class OraclePool(UnifiedPool):
    """A pure byte budget: any free byte serves any band, no geometry.

    The upper bound every layout is measured against. Physical ids are
    bookkeeping only, so a materialised buffer is refused.
    """

    band_classes = {"budget": BudgetBand}

    def __init__(self, layout: Layout, backend=None, ids: str | None = None, **_ignored) -> None:
        if backend is not None and getattr(backend, "materialized", False):
            raise ValueError("OraclePool has no byte layout; use a backend with materialize=False")
        super().__init__(layout, backend, ids=ids)

    def _band_kind(self, band):
        return "budget"

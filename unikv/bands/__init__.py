"""Band allocators, one mechanism per module, picked by a spec-to-class table."""

from unikv.bands.base import BandAllocator, BandContext
from unikv.bands.end import EndBand
from unikv.bands.float import FloatBand
from unikv.bands.region import BudgetBand, RegionBand
from unikv.layout import Grow

# How the unified pool realises each grow direction.
UNIFIED_BANDS = {Grow.UP: EndBand, Grow.DOWN: EndBand, Grow.FLOAT: FloatBand}

__all__ = [
    "BandAllocator", "BandContext", "EndBand", "FloatBand", "RegionBand",
    "BudgetBand", "UNIFIED_BANDS",
]

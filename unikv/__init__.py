"""unikv: one byte buffer for hybrid-model KV cache, and its simulator."""

from unikv.baselines import OraclePool, StaticPartitionPool
from unikv.layout import Band, Grow, Layout, Side, Unit
from unikv.pool import Compaction, UnifiedPool

__version__ = "0.1.0"

__all__ = [
    "Band", "Layout", "Grow", "Unit", "Side", "UnifiedPool", "Compaction",
    "StaticPartitionPool", "OraclePool", "__version__",
]

"""Pools that answer the unified pool's surface without its geometry: a
fixed byte split (what engines deploy today, and ratio sweeps) and the
byte-budget oracle every layout is measured against."""

from unikv.baselines.fixed import StaticPartitionPool
from unikv.baselines.oracle import OraclePool

__all__ = ["OraclePool", "StaticPartitionPool"]

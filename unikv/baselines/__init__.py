"""Pools that answer the unified pool's surface without its geometry: a
fixed byte split (what engines deploy today, and ratio sweeps), vLLM's one
block pool for every layer group, and the byte-budget oracle every layout is
measured against."""

from unikv.baselines.fixed import StaticPartitionPool
from unikv.baselines.oracle import OraclePool
from unikv.baselines.vllm import VllmPool

__all__ = ["OraclePool", "StaticPartitionPool", "VllmPool"]

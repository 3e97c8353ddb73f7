"""The conformance harness: one reference model, one byte shadow, one forward
model and one set of public checkers, driven two ways.

- `unikv.testing.machine` (needs hypothesis): `machine_for(kind, shapes,
  backend=...)`, the rule-based state machine for every pool kind
  (`pools.KINDS`) on any backend (`pools.sim_backend`,
  `pools.cuda_backend(device)`).
- `Driver(pool, rng)`: seeded random engine operations for long runs (the
  soak, per-module tests); `Driver.check()` runs the same invariant.

Every checker returns a list of violation strings (empty = healthy); see
`checks.pool_violations`. docs/fuzzing.md describes the whole harness.
"""

from unikv.testing.checks import pool_violations
from unikv.testing.device import HostEvents, host, host_ids
from unikv.testing.driver import Driver
from unikv.testing.forward import Forward
from unikv.testing.layouts import CHAINS, ENTRY_BYTES, make_layout
from unikv.testing.model import ChainModel, Request
from unikv.testing.pools import KINDS, cuda_backend, make_pool, sim_backend
from unikv.testing.random_ops import DEFAULT_WEIGHTS
from unikv.testing.shadow import ShadowBytes, pattern

__all__ = ["CHAINS", "DEFAULT_WEIGHTS", "ENTRY_BYTES", "KINDS", "ChainModel", "Driver", "Forward",
           "HostEvents", "Request", "ShadowBytes", "cuda_backend", "host", "host_ids", "make_layout",
           "make_pool", "pattern", "pool_violations", "sim_backend"]

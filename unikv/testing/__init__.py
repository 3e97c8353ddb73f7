"""Test support: a random-operation driver and invariant checker for pools.

`Driver(pool, rng)` plays the serving engine against a pool and keeps a
plain-Python model of what the engine holds; `Driver.check()` returns
violation strings (empty = healthy). See `driver.py` for the forward model.
"""

from unikv.testing.driver import Driver
from unikv.testing.model import Forward, Request
from unikv.testing.patterns import CHAINS, ENTRY_BYTES, make_layout, pattern_rows
from unikv.testing.random_ops import DEFAULT_WEIGHTS

__all__ = ["Driver", "Forward", "Request", "CHAINS", "ENTRY_BYTES", "make_layout",
           "pattern_rows", "DEFAULT_WEIGHTS"]

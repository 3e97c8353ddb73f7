"""The pools the conformance harness runs: every pool kind over a backend.

A backend factory takes the pool kind and returns the backend to build it
on: `sim_backend` (the CPU, real bytes except for the oracle) or
`cuda_backend(device)` (a `CudaBackend` whose forward events the harness
fires, see `device.HostEvents`).
"""

from __future__ import annotations

from collections.abc import Callable

from unikv import Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend
from unikv.baselines import VllmPool
from unikv.testing.device import HostEvents
from unikv.testing.layouts import grow_until_valid

KINDS = ("eager", "lazy", "static", "oracle",
         "vllm")
# Pools whose physical ids are bookkeeping only (no byte layout to shadow).
BOOKKEEPING_KINDS = ("oracle", "vllm")

# Core bugs the fuzzer found and tests/property/test_regressions.py pins
# (xfail until fixed). The machine steps around each one so it keeps fuzzing
# everything else; once the core is fixed, delete the entry and the machine
# checks it again. None is open: "ladder over a float" was the last
# (docs/fuzzing.md, bug 2).
KNOWN_BUGS: dict[str, str] = {}


def sim_backend(kind: str) -> SimBackend:
    """The sim backend for pool `kind`: materialised except for the
    `BOOKKEEPING_KINDS` (their physical ids are bookkeeping only)."""
    return SimBackend(materialize=kind not in BOOKKEEPING_KINDS)


def cuda_backend(device: str = "cuda") -> Callable[[str], HostEvents]:
    """A factory of `CudaBackend(device)` pools ("cpu" runs the same path
    on the CPU, Triton through its interpreter when TRITON_INTERPRET=1)."""
    def make(kind: str) -> HostEvents:
        from unikv.backends.cuda import CudaBackend  # torch and the kernels: only here

        return HostEvents(CudaBackend(device))
    make.__name__ = f"cuda_{device.replace(':', '_')}"
    return make


def make_pool(kind: str, layout: Layout, move_cap: int = 4096,
              backend: Callable[[str], object] = sim_backend) -> UnifiedPool:
    """A pool of `kind` (see `KINDS`) over `layout` on `backend(kind)`.

    Raises:
        ValueError: for an unknown kind (or a layout the kind refuses).
    """
    if kind == "oracle":
        return OraclePool(layout, backend=backend(kind))
    if kind == "static":
        return StaticPartitionPool(layout, backend=backend(kind))
    if kind == "vllm":  # blocks: the gcd of the bands' pages
        return VllmPool(layout, backend=backend(kind))
    if kind in ("eager", "lazy"):
        return UnifiedPool(layout, backend=backend(kind), compaction=kind, move_cap=move_cap)
    raise ValueError(f"kind={kind!r} is not one of {KINDS}")


def fit_layout(kind: str, layout: Layout) -> Layout:
    """`layout` grown until `kind` accepts it (a static split needs a page
    of every band inside its equal share)."""
    step = max(b.page_bytes for b in layout.bands)
    build = lambda t: make_pool(kind, Layout(total_bytes=t, bands=layout.bands)).layout  # noqa: E731
    return grow_until_valid(build, layout.total_bytes, step)


def known_core_bug(kind: str, layout: Layout) -> str | None:
    """The known bug (a `KNOWN_BUGS` key) this set-up trips at once, so the
    machine skips it; None otherwise. No open bug is set-up-wide now (the
    oracle's budget beyond a band's page grid was, until 2bbbfb8 fixed it:
    this skipped oracle layouts whose `(total - sink) // page_bytes`
    exceeded a band's usable pages)."""
    return None

"""Backends the allocator core runs against."""

from unikv.backends.base import Backend
from unikv.backends.sim import SimBackend, SimEvent

__all__ = ["Backend", "SimBackend", "SimEvent", "CudaBackend"]


def __getattr__(name: str):
    # The CUDA backend imports Triton lazily: CPU users never need it.
    if name == "CudaBackend":
        from unikv.backends.cuda import CudaBackend

        return CudaBackend
    raise AttributeError(name)

"""Paged attention over the pool's K/V pages: `paged_attention`.

`reference` (torch, the definition), `kernel` (the Triton kernel and its
checking launcher; imports Triton). `paged_attention` here dispatches: by
default the Triton launcher for CUDA tensors and the torch reference for CPU
tensors; `triton=True` asks for the launcher on any device (on CPU tensors it
runs Triton's interpreter when the process imported Triton with
`TRITON_INTERPRET=1`, else the reference, as every launcher does:
`unikv.kernels.launch.runs_triton`), `triton=False` for the reference. CPU
callers get the reference unless they ask, so a test suite that set
`TRITON_INTERPRET=1` for the kernel tests does not run model forwards
through the (slow) interpreter. Importing this package imports torch, never
Triton (the launcher is imported on the first call that needs it). Called by
`unikv.sim.real.attention` (the transformers attention function).
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from unikv.kernels.attention import reference


@functools.lru_cache(maxsize=1)
def _has_triton() -> bool:
    # Without Triton (no `cuda` extra) CUDA tensors get the reference, as in CudaBackend.
    return importlib.util.find_spec("triton") is not None


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    cu_q: torch.Tensor, seq_lens: torch.Tensor, *, scale: float, window: int | None = None,
                    sinks: torch.Tensor | None = None, softcap: float | None = None,
                    out: torch.Tensor | None = None, triton: bool | None = None) -> torch.Tensor:
    """Causal paged attention, dispatched (see `reference.paged_attention`
    for the arguments, returns and errors).

    Args:
        triton: None: the Triton launcher for CUDA `q` (when Triton is
            installed), else the reference;
            True: the launcher (see module docstring); False: the reference.
    """
    if triton is None:
        triton = isinstance(q, torch.Tensor) and q.is_cuda and _has_triton()
    if triton:
        from unikv.kernels.attention.kernel import paged_attention as launch

        return launch(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale, window=window, sinks=sinks,
                      softcap=softcap, out=out)
    return reference.paged_attention(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale, window=window,
                                     sinks=sinks, softcap=softcap, out=out)


__all__ = ["paged_attention", "reference"]

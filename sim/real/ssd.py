"""Mamba-2's chunked scan for a prefill chunk, as engines run it.

A Nemotron-H prefill chunk runs transformers' plain-torch chunked scan
(`mamba2_chunk_scan`, modeling_nemotron_h.py) where `mamba_ssm` is not
installed, as on the GPU machine here, and a decode token's state update
its plain-torch `mamba2_selective_state_update` (broadcast products over
the whole state: about 6 GB of traffic a Mamba-2 layer at batch 256 for
Nemotron-3-Nano, where engines read and write each state row once). In transformers 5.17 that function
forms each of the scan's five contractions as a broadcast product summed
over one axis: for a 4,096-token chunk of Nemotron-3-Nano (64 heads, head
dim 64, state 128, chunks of 128 tokens) the products are 2-17 GB of fp32
per Mamba-2 layer, about 45 GB written and read back in each of its 23
Mamba-2 layers (docs/real_executor.md, "Where a hybrid's prefill chunk
spends its time"); transformers 5.24 writes them as einsums. Serving
engines scan with mamba_ssm's Triton kernels (vLLM's and SGLang's
`mamba_chunk_scan_combined`).

`chunk_scan` (transformers' signature) runs `unikv.kernels.ssd.chunk_scan`:
four Triton kernels of the SSD algorithm on CUDA, its einsum reference
(fp32) on the CPU. `kernel_chunk_scan()` puts it in place of the module's
`mamba2_chunk_scan` for the duration of a `with` block; the real executor
wraps the forwards of a model with Mamba-2 mixers in it (`RealExecutor`,
`benchmarks/profile_model.py`). `einsum_chunk_scan()` swaps in the einsum
reference on every device (`benchmarks/profile_state_prefill.py --scans`
measures each). Outside the block transformers' own function runs, so a
reference generation with transformers' cache is untouched.
`kernel_chunk_scan()` also puts `state_update` (unikv's Triton decode
update, `unikv.kernels.ssd.update`) in place of the module's
`mamba2_selective_state_update`; the decode graphs of a model with such a
mixer run their bucket forwards inside it (`sim.real.graphs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

MIXER = "NemotronHMamba2Mixer"
"""The mixer class whose module's scan `swap_chunk_scan` replaces."""


def chunk_scan(hidden_states, dt, A, B, C, chunk_size: int, D=None, dt_bias=None, initial_states=None,
               dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
               return_final_states: bool = False, **kwargs: Any):
    """transformers' `mamba2_chunk_scan` (same arguments, same result up to
    fp32 rounding) through `unikv.kernels.ssd.model_scan`: its Triton
    kernels on CUDA (as engines scan), its einsum reference elsewhere
    (also under Triton's interpreter).
    Inside a `torch.compile` trace it is the opaque operator
    `unikv::ssd_chunk_scan` (`unikv.kernels.ssd.scan_op`, registered by
    `kernel_chunk_scan` before any trace).

    Shapes: `hidden_states` [b, t, h, p]; `dt` [b, t, h]; `A` [h]; `B`, `C`
    [b, t, g, n]; `D`, `dt_bias` [h]; `initial_states` [b, h, p, n]. Returns
    the output [b, t, h, p] in fp32 (as transformers' does), and with
    `return_final_states` the state after the last token [b, h, p, n]
    (fp32). Extra keyword arguments (`z=None`, the caller's kwargs) are
    ignored, as transformers' function ignores them.
    """
    import torch

    from unikv.kernels import ssd

    if torch.compiler.is_compiling():  # registered before any trace (`kernel_chunk_scan`)
        out, final = torch.ops.unikv.ssd_chunk_scan(hidden_states, dt, A, B, C, D, dt_bias, initial_states,
                                                    int(chunk_size), bool(dt_softplus), float(dt_limit[0]),
                                                    float(dt_limit[1]))
    else:
        out, final = ssd.model_scan(hidden_states, dt, A, B, C, int(chunk_size), D, dt_bias, initial_states,
                                    bool(dt_softplus), tuple(dt_limit))
    return (out, final) if return_final_states else out


def state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus: bool = False, z=None,
                 **kwargs: Any):
    """transformers' `mamba2_selective_state_update` (same arguments, the
    state updated in place, the same output up to rounding) through
    `unikv.kernels.ssd.update.model_update`: one Triton kernel on CUDA (as
    engines update a decode token's state, reading and writing each
    state row once), its torch reference elsewhere. Inside a
    `torch.compile` trace (a compiled prefill chunk of one token takes
    this path) it is the operator `unikv::ssd_state_update`
    (`unikv.kernels.ssd.update.update_op`). Nemotron-H's mixer
    passes `z=None` (its gate goes to the norm); a gate here is refused.

    Raises:
        ValueError: `z` given (transformers' function would gate the output).
    """
    import torch

    from unikv.kernels.ssd.update import model_update

    if z is not None:
        raise ValueError("state_update: z (an output gate) given; Nemotron-H's mixer gates in its norm and passes "
                         "z=None, the only call this replaces")
    if torch.compiler.is_compiling():  # registered before any trace (`kernel_chunk_scan`)
        return torch.ops.unikv.ssd_state_update(state, hidden_states, dt, A, B, C, D, dt_bias, bool(dt_softplus))
    return model_update(state, hidden_states, dt, A, B, C, D, dt_bias, bool(dt_softplus))


def reference_chunk_scan(hidden_states, dt, A, B, C, chunk_size: int, D=None, dt_bias=None, initial_states=None,
                         dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
                         return_final_states: bool = False, **kwargs: Any):
    """`chunk_scan` through the einsum reference on every device (no kernels)."""
    from unikv.kernels import ssd

    out, final = ssd.chunk_scan(hidden_states, dt, A, B, C, int(chunk_size), D, dt_bias, initial_states,
                                bool(dt_softplus), tuple(dt_limit), triton=False)
    return (out, final) if return_final_states else out


def has_mixer(model) -> bool:
    """Whether `model` holds a Mamba-2 mixer whose module scans with
    `mamba2_chunk_scan` (Nemotron-H)."""
    return any(type(m).__name__ == MIXER for m in model.modules())


def scan_for(model):
    """The context a forward of `model` runs in: `kernel_chunk_scan` for a
    model with such a mixer, `contextlib.nullcontext` otherwise. Decided
    once per model (it walks the modules), outside any timed forward."""
    return kernel_chunk_scan if has_mixer(model) else contextlib.nullcontext


@contextlib.contextmanager
def swap_chunk_scan(scan, update=None) -> Iterator[None]:
    """Within the block, transformers' Nemotron-H mixers scan with `scan`
    (transformers' signature) and, with `update`, update a decode token's
    state with it (`mamba2_selective_state_update`'s signature); the
    module's own functions are back after it."""
    from transformers.models.nemotron_h import modeling_nemotron_h as module

    saved = module.mamba2_chunk_scan, module.mamba2_selective_state_update
    module.mamba2_chunk_scan = scan
    if update is not None:
        module.mamba2_selective_state_update = update
    try:
        yield
    finally:
        module.mamba2_chunk_scan, module.mamba2_selective_state_update = saved


def kernel_chunk_scan():
    """`swap_chunk_scan(chunk_scan, state_update)`: the scan's and the
    decode update's kernels on CUDA (the executor's). Registers the
    operators `chunk_scan` and `state_update` call inside a compiled trace
    first (dynamo cannot trace the registration)."""
    from unikv.kernels.ssd import scan_op
    from unikv.kernels.ssd.update import update_op

    scan_op()
    update_op()
    return swap_chunk_scan(chunk_scan, state_update)


def einsum_chunk_scan():
    """`swap_chunk_scan(reference_chunk_scan)`: the einsum reference on every device."""
    return swap_chunk_scan(reference_chunk_scan)

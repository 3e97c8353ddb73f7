"""Mamba-2's chunked scan for a prefill chunk, written as contractions.

A Nemotron-H prefill chunk runs transformers' plain-torch chunked scan
(`mamba2_chunk_scan`, modeling_nemotron_h.py) where `mamba_ssm` is not
installed, as on the GPU machine here. In transformers 5.17 that function
forms each of the scan's five contractions as a broadcast product summed
over one axis: for a 4,096-token chunk of Nemotron-3-Nano (64 heads, head
dim 64, state 128, chunks of 128 tokens) the products are 2-17 GB of fp32
per Mamba-2 layer, about 45 GB written and read back in each of its 23
Mamba-2 layers (docs/real_executor.md, "Where a hybrid's prefill chunk
spends its time"). `chunk_scan` computes the same quantities, in the same
order of steps and in fp32, with each contraction one `torch.einsum`, so
no product larger than its result is materialised. transformers 5.24
writes the scan so too.

`einsum_chunk_scan()` puts `chunk_scan` in place of the module's
`mamba2_chunk_scan` for the duration of a `with` block; the real executor
wraps the forwards of a model with Mamba-2 mixers in it (`RealExecutor`,
`benchmarks/profile_model.py`). Outside the block transformers' own
function runs, so a reference generation with transformers' cache is
untouched. The decode path (one token, `selective_state_update`) does not
scan and is not affected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

MIXER = "NemotronHMamba2Mixer"
"""The mixer class whose module's scan `einsum_chunk_scan` replaces."""


def chunk_scan(hidden_states, dt, A, B, C, chunk_size: int, D=None, dt_bias=None, initial_states=None,
               dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
               return_final_states: bool = False, **kwargs: Any):
    """transformers' `mamba2_chunk_scan` (same arguments, same result up to
    fp32 rounding), each contraction one einsum.

    Shapes: `hidden_states` [b, t, h, p]; `dt` [b, t, h]; `A` [h]; `B`, `C`
    [b, t, g, n]; `D`, `dt_bias` [h]; `initial_states` [b, h, p, n]. Returns
    the output [b, t, h, p] in fp32 (as transformers' does), and with
    `return_final_states` the state after the last token [b, h, p, n]
    (fp32). Extra keyword arguments (`z=None`, the caller's kwargs) are
    ignored, as transformers' function ignores them.
    """
    import torch
    import torch.nn.functional as F
    from transformers.models.nemotron_h.modeling_nemotron_h import (
        pad_tensor_by_size,
        reshape_into_chunks,
        segment_sum,
    )

    batch, length, heads, head_dim = hidden_states.shape
    groups = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])

    x = hidden_states.float()
    B = B.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    C = C.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    pad = (chunk_size - length % chunk_size) % chunk_size
    skip = D[..., None] * pad_tensor_by_size(x, pad) if D is not None else None

    # discretise: x dt, A dt; then chunks of chunk_size tokens (c chunks of l tokens)
    x = x * dt[..., None].float()
    A = A.to(x.dtype) * dt.float()
    x, A, B, C = (reshape_into_chunks(t, pad, chunk_size) for t in (x, A, B, C))
    A = A.permute(0, 3, 1, 2)  # [b, h, c, l]
    A_cumsum = torch.cumsum(A, dim=-1)

    # 1. within each chunk: y_l = sum_s (C_l . B_s) exp(sum of A over (s, l]) x_s, s <= l
    decay = torch.exp(segment_sum(A))  # [b, h, c, l, s]
    scores = torch.einsum("bclhn,bcshn->bhcls", C, B) * decay
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, x)

    # 2. each chunk's own contribution to the state at its end
    to_end = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)  # [b, h, c, l]
    chunk_states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, to_end, x)

    # 3. the state entering each chunk: the chunks' states carried across chunk boundaries
    start = (initial_states[:, None].to(dtype=chunk_states.dtype, device=chunk_states.device)
             if initial_states is not None else torch.zeros_like(chunk_states[:, :1]))
    chunk_states = torch.cat([start, chunk_states], dim=1)  # [b, c + 1, h, p, n]
    carry = torch.exp(segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))  # [b, h, c + 1, c + 1]
    entering = torch.einsum("bhij,bjhpn->bihpn", carry, chunk_states)
    states, final_state = entering[:, :-1], entering[:, -1]

    # 4. what the state entering a chunk gives each of its tokens
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(A_cumsum))

    out = (y_diag + y_off).reshape(batch, -1, heads, head_dim)
    if skip is not None:
        out = out + skip
    if pad > 0:
        out = out[:, :length]
    if return_final_states:
        return out, final_state
    return out


def has_mixer(model) -> bool:
    """Whether `model` holds a Mamba-2 mixer whose module scans with
    `mamba2_chunk_scan` (Nemotron-H)."""
    return any(type(m).__name__ == MIXER for m in model.modules())


def scan_for(model):
    """The context a forward of `model` runs in: `einsum_chunk_scan` for a
    model with such a mixer, `contextlib.nullcontext` otherwise. Decided
    once per model (it walks the modules), outside any timed forward."""
    return einsum_chunk_scan if has_mixer(model) else contextlib.nullcontext


@contextlib.contextmanager
def einsum_chunk_scan() -> Iterator[None]:
    """Within the block, transformers' Nemotron-H mixers scan with
    `chunk_scan`; the module's own function is back after it."""
    from transformers.models.nemotron_h import modeling_nemotron_h as module

    saved = module.mamba2_chunk_scan
    module.mamba2_chunk_scan = chunk_scan
    try:
        yield
    finally:
        module.mamba2_chunk_scan = saved

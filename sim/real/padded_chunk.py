"""A Mamba-2 prefill chunk padded to a bucket: the conv and the scan stop at a length held on the device.

A captured packed step (`sim.real.packed_graphs.PackedGraphs`) pads its
tokens up to the bucket's size. Attention, norms, matmuls and the MoE see
each token alone or through a per-request mask, so padding rows change no
real row. A Mamba-2 mixer does not: transformers' chunk path
(`NemotronHMamba2Mixer.forward`, modeling_nemotron_h.py, 5.17 and 5.24)
keeps the last `d_conv` columns of the whole input as the conv state and
the scan's state after the last token, so padding would reach the state
the next chunk reads. Serving engines pass the real token count to their
Mamba kernels instead (vLLM's `MambaMixer2` reads `num_actual_tokens` and
the per-request query start locations from its metadata; its piecewise
CUDA graphs run the mixer outside the graph for that reason). Here the
length is a device tensor the bucket fills, so the whole chunk, mixers
included, is one captured graph:

- conv: the request's last `d_conv - 1` conv inputs (zeros for a first
  chunk) are put before the chunk's, the depthwise conv runs without
  padding (each output sees its `d_conv` inputs, as transformers' padded
  `causal_conv1d_fn` then `[-seq_len:]` does), and the new conv state is
  the `d_conv - 1` columns that end at the length (an index the device
  computes);
- scan: dt' = clamp(softplus(dt + bias)) is formed first, in dt's dtype
  as transformers forms it (`unikv.kernels.ssd.reference.process_dt`), and
  set to exactly 0 on every padding token (after the clamp: Nemotron-H's
  `time_step_limit` starts above 0), so a padding token's decay is
  exp(0) = 1 and its input dt' B x is 0, and the state after the last
  padding token is the state after the last real one; the scan then runs
  with no bias, softplus or clamp; outputs are causal, so no real row
  reads a padding token;
- padding rows can hold anything, NaN included (the padding request's
  attention reads the pool's sink, whose bytes a CUDA pool never cleared),
  so their conv outputs x, B, C are replaced by 0 (`torch.where`, not a
  product: 0 x NaN is NaN) before the scan, and no padding value reaches a
  state;
- the gated norm and the out projection are per token.

Inside `sim.real.mixers.served_mixers(model)` a mixer runs `padded_forward`
for a cache that carries a `ChunkLength` as `unikv_chunk` (the packed
bucket's static cache, and the `sim.real.hybrid.LayerCache` its compiled
blocks get), and transformers' own forward otherwise. The state tensors
are the cache's (transformers' `conv_states[0]`, `d_conv` columns of which
the oldest reaches no kept output, and `recurrent_states[0]`), updated in
place, so the state binder's gather before the forward and scatter after
it are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unikv.sim.real.state import conv_state, recurrent_state

CHUNK_ATTR = "unikv_chunk"
"""The attribute of a cache that carries the padded chunk's `ChunkLength`."""


@dataclass(frozen=True)
class ChunkLength:
    """The real extent of a padded one-request chunk, on the device.

    Attributes:
        length: `[1]` int64, the chunk's real tokens (at most the bucket's).
        fresh: `[1]` bool, the chunk starts the request (its state is zero,
            whatever the gathered slot holds).
    """

    length: Any
    fresh: Any


def padded_forward(mixer, hidden_states, cache, chunk: ChunkLength, attention_mask=None) -> Any:
    """The mixer's output `[1, T, hidden]` for a chunk padded to T tokens
    whose first `chunk.length` are real (module docstring); the cache's
    conv and SSM state of the mixer's layer end at the real length.

    Raises:
        ValueError: a batch of more than one sequence, an attention mask,
            or a cache that holds no state for the layer (the binder's
            static cache always does).
    """
    import torch
    import torch.nn.functional as F
    from transformers.activations import ACT2FN
    from unikv.sim.real.ssd import chunk_scan

    from unikv.kernels.ssd.reference import process_dt

    m = mixer
    b, t, _ = hidden_states.shape
    if b != 1 or attention_mask is not None:
        raise ValueError(f"padded_forward: layer {m.layer_idx}: a batch of {b} with mask "
                         f"{attention_mask is not None}; expected one padded chunk and no attention mask")
    conv, ssm = conv_state(cache, m.layer_idx), recurrent_state(cache, m.layer_idx)
    if conv is None or ssm is None:
        raise ValueError(f"padded_forward: layer {m.layer_idx}: the cache holds no conv / SSM state; expected "
                         "the state binder's static cache")
    dtype, device = hidden_states.dtype, hidden_states.device
    gate, xbc, dt = m.in_proj(hidden_states).split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
    k = m.conv_kernel_size
    fresh = chunk.fresh.view(1, 1, 1)
    prev = torch.where(fresh, torch.zeros((), dtype=conv.dtype, device=device), conv[..., 1:])
    seq = torch.cat([prev.to(xbc.dtype), xbc.transpose(1, 2)], dim=-1)  # [1, conv_dim, k - 1 + T]
    weight = m.conv1d.weight
    mixed = F.conv1d(seq.to(weight.dtype), weight, m.conv1d.bias, groups=m.conv_dim)  # [1, conv_dim, T]
    live = (torch.arange(t, device=device) < chunk.length).view(1, t, 1)
    zero = torch.zeros((), dtype=seq.dtype, device=device)
    # padding rows' x, B, C set to 0 (not multiplied: a padding row may hold NaN, read from the sink)
    mixed = torch.where(live.view(1, 1, t), ACT2FN[m.activation](mixed).to(seq.dtype), zero)
    # the conv state: the k - 1 inputs that end at the length (columns [n, n + k - 1) of seq)
    conv[..., 1:] = seq.index_select(-1, chunk.length + torch.arange(k - 1, device=device)).to(conv.dtype)

    groups = m.n_groups * m.ssm_state_size
    x, B, C = mixed.transpose(1, 2).split([m.intermediate_size, groups, groups], dim=-1)
    dt = process_dt(dt, m.dt_bias, True, m.time_step_limit)
    dt = torch.where(live, dt, torch.zeros((), dtype=dt.dtype, device=device))
    init = torch.where(chunk.fresh.view(1, 1, 1, 1), torch.zeros((), dtype=ssm.dtype, device=device), ssm)
    y, final = chunk_scan(x.reshape(1, t, m.num_heads, m.head_dim), dt, -torch.exp(m.A_log.float()),
                          B.reshape(1, t, m.n_groups, m.ssm_state_size), C.reshape(1, t, m.n_groups, m.ssm_state_size),
                          chunk_size=m.chunk_size, D=m.D, initial_states=init, return_final_states=True)
    ssm.copy_(final.to(ssm.dtype))
    y = m.norm(y.reshape(1, t, -1), gate)
    return m.out_proj(y.to(dtype))


def padded_ready(model) -> str | None:
    """Why `model`'s prefill chunks cannot run padded (None: they can):
    every recurrent layer must be a Mamba-2 mixer `padded_forward` knows
    (a short-conv layer, LFM2's, keeps transformers' unpadded path)."""
    from unikv.sim.real.mixers import mamba2_only

    why = mamba2_only(model, "padded chunk path")
    return None if why is None else f"{why}; their prefill chunks run uncaptured"


def carry(cache, chunk: ChunkLength) -> Any:
    """`cache` carrying `chunk` (as `CHUNK_ATTR`); returns the cache."""
    setattr(cache, CHUNK_ATTR, chunk)
    return cache

"""A Mamba-2 decode token updates its state where the pool keeps it, as serving engines do.

transformers' one-token path (`NemotronHMamba2Mixer.forward`,
modeling_nemotron_h.py) reads and writes a dense `[B, ...]` state per layer
that the cache holds, so the state binder gathers the batch's state from
the pool's slots before the forward and scatters it back after
(`sim.real.state.StateBinder`): for Nemotron-3-Nano at batch 256 that is
about 12 GB of SSM state read and written twice a step, ~21 ms of a
61 ms step on the H200 (docs/real_executor.md). Engines keep the state in
their pool and pass each request's slot to the kernels instead: vLLM's
`MambaMixer2` hands `state_indices_tensor` to `causal_conv1d_update`
(`conv_state_indices`) and to `selective_state_update` (`state_batch_indices`),
vllm/model_executor/layers/mamba/mamba_mixer2.py; SGLang's Mamba-2 mixer
does the same with its `MambaPool` indices.

`slot_forward` is the mixer's one-token step with the state in the slots
`DecodeSlots.slots` names:

- conv: the slot's `d_conv - 1` conv inputs and the token's are one window
  `[B, conv_dim, d_conv]`, convolved as transformers' `causal_conv1d_update`
  does (`F.conv1d` without padding, in the conv weight's dtype, the
  activation, then the input dtype); the window's newest `d_conv - 1`
  columns are written back to the slot (a gather and an index write of
  `conv_dim x (d_conv - 1)` values a row);
- SSM: unikv's update kernel (`unikv.kernels.ssd.update.model_update`)
  reads and writes each row's state in its slot (`state_indices`), as
  `selective_state_update` with `state_batch_indices` does; no copy of it
  is made (the torch reference on the CPU gathers, updates and scatters);
- the gated norm and the out projection as transformers'.

dt' is softplus(dt + bias) with no clamp, as transformers' one-token path
(its `time_step_limit` clamps only the chunked scan). Everything reads and
writes device tensors with no host read, so a decode bucket captures the
step; a padding row's slot is `sim.real.state.PAD_SLOT`, in the pool's sink.
The slot views are `StateViews` over the pool, the layout the binder uses
(conv in the model dtype, SSM in fp32: `sim.real.state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SLOTS_ATTR = "unikv_slots"
"""The attribute of a cache that carries the decode step's `DecodeSlots`."""


@dataclass(frozen=True)
class DecodeSlots:
    """Where a decode step's rows keep their recurrent state.

    Attributes:
        slots: `[B]` int64 on the model's device: row i's state slot in the
            pool (`pool.translate(state ids, band)`; padding rows
            `PAD_SLOT`), distinct for the real rows.
        views: the pool's `StateViews` holding each Mamba-2 layer's `conv`
            `[slots, conv_dim, d_conv - 1]` and `ssm` `[slots, heads,
            head_dim, d_state]`.
    """

    slots: Any
    views: Any


def slot_forward(mixer, hidden_states, decode: DecodeSlots, attention_mask=None) -> Any:
    """The mixer's output `[B, 1, hidden]` for one token per row, its conv
    and SSM state read from and written to the rows' slots (module
    docstring).

    Raises:
        ValueError: more than one token per row, an attention mask, or not
            one slot per row (the state untouched).
    """
    import torch
    import torch.nn.functional as F
    from transformers.activations import ACT2FN

    from unikv.kernels.ssd.update import model_update

    m = mixer
    b, t, _ = hidden_states.shape
    idx = decode.slots
    if t != 1 or attention_mask is not None or tuple(idx.shape) != (b,):
        raise ValueError(f"slot_forward: layer {m.layer_idx}: {t} tokens a row, mask "
                         f"{attention_mask is not None}, slots {tuple(idx.shape)} for {b} rows; expected one "
                         "token a row, no attention mask and one slot a row")
    conv = decode.views.get(m.layer_idx, "conv")
    ssm = decode.views.get(m.layer_idx, "ssm")
    dtype = hidden_states.dtype
    gate, xbc, dt = m.in_proj(hidden_states).split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
    weight = m.conv1d.weight
    window = torch.cat([conv[idx], xbc.transpose(1, 2).to(conv.dtype)], dim=-1).to(weight.dtype)
    conv[idx] = window[..., 1:].to(conv.dtype)
    mixed = F.conv1d(window, weight, m.conv1d.bias, groups=m.conv_dim)  # [B, conv_dim, 1]
    mixed = ACT2FN[m.activation](mixed).to(xbc.dtype).transpose(1, 2)

    groups = m.n_groups * m.ssm_state_size
    x, B, C = mixed.split([m.intermediate_size, groups, groups], dim=-1)
    p, n = m.head_dim, m.ssm_state_size
    A = -torch.exp(m.A_log.float())
    y = model_update(ssm, x.reshape(b, m.num_heads, p), dt.transpose(1, 2).expand(-1, -1, p),
                     A[:, None, None].expand(-1, p, n), B.reshape(b, m.n_groups, n), C.reshape(b, m.n_groups, n),
                     m.D[:, None].expand(-1, p), m.dt_bias[:, None].expand(-1, p), True, state_indices=idx)
    y = m.norm(y.reshape(b, 1, -1), gate)
    return m.out_proj(y.to(dtype))


def slot_ready(model) -> str | None:
    """Why `model`'s decode cannot update its state in the slots (None: it
    can): every recurrent layer must be a Mamba-2 mixer (LFM2's short conv
    keeps the binder's gather and scatter)."""
    from unikv.sim.real.mixers import mamba2_only

    return mamba2_only(model, "in-slot decode path")


def carry(cache, decode: DecodeSlots) -> Any:
    """`cache` carrying `decode` (as `SLOTS_ATTR`); returns the cache."""
    setattr(cache, SLOTS_ATTR, decode)
    return cache

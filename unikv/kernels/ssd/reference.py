"""Mamba-2's chunked scan (SSD) in torch: the Triton kernels' reference.

The scan, per head h of a sequence, with dt' = clamp(softplus(dt + bias))
(softplus when asked) and the head's group g:

    state_t = exp(dt'_t A_h) state_{t-1} + (dt'_t x_t) B_{g,t}^T      [p, n]
    y_t     = state_t C_{g,t} + D_h x_t                                  [p]

computed over chunks of `chunk_size` tokens as the SSD algorithm does
(Dao & Gu, "Transformers are SSMs", 2024, section 6): within a chunk a
masked, decayed (C B^T) product; each chunk's state at its end; the states
carried across chunk boundaries; what the state entering a chunk gives its
tokens. Everything is fp32, each contraction one `torch.einsum`, so no
product larger than its result is materialised. The steps and their order
are those of transformers' `mamba2_chunk_scan` (modeling_nemotron_h.py),
including where dt is rounded to its own dtype (the bias add and the
softplus run in dt's dtype), so the two agree to fp32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool,
               limit: tuple[float, float]) -> torch.Tensor:
    """dt' = clamp(softplus(dt + bias), *limit), in dt's dtype (as transformers)."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if softplus:
        dt = F.softplus(dt)
    return torch.clamp(dt, min=limit[0], max=limit[1])


def _chunks(t: torch.Tensor, pad: int, size: int) -> torch.Tensor:
    """[b, T, ...] zero-padded by `pad` tokens into [b, c, size, ...]."""
    t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.reshape(t.shape[0], -1, size, *t.shape[2:])


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """[..., l] -> [..., l, l]: entry (i, j) is x[j+1] + ... + x[i] for
    j <= i, and -inf above the diagonal (so its exp is 0)."""
    n = x.shape[-1]
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=-1)
    seg = x[..., None].expand(*x.shape, n).masked_fill(~lower, 0).cumsum(dim=-2)
    return seg.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device)), float("-inf"))


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
               initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, float("inf"))) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan (module docstring). Shapes: `x` [b, t, h, p]; `dt` [b, t, h];
    `A` [h]; `B`, `C` [b, t, g, n] (h a multiple of g); `D`, `dt_bias` [h];
    `initial_states` [b, h, p, n]. Returns (y [b, t, h, p], the state after
    the last token [b, h, p, n]), both fp32."""
    batch, length, heads, head_dim = x.shape
    groups = B.shape[2]
    dt = process_dt(dt, dt_bias, dt_softplus, dt_limit)

    xf = x.float()
    Bf = B.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    Cf = C.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    pad = (chunk_size - length % chunk_size) % chunk_size
    skip = D[..., None].float() * xf if D is not None else None

    xs = xf * dt[..., None].float()  # x dt
    dA = A.float() * dt.float()  # A dt, [b, t, h]
    xs, Bf, Cf = (_chunks(t, pad, chunk_size) for t in (xs, Bf, Cf))
    dA = _chunks(dA[..., None], pad, chunk_size)[..., 0].permute(0, 3, 1, 2)  # [b, h, c, l]
    cum = torch.cumsum(dA, dim=-1)

    # 1. within each chunk: y_l = sum_{s <= l} (C_l . B_s) exp(sum of dA over (s, l]) x_s dt_s
    scores = torch.einsum("bclhn,bcshn->bhcls", Cf, Bf) * torch.exp(_segment_sum(dA))
    y = torch.einsum("bhcls,bcshp->bclhp", scores, xs)

    # 2. each chunk's own contribution to the state at its end
    to_end = torch.exp(cum[..., -1:] - cum)  # [b, h, c, l]
    own = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bf, to_end, xs)

    # 3. the state entering each chunk: the chunks' states carried across boundaries
    start = (initial_states[:, None].to(dtype=own.dtype, device=own.device) if initial_states is not None
             else torch.zeros_like(own[:, :1]))
    own = torch.cat([start, own], dim=1)  # [b, c + 1, h, p, n]
    carry = torch.exp(_segment_sum(F.pad(cum[..., -1], (1, 0))))  # [b, h, c + 1, c + 1]
    entering = torch.einsum("bhij,bjhpn->bihpn", carry, own)

    # 4. what the state entering a chunk gives each of its tokens
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Cf, entering[:, :-1], torch.exp(cum))
    out = y.reshape(batch, -1, heads, head_dim)[:, :length]
    if skip is not None:
        out = out + skip
    return out, entering[:, -1]

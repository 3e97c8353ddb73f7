"""The Triton kernel of Mamba-2's decode step: contract and semantics in
`unikv.kernels.ssd.update` (its `state_update` dispatches here). Imports
Triton."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from unikv.kernels.launch import cdiv, next_pow2
from unikv.kernels.ssd.kernel import MAX_DIM, _round_as

TILE = 2048
"""Elements of a program's state tile: BP = TILE // n head dims (at most p)."""

__all__ = ["MAX_DIM", "TILE", "kernel_update"]


@triton.jit
def _softplus(d):
    # torch's softplus, threshold 20: log1p(exp(d)), log1p by Kahan's exact-ratio trick
    e = tl.exp(tl.minimum(d, 20.0))
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(d > 20.0, d, lp)


@triton.jit
def _update_kernel(st_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, bias_ptr, idx_ptr, out_ptr,
                   H, P, N, RATIO,
                   s_sb, s_sh, s_sp, s_sn, s_xb, s_xh, s_xp, s_tb, s_th, s_tp, s_ah, s_ap, s_an,
                   s_bb, s_bg, s_bn, s_cb, s_cg, s_cn, s_dh, s_dp, s_zh, s_zp,
                   HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                   HAS_INDEX: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    g = h // RATIO
    ps = tl.program_id(2) * BP + tl.arange(0, BP)
    ns = tl.arange(0, BN)
    pm = ps < P
    nm = ns < N
    tile = pm[:, None] & nm[None, :]
    kind = x_ptr.dtype.element_ty  # x, dt, B and C share it
    slot = row
    if HAS_INDEX:
        slot = tl.load(idx_ptr + row).to(tl.int64)
    x = tl.load(x_ptr + row * s_xb + h * s_xh + ps * s_xp, mask=pm, other=0.0).to(tl.float32)
    d = tl.load(dt_ptr + row * s_tb + h * s_th + ps * s_tp, mask=pm, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = _round_as(tl.load(bias_ptr + h * s_zh + ps * s_zp, mask=pm, other=0.0).to(tl.float32), kind)
        d = _round_as(d + bias, kind)
    if SOFTPLUS:
        d = _round_as(_softplus(d), kind)
    a = tl.load(a_ptr + h * s_ah + ps[:, None] * s_ap + ns[None, :] * s_an, mask=tile, other=0.0)
    da = tl.exp(d[:, None] * a.to(tl.float32))
    bb = tl.load(b_ptr + row * s_bb + g * s_bg + ns * s_bn, mask=nm, other=0.0).to(tl.float32)
    cc = tl.load(c_ptr + row * s_cb + g * s_cg + ns * s_cn, mask=nm, other=0.0).to(tl.float32)
    dbx = _round_as(_round_as(d[:, None] * bb[None, :], kind) * x[:, None], kind)
    at = st_ptr + slot * s_sb + h * s_sh + ps[:, None] * s_sp + ns[None, :] * s_sn
    held = st_ptr.dtype.element_ty
    new = tl.load(at, mask=tile, other=0.0).to(tl.float32) * da + dbx
    tl.store(at, _round_as(new, held).to(held), mask=tile)
    y = _round_as(tl.sum(_round_as(new, kind) * cc[None, :], axis=1), kind)
    if HAS_D:  # x D and the add in promote(x, D) (D is x's dtype or fp32), then x's dtype
        dk = d_ptr.dtype.element_ty
        xd = _round_as(x * tl.load(d_ptr + h * s_dh + ps * s_dp, mask=pm, other=0.0).to(tl.float32), dk)
        y = _round_as(_round_as(y + xd, dk), kind)
    tl.store(out_ptr + (row * H + h) * P + ps, y.to(kind), mask=pm)


def kernel_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                  dt_softplus: bool = False, state_indices: torch.Tensor | None = None) -> torch.Tensor:
    """The step through `_update_kernel` (arguments checked by the caller,
    n <= MAX_DIM); any strides, no copies. Returns out [b, h, p], contiguous."""
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[2]
    out = torch.empty((b, h, p), dtype=x.dtype, device=x.device)
    bn = max(16, next_pow2(n))
    bp = min(next_pow2(p), max(1, TILE // bn))
    d_arg, d_strides = (D, D.stride()) if D is not None else (x, (0, 0))
    z_arg, z_strides = (dt_bias, dt_bias.stride()) if dt_bias is not None else (x, (0, 0))
    _update_kernel[(b, h, cdiv(p, bp))](
        state, x, dt, A, B, C, d_arg, z_arg, state_indices if state_indices is not None else x, out,
        h, p, n, h // g, *state.stride(), *x.stride(), *dt.stride(), *A.stride(), *B.stride(), *C.stride(),
        *d_strides, *z_strides, HAS_D=D is not None, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
        HAS_INDEX=state_indices is not None, BP=bp, BN=bn, num_warps=4)
    return out

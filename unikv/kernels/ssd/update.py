"""Mamba-2's one-token decode step (`selective_state_update`) as a Triton kernel.

Per head h of a batch row, its group g = h // (heads / groups), and dt' =
softplus(dt + bias) (softplus when asked):

    state <- exp(dt' A) * state + (dt' B_g) * x                     [p, n]
    out    = state C_g + D x                                         [p]

`reference_update` is transformers' plain-torch `mamba2_selective_state_
update` (modeling_nemotron_h.py) written from these steps, with its
roundings: in a 16-bit model dtype the bias add, the softplus, dt' B, its
product with x, the state cast for the C product, that product, x D and
the final add round to the model dtype; exp(dt' A) and state * dA + dBx
run in fp32. Its broadcast products are [b, h, p, n] each (about 6 GB a
Mamba-2 layer at batch 256 for Nemotron-3-Nano).

`_update_kernel` computes the same, as serving engines run it (mamba_ssm's
and vLLM's `selective_state_update`), written here from the steps above:
one program per (batch row, head, block of head dims) loads its [BP, n]
tile of the state once, writes it once and reduces it against C for its
rows of out, rounding where transformers rounds (16-bit by the bits, as
`kernel._round_as`). `state_indices` picks the state row each batch row
updates in a larger tensor (a pool's slots). No host reads: the launch is
CUDA-graph safe.

`state_update` checks the arguments (metadata only) and runs the kernel on
CUDA tensors or under Triton's interpreter, the reference otherwise;
`model_update` is the step a model's forward runs (the kernel on CUDA,
never the interpreter). Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from unikv.kernels.launch import cdiv, next_pow2, runs_triton
from unikv.kernels.ssd.kernel import MAX_DIM, _round_as

OP = "ssd.state_update"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
TILE = 2048
"""Elements of a program's state tile: BP = TILE // n head dims (at most p)."""


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


def _float(t, name: str, kinds=None) -> None:
    if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point or (kinds and t.dtype not in kinds):
        want = "a float torch.Tensor" if not kinds else f"a torch.Tensor of {', '.join(map(str, kinds))}"
        raise ValueError(f"{OP}: {name} must be {want}, got {getattr(t, 'dtype', type(t).__name__)}")


def check_args(state, x, dt, A, B, C, D, dt_bias, state_indices) -> None:
    """ValueError (one line, the argument named) unless: `x` [b, h, p] and
    `dt`, `B`, `C` of x's dtype (fp32, bf16 or fp16); `dt` [b, h, p], `A`
    [h, p, n], `B` / `C` [b, g, n] with g dividing h, `D` / `dt_bias` [h,
    p] (D of x's dtype or fp32); `state` [b, h, p, n] fp32 / bf16 / fp16,
    or [slots, h, p, n] with `state_indices` int64 / int32 [b]; `state`
    not an expanded view; one device. Reads no device memory."""
    _float(x, "x", FLOATS)
    if x.dim() != 3:
        raise ValueError(f"{OP}: x has shape {tuple(x.shape)}; expected [batch, heads, head_dim]")
    b, h, p = x.shape
    for name, t in {"dt": dt, "A": A, "B": B, "C": C, "D": D, "dt_bias": dt_bias, "state": state}.items():
        if t is not None or name not in ("D", "dt_bias"):
            _float(t, name, FLOATS if name == "state" else None)
    if B.dim() != 3 or B.shape[0] != b or B.shape[1] < 1 or h % B.shape[1]:
        raise ValueError(f"{OP}: B has shape {tuple(B.shape)}; expected [{b}, groups, state] with groups "
                         f"dividing the {h} heads")
    g, n = B.shape[1], B.shape[2]
    slots = state.shape[0] if state_indices is not None and state.dim() == 4 else b
    want = {"dt": (b, h, p), "A": (h, p, n), "C": (b, g, n), "D": (h, p), "dt_bias": (h, p),
            "state": (slots, h, p, n)}
    named = {"dt": dt, "A": A, "C": C, "D": D, "dt_bias": dt_bias, "state": state}
    for name, shape in want.items():
        t = named[name]
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{OP}: {name} has shape {tuple(t.shape)}; expected {list(shape)}")
    for name, t in {"dt": dt, "B": B, "C": C}.items():
        if t.dtype != x.dtype:
            raise ValueError(f"{OP}: {name} has dtype {t.dtype}; expected x's {x.dtype}")
    if D is not None and D.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"{OP}: D has dtype {D.dtype}; expected x's {x.dtype} or torch.float32")
    if any(st == 0 and size > 1 for st, size in zip(state.stride(), state.shape)):
        raise ValueError(f"{OP}: state has strides {state.stride()}; it is written in place, not an expanded view")
    _check_indices(state_indices, b)
    tensors = [state, x, dt, A, B, C, D, dt_bias, state_indices]
    devices = {str(t.device) for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"{OP}: tensors on several devices {sorted(devices)}; expected one")


def _check_indices(state_indices, batch: int) -> None:
    if state_indices is None:
        return
    if not isinstance(state_indices, torch.Tensor) or state_indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{OP}: state_indices must be an int64 or int32 torch.Tensor, got "
                         f"{getattr(state_indices, 'dtype', type(state_indices).__name__)}")
    if tuple(state_indices.shape) != (batch,):
        raise ValueError(f"{OP}: state_indices has shape {tuple(state_indices.shape)}; expected [{batch}]")


def reference_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                     C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                     dt_softplus: bool = False, state_indices: torch.Tensor | None = None) -> torch.Tensor:
    """The step in plain torch (module docstring), as transformers computes
    it; `state` updated in place (rows `state_indices` when given: gather,
    update, scatter). Returns out [b, h, p] in x's dtype. Unchecked."""
    if state_indices is not None:
        rows = state[state_indices]
        out = reference_update(rows, x, dt, A, B, C, D, dt_bias, dt_softplus)
        state[state_indices] = rows
        return out
    heads, groups = x.shape[1], B.shape[1]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dA = torch.exp(dt.float()[..., None] * A.float())
    Bh = B.repeat_interleave(heads // groups, dim=1)  # [b, h, n]
    Ch = C.repeat_interleave(heads // groups, dim=1)
    new = state * dA + (dt[..., None] * Bh[:, :, None, :]) * x[..., None]
    state.copy_(new.to(state.dtype))
    out = torch.matmul(new.to(Ch.dtype), Ch[..., None])[..., 0]  # a batched matmul, as transformers' bmm
    if D is not None:
        out = (out + x * D).to(out.dtype)
    return out.to(x.dtype)


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


def state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                 dt_softplus: bool = False, state_indices: torch.Tensor | None = None,
                 triton: bool | None = None) -> torch.Tensor:
    """Mamba-2's decode step (module docstring): updates `state` in place
    and returns out [b, h, p] in x's dtype.

    Args:
        state: [b, h, p, n], or [slots, h, p, n] with `state_indices`.
        x: [b, h, p]; dt: [b, h, p]; A: [h, p, n]; B, C: [b, g, n];
            D, dt_bias: [h, p] (any strides, expanded views included).
        dt_softplus: dt' = softplus(dt + bias).
        state_indices: int64 / int32 [b], batch row i updates
            state[state_indices[i]] (distinct, in range: not checked).
        triton: None: the kernel where it runs (CUDA tensors, or the
            interpreter), else the reference; True: the kernel; False: the
            reference.
    Raises:
        ValueError: one line naming the argument (`check_args`), a state
            size n above `MAX_DIM` for the kernel, or triton=True where it
            cannot run. The state is untouched.
    """
    check_args(state, x, dt, A, B, C, D, dt_bias, state_indices)
    use = runs_triton(_update_kernel, x) if triton is None else triton
    if use:
        if not runs_triton(_update_kernel, x):
            raise ValueError(f"{OP}: triton=True but x is on {x.device} and Triton is not interpreted")
        if B.shape[2] > MAX_DIM:
            raise ValueError(f"{OP}: B has state size {B.shape[2]} > {MAX_DIM}, the kernel's tile limit")
        return kernel_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices)
    return reference_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices)


def model_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                 dt_softplus: bool = False, state_indices: torch.Tensor | None = None) -> torch.Tensor:
    """`state_update` as a model's forward runs it: the kernel on CUDA, the
    reference on other devices, never Triton's interpreter (as
    `unikv.kernels.ssd.model_scan`)."""
    return state_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices,
                        triton=None if x.is_cuda else False)

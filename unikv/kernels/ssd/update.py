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

`update_kernel._update_kernel` computes the same, as serving engines run it (mamba_ssm's
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
never the interpreter). Importing this module does not import Triton;
the kernel (`update_kernel`) is imported where it runs.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from unikv.kernels.launch import runs_triton

OP = "ssd.state_update"
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


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
            size n above `kernel.MAX_DIM` for the kernel, or triton=True where it
            cannot run. The state is untouched.
    """
    check_args(state, x, dt, A, B, C, D, dt_bias, state_indices)
    if triton is False:  # never imports Triton (a torch-only install runs a model's CPU decode so)
        return reference_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices)
    from unikv.kernels.ssd import update_kernel

    runs = runs_triton(update_kernel._update_kernel, x)
    if runs or triton:
        if not runs:
            raise ValueError(f"{OP}: triton=True but x is on {x.device} and Triton is not interpreted")
        if B.shape[2] > update_kernel.MAX_DIM:
            raise ValueError(f"{OP}: B has state size {B.shape[2]} > {update_kernel.MAX_DIM}, the kernel's tile "
                             "limit")
        return update_kernel.kernel_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices)
    return reference_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices)


def model_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                 dt_softplus: bool = False, state_indices: torch.Tensor | None = None) -> torch.Tensor:
    """`state_update` as a model's forward runs it: the kernel on CUDA, the
    reference on other devices, never Triton's interpreter (as
    `unikv.kernels.ssd.model_scan`)."""
    return state_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus, state_indices,
                        triton=None if x.is_cuda else False)


UPDATE_OP = "unikv::ssd_state_update"


@functools.cache
def update_op():
    """`torch.ops.unikv.ssd_state_update`, registered on the first call:
    (state, x, dt, A, B, C, D?, dt_bias?, dt_softplus) -> out, `model_update`
    with `state` updated in place (declared mutated). A compiled forward
    calls it (`sim.real.ssd.state_update`) so that dynamo never traces the
    Triton launch (it cannot: a Triton kernel object passed to a Python
    function has no type it knows) and the update stays one kernel.
    Registered outside any trace (dynamo cannot trace the registration)."""

    @torch.library.custom_op(UPDATE_OP, mutates_args=("state",))
    def ssd_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor, D: torch.Tensor | None, dt_bias: torch.Tensor | None,
                         dt_softplus: bool) -> torch.Tensor:
        return model_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus).contiguous()

    @ssd_state_update.register_fake
    def _(state, x, dt, A, B, C, D, dt_bias, dt_softplus):
        return x.new_empty(x.shape)

    return torch.ops.unikv.ssd_state_update

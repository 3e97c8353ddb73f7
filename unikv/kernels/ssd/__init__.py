"""Mamba-2's chunked scan (SSD) for a prefill chunk: `chunk_scan`.

`reference` (torch einsum contractions, fp32) and `kernel` (four Triton
kernels, the way serving engines scan; imports Triton). `chunk_scan`
checks its arguments (metadata only) and runs the kernels on CUDA tensors
or under Triton's interpreter, the reference otherwise.

`model_scan` is the scan a model's forward runs (the kernels on CUDA, the
reference elsewhere). `scan_op()` registers it as the torch operator `unikv::ssd_chunk_scan`
(`torch.library.custom_op`, a fake implementation for its output shapes),
so `torch.compile` traces a caller through one opaque call; the operator
runs `chunk_scan`. Registration happens on the first call (no import-time
side effect).

`update` is Mamba-2's one-token decode step (`selective_state_update`) as
a Triton kernel: `state_update`, `model_update`, `reference_update`,
exported here on first access (its kernel, `update_kernel`, imports
Triton only where it runs).
"""

from __future__ import annotations

import functools
import math

import torch

from unikv.kernels.launch import runs_triton

OP = "unikv::ssd_chunk_scan"
UPDATE = ("state_update", "model_update", "reference_update")


def __getattr__(name: str):
    if name in UPDATE:
        from unikv.kernels.ssd import update

        return getattr(update, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_args(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_limit) -> None:
    """ValueError (one line, the argument named) unless the shapes agree:
    `x` [b, t, h, p], `dt` [b, t, h], `A` [h], `B` / `C` [b, t, g, n] with
    g dividing h, `D` / `dt_bias` [h], `initial_states` [b, h, p, n], one
    device, float tensors, `chunk_size` >= 1, `dt_limit` (lo <= hi)."""
    op = "ssd.chunk_scan"
    named = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "dt_bias": dt_bias, "initial_states": initial_states}
    for name, t in named.items():
        if t is None and name in ("D", "dt_bias", "initial_states"):
            continue
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise ValueError(f"{op}: {name} must be a float torch.Tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)}")
    if x.dim() != 4:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}; expected [batch, tokens, heads, head_dim]")
    b, t, h, p = x.shape
    if B.dim() != 4 or B.shape[:2] != (b, t) or B.shape[2] < 1 or h % B.shape[2]:
        raise ValueError(f"{op}: B has shape {tuple(B.shape)}; expected [{b}, {t}, groups, state] with groups "
                         f"dividing the {h} heads")
    g, n = B.shape[2], B.shape[3]
    want = {"dt": (b, t, h), "A": (h,), "C": (b, t, g, n), "D": (h,), "dt_bias": (h,), "initial_states": (b, h, p, n)}
    for name, shape in want.items():
        tensor = named[name]
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{op}: {name} has shape {tuple(tensor.shape)}; expected {list(shape)}")
    devices = {str(tt.device) for tt in named.values() if tt is not None}
    if len(devices) > 1:
        raise ValueError(f"{op}: tensors on several devices {sorted(devices)}; expected one")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size={chunk_size!r}; expected an int >= 1")
    lo, hi = dt_limit
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"{op}: dt_limit={tuple(dt_limit)}; expected (lo, hi) with lo <= hi")


def triton_fits(x, B, C) -> str | None:
    """Why the kernels cannot take these inputs (None: they can): a state
    larger than `kernel.MAX_DIM`, or x, B, C of different dtypes."""
    from unikv.kernels.ssd.kernel import MAX_DIM

    if B.shape[3] > MAX_DIM:
        return f"state size {B.shape[3]} > {MAX_DIM}"
    if not (x.dtype == B.dtype == C.dtype):
        return f"x, B, C have dtypes {x.dtype}, {B.dtype}, {C.dtype}; the kernels dot them as one dtype"
    return None


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
               initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, float("inf")),
               triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's chunked scan (`reference` module docstring); returns (y [b,
    t, h, p], final state [b, h, p, n]), both fp32.

    Args:
        triton: None: the kernels where they can run (CUDA tensors, or the
            interpreter) and take the inputs (`triton_fits`), else the
            reference; True: the kernels (ValueError where they cannot);
            False: the reference.
    Raises:
        ValueError: one line naming the argument (`check_args`), or
            triton=True where the kernels cannot run.
    """
    check_args(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_limit)
    use = triton
    if triton is not False:
        from unikv.kernels.ssd import kernel

        why = None if runs_triton(kernel._scan_kernel, x) else f"x is on {x.device} and Triton is not interpreted"
        why = why or triton_fits(x, B, C)
        if why is not None and triton:
            raise ValueError(f"ssd.chunk_scan: triton=True but {why}")
        use = why is None
    if use:
        from unikv.kernels.ssd import kernel

        return kernel.chunk_scan(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus,
                                 (float(dt_limit[0]), float(dt_limit[1])))
    from unikv.kernels.ssd import reference

    return reference.chunk_scan(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus,
                                (float(dt_limit[0]), float(dt_limit[1])))


def model_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
               initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, float("inf"))) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_scan` as a model's forward runs it: the kernels on CUDA (where
    they take the inputs), the reference on other devices, never Triton's
    interpreter (which the kernel tests turn on for a whole session:
    interpreted, a model's scan would take minutes)."""
    return chunk_scan(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus, dt_limit,
                      triton=None if x.is_cuda else False)


@functools.cache
def scan_op():
    """`torch.ops.unikv.ssd_chunk_scan`, registered on the first call:
    (x, dt, A, B, C, D?, dt_bias?, initial_states?, chunk_size, dt_softplus,
    lo, hi) -> (y, final), `model_scan`, both contiguous (a compiled
    caller's views are planned on the fake's strides)."""

    @torch.library.custom_op(OP, mutates_args=())
    def ssd_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                       D: torch.Tensor | None, dt_bias: torch.Tensor | None, initial_states: torch.Tensor | None,
                       chunk_size: int, dt_softplus: bool, lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
        y, final = model_scan(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus, (lo, hi))
        return y.contiguous(), final.contiguous()  # the strides the fake implementation promises

    @ssd_chunk_scan.register_fake
    def _(x, dt, A, B, C, D, dt_bias, initial_states, chunk_size, dt_softplus, lo, hi):
        b, t, h, p = x.shape
        return (x.new_empty((b, t, h, p), dtype=torch.float32),
                x.new_empty((b, h, p, B.shape[3]), dtype=torch.float32))

    return torch.ops.unikv.ssd_chunk_scan

"""Shared plumbing of the Triton launchers: dispatch and argument checks.

Importing this module never imports Triton. The `<operator>/kernel.py`
modules import it at their top, so only code that calls a Triton launcher needs it.

Dispatch: a launcher runs its Triton kernel when the tensors live on a CUDA
device, or when the kernels were decorated by Triton's interpreter (the
process imported Triton with `TRITON_INTERPRET=1`), which runs kernels on CPU
tensors. Otherwise (CPU tensors, compiled Triton) it runs the torch reference.
"""

from __future__ import annotations

import torch


def interpreted(kernel) -> bool:
    """Whether `kernel` was decorated under Triton's CPU interpreter."""
    return type(kernel).__name__ == "InterpretedFunction"


def runs_triton(kernel, *tensors: torch.Tensor) -> bool:
    """Whether `kernel` can run on `tensors`' device (see module docstring)."""
    if interpreted(kernel):
        return True
    return all(t.is_cuda for t in tensors)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


# -- argument checks (metadata only: none reads device memory) --


def fast_ok(*tensors) -> bool:
    """The common case, cheaply: contiguous 1-D int64 tensors on one device.

    Launchers call it first and run the detailed checks (which name the
    offending argument) only when it fails, to keep the per-launch host
    cost low on the decode path.
    """
    device = None
    for t in tensors:
        if type(t) is not torch.Tensor or t.dtype is not torch.int64 or t.dim() != 1 or not t.is_contiguous():
            return False
        d = t.get_device()
        if device is None:
            device = d
        elif d != device:
            return False
    return True


def check_tensor(t, name: str, op: str, dtype: torch.dtype = torch.int64, dim: int | None = 1) -> None:
    """ValueError naming `op` and `name` unless `t` is a tensor of `dtype`
    (and `dim` dimensions when given)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{op}: {name} has dtype {t.dtype}; expected {dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected {dim}-D")


def check_table(t, name: str, op: str) -> None:
    """A page table: 1-D contiguous int64 (kernels scatter into it in place)."""
    check_tensor(t, name, op)
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (it is written in place)")


def check_same_device(op: str, **tensors: torch.Tensor) -> torch.device:
    """The one device of `tensors`, else ValueError listing each device."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {t.device}" for k, t in tensors.items())
        raise ValueError(f"{op}: tensors are on different devices ({where})")
    return next(iter(devices))


def check_same_length(op: str, **tensors: torch.Tensor) -> int:
    """The common length of 1-D `tensors`, else ValueError listing them."""
    lengths = {int(t.numel()) for t in tensors.values()}
    if len(lengths) > 1:
        what = ", ".join(f"{k} {int(t.numel())}" for k, t in tensors.items())
        raise ValueError(f"{op}: lengths differ ({what}); expected equal")
    return lengths.pop()


def check_positive(value, name: str, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{op}: {name}={value!r} must be a positive integer")
    return value


def contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when contiguous (kernels index raw memory), else a copy."""
    return t if t.is_contiguous() else t.contiguous()

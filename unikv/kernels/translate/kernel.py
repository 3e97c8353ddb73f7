"""Triton `translate`: virtual token ids -> physical slot or kernel-facing ids.

Same output as `unikv.kernels.translate.reference.translate` (tombstones ->
0, the sink), one launch, no host read; ids whose page lies outside `v2p`
also give 0 (the reference raises an index error there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from unikv.kernels.launch import (
    cdiv,
    check_positive,
    check_same_device,
    check_table,
    check_tensor,
    contiguous,
    fast_ok,
    runs_triton,
)
from unikv.kernels.translate import reference

BLOCK = 1024  # ids per program


@triton.jit
def _translate_kernel(t_ptr, v2p_ptr, out_ptr, n, v2p_size, page_size, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(t_ptr + offs, mask=mask, other=0)
    page = t // page_size
    off = t - page * page_size
    inside = mask & (page >= 0) & (page < v2p_size)
    phys = tl.load(v2p_ptr + page, mask=inside, other=-1)
    ids = phys * scale + off
    tl.store(out_ptr + offs, tl.where(phys < 0, tl.zeros_like(ids), ids), mask=mask)



def translate(v_tokens: torch.Tensor, v2p: torch.Tensor, page_size: int, multiplier: int = 1) -> torch.Tensor:
    """Virtual token ids -> physical slot ids, or kernel-facing ids with
    `multiplier` = blocks per page; tombstones (-1) -> 0 (the sink). See
    `reference.translate`; ids whose page lies outside `v2p` also give 0
    (the reference raises an index error there).

    Raises:
        ValueError: for non-int64 or non-1-D ids, mixed devices, a
            non-contiguous table, or a non-positive page_size / multiplier.
    """
    op = "translate"
    if not fast_ok(v_tokens, v2p):
        check_tensor(v_tokens, "v_tokens", op)
        check_table(v2p, "v2p", op)
        check_same_device(op, v_tokens=v_tokens, v2p=v2p)
    check_positive(page_size, "page_size", op)
    check_positive(multiplier, "multiplier", op)
    n = int(v_tokens.numel())
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=v2p.device)
    if not runs_triton(_translate_kernel, v2p):
        return reference.translate(v_tokens, v2p, page_size, multiplier)
    out = torch.empty(n, dtype=torch.int64, device=v2p.device)
    _translate_kernel[(cdiv(n, BLOCK),)](contiguous(v_tokens), v2p, out, n, v2p.numel(), page_size,
                                        page_size * multiplier, BLOCK=BLOCK)
    return out

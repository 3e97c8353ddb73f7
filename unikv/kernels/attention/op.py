"""One layer's K / V write and paged attention as one opaque torch operator.

`write_and_attend(...)` splits the step's physical slots into pages and
offsets (traced: in a compiled graph inductor folds the division into
kernels the layer launches anyway), then calls
`torch.ops.unikv.paged_attention_write`: it stores the new K / V rows at
`cache[page, offset]` of the layer's caches, then runs `paged_attention`
(the dispatcher of this package) over the layer's pages. Registered as a
`torch.library.custom_op` with a fake (meta) implementation, so
`torch.compile` traces it as one call whose output is `[T, Hq, Dv]` in q's
dtype, and never traces into the checks (metadata only, as the
launcher's), the write or the launcher (the Triton launch): they run when
the operator runs, e.g. once while a CUDA graph captures the compiled step.

The operator declares no mutated argument although it writes `k_cache`
and `v_cache`. Declared, AOTAutograd functionalises the write: every
layer's cache is a view of the pool's one buffer, and mutated inputs that
alias each other are merged into a synthetic base (in a 4-layer check with
torch 2.13, inductor's code then copied the views' shared storage every
call). Undeclared is exact here because no other operator of a decode
graph reads or writes the caches: each layer's K / V is written and read
inside its one call (vLLM's `unified_attention` operators take no KV-cache
argument at all: they find the layer's cache through their forward
context). The operator's output is always used, so it is never dropped.

Registration happens on the first call of `attention_op()` (no import-time
side effect), which must come before dynamo traces a caller; importing this
module imports torch, never Triton.
"""

from __future__ import annotations

import torch

NAME = "unikv::paged_attention_write"


def _write(cache: torch.Tensor, pages: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor) -> None:
    """`rows` `[T, Hkv, D]` into `cache` `[P, ps, Hkv, D]` at `[pages, offsets]` `[T]`."""
    cache[pages, offsets] = rows.to(cache.dtype)


def _check_rows(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != shape or not x.dtype.is_floating_point:
        raise ValueError(f"{NAME}: {name} is {tuple(x.shape)} {x.dtype}; expected a float tensor of shape "
                         f"{list(shape)} ([T, Hkv, D] of the layer's cache)")


def _impl(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          pages: torch.Tensor, offsets: torch.Tensor, block_table: torch.Tensor, cu_q: torch.Tensor,
          seq_lens: torch.Tensor,
          sinks: torch.Tensor | None, scale: float, window: int | None, softcap: float | None,
          triton: bool | None) -> torch.Tensor:
    from unikv.kernels.attention import paged_attention, reference

    reference.check_args(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale, window=window,
                         sinks=sinks, softcap=softcap)
    _check_rows("key", key, (q.shape[0], *k_cache.shape[2:]))
    _check_rows("value", value, (q.shape[0], *v_cache.shape[2:]))
    for name, t in (("pages", pages), ("offsets", offsets)):
        if t.shape != (q.shape[0],) or t.dtype not in reference.INDEX_DTYPES:
            raise ValueError(f"{NAME}: {name} has shape {tuple(t.shape)} {t.dtype}; expected "
                             f"[{q.shape[0]}] int64 (one per query token)")
    _write(k_cache, pages, offsets, key)
    _write(v_cache, pages, offsets, value)
    return paged_attention(q, k_cache, v_cache, block_table, cu_q, seq_lens, scale=scale, window=window,
                           sinks=sinks, softcap=softcap, triton=triton)


def _fake(q, key, value, k_cache, v_cache, pages, offsets, block_table, cu_q, seq_lens, sinks, scale, window,
          softcap, triton) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], v_cache.shape[3])


_REGISTERED: list = []  # the operator, once registered


def attention_op():
    """The registered operator (registered on the first call; a compiled
    caller must call it once before tracing: dynamo cannot trace the
    registration)."""
    if not _REGISTERED:
        op = torch.library.custom_op(NAME, _impl, mutates_args=())
        op.register_fake(_fake)
        _REGISTERED.append(op)
    return _REGISTERED[0]


def write_and_attend(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slots: torch.Tensor, block_table: torch.Tensor, cu_q: torch.Tensor,
                     seq_lens: torch.Tensor, *, scale: float, window: int | None = None,
                     sinks: torch.Tensor | None = None, softcap: float | None = None,
                     triton: bool | None = None) -> torch.Tensor:
    """Write the step's K / V, then attend (see the module docstring).

    Args:
        q: `[T, Hq, Dk]` queries; key `[T, Hkv, Dk]`, value `[T, Hkv, Dv]`
            (cast to the caches' dtype when written).
        k_cache, v_cache: the layer's `[P, ps, Hkv, D]` pages (`KVViews.k` / `v`).
        slots: `[T]` int64 physical slot of each token on the layer's band.
        block_table, cu_q, seq_lens, scale, window, sinks, softcap, triton:
            as `unikv.kernels.attention.paged_attention`.
    Returns:
        `[T, Hq, Dv]` in q's dtype.
    Raises:
        ValueError: key, value or slots whose rows differ from the queries',
            or what `paged_attention`'s checks refuse; nothing is written.
    """
    ps = k_cache.shape[1]
    pages = torch.div(slots, ps, rounding_mode="floor")
    return attention_op()(q, key, value, k_cache, v_cache, pages, slots - pages * ps, block_table, cu_q, seq_lens,
                          sinks, float(scale), window, None if softcap is None else float(softcap), triton)

"""A transformers attention function whose KV cache is the unikv pool.

`register()` adds "unikv" to transformers' `AttentionInterface` (and a mask
function that builds no mask to `AttentionMaskInterface`); a model built
with `attn_implementation="unikv"` then calls `unikv_attention` in every
attention layer. Per call it

1. writes the forward's new K / V (post-RoPE, as the modeling file would
   hand them to `cache.update`) into the pool at the step's physical slots
   (`KVViews.write`), then
2. computes attention over the layer's pages with
   `unikv.kernels.attention.paged_attention`, so the queries read every
   earlier token (a cached prefix, an earlier chunk, earlier decode steps)
   from the pool.

The step's batch (block tables, query offsets, KV lengths, write slots) is
a `StepContext` the executor sets around the forward with `use_step`; the
model is called without a transformers cache (`use_cache=False`).

What the function reads, as transformers 5.17 / 5.24's eager attention
reads it (each modeling file's `*Attention.forward` and
`eager_attention_forward`): `scaling` (a keyword every model passes;
`module.head_dim ** -0.5` when None, as Gemma-2's eager does), the
`sliding_window` keyword (Gemma-2/3, gpt-oss: the layer's window or None),
the `softcap` keyword (Gemma-2 `attn_logit_softcapping`; Gemma-3 passes
none, so none applies), the `s_aux` keyword (gpt-oss `module.sinks`),
`module.layer_idx` and `module.is_causal` (a bidirectional layer is
refused). The mask transformers would build is not needed: the kernel
masks by positions (causal, window). Registering a mask function keeps
transformers' mask preprocessing (`masking_utils._preprocess_mask_arguments`),
whose packed-sequence check reads the device once per mask in an eager
forward (not while a CUDA graph captures); `register(mask=False)` skips it:
transformers then builds no mask for a custom attention at all.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from unikv.kernels.attention import paged_attention
from unikv.kernels.attention.op import write_and_attend
from unikv.tensors import KVViews

NAME = "unikv"
LAYOUTS = ("packed", "padded")
_STEP: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("unikv_step", default=None)


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """One forward's batch, as the pool holds it.

    Args:
        views: the pool's KV views.
        block_tables: band -> `[B, W]` int32 physical pages of each request
            (`KVViews.block_table`), for every band of `views`.
        cu_q: `[B+1]` int32 prefix sums of the requests' query counts.
        seq_lens: `[B]` int32 KV length of each request after this step.
        write_slots: band -> `[T]` physical slot of each query token on the
            band (`pool.translate(vids, band)`), in batch order.
        layout: "packed" (input `[1, T]`) or "padded" (`[B, 1]`, decode).
        triton: passed to `paged_attention`: None (the Triton kernel for CUDA
            tensors, else the torch reference), True (the kernel; on CPU
            tensors through Triton's interpreter when the process imported
            Triton with `TRITON_INTERPRET=1`), False (the reference).
        opaque: write and attend through one torch operator
            (`unikv.kernels.attention.op.write_and_attend`), which
            `torch.compile` keeps as one opaque call, over the caches each
            attention module carries (`unikv_cache`): the compiled decode
            layers (`sim.real.graphs.CompiledLayers`).
    Raises:
        ValueError: a band without a table or slots, or shapes that
            disagree (checked on shapes only: no device read).
    """

    views: KVViews
    block_tables: Mapping[str, torch.Tensor]
    cu_q: torch.Tensor
    seq_lens: torch.Tensor
    write_slots: Mapping[str, torch.Tensor]
    layout: str = "packed"
    triton: bool | None = None
    opaque: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"StepContext: layout={self.layout!r} must be one of {LAYOUTS}")
        b = self.seq_lens.numel()
        if self.seq_lens.dim() != 1 or self.cu_q.shape != (b + 1,):
            raise ValueError(f"StepContext: cu_q has shape {tuple(self.cu_q.shape)}, seq_lens "
                             f"{tuple(self.seq_lens.shape)}; expected [B+1] and [B]")
        tokens = set()
        for band in self.views.bands:
            table, slots = self.block_tables.get(band), self.write_slots.get(band)
            if table is None or slots is None:
                raise ValueError(f"StepContext: band {band!r} needs block_tables[{band!r}] and "
                                 f"write_slots[{band!r}]")
            if table.dim() != 2 or table.shape[0] != b:
                raise ValueError(f"StepContext: block_tables[{band!r}] has shape {tuple(table.shape)}; "
                                 f"expected [B={b}, W]")
            tokens.add(slots.numel())
        if len(tokens) > 1:
            raise ValueError(f"StepContext: write_slots hold {sorted(tokens)} tokens across bands; "
                             "expected one count T")


@contextlib.contextmanager
def use_step(ctx: StepContext) -> Iterator[StepContext]:
    """Make `ctx` the step every "unikv" attention call reads, for one forward."""
    if not isinstance(ctx, StepContext):
        raise ValueError(f"use_step: ctx={type(ctx).__name__} must be a StepContext")
    token = _STEP.set(ctx)
    try:
        yield ctx
    finally:
        _STEP.reset(token)


def current_step() -> StepContext:
    """The step set by `use_step`. Raises RuntimeError outside one."""
    ctx = _STEP.get()
    if ctx is None:
        raise RuntimeError("unikv attention called outside `with use_step(ctx):` (no StepContext)")
    return ctx


def unikv_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None,
                    dropout: float = 0.0, sliding_window: int | None = None,
                    softcap: float | None = None, s_aux: torch.Tensor | None = None,
                    unikv_step: StepContext | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract, over the pool.

    Args:
        query: `[B, Hq, S, Dk]`; key `[B, Hkv, S, Dk]`; value `[B, Hkv, S, Dv]`
            (packed: B = 1, S = T; padded: S = 1, B = the requests).
        attention_mask: ignored (the kernel masks by position).
        scaling, sliding_window, softcap, s_aux: as the model passes them.
        unikv_step: the step, passed to the model's forward as a keyword
            (transformers hands its forward's keywords to the attention
            function); None: the step `use_step` set. The keyword is what
            a compiled forward uses: dynamo does not trace `ContextVar.get`.
    Returns:
        `([B, S, Hq, Dv], None)` in the query's dtype (no attention weights).
    Raises:
        RuntimeError: outside `use_step`.
        ValueError: a non-causal layer, dropout in training, or a batch
            shape the step's layout does not expect.
    """
    ctx = unikv_step if unikv_step is not None else current_step()
    if not getattr(module, "is_causal", True):
        raise ValueError(f"unikv attention: layer {module.layer_idx} is bidirectional (is_causal=False); "
                         "expected a causal decoder layer")
    if dropout and module.training:
        raise ValueError(f"unikv attention: dropout={dropout} in training; the pool serves inference")
    b, hq, s, dk = query.shape
    if (ctx.layout == "packed" and b != 1) or (ctx.layout == "padded" and s != 1):
        want = "[1, T]" if ctx.layout == "packed" else "[B, 1]"
        raise ValueError(f"unikv attention: input batch [{b}, {s}] for layout={ctx.layout!r}; "
                         f"expected {want}")
    tokens = b * s
    q = query.transpose(1, 2).reshape(tokens, hq, dk)
    if key.shape[2] != s:  # a cache passed to the forward (a hybrid's) prepended its past K/V
        key, value = key[:, :, -s:], value[:, :, -s:]
    scale = scaling if scaling is not None else module.head_dim ** -0.5
    if ctx.opaque:
        out = _opaque(module, ctx, q, _tokens(key), _tokens(value), scale, sliding_window, s_aux, softcap)
        return out.reshape(b, s, hq, -1), None
    layer = module.layer_idx
    band = ctx.views.band(layer)
    ctx.views.write(layer, ctx.write_slots[band], _tokens(key), _tokens(value))
    out = paged_attention(q, ctx.views.k(layer), ctx.views.v(layer), ctx.block_tables[band],
                          ctx.cu_q, ctx.seq_lens, scale=scale, window=sliding_window,
                          sinks=s_aux, softcap=softcap, triton=ctx.triton)
    return out.reshape(b, s, hq, -1), None


def _opaque(module: torch.nn.Module, ctx: StepContext, q, key, value, scale, window, sinks, softcap):
    """The write and the attention as one operator, over the caches the
    module carries (`unikv_cache`: K view, V view, band; set by
    `sim.real.graphs.CompiledLayers`), never its layer index: a compiled
    graph then holds nothing layer-specific, and layers share it."""
    cache = getattr(module, "unikv_cache", None)
    if cache is None:
        raise ValueError(f"unikv attention: StepContext(opaque=True) and layer {module.layer_idx}'s module has "
                         "no unikv_cache (K view, V view, band); expected CompiledLayers.active around the forward")
    k_cache, v_cache, band = cache
    return write_and_attend(q, key, value, k_cache, v_cache, ctx.write_slots[band], ctx.block_tables[band],
                            ctx.cu_q, ctx.seq_lens, scale=scale, window=window, sinks=sinks, softcap=softcap,
                            triton=ctx.triton)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """`[B, H, S, D]` -> `[B*S, H, D]`, tokens in batch order."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def unikv_mask(*args, **kwargs) -> None:
    """transformers' mask-function contract: no mask (the kernel masks by position)."""
    return None


def register(name: str = NAME, *, mask: bool = True) -> str:
    """Register `unikv_attention` (and, with `mask`, `unikv_mask`) under `name`
    in transformers' global attention (and mask) interfaces; idempotent.
    Without `mask`, a mask function an earlier call registered under `name`
    is removed: the last call decides, so a forward captured as a CUDA graph
    after an eager run in the same process reads no device for a mask.

    Returns:
        `name`, for `attn_implementation=` or `model.set_attn_implementation`.
    """
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, unikv_attention)
    if mask:
        AttentionMaskInterface.register(name, unikv_mask)
    elif AttentionMaskInterface._global_mapping.get(name) is unikv_mask:
        del AttentionMaskInterface._global_mapping[name]
    return name

"""Recurrent state in the pool's state slots, bound to a transformers model around each forward.

transformers' torch Mamba-2 path (Nemotron-H: `NemotronHMamba2Mixer.forward`
in transformers/models/nemotron_h/modeling_nemotron_h.py) and its short-conv
layers (LFM3: `Lfm3ShortConv.forward`, transformers 5.24) read and write their
state through the cache object (`Cache.get_conv_state`,
`update_conv_state`, `update_recurrent_state`; the layers are
`LinearAttentionLayer` in transformers/cache_utils.py), one dense
`[B, ...]` tensor per layer. The pool keeps each request's state in one slot
of a state band (`unikv.tensors.StateViews`). `StateBinder.before` gathers
the batch's slots into a fresh `DynamicCache`; `after` scatters the updated
states back into the same slots.

Layout in a slot, per recurrent layer (ascending layer index):
- `conv`: `(conv_dim, d_conv - 1)` in the model dtype. vLLM and SGLang keep
  `d_conv - 1` columns (vLLM `MambaStateShapeCalculator.mamba2_state_shape`),
  and so does unikv's sizing (`sim/model_states.py`). transformers keeps
  `d_conv` columns (`LinearAttentionLayer.lazy_initialization` sizes
  `conv_states` by `conv_kernel_size`), but the oldest one only reaches conv
  outputs it discards (`causal_conv1d_update` keeps `out[..., -seq_len:]`),
  so the gather fills it with zeros and the forward is unchanged.
- `ssm`: `(heads, head_dim, d_state)` in fp32: `mamba2_chunk_scan` returns
  the final state in fp32 and the decode update keeps the cache's dtype
  (Nemotron-H's `mamba_ssm_cache_dtype` defaults to "float32").
A short-conv layer keeps only `conv`: `(hidden, L_cache - 1)` (its
`causal_conv1d_update` discards the oldest column's output the same way;
vLLM `short_conv_state_shape`, unikv's `sim/model_states.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unikv.tensors import LayerState, StateViews

if TYPE_CHECKING:
    import torch

PAD_SLOT = 0
"""The state slot a padding row of a decode bucket reads and writes: slot 0
lies in the pool's sink (a band's first slot is past the sink,
`Layout._build_geometry`), so no request ever holds it."""

_MIXER_FIELDS = ("layer_idx", "conv_dim", "conv_kernel_size", "num_heads", "head_dim", "ssm_state_size")
_SHORT_CONV_FIELDS = ("layer_idx", "conv_kernel_size", "conv", "in_proj", "out_proj")


@dataclass(frozen=True, kw_only=True)
class Mamba2Geometry:
    """The per-request state shape of one Mamba-2 layer.

    Attributes:
        layer: the model's layer index.
        conv_dim: conv channels (`intermediate + 2 * n_groups * d_state`).
        d_conv: the conv kernel width (the pool keeps `d_conv - 1` columns).
        heads, head_dim, d_state: the SSM state is `(heads, head_dim, d_state)`.
    """

    layer: int
    conv_dim: int
    d_conv: int
    heads: int
    head_dim: int
    d_state: int

    @property
    def ssm_shape(self) -> tuple[int, ...] | None:
        return (self.heads, self.head_dim, self.d_state)


@dataclass(frozen=True, kw_only=True)
class ShortConvGeometry:
    """The per-request state shape of one short-conv layer (LFM2 / LFM3):
    a conv state only.

    Attributes:
        layer: the model's layer index.
        conv_dim: conv channels (the hidden size).
        d_conv: the conv kernel width, `conv_L_cache` (the pool keeps `d_conv - 1` columns).
    """

    layer: int
    conv_dim: int
    d_conv: int

    @property
    def ssm_shape(self) -> tuple[int, ...] | None:
        return None  # no recurrent (SSM) state


def is_recurrent(module) -> bool:
    """Whether `module` is a recurrent layer `recurrent_layers` binds: a
    Mamba-2 mixer or a short-conv layer (by their fields)."""
    return any(all(hasattr(module, f) for f in fields) for fields in (_MIXER_FIELDS, _SHORT_CONV_FIELDS))


def mamba2_layers(model) -> tuple[Mamba2Geometry, ...]:
    """The Mamba-2 mixers of a transformers model, in layer order.

    A mixer is a module with transformers' Mamba-2 fields
    (`NemotronHMamba2Mixer`: layer_idx, conv_dim, conv_kernel_size,
    num_heads, head_dim, ssm_state_size).

    Raises:
        ValueError: the model has no such mixer.
    """
    found = [m for m in model.modules() if all(hasattr(m, f) for f in _MIXER_FIELDS)]
    if not found:
        raise ValueError(f"model {type(model).__name__}: no Mamba-2 mixer (a module with "
                         f"{', '.join(_MIXER_FIELDS)})")
    return tuple(sorted(
        (Mamba2Geometry(layer=m.layer_idx, conv_dim=m.conv_dim, d_conv=m.conv_kernel_size,
                        heads=m.num_heads, head_dim=m.head_dim, d_state=m.ssm_state_size)
         for m in found), key=lambda g: g.layer))


def recurrent_layers(model) -> tuple[Mamba2Geometry | ShortConvGeometry, ...]:
    """The recurrent layers of a transformers model, in layer order: its
    Mamba-2 mixers, else its short-conv layers (`Lfm3ShortConv`: layer_idx,
    conv_kernel_size, a depthwise `conv`, in_proj, out_proj).

    Raises:
        ValueError: the model has neither.
    """
    if any(all(hasattr(m, f) for f in _MIXER_FIELDS) for m in model.modules()):
        return mamba2_layers(model)
    found = [m for m in model.modules() if all(hasattr(m, f) for f in _SHORT_CONV_FIELDS)]
    if not found:
        raise ValueError(f"model {type(model).__name__}: no Mamba-2 mixer (a module with "
                         f"{', '.join(_MIXER_FIELDS)}) and no short-conv layer (a module with "
                         f"{', '.join(_SHORT_CONV_FIELDS)})")
    return tuple(sorted((ShortConvGeometry(layer=m.layer_idx, conv_dim=m.conv.in_channels,
                                           d_conv=m.conv_kernel_size) for m in found),
                        key=lambda g: g.layer))


def layer_states(model, band: str = "mamba", *, conv_dtype=None, ssm_dtype=None) -> tuple[LayerState, ...]:
    """The `LayerState` of every recurrent layer of `model` (`recurrent_layers`), for `StateViews`.

    Args:
        model: a transformers model with Mamba-2 mixers or short-conv layers.
        band: the pool's state band.
        conv_dtype: the conv state's dtype; None: the model's dtype (what
            transformers' cache keeps).
        ssm_dtype: the SSM state's dtype; None: fp32 (see the module doc).
    """
    import torch

    conv_dtype = model.dtype if conv_dtype is None else conv_dtype
    ssm_dtype = torch.float32 if ssm_dtype is None else ssm_dtype
    out = []
    for g in recurrent_layers(model):
        tensors: list[tuple[str, tuple[int, ...], Any]] = [("conv", (g.conv_dim, g.d_conv - 1), conv_dtype)]
        if g.ssm_shape is not None:
            tensors.append(("ssm", g.ssm_shape, ssm_dtype))
        out.append(LayerState(g.layer, band, tuple(tensors)))
    return tuple(out)


def cache_kwarg(model) -> str:
    """The keyword `model.forward` takes its cache by: "cache" (transformers
    5.24, where `past_key_values` is deprecated) or "past_key_values"."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def state_bytes(states: Sequence[LayerState]) -> int:
    """Bytes of one request's state (one slot) for `states`, without padding."""
    total = 0
    for s in states:
        for _, shape, dtype in s.tensors:
            n = dtype.itemsize
            for d in shape:
                n *= d
            total += n
    return total


class StateBinder:
    """Gathers a batch's recurrent state from the pool into a transformers
    cache before a forward, and scatters it back after.

    Args:
        model: the transformers model (its Mamba-2 mixers or short-conv
            layers name the layers: `recurrent_layers`).
        views: `StateViews` over the pool, holding every such layer of
            `model` with the shapes `layer_states(model)` gives.
    Raises:
        ValueError: a mixer's layer is missing from `views` or its shape
            differs (named), or transformers' `DynamicCache` lacks the
            linear-attention API (`update_conv_state`, transformers 5.24).
    """

    def __init__(self, model, views: StateViews) -> None:
        from transformers import DynamicCache

        if not hasattr(DynamicCache, "update_conv_state"):
            raise ValueError("StateBinder: this transformers' DynamicCache has no update_conv_state "
                             "(the linear-attention cache API of transformers 5.24, cache_utils.py); "
                             "expected a transformers with it")
        self.config = model.config
        self.layers = recurrent_layers(model)
        self.views = views
        self._cache: Any = None  # the last batch's cache, reused while its batch size holds
        self._cache_batch = 0
        for g in self.layers:
            conv = views.get(g.layer, "conv")
            ssm = views.get(g.layer, "ssm") if g.ssm_shape is not None else None
            want = ((g.conv_dim, g.d_conv - 1), g.ssm_shape)
            have = (tuple(conv.shape[1:]), None if ssm is None else tuple(ssm.shape[1:]))
            if have != want:
                raise ValueError(f"StateBinder: layer {g.layer}: views hold conv {have[0]}, "
                                 f"ssm {have[1]}; the model needs conv {want[0]}, ssm {want[1]}")

    def before(self, slots, *, fresh: bool = False) -> Any:
        """A `DynamicCache` for one forward over the requests in `slots`.

        The cache of the last non-fresh call is reused while the batch size
        stays the same: its attention layers are emptied (`reset`) and the
        state is gathered straight into its tensors, so a steady decode
        allocates nothing and holds one copy of the batch's state. Call
        `after` before the next `before`.

        Args:
            slots: physical state slots in batch order (`pool.translate(
                state_ids, band)`), shape `[B]`.
            fresh: the requests start from no state (a first prefill chunk):
                a new cache whose recurrent layers are empty, so the model
                runs its own from-zero path; False: their state is gathered.
        Returns:
            The cache to pass to the model (`**{cache_kwarg(model): cache}`);
            its attention layers are empty.
        Raises:
            ValueError: host `slots` that repeat a slot.
        """
        from transformers import DynamicCache

        if fresh:
            return DynamicCache(config=self.config)
        idx = self.slot_index(slots)
        cache = self._cache if self._cache is not None and self._cache_batch == len(idx) else None
        if cache is None:
            self._cache, self._cache_batch = self._new_cache(idx), len(idx)
            return self._cache
        for layer in self.attention_layers(cache):
            _drop_attention(layer)  # attention K/V of the last forward: the pool holds them
        self.gather(cache, idx)
        return cache

    def attention_layers(self, cache) -> list:
        """The layers of `cache` that are not recurrent (attention: the pool holds their K/V)."""
        linear = {g.layer for g in self.layers}
        return [layer for i, layer in enumerate(cache.layers) if i not in linear]

    def gather(self, cache, idx: torch.Tensor) -> None:
        """Write the state of slots `idx` (`[B]` int64 on the views'
        device) into the recurrent tensors `cache` holds for `B` rows, in
        place: their addresses stay, so a CUDA graph may capture this.
        The oldest conv column is left as it is (it reaches no kept output)."""
        for g in self.layers:
            conv_state(cache, g.layer)[..., 1:] = self.views.get(g.layer, "conv")[idx]
            if g.ssm_shape is not None:
                torch_index_select(self.views.get(g.layer, "ssm"), idx, recurrent_state(cache, g.layer))

    def scatter(self, cache, idx: torch.Tensor) -> None:
        """Write the recurrent state `cache` holds back into slots `idx`
        (`gather`'s index): one index write per tensor, no host read.
        Rows of `idx` that repeat a slot write it in an unspecified order."""
        for g in self.layers:
            conv = self.views.get(g.layer, "conv")
            # index_put: on the CPU several times faster than index_copy_ into the strided view
            conv[idx] = conv_state(cache, g.layer)[..., 1:].to(conv.dtype)
            if g.ssm_shape is not None:
                ssm = self.views.get(g.layer, "ssm")
                ssm[idx] = recurrent_state(cache, g.layer).to(ssm.dtype)

    def static_cache(self, n: int, share=None) -> Any:
        """A cache of `n` rows for `gather` / `scatter` at fixed addresses
        (a decode bucket's, `sim.real.graphs.DecodeGraphs`).

        It is built for one row through transformers' cache API, then each
        recurrent layer's tensors (its `conv_states[0]` /
        `recurrent_states[0]`, `LinearAttentionLayer`, 5.17 and 5.24) are
        replaced by `n`-row ones, so no `n`-row temporary is made
        (Nemotron-3-Nano: 47 MiB a row).

        Args:
            n: the rows.
            share: a static cache of at least `n` rows whose tensors' first
                `n` rows become this cache's (buckets that never run at
                once share one store); None: its own tensors, zeros.
        """
        import torch

        device = self.views.get(self.layers[0].layer, "conv").device
        cache = self._new_cache(torch.full((1,), PAD_SLOT, dtype=torch.int64, device=device))
        for g in self.layers:
            held = cache.layers[g.layer]
            kinds = [(held.conv_states, conv_state)]
            if g.ssm_shape is not None:
                kinds.append((held.recurrent_states, recurrent_state))
            for states, get in kinds:
                one = states[0]
                states[0] = one.new_zeros((n, *one.shape[1:])) if share is None else get(share, g.layer)[:n]
        return cache

    def _new_cache(self, idx: torch.Tensor) -> Any:
        """A cache holding the state of slots `idx`, through transformers'
        own cache API (it allocates the layers' tensors)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for g in self.layers:
            conv = self.views.get(g.layer, "conv")
            full = conv.new_zeros((len(idx), g.conv_dim, g.d_conv))
            full[..., 1:] = conv[idx]  # the oldest column never reaches a kept output
            cache.update_conv_state(full, g.layer, conv_kernel_size=g.d_conv)
            if g.ssm_shape is not None:
                cache.update_recurrent_state(self.views.get(g.layer, "ssm")[idx], g.layer)
        return cache

    def after(self, cache, slots) -> None:
        """Write the states `cache` holds after the forward back into `slots`
        (the same slots, in the same order, as `before`).

        Raises:
            ValueError: a layer's state is missing from `cache` or its batch
                differs from `slots`.
        """
        idx = self.slot_index(slots)
        for g in self.layers:
            conv = conv_state(cache, g.layer)
            ssm = recurrent_state(cache, g.layer) if g.ssm_shape is not None else conv
            if conv is None or ssm is None or conv.shape[0] != len(idx) or ssm.shape[0] != len(idx):
                raise ValueError(f"StateBinder.after: layer {g.layer}: the cache holds no state for "
                                 f"the {len(idx)} requests of slots (did the forward run with this cache?)")
        self.scatter(cache, idx)

    def slot_index(self, slots) -> torch.Tensor:
        """`slots` as an int64 index on the views' device; repeats are
        refused for host slots (a device tensor is not read back: no sync).

        Raises:
            ValueError: host `slots` that repeat a slot.
        """
        import torch

        device = self.views.get(self.layers[0].layer, "conv").device
        idx = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
        if idx.device.type == "cpu" and len(set(idx.tolist())) != idx.numel():
            raise ValueError(f"StateBinder: slots={idx.tolist()} repeat a slot")
        return idx.to(device)


def request_slots(binder: StateBinder, state_slots, b: int, who: str) -> torch.Tensor:
    """A graph bucket's state slots for the `b` requests of a step: the
    binder's device index of `state_slots` (`StateBinder.slot_index`).

    Raises:
        ValueError: one line starting with `who`: no `state_slots`, host
            slots that hold `PAD_SLOT` (the padding rows' slot) or repeat a
            slot, or not one slot per request.
    """
    import torch

    if state_slots is None:
        raise ValueError(f"{who}: a model with recurrent state: expected the batch's state_slots")
    host = state_slots if isinstance(state_slots, torch.Tensor) else torch.as_tensor(state_slots)
    if host.device.type == "cpu" and bool((host == PAD_SLOT).any()):
        raise ValueError(f"{who}: state_slots={host.tolist()} hold the padding slot {PAD_SLOT} "
                         "(the pool's sink); expected the requests' own slots")
    idx = binder.slot_index(host)  # refuses repeated host slots
    if len(idx) != b:
        raise ValueError(f"{who}: {len(idx)} state_slots for a batch of {b}; expected one each")
    return idx


def _drop_attention(layer) -> None:
    """Empty an attention layer of a reused cache, as transformers 5.24's
    `DynamicLayer.reset` does (keys and values dropped, so the next `update`
    starts from the new tokens). 5.17's `reset` zeroes them in place and the
    next `update` concatenates onto the zeros (cache_utils.py,
    `CacheLayerMixin.reset`, v5.17.0), so the keys are dropped here first."""
    layer.keys = layer.values = None
    layer.is_initialized = False
    layer.reset()


def hold_empty(layer, empty) -> None:
    """Empty an attention layer of a static cache so that its next `update`
    allocates nothing but the K/V it returns: `keys` and `values` set to
    `empty` (a 1-D tensor of 0 elements in the K/V dtype, which `torch.cat`
    skips), the layer initialised. A layer `_drop_attention` emptied would
    initialise itself in the next `update` with `torch.tensor([], device=...)`
    (cache_utils.py, `DynamicLayer.lazy_initialization`, 5.17 and 5.24), a
    host-built tensor inside a forward that a CUDA graph captures."""
    layer.keys = layer.values = empty
    layer.is_initialized = True


def conv_state(cache, layer: int):
    """The conv state a `DynamicCache` holds for linear-attention `layer`
    (None before its first update). transformers 5.24 has
    `Cache.get_conv_state`; 5.17 (the H200 image) keeps the same tensor as
    `cache.layers[layer].conv_states[0]`, valid once `has_previous_state[0]`
    (cache_utils.py, `LinearAttentionLayer.update_conv_state`, v5.17.0)."""
    get = getattr(cache, "get_conv_state", None)
    if get is not None:
        return get(layer)
    held = cache.layers[layer]
    return held.conv_states[0] if held.has_previous_state[0] else None


def recurrent_state(cache, layer: int):
    """The recurrent (SSM) state of linear-attention `layer`, as `conv_state`
    finds the conv state (5.24 `Cache.get_recurrent_state`; 5.17
    `cache.layers[layer].recurrent_states[0]`)."""
    get = getattr(cache, "get_recurrent_state", None)
    if get is not None:
        return get(layer)
    held = cache.layers[layer]
    return held.recurrent_states[0] if held.has_previous_state[0] else None


def torch_index_select(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
    """`out[:] = src[idx]` without a temporary (rows of a strided pool view)."""
    import torch

    torch.index_select(src, 0, idx, out=out)


def pool_state_views(model, pool, band: str) -> StateViews:
    """`StateViews` of `model`'s recurrent layers (`layer_states`: conv in
    the model's dtype, SSM in fp32) over the pool's state band `band`.

    Raises:
        ValueError: one line: the band's bytes per request differ from what
            the model's recurrent layers keep (named, with the dtypes), or
            the model has no layer `recurrent_layers` can bind.
    """
    states = layer_states(model, band)
    need, have = state_bytes(states), pool.layout.geometry(band).band.entry_bytes
    if need != have:
        dtypes = sorted({str(t[2]).removeprefix("torch.") for s in states for t in s.tensors})
        raise ValueError(f"state band {band!r} holds {have} bytes per request; the model's {len(states)} "
                         f"recurrent layers keep {need} (in {', '.join(dtypes)}: conv in the model's dtype, "
                         "SSM in fp32); expected equal sizes")
    return StateViews(pool, states)

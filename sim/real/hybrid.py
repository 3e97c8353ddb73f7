"""Decoder layers of a hybrid model (attention, recurrent, MLP / MoE blocks) for the compiled layers.

An attention-only model's decoder layer holds its attention as `self_attn`.
A hybrid's layer stack mixes kinds: Nemotron-H's `NemotronHBlock` holds one
`mixer` (`NemotronHAttention`, a Mamba-2 mixer, an MoE or an MLP; its
`block_type` says which); LFM2's layers hold `self_attn` or a short `conv`.
`attention_module` and `recurrent_module` find a layer's attention and
recurrent module, whatever it is called.

A recurrent module reads and writes its state through the transformers
cache the forward carries (`DynamicCache`: `get_conv_state`,
`update_conv_state`, `update_recurrent_state`; transformers 5.17 reads
`has_previous_state(i)` and `layers[i].conv_states[0]` instead), always at
its own `layer_idx`. Compiled with the whole cache as an input, a graph
would index the cache's list of layers by that index and hold it as a
constant, so every recurrent layer would compile a graph of its own.
`LayerCache` is the cache one layer's compiled forward gets instead: the
same API, every index answering with the one transformers layer
(`LinearAttentionLayer`) the wrapper took from the real cache before the
call. The layer's own `update_conv_state` / `update_recurrent_state` run
inside the graph (dynamo traces them; a first chunk's lazy allocation of
the state tensors is replayed on the layer after the graph), so the state
the binder scatters after the forward is transformers' own. The graph's
guards read the layer's flags (`has_previous_state`, initialised or not),
so a first chunk (no state yet) and a continuing chunk compile one graph
each, shared by every recurrent layer of the model.
"""

from __future__ import annotations

from typing import Any

CACHE_KWARGS = ("cache", "past_key_values")
"""The keyword a decoder layer takes its cache by: transformers 5.24
(`cache`) or 5.17 (`past_key_values`)."""


def attention_module(layer) -> Any:
    """The attention module of a decoder layer that carries its
    `layer_idx` (`self_attn`, or a hybrid block's `mixer` whose class is an
    attention: transformers names them `*Attention`), or None."""
    attn = getattr(layer, "self_attn", None)
    if attn is not None and hasattr(attn, "layer_idx"):
        return attn
    mixer = getattr(layer, "mixer", None)
    if mixer is not None and type(mixer).__name__.endswith("Attention") and hasattr(mixer, "layer_idx"):
        return mixer
    return None


def recurrent_module(layer) -> Any:
    """The recurrent child of a decoder layer (a Mamba-2 mixer, a short
    conv: `sim.real.state.is_recurrent`), or None."""
    from unikv.sim.real.state import is_recurrent

    return next((m for m in layer.children() if is_recurrent(m)), None)


def stateless_block(layer) -> bool:
    """Whether a decoder layer is a hybrid's block without attention or
    state (Nemotron-H's MLP and MoE blocks: a `mixer` that reads no cache)."""
    return getattr(layer, "mixer", None) is not None and attention_module(layer) is None \
        and recurrent_module(layer) is None


class _Every:
    """A sequence whose every index is the same item (`LayerCache.layers`)."""

    def __init__(self, item: Any, n: int) -> None:
        self.item, self.n = item, n

    def __getitem__(self, index: Any) -> Any:
        return self.item

    def __len__(self) -> int:
        return self.n


class LayerCache:
    """The transformers cache API of one recurrent layer: every layer index
    answers with `layer` (the real cache's `layers[i]`), so the index is no
    constant of a compiled graph (module docstring).

    Args:
        layer: transformers' linear-attention cache layer (5.17 and 5.24:
            `conv_states`, `recurrent_states`, `has_previous_state` dicts by
            state index, `update_conv_state`, `update_recurrent_state`).
        n: the real cache's number of layers (what `len(cache.layers)` says).
    """

    def __init__(self, layer: Any, n: int) -> None:
        self.layer = layer
        self.layers = _Every(layer, n)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> Any:
        """The conv state, None before the layer's first update (5.24's `Cache.get_conv_state`)."""
        return self.layer.conv_states[state_idx] if self.layer.has_previous_state[state_idx] else None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> Any:
        """The recurrent state, None before the layer's first update (5.24)."""
        return self.layer.recurrent_states[state_idx] if self.layer.has_previous_state[state_idx] else None

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        """Whether the layer holds state (5.17's `Cache.has_previous_state`)."""
        flags = self.layer.has_previous_state
        return all(flags.values()) if state_idx is None else bool(flags[state_idx])

    def is_recording_past(self, layer_idx: int) -> bool:
        return bool(getattr(self.layer, "record_past", False))

    def update_conv_state(self, conv_states: Any, layer_idx: int, state_idx: int = 0, **kwargs) -> Any:
        return self.layer.update_conv_state(conv_states, state_idx, **kwargs)

    def update_recurrent_state(self, recurrent_states: Any, layer_idx: int, state_idx: int = 0, **kwargs) -> Any:
        return self.layer.update_recurrent_state(recurrent_states, state_idx, **kwargs)


def layer_kwargs(kwargs: dict, recurrent: Any, attention: Any, index: int | None = None) -> dict:
    """A layer's keywords for its compiled forward. The cache is replaced
    by the layer's `LayerCache` (a recurrent layer) or dropped (an
    attention layer keeps its K / V in the pool; an MLP / MoE block reads
    none); the step's `unikv_step` reaches only an attention layer
    (transformers hands a mixer's keywords on to its conv and scan
    kernels). An attention-only model's keywords (no cache, every layer an
    attention) are returned as they are. `index`: the recurrent layer's
    own index in the cache (default its `layer_idx`; `CompiledLayers.
    active` gives every recurrent module one index inside its block). A
    cache carrying a padded chunk's length (`sim.real.padded_chunk.
    ChunkLength`, as `unikv_chunk`) hands it on to the layer's cache."""
    name = next((n for n in CACHE_KWARGS if kwargs.get(n) is not None), None)
    if name is None and (attention is not None or "unikv_step" not in kwargs):
        return kwargs
    out = dict(kwargs)
    if attention is None:
        out.pop("unikv_step", None)
    if name is not None:
        cache = out.pop(name)
        if recurrent is not None:
            own = recurrent.layer_idx if index is None else index
            out[name] = LayerCache(cache.layers[own], len(cache.layers))
            chunk = getattr(cache, "unikv_chunk", None)
            if chunk is not None:  # a padded chunk's length (sim.real.padded_chunk.carry)
                out[name].unikv_chunk = chunk
    return out

"""Which layers of a transformers model keep which cache, read from its config.

`model_layers(config, dtype)` reads a transformers config object exactly as
transformers' modeling code does (5.17 and 5.24 alike):

- the layer kinds from `config.layer_types` ("full_attention",
  "sliding_attention"; the recurrent kinds "linear_attention", "mamba",
  "conv" hold no KV); a config without `layer_types` is all full attention
  unless it sets `sliding_window` (then the modeling file decides which
  layers slide, e.g. Mistral every layer: refused here rather than guessed);
- `head_dim` as `getattr(config, "head_dim", hidden_size // num_attention_heads)`
  (`LlamaAttention.__init__`, `GptOssAttention.__init__`; Gemma-2/3 set it
  in their configs);
- `num_key_value_heads` (`LlamaAttention.num_key_value_groups`);
- the window of a sliding layer: `config.sliding_window`
  (`Gemma3Attention.__init__`: `sliding_window if layer_type ==
  "sliding_attention"`), applied as `i - window < j <= i`
  (`masking_utils.sliding_window_overlay`).

`check_layout(layers, layout)` holds that description against the bands
unikv's `build_layout` made for the same config: the bytes per token of each
band must be equal (K and V of every layer of the band), else the views
would misread the pool. `check_recurrent(layers, bound=...)` refuses
recurrent layers whose state the forward does not bind to the pool's state
slots (the real executor binds Mamba-2 mixers and short-conv layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from unikv.tensors import LayerKV

FULL, SLIDING, RECURRENT, NONE = "full", "sliding", "recurrent", "none"
# "mlp" / "moe": Nemotron-H's feed-forward-only layers (`NemotronHConfig.layer_types`), no cache;
# "attention" / "mamba": the legacy names transformers 5.24 remaps to "full_attention" /
# "linear_attention" (`configuration_utils._LEGACY_LAYER_TYPE_REMAP`)
_KINDS = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING,
          "linear_attention": RECURRENT, "mamba": RECURRENT, "mamba2": RECURRENT, "conv": RECURRENT,
          "mlp": NONE, "moe": NONE}


@dataclass(frozen=True, kw_only=True)
class ModelLayers:
    """The per-layer cache of one model.

    Attributes:
        kinds: per layer index, "full", "sliding", "recurrent" or "none"
            (a feed-forward layer: no cache).
        kv: the attention layers' `LayerKV`, ascending by layer.
        window_tokens: the sliding layers' window (None without one).
    """

    kinds: tuple[str, ...]
    kv: tuple[LayerKV, ...]
    window_tokens: int | None

    @property
    def recurrent(self) -> tuple[int, ...]:
        """Layer indices that keep recurrent state instead of KV."""
        return tuple(i for i, k in enumerate(self.kinds) if k == RECURRENT)

    def window(self, layer: int) -> int | None:
        """The window of `layer` (None for a full layer)."""
        return self.window_tokens if self.kinds[layer] == SLIDING else None

    def band_bytes(self) -> dict[str, int]:
        """Bytes per token of each band: K + V of all its layers."""
        out: dict[str, int] = {}
        for spec in self.kv:
            out[spec.band] = out.get(spec.band, 0) + spec.token_bytes
        return out

    def band_blocks(self) -> dict[str, int]:
        """Blocks per page of each band (2 per K/V layer), its `blocks_per_page`."""
        out: dict[str, int] = {}
        for spec in self.kv:
            out[spec.band] = out.get(spec.band, 0) + spec.blocks
        return out


def model_layers(config, dtype: torch.dtype, *, bands: Mapping[str, str] | None = None) -> ModelLayers:
    """The per-layer cache of a transformers model's (text) config.

    Args:
        config: a transformers `PretrainedConfig` (a multimodal config's
            `get_text_config()` is read).
        dtype: the KV dtype stored in the pool.
        bands: layer kind -> band name; default {"full": "full", "sliding":
            "swa"} (a layout that keeps every layer on one band maps both
            to "full").
    Raises:
        ValueError: naming the field: an unknown layer type, a layer count
            that differs from `num_hidden_layers`, a `sliding_window`
            without `layer_types`, an MLA config (`kv_lora_rank`:
            transformers' attention receives decompressed K / V, not the
            latent), or a sliding layer without a window.
    """
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = {FULL: "full", SLIDING: "swa", **(bands or {})}
    kinds = _layer_kinds(c)
    if getattr(c, "kv_lora_rank", None) is not None:
        raise ValueError(f"config kv_lora_rank={c.kv_lora_rank}: MLA is not described; transformers' "
                         "attention receives per-head decompressed K / V, not the latent")
    window = getattr(c, "sliding_window", None) if SLIDING in kinds else None
    if SLIDING in kinds and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"config sliding_window={window!r}: sliding layers need a positive window")
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    kv = tuple(LayerKV(i, names[k], kv_heads, head_dim, head_dim, dtype)
               for i, k in enumerate(kinds) if k in (FULL, SLIDING))
    return ModelLayers(kinds=kinds, kv=kv, window_tokens=window)


def _layer_kinds(c) -> tuple[str, ...]:
    n = c.num_hidden_layers
    types = getattr(c, "layer_types", None)
    if types is None:
        window = getattr(c, "sliding_window", None)
        if window is not None:
            raise ValueError(f"config sliding_window={window} without layer_types: which layers slide "
                             "is model-specific; expected layer_types")
        return (FULL,) * n
    unknown = sorted({t for t in types if t not in _KINDS})
    if unknown:
        raise ValueError(f"config layer_types holds {unknown}; expected types in {sorted(_KINDS)}")
    if len(types) != n:
        raise ValueError(f"config layer_types has {len(types)} entries; expected num_hidden_layers={n}")
    return tuple(_KINDS[t] for t in types)


def check_layout(layers: ModelLayers, layout) -> None:
    """Refuse a layout whose token bands differ from the model's layers.

    Args:
        layers: `model_layers` of the model.
        layout: a `unikv.Layout` (e.g. `build_layout(...).layout` for the
            same config at the same KV dtype).
    Raises:
        ValueError: naming the band and both bytes-per-token figures (or
            both blocks-per-page figures), or a band only one side has.
    """
    have = {b.name: b for b in layout.token_bands}
    want = layers.band_bytes()
    for name in sorted(set(have) ^ set(want)):
        side = "the layout has no" if name not in have else "the model's layers hold nothing on"
        raise ValueError(f"band {name!r}: {side} band {name!r}; model bands {sorted(want)}, "
                         f"layout token bands {sorted(have)}")
    for name in sorted(want):
        if have[name].entry_bytes != want[name]:
            raise ValueError(f"band {name!r}: the model's layers hold {want[name]} bytes per token; "
                             f"the layout's band holds {have[name].entry_bytes}")
        blocks = layers.band_blocks()[name]
        if have[name].blocks_per_page != blocks:
            raise ValueError(f"band {name!r}: the model's layers make {blocks} blocks per page; "
                             f"the layout's band has blocks_per_page={have[name].blocks_per_page}")


def check_recurrent(layers: ModelLayers, config=None, *, bound: tuple[int, ...] = ()) -> None:
    """Refuse recurrent layers whose state the forward does not carry
    between steps: every recurrent layer must be in `bound` (the layers a
    `sim.real.state.StateBinder` gathers and scatters). A layer left out
    would start each step from zero state (the real executor runs without
    transformers' own cache), and decode would yield wrong tokens without
    an error.

    Args:
        config: the transformers config, to name its layer types (optional).
        bound: layer indices whose state is bound to the pool's state slots.
    Raises:
        ValueError: naming the unbound recurrent layers (and their types).
    """
    loose = [i for i in layers.recurrent if i not in set(bound)]
    if not loose:
        return
    c = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    types = getattr(c, "layer_types", None) if c is not None else None
    kinds = sorted({types[i] for i in loose}) if types else ["recurrent"]
    model = getattr(c, "model_type", None) or "this model"
    raise ValueError(f"layers {loose} keep recurrent state ({', '.join(kinds)}) of {model}, which the real "
                     "executor cannot bind to the pool's state slots (sim/real/state.py binds Mamba-2 "
                     "mixers and short-conv layers); expected Nemotron-H, LFM3 or an attention-only model")

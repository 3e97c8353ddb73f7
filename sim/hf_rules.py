"""The attributes transformers' config classes derive in `__post_init__`, per model_type.

Each rule takes the config dict already holding the file's fields and the
class's field defaults (`hf_config._fill`), and sets what
`transformers/models/<x>/configuration_<x>.py` `XConfig.__post_init__`
(transformers 5.24.0) sets, for the fields unikv reads. `RULES[model_type]`
lists a type's rules in the order its `__post_init__` runs them. A
`kwargs.get(name, default)` of transformers is `c.get(name, default)` here:
the file's extra keys stay in the dict, as transformers keeps them as
attributes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a rule may read besides the config.

    Attributes:
        class_defaults: the class's `default_*` constants (hf_defaults.json).
        given: the keys the file itself gave (before the defaults).
        source: how errors name the config (its file).
    """

    class_defaults: Mapping[str, Any]
    given: frozenset[str]
    source: str


Rule = Callable[[Config, Context], None]

# Model types whose config class lives under another name: Kimi-K2's
# config.json says "kimi_k2" and its auto_map names DeepSeek's DeepseekV3Config.
ALIASES = {"kimi_k2": "deepseek_v3"}

# transformers/configuration_utils.py `_LEGACY_LAYER_TYPE_REMAP`, applied by
# `remap_legacy_layer_types` at the end of PreTrainedConfig.__post_init__.
_LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention",
                       "deepseek_sparse_attention": "indexed_attention",
                       "qwen_sparse_attention": "indexed_attention"}


def remap_layer_types(c: Config) -> None:
    """Rename legacy layer-type names in `layer_types` / `mtp_layer_types` (every class)."""
    for key in ("layer_types", "mtp_layer_types"):
        if isinstance(c.get(key), list):
            c[key] = [_LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in c[key]]


def _n(c: Config) -> int:
    return c["num_hidden_layers"]


# -- rules shared by many classes ----------------------------------------------

def kv_heads(c: Config, x: Context) -> None:
    """`num_key_value_heads` None -> `num_attention_heads` (LlamaConfig.__post_init__ and most others)."""
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c.get("num_attention_heads")


def head_dim(c: Config, x: Context) -> None:
    """`head_dim` None -> hidden_size // num_attention_heads (LlamaConfig.__post_init__)."""
    if c.get("head_dim") is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]


def mla_dims(c: Config, x: Context) -> None:
    """DeepseekV3Config.__post_init__: qk_head_dim = nope + rope; head_dim points at the rope slice."""
    c["qk_head_dim"] = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    c["head_dim"] = c["qk_rope_head_dim"]


def _types(c: Config, make: Callable[[int], str]) -> None:
    if c.get("layer_types") is None:
        c["layer_types"] = [make(i) for i in range(_n(c))]


# -- per family ------------------------------------------------------------------

def qwen2_window(c: Config, x: Context) -> None:
    """Qwen2Config / Qwen3Config.__post_init__: window only with use_sliding_window; layers >= max_window_layers slide."""
    c["sliding_window"] = c.get("sliding_window") if c.get("use_sliding_window") else None
    _types(c, lambda i: "sliding_attention" if c["sliding_window"] is not None
           and i >= c["max_window_layers"] else "full_attention")


def qwen2_moe_window(c: Config, x: Context) -> None:
    """Qwen2MoeConfig.__post_init__: window 0 when off; even layers below max_window_layers slide."""
    c["mlp_only_layers"] = c.get("mlp_only_layers") or []
    c["sliding_window"] = c.get("sliding_window") if c.get("use_sliding_window") else 0
    _types(c, lambda i: "sliding_attention" if (i + 1) % 2 and i < c["max_window_layers"]
           and c.get("use_sliding_window") else "full_attention")


def qwen3_moe_window(c: Config, x: Context) -> None:
    """Qwen3MoeConfig.__post_init__: window only with use_sliding_window (no layer_types)."""
    c["sliding_window"] = c.get("sliding_window") if c.get("use_sliding_window") else None
    c["mlp_only_layers"] = c.get("mlp_only_layers") or []


def alternate_sliding(c: Config, x: Context) -> None:
    """Gemma2Config / GptOssConfig.__post_init__: even layers slide, odd layers are full."""
    _types(c, lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention")


def gemma3_layers(c: Config, x: Context) -> None:
    """Gemma3TextConfig.__post_init__: bidirectional halves the window; every k-th layer full (k = sliding_window_pattern, 6)."""
    if c.get("use_bidirectional_attention"):
        c["sliding_window"] = c["sliding_window"] // 2 + 1
    k = c.get("sliding_window_pattern", 6)
    _types(c, lambda i: "sliding_attention" if (i + 1) % k else "full_attention")


def gemma3n_layers(c: Config, x: Context) -> None:
    """Gemma3nTextConfig.__post_init__: one intermediate size per layer; every 5th layer full."""
    if not isinstance(c.get("intermediate_size"), list):
        c["intermediate_size"] = [c["intermediate_size"]] * _n(c)
    _types(c, lambda i: "full_attention" if (i + 1) % 5 == 0 else "sliding_attention")


def gemma4_layers(c: Config, x: Context) -> None:
    """Gemma4TextConfig.__post_init__: 5:1 sliding pattern, last layer forced full, global-layer geometry.

    transformers moves `global_head_dim` (default 512) and
    `num_global_key_value_heads` (if `attention_k_eq_v`) into the full layers'
    `per_layer_config`; here they stay as fields, filled with those defaults.
    """
    if c.get("use_bidirectional_attention") == "all":
        c["sliding_window"] = c["sliding_window"] // 2 + 1
    _types(c, lambda i: "sliding_attention" if (i + 1) % 6 else "full_attention")
    if c["layer_types"]:
        c["layer_types"][-1] = "full_attention"
    c.setdefault("global_head_dim", 512)
    global_kv = c.get("num_global_key_value_heads") if c.get("attention_k_eq_v", True) else None
    c["num_global_key_value_heads"] = global_kv if global_kv is not None else c["num_key_value_heads"]


def llama4_layers(c: Config, x: Context) -> None:
    """Llama4TextConfig.__post_init__: NoPE every no_rope_layer_interval-th layer, MoE layers, chunked layers."""
    k = c["no_rope_layer_interval"]
    if not c.get("no_rope_layers"):
        c["no_rope_layers"] = [int((i + 1) % k != 0) for i in range(_n(c))]
    head_dim(c, x)
    step = c["interleave_moe_layer_step"]
    if c.get("moe_layers") is None:
        c["moe_layers"] = list(range(step - 1, _n(c), step))
    if c.get("layer_types") is None:
        chunked = c.get("attention_chunk_size") is not None
        c["layer_types"] = ["chunked_attention" if r and chunked else "full_attention"
                            for r in c["no_rope_layers"]]


def deepseek_v32_layers(c: Config, x: Context) -> None:
    """DeepseekV32Config.__post_init__: dense first layers, every layer indexed (DSA)."""
    if c.get("mlp_layer_types") is None:
        dense = min(c["first_k_dense_replace"], _n(c))
        c["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (_n(c) - dense)
    _types(c, lambda i: "indexed_attention")
    if c.get("num_experts") is not None:
        c["n_routed_experts"] = c["num_experts"]


def glm_dsa_layers(c: Config, x: Context) -> None:
    """GlmMoeDsaConfig.__post_init__: per-layer indexer mode from a pattern or the freq/offset schedule,
    then as DeepSeek-V3.2 (dense first layers, every layer indexed)."""
    if c.get("indexer_types") is None:
        pattern = c.get("index_topk_pattern")
        if isinstance(pattern, str):
            c["indexer_types"] = [{"F": "full", "S": "shared"}[ch] for ch in pattern]
        elif pattern is not None:
            c["indexer_types"] = list(pattern)
        else:
            freq, offset = max(c.get("index_topk_freq", 1), 1), c.get("index_skip_topk_offset", 2)
            c["indexer_types"] = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(_n(c))]
    deepseek_v32_layers(c, x)


_V4_RATIOS = {0: "sliding_attention", 4: "compressed_sparse_attention",
              128: "heavily_compressed_attention"}


def deepseek_v4_layers(c: Config, x: Context) -> None:
    """DeepseekV4Config.__post_init__: layer_types from legacy compress_ratios, else 2 HCA + CSA/HCA interleave."""
    n = _n(c)
    if c.get("layer_types") is None and c.get("compress_ratios") is not None:
        bad = [r for r in c["compress_ratios"] if r not in _V4_RATIOS]
        if bad:
            raise ValueError(f"{x.source}: field 'compress_ratios' holds {bad}; expected "
                             f"ratios of {sorted(_V4_RATIOS)}")
        c["layer_types"] = [_V4_RATIOS[r] for r in c["compress_ratios"]]
    if c.get("layer_types") is None:
        mix = ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
               for i in range(max(n - 2, 0))]
        c["layer_types"] = ["heavily_compressed_attention"] * min(n, 2) + mix
    c["layer_types"] = list(c["layer_types"][:n])
    if c.get("mlp_layer_types") is None:
        hashed = c.get("num_hash_layers", x.class_defaults["default_num_hash_layers"])
        c["mlp_layer_types"] = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    c["mlp_layer_types"] = list(c["mlp_layer_types"][:n])
    if c.get("compress_rates") is None:
        c["compress_rates"] = dict(x.class_defaults["default_compress_rates"])
    if c.get("partial_rotary_factor") is None:
        rope = c.get("qk_rope_head_dim")
        c["partial_rotary_factor"] = (rope / c["head_dim"] if rope is not None
                                      else x.class_defaults["default_partial_rotary_factor"])
    c["qk_rope_head_dim"] = int(c["head_dim"] * c["partial_rotary_factor"])


def kimi_linear_layers(c: Config, x: Context) -> None:
    """KimiLinearConfig.__post_init__: KDA fields from linear_attn_config; 1-indexed layer lists."""
    lin = c.get("linear_attn_config") or {}
    c["linear_head_dim"] = lin.get("head_dim", c.get("linear_head_dim"))
    c["linear_num_heads"] = lin.get("num_heads", c.get("linear_num_heads"))
    c["linear_conv_kernel_dim"] = lin.get("short_conv_kernel_size", c.get("linear_conv_kernel_dim"))
    if c.get("layer_types") is None:
        if "full_attn_layers" in lin and "kda_layers" in lin:
            types: list[Any] = [None] * _n(c)
            for layer in lin["full_attn_layers"]:
                types[layer - 1] = "full_attention"
            for layer in lin["kda_layers"]:
                types[layer - 1] = "linear_attention"
            c["layer_types"] = types
        else:
            _types(c, lambda i: "full_attention" if i and i % 4 == 0 else "linear_attention")
    if c.get("mlp_layer_types") is None:
        dense = c.get("first_k_dense_replace", 1)
        c["mlp_layer_types"] = ["dense" if i < dense else "sparse" for i in range(_n(c))]


_ZAMBA2_DEFAULT_BLOCKS = (["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7
                          + ["linear_attention"] * 4 + ["hybrid"] + ["linear_attention"] * 3
                          + ["hybrid"] + ["linear_attention"] * 2)


def zamba2_dims(c: Config, x: Context) -> None:
    """Zamba2Config.__post_init__: shared-attention width 2 x hidden, mamba head dim, 54-layer default pattern."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    c["intermediate_size"] = c.get("intermediate_size") or 4 * hidden
    c["attention_hidden_size"] = 2 * hidden
    c["attention_head_dim"] = 2 * hidden // heads
    c["mamba_headdim"] = int(c["mamba_expand"] * hidden) // c["n_mamba_heads"]
    if c.get("use_long_context"):
        c["max_position_embeddings"] = 16384
    kv_heads(c, x)
    c["kv_channels"] = hidden // heads
    blocks = c.get("layers_block_type")
    c["layers_block_type"] = list(_ZAMBA2_DEFAULT_BLOCKS) if blocks is None else [
        _LEGACY_LAYER_TYPES.get(t, t) for t in blocks]
    c["hybrid_layer_ids"] = [i for i, t in enumerate(c["layers_block_type"]) if t == "hybrid"]


def lfm2_layers(c: Config, x: Context) -> None:
    """Lfm2Config.__post_init__: attention at full_attn_idxs (default all), conv elsewhere; legacy names."""
    if c.get("layer_types") is None:
        idxs = c.get("full_attn_idxs")
        c["full_attn_idxs"] = idxs = list(range(_n(c))) if idxs is None else idxs
        c["layer_types"] = ["full_attention" if i in idxs else "conv" for i in range(_n(c))]
    lfm2_tie(c, x)
    c["intermediate_size"] = c.get("block_ff_dim", c["intermediate_size"])


def lfm2_tie(c: Config, x: Context) -> None:
    """Lfm2(Moe)Config.__post_init__: legacy `tie_embedding` wins over tie_word_embeddings."""
    c["tie_word_embeddings"] = c.get("tie_embedding", c["tie_word_embeddings"])


def mamba_dims(c: Config, x: Context) -> None:
    """MambaConfig.__post_init__: intermediate = expand x hidden; time_step_rank "auto" = ceil(hidden / 16)."""
    c["intermediate_size"] = int(c["expand"] * c["hidden_size"])
    mamba2_rank(c, x)


def mamba2_rank(c: Config, x: Context) -> None:
    """Mamba2Config.__post_init__: time_step_rank "auto" = ceil(hidden / 16)."""
    if c.get("time_step_rank") == "auto":
        c["time_step_rank"] = math.ceil(c["hidden_size"] / 16)


def mamba_d_head(c: Config, x: Context) -> None:
    """FalconH1Config / GraniteMoeHybridConfig.__post_init__: mamba_d_head "auto" = mamba width / mamba_n_heads."""
    width = c.get("mamba_d_ssm") or c["mamba_expand"] * c["hidden_size"]
    if c.get("mamba_d_head") == "auto":
        c["mamba_d_head"] = width // c["mamba_n_heads"]


def granite_layers(c: Config, x: Context) -> None:
    """GraniteMoeHybridConfig.__post_init__: every layer mamba unless layer_types says otherwise."""
    _types(c, lambda i: "linear_attention")


def jamba_rank(c: Config, x: Context) -> None:
    """JambaConfig.__post_init__: mamba_dt_rank "auto" = ceil(hidden / 16)."""
    if c.get("mamba_dt_rank") == "auto":
        c["mamba_dt_rank"] = math.ceil(c["hidden_size"] / 16)


def jamba_layers(c: Config, x: Context) -> None:
    """JambaConfig's `layers_block_type` / `layer_types` properties: attention where i % period == offset."""
    period, offset = c["attn_layer_period"], c["attn_layer_offset"]
    c["layers_block_type"] = ["attention" if i % period == offset else "mamba" for i in range(_n(c))]
    c["layer_types"] = ["full_attention" if t == "attention" else "linear_attention"
                        for t in c["layers_block_type"]]


def all_recurrent(c: Config, x: Context) -> None:
    """MambaConfig / Mamba2Config's `layer_types` property: every layer recurrent."""
    c["layer_types"] = ["linear_attention"] * _n(c)


def falcon_h1_layers(c: Config, x: Context) -> None:
    """FalconH1Config's `layers_block_type` property: every layer "hybrid" (attention and Mamba-2 in parallel)."""
    c["layers_block_type"] = ["hybrid"] * _n(c)


_NEMOTRON_LEGACY = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                    "mamba_expand": "expand", "mamba_chunk_size": "chunk_size",
                    "mamba_conv_bias": "use_conv_bias"}
_NEMOTRON_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def nemotron_h_layers(c: Config, x: Context) -> None:
    """NemotronHConfig.__post_init__: legacy mamba_* names; layers_block_type from hybrid_override_pattern."""
    for legacy, name in _NEMOTRON_LEGACY.items():
        if legacy in c:
            c[name] = c[legacy]
    pattern = c.get("hybrid_override_pattern")
    if c.get("layers_block_type") is None and pattern is not None:
        bad = sorted({ch for ch in str(pattern) if ch not in _NEMOTRON_PATTERN})
        if not isinstance(pattern, str) or bad:
            raise ValueError(f"{x.source}: field 'hybrid_override_pattern'={pattern!r} must be a "
                             f"string of {''.join(_NEMOTRON_PATTERN)}")
        c["layers_block_type"] = [_NEMOTRON_PATTERN[ch] for ch in pattern]
    elif c.get("layers_block_type") is None:
        c["layers_block_type"] = ["linear_attention", "moe", "full_attention", "mlp"]
    c["layers_block_type"] = [_LEGACY_LAYER_TYPES.get(t, t) for t in c["layers_block_type"]]
    # NemotronHConfig's `num_hidden_layers` property is len(layers_block_type); a file whose
    # own count disagrees is malformed (transformers would silently take the pattern's).
    given, depth = c.get("num_hidden_layers"), len(c["layers_block_type"])
    if given is not None and given != depth and "num_hidden_layers" in x.given:
        raise ValueError(f"{x.source}: field 'hybrid_override_pattern' has {depth} entries but "
                         f"num_hidden_layers={given}; expected one per layer")
    c["num_hidden_layers"] = depth
    kv_heads(c, x)


def interval_layers(c: Config, x: Context) -> None:
    """Qwen3NextConfig / Qwen3_5TextConfig.__post_init__: every full_attention_interval-th layer (4) is full."""
    c["mlp_only_layers"] = c.get("mlp_only_layers") or []
    k = c.get("full_attention_interval", 4)
    _types(c, lambda i: "linear_attention" if (i + 1) % k else "full_attention")


def minimax_layers(c: Config, x: Context) -> None:
    """MiniMaxConfig.__post_init__: even layers full, odd layers lightning, unless layer_types says.

    A remote-code `attn_type_list` is not read by transformers (it would
    alternate the layers): refused, so a MiniMax-Text-01 file is never misread.
    """
    if c.get("layer_types") is None and c.get("attn_type_list") is not None:
        raise ValueError(f"{x.source}: field 'attn_type_list' is not read by transformers' "
                         "MiniMaxConfig (it would alternate the layers); give 'layer_types'")
    kv_heads(c, x)
    _types(c, lambda i: "full_attention" if (i + 1) % 2 else "linear_attention")


def mimo_layers(c: Config, x: Context) -> None:
    """MiMoV2FlashConfig.__post_init__: layer 0 and every 6th full; dense first MLP; window = sliding_window_size + 1."""
    _types(c, lambda i: "full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention")
    if c.get("mlp_layer_types") is None:
        c["mlp_layer_types"] = ["dense"] + ["sparse"] * (_n(c) - 1)
    if c.get("sliding_window_size") is not None:
        c["sliding_window"] = c["sliding_window_size"] + 1  # SGLang attends to window + the query


RULES: dict[str, tuple[Rule, ...]] = {
    "llama": (head_dim, kv_heads),
    "mistral": (head_dim, kv_heads),
    "mixtral": (kv_heads,),
    "qwen2": (qwen2_window, kv_heads),
    "qwen3": (qwen2_window, kv_heads),
    "qwen2_moe": (qwen2_moe_window,),
    "qwen3_moe": (qwen3_moe_window,),
    "gemma2": (alternate_sliding,),
    "gemma3_text": (gemma3_layers,),
    "gemma3n_text": (gemma3n_layers,),
    "gemma4_text": (gemma4_layers,),
    "gpt_oss": (kv_heads, head_dim, alternate_sliding),
    "llama4_text": (kv_heads, llama4_layers),
    "deepseek_v2": (mla_dims, kv_heads),
    "deepseek_v3": (kv_heads, mla_dims),
    "deepseek_v32": (mla_dims, deepseek_v32_layers),
    "glm_moe_dsa": (mla_dims, glm_dsa_layers),
    "deepseek_v4": (deepseek_v4_layers,),
    "kimi_linear": (kv_heads, mla_dims, kimi_linear_layers),
    "zamba2": (zamba2_dims,),
    "lfm2": (lfm2_layers,),
    "lfm2_moe": (lfm2_tie,),
    "mamba": (mamba_dims, all_recurrent),
    "mamba2": (mamba2_rank, all_recurrent),
    "falcon_h1": (kv_heads, mamba_d_head, falcon_h1_layers),
    "jamba": (kv_heads, jamba_rank, jamba_layers),
    "nemotron_h": (nemotron_h_layers,),
    "qwen3_next": (interval_layers,),
    "qwen3_5_text": (interval_layers,),
    "qwen3_5_moe_text": (interval_layers,),
    "minimax": (minimax_layers,),
    "granitemoehybrid": (kv_heads, mamba_d_head, granite_layers),
    "mimo_v2_flash": (mimo_layers,),
}

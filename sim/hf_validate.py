"""Checks of a filled config: which fields are counts, intervals and layer patterns.

A malformed field gets one ValueError naming the config (its file), the
field, the value and what was expected. `check_inputs` runs before the
derivation rules (they divide by these fields and iterate these lists), on
the types only; `check_fields` runs on the filled config. A field that is
absent or null is not checked here (except `REQUIRED`): the code that needs
it names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Divisors and strides of the layer patterns: integers >= 1.
INTERVALS = (
    "sliding_window_pattern", "full_attention_interval", "no_rope_layer_interval",
    "attn_layer_period", "expert_layer_period", "interleave_moe_layer_step",
    "decoder_sparse_step", "num_hidden_layers",
)

# Counts and sizes: integers >= 1.
POSITIVE = (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "max_position_embeddings", "attention_chunk_size", "intermediate_size",
    "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok",
    "n_routed_experts", "num_local_experts", "num_experts", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "global_head_dim",
    "num_global_key_value_heads", "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "linear_num_heads", "linear_head_dim",
    "mamba_num_heads", "mamba_n_heads", "n_mamba_heads", "mamba_head_dim", "mamba_d_head",
    "mamba_d_state", "ssm_state_size", "state_size", "mamba_d_conv", "conv_kernel",
    "mamba_n_groups", "n_groups", "mamba_expand", "expand", "mamba_d_ssm", "attention_head_dim",
    "conv_L_cache", "time_step_rank", "mamba_dt_rank", "index_n_heads", "index_head_dim",
    "index_topk",
)

# Counts that may be 0.
NON_NEGATIVE = (
    "first_k_dense_replace", "n_shared_experts", "max_window_layers", "attn_layer_offset",
    "expert_layer_offset", "num_kv_shared_layers", "num_memory_tokens",
    "num_nextn_predict_layers",
)

# One entry per layer.
PATTERNS = (
    "layer_types", "mlp_layer_types", "no_rope_layers", "attn_type_list",
    "hybrid_layer_pattern", "layers_block_type", "hybrid_override_pattern",
)

# Lists of layer indices (0-based).
INDEX_LISTS = ("moe_layers", "full_attn_idxs", "mlp_only_layers", "hybrid_layer_ids")

# Sizes a class may leave as "auto" until __post_init__ derives them.
AUTO = ("mamba_d_head", "mamba_dt_rank", "time_step_rank")

# Fields the rules compute with: not null where the class gives them a default.
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "qk_nope_head_dim",
            "qk_rope_head_dim", "mamba_n_heads", "n_mamba_heads", "mamba_expand", "expand",
            "max_window_layers", "first_k_dense_replace", "head_dim")

# Fractions in (0, 1].
FRACTIONS = ("partial_rotary_factor",)

# Nested objects the rules read.
OBJECTS = ("linear_attn_config", "compress_rates")


def check_intervals(config: Mapping[str, Any], source: str) -> None:
    """Raise ValueError unless every interval field present is an integer >= 1."""
    for name in INTERVALS:
        _check_int(config, name, 1, source)


def check_inputs(config: Mapping[str, Any], defaults: Mapping[str, Any], source: str) -> None:
    """Before the rules: counts are integers (or "auto" where a class derives them), lists are lists.

    Args:
        config: the file's fields with the class defaults filled in.
        defaults: the class's field defaults (a REQUIRED field with a
            non-null default may not be null).
        source: how errors name the config.
    """
    for name in REQUIRED + INTERVALS:
        # An interval is never null in transformers (a null one fails there too).
        if name in config and config[name] is None and (name in INTERVALS or defaults.get(name) is not None):
            raise ValueError(f"{source}: field {name!r} is null; expected an integer")
    check_intervals(config, source)
    for names, minimum in ((POSITIVE, 1), (NON_NEGATIVE, 0)):
        for name in names:
            value = config.get(name)
            if value == "auto" and name in AUTO:
                continue
            if name == "intermediate_size" and isinstance(value, list):
                continue  # Gemma-3n: one per layer, checked with the filled config
            _check_int(config, name, minimum, source)
    _check_window(config, source)
    for name in PATTERNS + INDEX_LISTS:
        value = config.get(name)
        if value is not None and not isinstance(value, list) and not (
                name == "hybrid_override_pattern" and isinstance(value, str)):
            raise ValueError(f"{source}: field {name!r}={value!r} must be a list with one entry per layer")
    for name in FRACTIONS:
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value <= 1):
            raise ValueError(f"{source}: field {name!r}={value!r} must be a number in (0, 1]")
    for name in OBJECTS:
        if config.get(name) is not None and not isinstance(config[name], Mapping):
            raise ValueError(f"{source}: field {name!r}={config[name]!r} must be a JSON object")


def check_fields(config: Mapping[str, Any], source: str) -> None:
    """Raise ValueError on the first malformed count, size, pattern or index list."""
    check_intervals(config, source)
    for name in POSITIVE:
        if name == "intermediate_size" and isinstance(config.get(name), list):  # Gemma-3n: per layer
            _check_list(config, name, source)
            for value in config[name]:
                _check_value(name, value, 1, source)
            continue
        _check_int(config, name, 1, source)
    for name in NON_NEGATIVE:
        _check_int(config, name, 0, source)
    _check_window(config, source)
    for name in PATTERNS:
        _check_list(config, name, source)
    for name in INDEX_LISTS:
        _check_indices(config, name, source)


def _check_window(config: Mapping[str, Any], source: str) -> None:
    window = config.get("sliding_window")
    if window is not None and not (window == 0 and config.get("use_sliding_window") is False):
        _check_value("sliding_window", window, 1, source)  # Qwen2-MoE writes 0 for "off"
    _check_int(config, "sliding_window_size", 1, source)


def _check_int(config: Mapping[str, Any], name: str, minimum: int, source: str) -> None:
    if config.get(name) is not None:
        _check_value(name, config[name], minimum, source)


def _check_value(name: str, value: Any, minimum: int, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{source}: field {name!r}={value!r} must be an integer >= {minimum}")


def _check_list(config: Mapping[str, Any], name: str, source: str) -> None:
    value = config.get(name)
    if value is None:
        return
    if not isinstance(value, (list, str)) or (name != "hybrid_override_pattern" and isinstance(value, str)):
        raise ValueError(f"{source}: field {name!r}={value!r} must be a list with one entry per layer")
    n = config.get("num_hidden_layers")
    # Nemotron-H's block list defines the depth (transformers ignores num_hidden_layers there).
    if n is not None and len(value) != n:
        raise ValueError(f"{source}: field {name!r} has {len(value)} entries but "
                         f"num_hidden_layers={n}; expected one per layer")


def _check_indices(config: Mapping[str, Any], name: str, source: str) -> None:
    value, n = config.get(name), config.get("num_hidden_layers")
    if value is None or n is None:
        return
    if not isinstance(value, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n for i in value):
        raise ValueError(f"{source}: field {name!r}={value!r} must list layer indices in "
                         f"[0, {n}) (num_hidden_layers={n})")

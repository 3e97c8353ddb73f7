"""Read a Hugging Face config.json as transformers reads it, without transformers.

A `config.json` may leave any field to the defaults of transformers' config
class for its `model_type`, and transformers' `__post_init__` derives more
attributes from the others (Gemma-3's `layer_types` from
`sliding_window_pattern`, Llama's `head_dim` from `hidden_size`, Qwen's
windowed layers from `use_sliding_window` and `max_window_layers`). The
field defaults are package data (`data/hf_defaults.json`, derived from the
installed transformers by `benchmarks/derive_hf_defaults.py`, which records
the version and each class's module); the derivations are the rules of
`hf_rules`. A model_type transformers does not have gets no defaults.

    filled = load_config("path/to/model")            # read_config + with_defaults
    counts = unikv.sim.params.count_params(filled)

`docs/models.md` ("Reading a config.json") lists what is reproduced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from unikv.sim.hf_rules import ALIASES, RULES, Context, remap_layer_types
from unikv.sim.hf_validate import check_fields, check_inputs, check_intervals

# The fields unikv reads (the model parser and `params.count_params`): the
# tests hold these equal to transformers' own config objects.
READ_FIELDS = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "tie_word_embeddings",
    "num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias", "mlp_bias",
    "max_position_embeddings", "sliding_window", "use_sliding_window", "max_window_layers",
    "layer_types", "mlp_layer_types", "attention_chunk_size", "no_rope_layers",
    "no_rope_layer_interval", "moe_layers", "interleave_moe_layer_step",
    "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "num_kv_shared_layers",
    "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "qk_head_dim",
    "v_head_dim", "n_routed_experts", "num_local_experts", "num_experts", "num_experts_per_tok",
    "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
    "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers",
    "index_n_heads", "index_head_dim", "full_attention_interval", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "linear_num_heads", "linear_head_dim",
    "layers_block_type", "hybrid_layer_ids", "attention_hidden_size", "attention_head_dim",
    "mamba_num_heads", "mamba_n_heads", "mamba_head_dim", "mamba_d_head", "mamba_d_state",
    "mamba_d_conv", "mamba_expand", "mamba_n_groups", "mamba_d_ssm", "mamba_dt_rank",
    "mamba_headdim", "n_mamba_heads", "ssm_state_size", "state_size", "conv_kernel", "n_groups",
    "expand", "time_step_rank", "chunk_size", "use_conv_bias", "use_bias", "mamba_conv_bias",
    "mamba_proj_bias", "full_attn_idxs", "conv_L_cache", "attn_layer_period", "attn_layer_offset",
    "expert_layer_period", "expert_layer_offset", "num_memory_tokens", "compress_rates", "dtype",
)

# Top-level keys of a multimodal config kept beside its filled text config.
_TOP_LEVEL_KEPT = ("architectures", "torch_dtype", "dtype", "quantization_config", "auto_map")


@cache
def defaults_table() -> dict[str, Any]:
    """The bundled defaults table (`data/hf_defaults.json`), parsed once."""
    text = resources.files("unikv.sim").joinpath("data").joinpath("hf_defaults.json").read_text()
    return json.loads(text)


def transformers_version() -> str:
    """The transformers version the bundled defaults were derived from."""
    return str(defaults_table()["transformers_version"])


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a config.json, as written (no defaults).

    Args:
        path: a config.json file, or a model folder holding one.

    Returns:
        A new dict.

    Raises:
        ValueError: naming the file: missing, a folder without config.json,
            not a regular file, unreadable, not UTF-8, not JSON, or JSON
            whose top level is not an object.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: a folder with no config.json in it")
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"{path}: no such file (expected a config.json or a model folder)")
    if not path.is_file():
        raise ValueError(f"{path}: not a regular file (expected a config.json)")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the top level is a JSON {_json_kind(config)}; expected an object")
    return config


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def with_defaults(config: Mapping[str, Any], *, source: str = "config") -> dict[str, Any]:
    """The text config filled as transformers' config class would fill it.

    A multimodal config (one whose class has a `text_config`) is replaced by
    its filled text config, with the top-level `architectures`, dtype,
    `quantization_config` and `auto_map` kept where the text config lacks
    them. Aliases of the class's `attribute_map` appear under both names.

    Args:
        config: a config.json object (`read_config`); not modified.
        source: how errors name the config (the file's path).

    Returns:
        A new dict: the file's fields, the class defaults of the fields it
        omits, and the attributes transformers derives (`hf_rules`).

    Raises:
        ValueError: naming `source` and the field: a malformed count,
            interval or layer pattern, or (model_types transformers lacks) a
            required field missing.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"{source}: the top level is a JSON {_json_kind(config)}; expected an object")
    types = defaults_table()["model_types"]
    model_type = str(config.get("model_type", ""))
    entry = types.get(ALIASES.get(model_type, model_type))
    if entry is not None and entry["text_config"] is not None:
        text = config.get("text_config") or {}
        if not isinstance(text, Mapping):
            raise ValueError(f"{source}: field 'text_config'={text!r} must be a JSON object")
        _refuse_flat_text_fields(config, text, model_type, source)
        filled = _fill(text, entry["text_config"], source)
        for key in _TOP_LEVEL_KEPT:
            if key in config and key not in filled:
                filled[key] = config[key]
        return filled
    return _fill(config, ALIASES.get(model_type, model_type), source)


def _refuse_flat_text_fields(config: Mapping[str, Any], text: Mapping[str, Any], model_type: str,
                             source: str) -> None:
    """A multimodal config's model fields at its top level would be ignored (transformers reads text_config)."""
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads"):
        if key in config and key not in text:
            raise ValueError(f"{source}: field {key!r} is at the top level of a {model_type!r} config; "
                             "transformers reads the model from 'text_config' and would ignore it")


def load_config(path: str | Path) -> dict[str, Any]:
    """`with_defaults(read_config(path))`, errors naming the file."""
    return with_defaults(read_config(path), source=str(path))


def _fill(raw: Mapping[str, Any], model_type: str, source: str) -> dict[str, Any]:
    entry = defaults_table()["model_types"].get(model_type)
    if entry is None:  # remote code: nothing to fill, everything must be in the file
        out = dict(raw)
        _require(out, ("num_hidden_layers", "hidden_size"), source, out.get("model_type"))
        check_intervals(out, source)
        check_fields(out, source)
        return out
    aliases: dict[str, str] = entry["attribute_map"]
    out = {aliases.get(k, k): v for k, v in raw.items()}
    given = set(out)
    out["model_type"] = model_type
    for key, value in entry["defaults"].items():
        # A field named by an alias is stored under its target, as transformers' __setattr__ does.
        out.setdefault(aliases.get(key, key), json.loads(json.dumps(value)))  # a fresh copy
    # PreTrainedConfig.__post_init__: `dtype` wins over the legacy `torch_dtype`.
    out["dtype"] = out.get("dtype") if out.get("dtype") is not None else out.get("torch_dtype")
    check_inputs(out, entry["defaults"], source)
    context = Context(class_defaults=entry["class_defaults"], given=frozenset(given), source=source)
    for rule in RULES.get(model_type, ()):
        _apply(rule, out, context, model_type)
    remap_layer_types(out)
    for alias, real in aliases.items():
        if real in out:
            out[alias] = out[real]
    check_fields(out, source)
    return out


def _apply(rule, config: dict[str, Any], context: Context, model_type: str) -> None:
    """Run one rule; a malformed value the checks let through still becomes one ValueError."""
    try:
        rule(config, context)
    except (TypeError, KeyError, ZeroDivisionError, AttributeError, IndexError) as e:
        what = (rule.__doc__ or rule.__name__).split(":")[0].strip()
        raise ValueError(f"{context.source}: {model_type} config is malformed for {what} "
                         f"({type(e).__name__}: {e})") from None


def _require(config: Mapping[str, Any], keys: tuple[str, ...], source: str, model_type) -> None:
    for key in keys:
        if config.get(key) is None:
            raise ValueError(f"{source}: missing field {key!r} (model_type {model_type!r} is not "
                             f"in transformers {transformers_version()}, so it has no defaults)")

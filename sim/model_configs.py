"""A `ModelSpec` from a Hugging Face config dict: `parse_config(config, name=...)`.

The layer kinds come from the config's own layer pattern fields (table in
docs/models.md); per-token bytes from `sim.model_attention`, per-request
state from `sim.model_states`. Whatever cannot be described exactly is
refused with an error naming the architecture and the field.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from unikv.sim.model_attention import token_kinds
from unikv.sim.model_spec import STATE_DTYPES, ModelSpec, check_kv_cache_dtype
from unikv.sim.model_states import state_dtypes, state_kind

# Fields whose presence means an attention scheme the parser does not describe.
_REFUSED_FIELDS = {
    "compress_ratios": "DeepSeek-V4 compressed attention (per-layer compression ratio, "
                       "window and indexer over compressed entries)",
    "cross_attention_layers": "cross-attention layers (their KV depends on the image, not the tokens)",
}
_REFUSED_MODEL_TYPES = {"deepseek_v4": "compress_ratios"}


def parse_config(config: Mapping[str, Any], *, name: str, state_dtype: str = "bf16",
                 kv_cache_dtype: str = "bf16") -> ModelSpec:
    """A ModelSpec from a Hugging Face config dict (nested `text_config` honoured).

    Args:
        config: the config.json contents (fields the file omits must be
            filled first: the parser names a missing field, it never guesses).
        name: the spec's name.
        state_dtype: the state dtypes when the config declares none: "bf16"
            (conv and SSM bf16) or "fp32_ssm" (conv bf16, SSM fp32). A
            declared `mamba_ssm_cache_dtype` / `mamba_ssm_dtype` wins.
        kv_cache_dtype: "bf16", "fp8_e4m3" or "fp8_e5m2".

    Parameter counts are left None (a config does not state them).

    Raises:
        ValueError: naming the architecture and the field that is missing,
            malformed or not describable.
    """
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype={state_dtype!r} is not one of {STATE_DTYPES}")
    check_kv_cache_dtype(kv_cache_dtype)
    c = ConfigReader(text_config(config), name, architecture(config))
    _refuse_unsupported(c)
    counts = layer_counts(c, c.need("num_hidden_layers", what="the layer count"))
    if counts["chunked"] and counts["swa"]:
        raise ValueError(f"config {name!r}: both sliding and chunked layers; unsupported")
    default = ("bf16", "fp32") if state_dtype == "fp32_ssm" else ("bf16", "bf16")
    dtypes = state_dtypes(c, default)
    states = (state_kind(c, counts["state"], dtypes),) if counts["state"] else ()
    dtype = c.get("torch_dtype", "dtype") or config.get("torch_dtype") or config.get("dtype")
    return ModelSpec.from_kinds(
        name=name,
        token_kinds=token_kinds(c, counts, kv_cache_dtype),
        state_kinds=states,
        state_dtypes=dtypes,
        meta_tokens=_hymba_meta_tokens(c) if is_hymba(c) else 0,
        max_context_tokens=c.get("max_position_embeddings"),
        architecture=c.architecture,
        model_type=str(config.get("model_type") or c.model_type) or None,
        kv_cache_dtype=kv_cache_dtype,
        sources={"config_torch_dtype": str(dtype)},
    )


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) and "num_hidden_layers" in text else config


def architecture(config: Mapping[str, Any]) -> str | None:
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else None


class ConfigReader:
    """Field access that names the missing field in its error."""

    def __init__(self, config: Mapping[str, Any], name: str, arch: str | None = None) -> None:
        self.config, self.name, self.architecture = config, name, arch

    def get(self, *keys: str, default=None):
        return next((self.config[k] for k in keys if self.config.get(k) is not None), default)

    def need(self, *keys: str, what: str):
        value = self.get(*keys)
        if value is None:
            alts = " or ".join(repr(k) for k in keys)
            raise ValueError(f"config {self.name!r}: missing field {alts} (needed for {what})")
        return value

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))


def _refuse_unsupported(c: ConfigReader) -> None:
    field = _REFUSED_MODEL_TYPES.get(c.model_type)
    field = field or next((f for f in _REFUSED_FIELDS if c.has(f)), None)
    if field is None:
        return
    arch = c.architecture or c.model_type or "unknown architecture"
    raise ValueError(f"config {c.name!r}: {arch} is refused: {_REFUSED_FIELDS[field]} "
                     f"(field {field!r}) is not described exactly yet, and an approximation "
                     "would misstate its bytes")


_LAYER_TYPES = {
    "full_attention": "full", "attention": "full", "global_attention": "full",
    "sliding_attention": "swa", "sliding_window_attention": "swa",
    "chunked_attention": "chunked",
    "indexed_attention": "full", "deepseek_sparse_attention": "full",  # DeepSeek-V3.2 / GLM-5 DSA (MLA)
    "linear_attention": "state", "mamba": "state", "mamba2": "state",
    "conv": "state",  # LFM2 short-conv layers
    # MLP-only layers (transformers' NemotronHConfig.layer_types from hybrid_override_pattern: "-", "E")
    "mlp": None, "moe": None,
}
_NEMOTRON_H_PATTERN = {"M": "state", "*": "full", "-": None, "E": None}
_ZAMBA2_BLOCKS = {"hybrid": ("full", "state"), "mamba": ("state",), "linear_attention": ("state",)}


def layer_counts(c: ConfigReader, n: int) -> Counter:
    """KV-storing layers by kind ("full", "swa", "chunked") and state layers ("state").

    MLP-only layers and layers that reuse another layer's KV are dropped.
    """
    if c.model_type.startswith("falcon_h1"):
        return Counter(full=n, state=n)  # parallel hybrid: attention and Mamba-2 in every layer
    if is_hymba(c):
        return _hymba_counts(c, n)
    if c.model_type == "zamba2":
        return _zamba2_counts(c, n)
    if c.model_type in ("mamba", "mamba2", "falcon_mamba"):
        return Counter(state=n)  # pure recurrent: no token band
    kinds = _layer_kinds(c, n)
    if len(kinds) != n:
        raise ValueError(f"config {c.name!r}: layer pattern has {len(kinds)} entries, "
                         f"num_hidden_layers={n}")
    return Counter(k for k in _drop_kv_shared(c, kinds) if k is not None)


def _drop_kv_shared(c: ConfigReader, kinds: list) -> list:
    """Gemma-3n / Gemma-4 E-models: the last `num_kv_shared_layers` layers reuse the
    KV of an earlier layer of their type and store none (transformers
    `Gemma3nTextAttention.is_kv_shared_layer`; vLLM `kv_sharing_target_layer_name`)."""
    shared = c.get("num_kv_shared_layers", default=0)
    if not isinstance(shared, int) or not 0 <= shared < len(kinds):
        raise ValueError(f"config {c.name!r}: num_kv_shared_layers={shared!r} must be an integer "
                         f"in [0, {len(kinds)})")
    if not shared:
        return kinds
    first = len(kinds) - shared
    producers = {k for k in kinds[:first] if k in ("full", "swa", "chunked")}
    orphan = {k for k in kinds[first:] if k in ("full", "swa", "chunked")} - producers
    if orphan:
        raise ValueError(f"config {c.name!r}: num_kv_shared_layers={shared} leaves {sorted(orphan)} "
                         "layers with no earlier layer of their type to share KV with")
    return kinds[:first] + [None if k in producers else k for k in kinds[first:]]


def _layer_kinds(c: ConfigReader, n: int) -> list:
    if c.has("linear_attn_config"):
        return _kimi_linear_kinds(c, n)
    if c.has("layer_types"):
        return [_lookup(_LAYER_TYPES, t, c, "layer_types") for t in c.config["layer_types"]]
    if c.has("hybrid_override_pattern"):
        return [_lookup(_NEMOTRON_H_PATTERN, ch, c, "hybrid_override_pattern")
                for ch in c.config["hybrid_override_pattern"]]
    if c.has("hybrid_layer_pattern"):  # MiMo-V2: 1 = sliding window, 0 = full
        return ["swa" if v else "full" for v in c.config["hybrid_layer_pattern"]]
    if c.has("layers_block_type"):
        return [_lookup(_LAYER_TYPES, t, c, "layers_block_type") for t in c.config["layers_block_type"]]
    if c.has("attn_type_list"):  # MiniMax: 1 = softmax, 0 = lightning
        return ["full" if v else "state" for v in c.config["attn_type_list"]]
    if c.has("attn_layer_period"):  # Jamba
        period = c.config["attn_layer_period"]
        offset = c.need("attn_layer_offset", what="Jamba's attention layer positions")
        return ["full" if i % period == offset else "state" for i in range(n)]
    if c.has("full_attention_interval"):  # Qwen3-Next: the rest are gated DeltaNet
        k = c.config["full_attention_interval"]
        return ["full" if (i + 1) % k == 0 else "state" for i in range(n)]
    if c.model_type.startswith("lfm2") and c.has("full_attn_idxs"):  # LFM2: the rest short-conv
        full = set(c.config["full_attn_idxs"])
        return ["full" if i in full else "state" for i in range(n)]
    return _attention_only_kinds(c, n)


def _kimi_linear_kinds(c: ConfigReader, n: int) -> list:
    """Kimi-Linear: `linear_attn_config` lists the KDA and MLA (full) layers, 1-based
    (vLLM `KimiLinearConfig.is_kda_layer`)."""
    cfg = c.config["linear_attn_config"]
    kda, full = cfg.get("kda_layers"), cfg.get("full_attn_layers")
    if kda is None or full is None:
        missing = "kda_layers" if kda is None else "full_attn_layers"
        raise ValueError(f"config {c.name!r}: missing field 'linear_attn_config.{missing}' "
                         "(needed for Kimi-Linear's layer kinds)")
    if sorted(list(kda) + list(full)) != list(range(1, n + 1)):
        raise ValueError(f"config {c.name!r}: linear_attn_config kda_layers + full_attn_layers must "
                         f"list layers 1..{n} once each (1-based)")
    return ["full" if i + 1 in set(full) else "state" for i in range(n)]


def _attention_only_kinds(c: ConfigReader, n: int) -> list:
    window = c.get("sliding_window", "sliding_window_size")
    if c.model_type.startswith("llama4") and c.has("attention_chunk_size"):
        if c.has("no_rope_layers"):  # 1 = RoPE chunked-local layer, 0 = global NoPE layer
            return ["chunked" if v else "full" for v in c.config["no_rope_layers"]]
        k = c.get("no_rope_layer_interval", default=4)  # transformers Llama4TextConfig default
        return ["full" if (i + 1) % k == 0 else "chunked" for i in range(n)]
    if window is None or c.config.get("use_sliding_window") is False:
        return ["full"] * n
    if c.has("sliding_window_pattern"):  # Gemma-3: every k-th layer is full
        k = c.config["sliding_window_pattern"]
        return ["full" if (i + 1) % k == 0 else "swa" for i in range(n)]
    if c.model_type == "gemma2":  # transformers Gemma2Config: sliding when i is even
        return ["swa" if i % 2 == 0 else "full" for i in range(n)]
    if c.has("max_window_layers"):  # Qwen2-style: layers >= max_window_layers slide
        first = c.config["max_window_layers"]
        return ["swa" if i >= first else "full" for i in range(n)]
    return ["swa"] * n  # Mistral-style: every layer slides


def _zamba2_counts(c: ConfigReader, n: int) -> Counter:
    """Zamba2: every layer has a Mamba-2 mixer; each "hybrid" layer also applies a
    shared attention block, and each application keeps its own KV (vLLM
    `Zamba2Attention` holds one `Attention` per application, `dpa_list`)."""
    blocks = c.need("layers_block_type", what="Zamba2's layer kinds")
    if len(blocks) != n:
        raise ValueError(f"config {c.name!r}: layers_block_type has {len(blocks)} entries, "
                         f"num_hidden_layers={n}")
    return Counter(k for b in blocks for k in _lookup(_ZAMBA2_BLOCKS, b, c, "layers_block_type"))


def _lookup(table: dict, key, c: ConfigReader, field_name: str):
    if key not in table:
        raise ValueError(f"config {c.name!r}: {field_name} holds {key!r}; "
                         f"supported values are {sorted(map(str, table))}")
    return table[key]


# -- Hymba (NVIDIA, model_type "hymba") ---------------------------------------
# Read as NVIDIA's modeling_hymba.py / configuration_hymba.py read config.json:
# every layer of `layer_type` "h" runs attention heads and Mamba(-1) heads in
# parallel; `global_attn_idx` lists the full-attention layers, the others slide
# over `sliding_window` tokens; in each `kv_reuse_group` the first layer
# produces K/V and the rest reuse it (KV stored once per group);
# `num_memory_tokens` meta tokens are prepended to every request.

_HYMBA_LAYER_TYPES = {"h": (True, True), "a": (True, False), "m": (False, True)}  # (attention, mamba)


def is_hymba(c: ConfigReader) -> bool:
    return c.model_type.startswith("hymba")


def _hymba_counts(c: ConfigReader, n: int) -> Counter:
    """KV-storing attention layers by kind, and Mamba layers, of a Hymba config."""
    global_idx = c.need("global_attn_idx", what="Hymba's full-attention layers")
    bad = [i for i in global_idx if not (isinstance(i, int) and 0 <= i < n)]
    if bad:
        raise ValueError(f"config {c.name!r}: global_attn_idx holds {bad}, not layers of "
                         f"num_hidden_layers={n}")
    types = c.get("layer_type", default=["h"] * n)
    if len(types) != n:
        raise ValueError(f"config {c.name!r}: layer_type has {len(types)} entries, "
                         f"num_hidden_layers={n}")
    roles = [_lookup(_HYMBA_LAYER_TYPES, t, c, "layer_type") for t in types]
    windowed = c.has("sliding_window")
    kind = ["full" if i in global_idx or not windowed else "swa" for i in range(n)]
    consumers = _hymba_consumers(c, n, roles, kind)
    counts: Counter = Counter()
    for i, (attention, mamba) in enumerate(roles):
        if attention and i not in consumers:
            counts[kind[i]] += 1
        if mamba:
            counts["state"] += 1
    return counts


def _hymba_consumers(c: ConfigReader, n: int, roles: list, kind: list) -> set[int]:
    groups = c.get("kv_reuse_group") or []
    if not groups and c.get("kv_reuse_every_i_layer", default=-1) > 0:
        raise ValueError(f"config {c.name!r}: kv_reuse_every_i_layer > 0 without kv_reuse_group "
                         "is unsupported (give the groups explicitly)")
    consumers: set[int] = set()
    seen: set[int] = set()
    for group in groups:
        if (not group or any(not (isinstance(i, int) and 0 <= i < n) for i in group)
                or seen & set(group) or any(not roles[i][0] for i in group)
                or len({kind[i] for i in group}) != 1):
            raise ValueError(f"config {c.name!r}: kv_reuse_group {group} must list distinct "
                             "attention layers of one kind (full or sliding), in no other group")
        seen.update(group)
        consumers.update(group[1:])  # group[0] produces K/V; the rest reuse it
    return consumers


def _hymba_meta_tokens(c: ConfigReader) -> int:
    if c.get("memory_tokens_interspersed_every", default=0) > 0:
        raise ValueError(f"config {c.name!r}: memory_tokens_interspersed_every > 0 (meta tokens "
                         "repeated through the sequence) is unsupported")
    return c.get("num_memory_tokens", default=0)

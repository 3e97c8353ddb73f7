"""Model geometry for the simulator: what one token and one request cost in bytes.

`ModelSpec` is the simulator's view of a model: layer counts by kind, the
per-token bytes of its full and sliding-window (or chunked-local) layers, the
per-request recurrent state, and the parameter counts the cost model needs.
`load_model` reads a bundled model (`sim/data/models.json` + `params.json`) or
parses a Hugging Face `config.json` with the same conventions
(`docs/models.md`): K and V both stored in bf16, state shapes as in vLLM's
`MambaStateShapeCalculator` at tensor-parallel size 1.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

KV_DTYPE_BYTES = 2  # bf16; no checkpoint declares a KV-cache dtype
STATE_DTYPES = ("bf16", "fp32_ssm")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Byte geometry and size of one model (whole model on one rank).

    Attributes:
        name: model id ("gpt-oss-120b") or the config file's stem.
        full_layers: global-attention layers that store KV (a layer that
            reuses another layer's KV, as Hymba's `kv_reuse_group`
            consumers do, is not counted: its bytes are not stored twice).
        swa_layers: sliding-window or chunked-local attention layers that
            store KV (same rule).
        state_layers: Mamba / gated-DeltaNet / lightning layers (recurrent state).
        window_tokens: the sliding window, or the chunk size when `chunked`.
        chunked: True for chunk-aligned local attention (Llama-4).
        full_token_bytes: KV bytes of one token over all full layers.
        swa_token_bytes: KV bytes of one token over all swa / chunked layers.
        state_bytes: recurrent-state bytes of one request over all state layers.
        state_dtype: "bf16" (engine default) or "fp32_ssm" (SSM state in fp32).
        meta_tokens: learned tokens prepended to every request (Hymba's
            `num_memory_tokens`). Each request holds their KV in every
            attention layer, full and swa; the sliding window never evicts
            them. They are the same for every request (a shareable prefix).
        weight_bytes: bytes of the weights (None: unknown).
        params_total / params_active: parameter counts (None: unknown).
        max_context_tokens: the model's maximum context (None: unknown).
        sources: where each number came from.
    """

    name: str
    full_layers: int
    swa_layers: int = 0
    state_layers: int = 0
    window_tokens: int | None = None
    chunked: bool = False
    full_token_bytes: int = 0
    swa_token_bytes: int = 0
    state_bytes: int = 0
    state_dtype: str = "bf16"
    meta_tokens: int = 0
    weight_bytes: int | None = None
    params_total: int | None = None
    params_active: int | None = None
    max_context_tokens: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        owner = f"ModelSpec {self.name!r}"
        for name in ("full_layers", "swa_layers", "state_layers", "full_token_bytes",
                     "swa_token_bytes", "state_bytes", "meta_tokens"):
            _check_int(owner, name, getattr(self, name), minimum=0)
        for name in ("weight_bytes", "params_total", "params_active", "max_context_tokens"):
            if getattr(self, name) is not None:
                _check_int(owner, name, getattr(self, name), minimum=1)
        for layers, nbytes in (("full_layers", "full_token_bytes"), ("swa_layers", "swa_token_bytes"),
                               ("state_layers", "state_bytes")):
            if (getattr(self, layers) > 0) != (getattr(self, nbytes) > 0):
                raise ValueError(f"{owner}: {layers}={getattr(self, layers)} but "
                                 f"{nbytes}={getattr(self, nbytes)}; both or neither must be > 0")
        if self.swa_layers:
            _check_int(owner, "window_tokens", self.window_tokens, minimum=1)
        if self.chunked and not self.swa_layers:
            raise ValueError(f"{owner}: chunked=True needs swa_layers > 0")
        if self.meta_tokens and not (self.full_layers or self.swa_layers):
            raise ValueError(f"{owner}: meta_tokens={self.meta_tokens} needs attention layers")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"{owner}: state_dtype={self.state_dtype!r} is not one of {STATE_DTYPES}")
        if (self.params_active or 0) > (self.params_total or float("inf")):
            raise ValueError(f"{owner}: params_active={self.params_active} exceeds "
                             f"params_total={self.params_total}")
        object.__setattr__(self, "sources", dict(self.sources))

    @property
    def kinds(self) -> tuple[str, ...]:
        """The band kinds this model needs, low byte -> high byte: of "mamba", "swa", "full"."""
        present = (("mamba", self.state_layers), ("swa", self.swa_layers), ("full", self.full_layers))
        return tuple(kind for kind, layers in present if layers)

    @property
    def token_bytes(self) -> int:
        """KV bytes of one token over all attention layers (full + swa)."""
        return self.full_token_bytes + self.swa_token_bytes

    def request_bytes(self, tokens: int) -> int:
        """Resident bytes of one request of `tokens` tokens, without page rounding.

        full: (tokens + meta) x full_token_bytes; swa: (min(tokens, window) +
        meta) x swa_token_bytes (the window never evicts meta tokens);
        plus one recurrent state.
        """
        meta = self.meta_tokens
        swa = (min(tokens, self.window_tokens) + meta) * self.swa_token_bytes if self.swa_layers else 0
        full = (tokens + meta) * self.full_token_bytes if self.full_layers else 0
        return full + swa + (self.state_bytes if self.state_layers else 0)


def _check_int(owner: str, name: str, value, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name}={value!r} must be an integer >= {minimum}")


# -- bundled models ----------------------------------------------------------

def _read_data(filename: str) -> dict:
    return json.loads(resources.files("unikv.sim").joinpath("data").joinpath(filename).read_text())


@cache
def _bundled() -> tuple[dict[str, dict], dict[str, dict]]:
    models = {m["id"]: m for m in _read_data("models.json")["models"]}
    return models, _read_data("params.json")["models"]


def list_models() -> list[str]:
    """Names of the bundled models, sorted."""
    return sorted(_bundled()[0])


def load_model(name_or_path: str | Path, *, state_dtype: str = "bf16") -> ModelSpec:
    """A bundled model by name, or a model parsed from a Hugging Face config.json.

    Args:
        name_or_path: a name from `list_models()`, or a path to a config.json
            (a path whose file name matches a bundled model's source config
            also gets that model's name and parameter counts).
        state_dtype: "bf16" (vLLM default: state in the model dtype) or
            "fp32_ssm" (conv state bf16, SSM / recurrent state fp32).

    Raises:
        ValueError: unknown name (listing the valid ones), a missing file, a
            bad `state_dtype`, or a config whose architecture is unsupported
            (naming the missing field).
    """
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype={state_dtype!r} is not one of {STATE_DTYPES}")
    models, params = _bundled()
    key = str(name_or_path)
    if not isinstance(name_or_path, Path) and key in models:
        return _from_entry(models[key], params.get(key, {}), state_dtype)
    path = Path(name_or_path)
    if path.is_file():
        return _from_config_file(path, state_dtype)
    if isinstance(name_or_path, Path) or key.endswith(".json"):
        raise ValueError(f"no config file at {key!r}")
    raise ValueError(f"unknown model {key!r}; bundled models are {list_models()} "
                     "(or pass a path to a config.json)")


def _from_entry(entry: dict, params: dict, state_dtype: str) -> ModelSpec:
    by_type, per_token = entry["layers_by_type"], entry["per_token_kv_bytes"]
    chunked = "chunked" in by_type
    swa_kind = "chunked" if chunked else "swa"
    state = entry["per_request_state_bytes"]
    state_key = "mamba_if_ssm_fp32" if state_dtype == "fp32_ssm" else "mamba"
    sources = {f"geometry.{k}": v for k, v in entry["sources"].items()}
    sources["geometry.verification"] = entry["verification"]
    return ModelSpec(
        name=entry["id"],
        full_layers=by_type.get("full", 0),
        swa_layers=by_type.get(swa_kind, 0),
        state_layers=by_type.get("mamba", 0) + by_type.get("linear", 0),
        window_tokens=entry["attention_pools"].get(swa_kind, {}).get("window_tokens"),
        chunked=chunked,
        full_token_bytes=per_token.get("full", 0),
        swa_token_bytes=per_token.get(swa_kind, 0),
        state_bytes=state.get(state_key, 0),
        state_dtype=state_dtype,
        meta_tokens=entry.get("meta_tokens", 0),
        sources=sources | _param_sources(params),
        **_param_fields(params),
    )


def _param_fields(params: dict) -> dict[str, Any]:
    """ModelSpec size fields from one params.json entry (empty entry: all None)."""
    total = params.get("params_total")
    weight = params.get("weight_bytes")
    if weight is None and total is not None:
        weight = round(total * params.get("weight_bytes_per_param", 2))
    return {"params_total": total, "params_active": params.get("params_active"),
            "weight_bytes": weight, "max_context_tokens": params.get("max_context_tokens")}


def _param_sources(params: dict) -> dict[str, str]:
    out = {f"params.{k}": v for k, v in params.get("sources", {}).items()}
    if "verification" in params:
        out["params.verification"] = params["verification"]
    return out


def _from_config_file(path: Path, state_dtype: str) -> ModelSpec:
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    models, params = _bundled()
    # Only a distinctive file name ("<org>--<model>_config.json") identifies a bundled model.
    known = None if path.name == "config.json" else next(
        (m["id"] for m in models.values() if f"/{path.name}" in m["sources"].get("config", "")),
        None)
    spec = parse_config(config, name=known or path.stem, state_dtype=state_dtype)
    extra = params.get(known, {}) if known else {}
    sizes = {k: v for k, v in _param_fields(extra).items() if v is not None}
    if spec.max_context_tokens is not None:
        sizes.pop("max_context_tokens", None)  # the config's own value wins
    sources = spec.sources | {"config": str(path)} | _param_sources(extra)
    return dataclasses.replace(spec, sources=sources, **sizes)


# -- config.json parser --------------------------------------------------------

def parse_config(config: Mapping[str, Any], *, name: str, state_dtype: str = "bf16") -> ModelSpec:
    """A ModelSpec from a Hugging Face config dict (nested `text_config` honoured).

    Parameter counts are left None (a config does not state them).

    Raises:
        ValueError: naming the field that is missing or malformed.
    """
    c = _ConfigReader(_text_config(config), name)
    n_layers = c.need("num_hidden_layers", what="the layer count")
    counts = _layer_counts(c, n_layers)
    swa_kind = "chunked" if counts["chunked"] else "swa"
    if counts["chunked"] and counts["swa"]:
        raise ValueError(f"config {name!r}: both sliding and chunked layers; unsupported")
    n_swa = counts[swa_kind]
    conv, ssm = _state_elems(c) if counts["state"] else (0, 0)
    ssm_bytes = 4 if state_dtype == "fp32_ssm" else 2
    window = None
    if n_swa:
        keys = ("attention_chunk_size",) if swa_kind == "chunked" else ("sliding_window",
                                                                         "sliding_window_size")
        window = c.need(*keys, what=f"the {swa_kind} layers' window")
    dtype = c.get("torch_dtype", "dtype") or config.get("torch_dtype") or config.get("dtype")
    meta = _hymba_meta_tokens(c) if _is_hymba(c) else 0
    return ModelSpec(
        name=name,
        full_layers=counts["full"],
        swa_layers=n_swa,
        state_layers=counts["state"],
        window_tokens=window,
        chunked=swa_kind == "chunked",
        full_token_bytes=counts["full"] * _kv_bytes(c, "full") if counts["full"] else 0,
        swa_token_bytes=n_swa * _kv_bytes(c, "swa") if n_swa else 0,
        state_bytes=counts["state"] * (conv * 2 + ssm * ssm_bytes),
        state_dtype=state_dtype,
        meta_tokens=meta,
        max_context_tokens=c.get("max_position_embeddings"),
        sources={"config_torch_dtype": str(dtype)},
    )


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) and "num_hidden_layers" in text else config


class _ConfigReader:
    """Field access that names the missing field in its error."""

    def __init__(self, config: Mapping[str, Any], name: str) -> None:
        self.config, self.name = config, name

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


_LAYER_TYPES = {
    "full_attention": "full", "attention": "full", "global_attention": "full",
    "sliding_attention": "swa", "sliding_window_attention": "swa",
    "chunked_attention": "chunked",
    "linear_attention": "state", "mamba": "state", "mamba2": "state",
}
_NEMOTRON_H_PATTERN = {"M": "state", "*": "full", "-": None, "E": None}


def _layer_counts(c: _ConfigReader, n: int) -> Counter:
    """Layers by kind ("full", "swa", "chunked", "state"); MLP-only layers are dropped."""
    if c.model_type.startswith("falcon_h1"):
        return Counter(full=n, state=n)  # parallel hybrid: attention and Mamba-2 in every layer
    if _is_hymba(c):
        return _hymba_counts(c, n)
    kinds = _layer_kinds(c, n)
    if len(kinds) != n:
        raise ValueError(f"config {c.name!r}: layer pattern has {len(kinds)} entries, "
                         f"num_hidden_layers={n}")
    return Counter(k for k in kinds if k is not None)


def _layer_kinds(c: _ConfigReader, n: int) -> list:
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
    return _attention_only_kinds(c, n)


def _attention_only_kinds(c: _ConfigReader, n: int) -> list:
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


def _lookup(table: dict, key, c: _ConfigReader, field_name: str):
    if key not in table:
        raise ValueError(f"config {c.name!r}: {field_name} holds {key!r}; "
                         f"supported values are {sorted(map(str, table))}")
    return table[key]


def _kv_bytes(c: _ConfigReader, kind: str) -> int:
    """KV bytes of one token in one layer of `kind` ("full" or "swa"/"chunked")."""
    what = "the attention layers' KV bytes"
    if _is_hymba(c):
        return _hymba_kv_bytes(c)
    heads = c.need("num_attention_heads", what=what)
    kv_heads = c.get("num_key_value_heads", default=heads)
    head_k = c.get("head_dim", "attention_head_dim")
    if head_k is None:
        head_k = c.need("hidden_size", what=what) // heads
    head_v = c.get("v_head_dim", default=head_k)
    if kind == "full" and c.has("global_head_dim"):  # Gemma-4 global layers
        head_k = head_v = c.config["global_head_dim"]
        kv_heads = c.get("num_global_key_value_heads", default=kv_heads)
    elif kind != "full":  # MiMo-V2 sliding layers carry their own geometry
        kv_heads = c.get("swa_num_key_value_heads", default=kv_heads)
        head_v = c.get("swa_v_head_dim", "swa_head_dim", default=head_v)
        head_k = c.get("swa_head_dim", default=head_k)
    return kv_heads * (head_k + head_v) * KV_DTYPE_BYTES


def _state_elems(c: _ConfigReader) -> tuple[int, int]:
    """(conv, ssm) state elements of one layer, as vLLM's MambaStateShapeCalculator (tp=1)."""
    if c.has("linear_num_value_heads"):  # gated DeltaNet
        what = "the gated-DeltaNet state"
        n_k, d_k = c.need("linear_num_key_heads", what=what), c.need("linear_key_head_dim", what=what)
        n_v, d_v = c.config["linear_num_value_heads"], c.need("linear_value_head_dim", what=what)
        kernel = c.need("linear_conv_kernel_dim", what=what)
        return (kernel - 1) * (2 * n_k * d_k + n_v * d_v), n_v * d_k * d_v
    if c.has("attn_type_list") or c.model_type.startswith("minimax"):  # lightning attention
        heads = c.need("num_attention_heads", what="the lightning-attention state")
        head = c.get("head_dim") or c.need("hidden_size", what="the lightning-attention state") // heads
        return 0, heads * head * head
    if c.has("mamba_num_heads") or c.has("mamba_n_heads"):
        return _mamba2_elems(c)
    if c.has("mamba_d_state") and c.has("mamba_expand"):  # Mamba-1 (Jamba)
        what = "the Mamba-1 state"
        d_inner = c.config["mamba_expand"] * c.need("hidden_size", what=what)
        d_conv = c.need("mamba_d_conv", "conv_kernel", what=what)
        return (d_conv - 1) * d_inner, d_inner * c.config["mamba_d_state"]
    raise ValueError(
        f"config {c.name!r}: has recurrent-state layers but no state shape; missing field "
        "'linear_num_value_heads' (gated DeltaNet), 'mamba_num_heads'/'mamba_n_heads' (Mamba-2), "
        "'mamba_d_state' with 'mamba_expand' (Mamba-1) or 'attn_type_list' (lightning)")


def _mamba2_elems(c: _ConfigReader) -> tuple[int, int]:
    what = "the Mamba-2 state"
    heads = c.get("mamba_num_heads", "mamba_n_heads")
    head_dim = c.need("mamba_head_dim", "mamba_d_head", what=what)
    d_state = c.need("ssm_state_size", "mamba_d_state", "state_size", what=what)
    groups = c.need("mamba_n_groups", "n_groups", what=what)
    d_conv = c.need("conv_kernel", "mamba_d_conv", what=what)
    inner = c.get("mamba_d_ssm", default=heads * head_dim)
    return (d_conv - 1) * (inner + 2 * groups * d_state), heads * head_dim * d_state


# -- Hymba (NVIDIA, model_type "hymba") ---------------------------------------
# Read as NVIDIA's modeling_hymba.py / configuration_hymba.py read config.json:
# every layer of `layer_type` "h" runs attention heads and Mamba(-1) heads in
# parallel; `global_attn_idx` lists the full-attention layers, the others slide
# over `sliding_window` tokens; in each `kv_reuse_group` the first layer
# produces K/V and the rest reuse it (KV stored once per group);
# `num_memory_tokens` meta tokens are prepended to every request.

_HYMBA_LAYER_TYPES = {"h": (True, True), "a": (True, False), "m": (False, True)}  # (attention, mamba)


def _is_hymba(c: _ConfigReader) -> bool:
    return c.model_type.startswith("hymba")


def _hymba_counts(c: _ConfigReader, n: int) -> Counter:
    """KV-storing attention layers by kind, and Mamba layers, of a Hymba config."""
    what = "Hymba's full-attention layers"
    global_idx = c.need("global_attn_idx", what=what)
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
    counts = Counter()
    for i, (attention, mamba) in enumerate(roles):
        if attention and i not in consumers:
            counts[kind[i]] += 1
        if mamba:
            counts["state"] += 1
    return counts


def _hymba_kv_bytes(c: _ConfigReader) -> int:
    """KV bytes of one token in one KV-storing Hymba layer (full and sliding alike)."""
    what = "Hymba's attention KV bytes"
    heads = c.need("num_attention_heads", what=what)
    kv_heads = c.need("num_key_value_heads", what=what)
    attn_hidden = c.get("attn_hidden_size", default=-1)
    if attn_hidden <= 0:  # -1: the attention width is hidden_size
        attn_hidden = c.need("hidden_size", what=what)
    head = attn_hidden // heads
    head_k = c.get("kq_head_dim", default=-1)
    head_v = c.get("v_head_dim", default=-1)
    head_k = head_k if head_k > 0 else head  # -1: attn_hidden_size / num_attention_heads
    head_v = head_v if head_v > 0 else head
    return kv_heads * (head_k + head_v) * KV_DTYPE_BYTES


def _hymba_meta_tokens(c: _ConfigReader) -> int:
    if c.get("memory_tokens_interspersed_every", default=0) > 0:
        raise ValueError(f"config {c.name!r}: memory_tokens_interspersed_every > 0 (meta tokens "
                         "repeated through the sequence) is unsupported")
    return c.get("num_memory_tokens", default=0)

"""Parameter counts of a model, computed from its (defaults-filled) config.

`count_params(with_defaults(config))` counts every weight transformers'
`<X>ForCausalLM` builds for that config (the modules of
`transformers/models/<x>/modeling_<x>.py`, transformers 5.24.0): embeddings
(tied or not), attention (GQA with its biases and q/k norms, MLA with its
low-rank projections and norms, the DSA indexer), dense MLPs (gated or not),
MoE routers, routed and shared experts, Mamba-2, gated-DeltaNet and lightning
blocks, and the norms. `active` counts only `num_experts_per_tok` of the
routed experts of each MoE layer (shared experts and routers always run).
A model_type without a rule here is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unikv.sim.param_blocks import (
    dsa_indexer,
    gated_deltanet,
    gated_mlp,
    gqa,
    lightning,
    mamba1,
    mamba2,
    mla,
    need,
)

Config = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Parameters of one model (whole model, no sharding).

    Attributes:
        total: every parameter.
        active: parameters one token uses (routed experts: top-k only).
        embedding: input embedding plus the output head when untied.
        attention: attention projections, their biases and norms.
        recurrent: Mamba / gated-DeltaNet / lightning blocks.
        mlp: dense MLPs, shared experts and routers.
        routed_experts: all routed experts.
        norms: the layers' and the final norms.
    """

    total: int
    active: int
    embedding: int
    attention: int = 0
    recurrent: int = 0
    mlp: int = 0
    routed_experts: int = 0
    norms: int = 0


@dataclass
class _Tally:
    parts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("embedding", "attention", "recurrent", "mlp", "routed_experts", "norms"), 0))
    inactive: int = 0  # routed-expert parameters a token does not use

    def add(self, part: str, n: int) -> None:
        self.parts[part] += n

    def experts(self, n_experts: int, per_expert: int, top_k: int) -> None:
        self.add("routed_experts", n_experts * per_expert)
        self.inactive += max(n_experts - top_k, 0) * per_expert

    def counts(self) -> ParamCounts:
        total = sum(self.parts.values())
        return ParamCounts(total=total, active=total - self.inactive, **self.parts)


# -- families ----------------------------------------------------------------------

def _layers(c: Config) -> range:
    return range(need(c, "num_hidden_layers"))


def _moe_every(c: Config, i: int) -> bool:
    """Qwen2/3-MoE, Qwen3-Next: MoE unless in mlp_only_layers; every decoder_sparse_step-th layer."""
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    return (i not in (c.get("mlp_only_layers") or []) and experts > 0
            and (i + 1) % c.get("decoder_sparse_step", 1) == 0)


def _decoder(c: Config, t: _Tally, attention: Callable[[int], int], mlp: Callable[[int], None],
             norms_per_layer: int = 2) -> None:
    h = need(c, "hidden_size")
    for i in _layers(c):
        t.add("attention", attention(i))
        mlp(i)
        t.add("norms", norms_per_layer * h)


def _dense(c: Config, t: _Tally, bias: bool = False) -> Callable[[int], None]:
    return lambda i: t.add("mlp", gated_mlp(need(c, "hidden_size"), need(c, "intermediate_size"), bias))


def _llama(c: Config, t: _Tally) -> None:
    bias = bool(c.get("attention_bias"))
    _decoder(c, t, lambda i: gqa(c, qkv_bias=bias, o_bias=bias), _dense(c, t, bool(c.get("mlp_bias"))))


def _qwen2(c: Config, t: _Tally) -> None:
    _decoder(c, t, lambda i: gqa(c, qkv_bias=True), _dense(c, t))


def _qwen3(c: Config, t: _Tally) -> None:
    bias = bool(c.get("attention_bias"))
    _decoder(c, t, lambda i: gqa(c, qkv_bias=bias, o_bias=bias, qk_norm=True), _dense(c, t))


def _gemma(c: Config, t: _Tally, qk_norm: bool) -> None:
    bias = bool(c.get("attention_bias"))
    _decoder(c, t, lambda i: gqa(c, qkv_bias=bias, o_bias=bias, qk_norm=qk_norm), _dense(c, t),
             norms_per_layer=4)  # input, post-attention, pre- and post-feedforward


def _moe_mlp(c: Config, t: _Tally, *, inter: int, experts: int, shared_inter: int = 0,
             shared_gate: bool = False, gated: bool = True) -> None:
    """Router (no bias) + routed experts + optional shared expert (and its sigmoid gate)."""
    h = need(c, "hidden_size")
    per_expert = (3 if gated else 2) * h * inter
    t.experts(experts, per_expert, need(c, "num_experts_per_tok"))
    t.add("mlp", experts * h + (3 if gated else 2) * h * shared_inter + (h if shared_gate else 0))


def _qwen_moe(c: Config, t: _Tally, *, qk_norm: bool, qkv_bias: bool, shared: bool) -> None:
    experts = c.get("num_experts") or need(c, "num_local_experts")

    def mlp(i: int) -> None:
        if not _moe_every(c, i):
            return t.add("mlp", gated_mlp(need(c, "hidden_size"), need(c, "intermediate_size")))
        _moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=experts,
                 shared_inter=c.get("shared_expert_intermediate_size") or 0 if shared else 0,
                 shared_gate=shared)
    _decoder(c, t, lambda i: gqa(c, qkv_bias=qkv_bias, qk_norm=qk_norm), mlp)


def _mixtral(c: Config, t: _Tally) -> None:
    _decoder(c, t, lambda i: gqa(c), lambda i: _moe_mlp(
        c, t, inter=need(c, "intermediate_size"), experts=need(c, "num_local_experts")))


def _gpt_oss(c: Config, t: _Tally) -> None:
    """GptOssAttention (biases, per-head sinks) + GptOssMLP (router with bias, experts with biases)."""
    h, experts, inter = need(c, "hidden_size"), need(c, "num_local_experts"), need(c, "intermediate_size")

    def mlp(i: int) -> None:
        t.experts(experts, 3 * h * inter + 2 * inter + h, need(c, "num_experts_per_tok"))
        t.add("mlp", experts * h + experts)
    heads = need(c, "num_attention_heads")
    _decoder(c, t, lambda i: gqa(c, qkv_bias=True, o_bias=True) + heads, mlp)


def _deepseek(c: Config, t: _Tally) -> None:
    """DeepseekV2/V3 DecoderLayer: MLA; dense MLPs before first_k_dense_replace, MoE after (moe_layer_freq is
    not read); V3.2: MoE where mlp_layer_types says "sparse", and the DSA indexer in every layer."""
    h, first = need(c, "hidden_size"), c.get("first_k_dense_replace") or 0
    indexer = c.get("model_type") == "deepseek_v32"
    sparse = c.get("mlp_layer_types") if indexer else None

    def mlp(i: int) -> None:
        if (sparse[i] != "sparse") if sparse is not None else i < first:
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
        inter = need(c, "moe_intermediate_size")
        _moe_mlp(c, t, inter=inter, experts=need(c, "n_routed_experts"),
                 shared_inter=inter * (c.get("n_shared_experts") or 0))
    _decoder(c, t, lambda i: mla(c) + (dsa_indexer(c) if indexer else 0), mlp)


def _llama4(c: Config, t: _Tally) -> None:
    """Llama4TextDecoderLayer: MoE (router, experts, one shared expert) in moe_layers, else intermediate_size_mlp."""
    h, moe_layers = need(c, "hidden_size"), set(c.get("moe_layers") or [])

    def mlp(i: int) -> None:
        if i not in moe_layers:
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size_mlp")))
        inter = need(c, "intermediate_size")
        _moe_mlp(c, t, inter=inter, experts=need(c, "num_local_experts"), shared_inter=inter)
    _decoder(c, t, lambda i: gqa(c, qkv_bias=bool(c.get("attention_bias"))), mlp)


def _hybrid_linear(c: Config, t: _Tally, block: Callable[[Config], int], gated_q: bool,
                   qk_norm: bool, moe: Callable[[int], None]) -> None:
    """Qwen3-Next / Qwen3.5 / MiniMax: full-attention layers among linear-attention layers."""
    types = need(c, "layer_types")

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return gqa(c, gated_q=gated_q, qk_norm=qk_norm)
        t.add("recurrent", block(c))
        return 0
    _decoder(c, t, mixer, moe)


def _qwen3_next(c: Config, t: _Tally) -> None:
    experts = c.get("num_experts") or need(c, "num_local_experts")

    def mlp(i: int) -> None:
        if not _moe_every(c, i):
            return t.add("mlp", gated_mlp(need(c, "hidden_size"), need(c, "intermediate_size")))
        _moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=experts,
                 shared_inter=need(c, "shared_expert_intermediate_size"), shared_gate=True)
    _hybrid_linear(c, t, gated_deltanet, gated_q=True, qk_norm=True, moe=mlp)


def _qwen3_5_dense(c: Config, t: _Tally) -> None:
    _hybrid_linear(c, t, gated_deltanet, gated_q=True, qk_norm=True, moe=_dense(c, t))


def _minimax(c: Config, t: _Tally) -> None:
    _hybrid_linear(c, t, lightning, gated_q=False, qk_norm=False, moe=lambda i: _moe_mlp(
        c, t, inter=need(c, "intermediate_size"), experts=need(c, "num_local_experts")))


def _nemotron_h(c: Config, t: _Tally) -> None:
    """NemotronHBlock: one norm, then one mixer: Mamba-2, attention, relu2 MLP or relu2 MoE (+shared)."""
    h = need(c, "hidden_size")
    for kind in need(c, "layers_block_type"):
        t.add("norms", h)
        if kind == "linear_attention":
            t.add("recurrent", mamba2(c, heads="mamba_num_heads", head_dim="mamba_head_dim",
                                      state="ssm_state_size"))
        elif kind == "full_attention":
            t.add("attention", gqa(c))  # NemotronHAttention: bias=False whatever attention_bias says
        elif kind == "mlp":
            t.add("mlp", 2 * h * need(c, "intermediate_size"))
        elif kind == "moe":
            _moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=need(c, "n_routed_experts"),
                     shared_inter=need(c, "moe_shared_expert_intermediate_size")
                     * (c.get("n_shared_experts") or 0), gated=False)
        else:
            raise ValueError(f"count_params: nemotron_h layer kind {kind!r} is not supported")


def _mamba2_model(c: Config, t: _Tally) -> None:
    h = need(c, "hidden_size")
    for _ in _layers(c):
        t.add("norms", h)
        t.add("recurrent", mamba2(c, heads="num_heads", head_dim="head_dim", state="state_size"))


def _jamba(c: Config, t: _Tally) -> None:
    """JambaDecoderLayer: Mamba-1 or attention, then MoE where i % expert_layer_period == offset, else dense."""
    h, types = need(c, "hidden_size"), need(c, "layer_types")
    period, offset = need(c, "expert_layer_period"), need(c, "expert_layer_offset")
    experts = c.get("num_experts") or c.get("num_local_experts") or 1

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return gqa(c)
        t.add("recurrent", mamba1(c))
        return 0

    def mlp(i: int) -> None:
        if experts > 1 and i % period == offset:
            return _moe_mlp(c, t, inter=need(c, "intermediate_size"), experts=experts)
        t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
    _decoder(c, t, mixer, mlp)


def _falcon_h1(c: Config, t: _Tally) -> None:
    """FalconH1DecoderLayer: attention and a Mamba-2 mixer in parallel in every layer, then a gated MLP."""
    bias = bool(c.get("attention_bias"))

    def mixer(i: int) -> int:
        t.add("recurrent", mamba2(c, heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state",
                                  groups="mamba_n_groups", kernel="mamba_d_conv",
                                  proj_bias="mamba_proj_bias", conv_bias="mamba_conv_bias",
                                  out_bias="projectors_bias", norm=bool(c.get("mamba_rms_norm"))))
        return gqa(c, qkv_bias=bias, o_bias=bias)
    _decoder(c, t, mixer, _dense(c, t, bool(c.get("mlp_bias"))))


def _granite_hybrid(c: Config, t: _Tally) -> None:
    """GraniteMoeHybridDecoderLayer: Mamba-2 or attention; MoE (router, experts) if any, plus a shared MLP."""
    h, types = need(c, "hidden_size"), need(c, "layer_types")
    experts, shared = c.get("num_local_experts") or 0, c.get("shared_intermediate_size") or 0
    bias = bool(c.get("attention_bias"))

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return gqa(c, qkv_bias=bias, o_bias=bias)
        t.add("recurrent", mamba2(c, heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state",
                                  groups="mamba_n_groups", kernel="mamba_d_conv",
                                  proj_bias="mamba_proj_bias", conv_bias="mamba_conv_bias"))
        return 0

    def mlp(i: int) -> None:
        if experts:
            _moe_mlp(c, t, inter=need(c, "intermediate_size"), experts=experts)
        t.add("mlp", 3 * h * shared)
    _decoder(c, t, mixer, mlp)


# What MiMoV2FlashAttention builds for a sliding layer, by the file's own swa_* fields.
_MIMO_SWA = (("swa_num_key_value_heads", lambda c: 2 * c["num_key_value_heads"]),
             ("swa_num_attention_heads", lambda c: c["num_attention_heads"]),
             ("swa_head_dim", lambda c: c["head_dim"]), ("swa_v_head_dim", lambda c: c["v_head_dim"]),
             ("add_swa_attention_sink_bias", lambda c: True),
             ("add_full_attention_sink_bias", lambda c: False))


def _mimo_v2(c: Config, t: _Tally) -> None:
    """MiMoV2FlashAttention: sliding layers have 2 x the KV heads and per-head sinks; dense or MoE by mlp_layer_types.

    transformers ignores the remote-code swa_* fields; a file whose values
    differ from what transformers builds is refused, naming the field.
    """
    h, types, mlps = need(c, "hidden_size"), need(c, "layer_types"), need(c, "mlp_layer_types")
    for name, built in _MIMO_SWA:
        if c.get(name) is not None and c[name] != built(c):
            raise ValueError(f"count_params: mimo_v2_flash field {name!r}={c[name]!r} differs from "
                             f"what transformers' MiMoV2FlashAttention builds ({built(c)!r})")
    heads, kv, d_k, d_v = (need(c, k) for k in ("num_attention_heads", "num_key_value_heads",
                                                 "head_dim", "v_head_dim"))
    bias = bool(c.get("attention_bias"))

    def attention(i: int) -> int:
        swa = types[i] == "sliding_attention"
        n_kv = 2 * kv if swa else kv
        n = h * heads * d_k + h * n_kv * (d_k + d_v) + heads * d_v * h
        return n + (heads * d_k + n_kv * (d_k + d_v) if bias else 0) + (heads if swa else 0)

    def mlp(i: int) -> None:
        if mlps[i] == "dense":
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
        _moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=need(c, "n_routed_experts"))
    _decoder(c, t, attention, mlp)


def _gemma4_attention(c: Config, i: int, reuse: bool) -> int:
    """Gemma4TextAttention: full layers at global_head_dim (K = V when attention_k_eq_v); KV-shared layers have q and o only."""
    h, heads = need(c, "hidden_size"), need(c, "num_attention_heads")
    full = need(c, "layer_types")[i] == "full_attention"
    d = need(c, "global_head_dim") if full else need(c, "head_dim")
    kv = need(c, "num_global_key_value_heads") if full else need(c, "num_key_value_heads")
    bias = bool(c.get("attention_bias"))
    n = 2 * h * heads * d + d + (heads * d + h if bias else 0)  # q, o, q_norm
    if not reuse:
        projections = 1 if full and c.get("attention_k_eq_v") else 2
        n += d + projections * kv * d * (h + (1 if bias else 0))  # k_norm, k (and v)
    return n


def _gemma4(c: Config, t: _Tally) -> None:
    """Gemma4TextDecoderLayer: attention, gated MLP (double width when KV-shared and use_double_wide_mlp),
    4 norms; per-layer inputs (gate, projection, norm) when hidden_size_per_layer_input; a parallel MoE
    block (router scale, per-expert scale, projection; experts; 3 norms) when enable_moe_block."""
    h, n = need(c, "hidden_size"), need(c, "num_hidden_layers")
    first_shared = n - (c.get("num_kv_shared_layers") or 0)
    per_layer = c.get("hidden_size_per_layer_input") or 0
    for i in range(n):
        reuse = i >= first_shared
        t.add("attention", _gemma4_attention(c, i, reuse))
        wide = 2 if reuse and c.get("use_double_wide_mlp") else 1
        t.add("mlp", gated_mlp(h, need(c, "intermediate_size") * wide))
        t.add("norms", 4 * h)
        if per_layer:
            t.add("mlp", 2 * h * per_layer)
            t.add("norms", h)
        if c.get("enable_moe_block"):
            experts = need(c, "num_experts")
            t.experts(experts, 3 * h * need(c, "moe_intermediate_size"), need(c, "top_k_experts"))
            t.add("mlp", h + experts + experts * h)
            t.add("norms", 3 * h)
    if per_layer:  # Gemma4TextModel: per-layer embeddings, their projection and norm
        t.add("embedding", need(c, "vocab_size_per_layer_input") * n * per_layer)
        t.add("mlp", n * per_layer * h)
        t.add("norms", per_layer)


_FAMILIES: dict[str, Callable[[Config, _Tally], None]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
    "gemma2": lambda c, t: _gemma(c, t, qk_norm=False),
    "gemma3_text": lambda c, t: _gemma(c, t, qk_norm=True),
    "mixtral": _mixtral, "gpt_oss": _gpt_oss,
    "qwen2_moe": lambda c, t: _qwen_moe(c, t, qk_norm=False, qkv_bias=True, shared=True),
    "qwen3_moe": lambda c, t: _qwen_moe(c, t, qk_norm=True, qkv_bias=False, shared=False),
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "deepseek_v32": _deepseek,
    "llama4_text": _llama4, "qwen3_next": _qwen3_next, "qwen3_5_moe_text": _qwen3_next,
    "qwen3_5_text": _qwen3_5_dense, "minimax": _minimax, "nemotron_h": _nemotron_h,
    "mamba2": _mamba2_model, "jamba": _jamba, "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granite_hybrid, "mimo_v2_flash": _mimo_v2, "gemma4_text": _gemma4,
}
SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILIES))


def count_params(config: Config) -> ParamCounts:
    """Parameter counts of the model a defaults-filled config describes.

    Args:
        config: `hf_config.with_defaults(...)` of a config.json (Kimi-K2's
            "kimi_k2" is already read as "deepseek_v3" there).

    Returns:
        ParamCounts; `total` equals the sum of `numel()` over the parameters
        of transformers' `AutoModelForCausalLM.from_config` (tied weights once).

    Raises:
        ValueError: a model_type without a counting rule (naming it and the
            supported ones), or a missing field (naming it).
    """
    model_type = config.get("model_type")
    family = _FAMILIES.get(str(model_type))
    if family is None:
        raise ValueError(f"count_params: model_type {model_type!r} has no parameter-count rule; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    t = _Tally()
    h, vocab = need(config, "hidden_size"), need(config, "vocab_size")
    tied = bool(config.get("tie_word_embeddings"))
    t.add("embedding", vocab * h * (1 if tied else 2))
    t.add("norms", h)  # the final norm
    family(config, t)
    return t.counts()

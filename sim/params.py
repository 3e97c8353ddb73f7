"""Parameter counts of a model, computed from its (defaults-filled) config.

`count_params(with_defaults(config))` counts every weight transformers'
`<X>ForCausalLM` builds for that config (the modules of
`transformers/models/<x>/modeling_<x>.py`, transformers 5.24.0): embeddings
(tied or not), attention (GQA with its biases and q/k norms, MLA with its
low-rank projections and norms, the DSA indexer, GLM-5's shared-indexer layers), dense MLPs (gated or not),
MoE routers, routed and shared experts, Mamba-1 / Mamba-2, gated-DeltaNet,
KDA, lightning and short-conv blocks, Gemma-3n's AltUp / Laurel / per-layer
inputs, Zamba2's shared transformer blocks
(`params_hybrid`), and the norms. `active` counts only `num_experts_per_tok` of the
routed experts of each MoE layer (shared experts and routers always run).
A model_type without a rule here is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from unikv.sim.param_blocks import dsa_indexer, gated_mlp, gqa, mla, need
from unikv.sim.param_layers import ParamCounts, Tally, decoder, dense, moe_every, moe_mlp
from unikv.sim.params_hybrid import HYBRID_FAMILIES

Config = Mapping[str, Any]

__all__ = ["SUPPORTED_MODEL_TYPES", "ParamCounts", "count_params"]


# -- attention-only families ----------------------------------------------------------

def _llama(c: Config, t: Tally) -> None:
    bias = bool(c.get("attention_bias"))
    decoder(c, t, lambda i: gqa(c, qkv_bias=bias, o_bias=bias), dense(c, t, bool(c.get("mlp_bias"))))


def _qwen2(c: Config, t: Tally) -> None:
    decoder(c, t, lambda i: gqa(c, qkv_bias=True), dense(c, t))


def _qwen3(c: Config, t: Tally) -> None:
    bias = bool(c.get("attention_bias"))
    decoder(c, t, lambda i: gqa(c, qkv_bias=bias, o_bias=bias, qk_norm=True), dense(c, t))


def _gemma(c: Config, t: Tally, qk_norm: bool) -> None:
    bias = bool(c.get("attention_bias"))
    decoder(c, t, lambda i: gqa(c, qkv_bias=bias, o_bias=bias, qk_norm=qk_norm), dense(c, t),
             norms_per_layer=4)  # input, post-attention, pre- and post-feedforward


def _qwen_moe(c: Config, t: Tally, *, qk_norm: bool, qkv_bias: bool, shared: bool) -> None:
    experts = c.get("num_experts") or need(c, "num_local_experts")

    def mlp(i: int) -> None:
        if not moe_every(c, i):
            return t.add("mlp", gated_mlp(need(c, "hidden_size"), need(c, "intermediate_size")))
        moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=experts,
                 shared_inter=c.get("shared_expert_intermediate_size") or 0 if shared else 0,
                 shared_gate=shared)
    decoder(c, t, lambda i: gqa(c, qkv_bias=qkv_bias, qk_norm=qk_norm), mlp)


def _mixtral(c: Config, t: Tally) -> None:
    decoder(c, t, lambda i: gqa(c), lambda i: moe_mlp(
        c, t, inter=need(c, "intermediate_size"), experts=need(c, "num_local_experts")))


def _gpt_oss(c: Config, t: Tally) -> None:
    """GptOssAttention (biases, per-head sinks) + GptOssMLP (router with bias, experts with biases)."""
    h, experts, inter = need(c, "hidden_size"), need(c, "num_local_experts"), need(c, "intermediate_size")

    def mlp(i: int) -> None:
        t.experts(experts, 3 * h * inter + 2 * inter + h, need(c, "num_experts_per_tok"))
        t.add("mlp", experts * h + experts)
    heads = need(c, "num_attention_heads")
    decoder(c, t, lambda i: gqa(c, qkv_bias=True, o_bias=True) + heads, mlp)


def _deepseek(c: Config, t: Tally) -> None:
    """DeepseekV2/V3 DecoderLayer: MLA; dense MLPs before first_k_dense_replace, MoE after (moe_layer_freq is
    not read); V3.2: MoE where mlp_layer_types says "sparse", and the DSA indexer in every layer. Biases:
    attention_bias on q_a / kv_a / o; mlp_bias on V2's dense MLPs and shared experts only (DeepseekV2MLP)."""
    h, first = need(c, "hidden_size"), c.get("first_k_dense_replace") or 0
    indexer = c.get("model_type") == "deepseek_v32"
    sparse = c.get("mlp_layer_types") if indexer else None
    mlp_bias = c.get("model_type") == "deepseek_v2" and bool(c.get("mlp_bias"))

    def mlp(i: int) -> None:
        if (sparse[i] != "sparse") if sparse is not None else i < first:
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size"), mlp_bias))
        inter = need(c, "moe_intermediate_size")
        shared = inter * (c.get("n_shared_experts") or 0)
        moe_mlp(c, t, inter=inter, experts=need(c, "n_routed_experts"), shared_inter=shared)
        t.add("mlp", 2 * shared + h if mlp_bias and shared else 0)
    bias = bool(c.get("attention_bias"))
    decoder(c, t, lambda i: mla(c, bias=bias) + (dsa_indexer(c) if indexer else 0), mlp)


def _glm_moe_dsa(c: Config, t: Tally) -> None:
    """GlmMoeDsaDecoderLayer (transformers models/glm_moe_dsa/modeling_glm_moe_dsa.py): GlmMoeDsaAttention is
    MLA (q_a, kv_a and o biased by attention_bias) with a GlmMoeDsaIndexer only where indexer_types says
    "full" ("shared" layers reuse the previous top-k); GlmMoeDsaMoE (router, experts, shared experts of
    moe_intermediate_size x n_shared_experts) where mlp_layer_types says "sparse", else a dense MLP."""
    h, indexers, mlps = need(c, "hidden_size"), need(c, "indexer_types"), need(c, "mlp_layer_types")
    bias = bool(c.get("attention_bias"))

    def mlp(i: int) -> None:
        if mlps[i] != "sparse":
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
        inter = need(c, "moe_intermediate_size")
        moe_mlp(c, t, inter=inter, experts=need(c, "n_routed_experts"),
                 shared_inter=inter * need(c, "n_shared_experts"))
    decoder(c, t, lambda i: mla(c, bias=bias) + (dsa_indexer(c) if indexers[i] == "full" else 0), mlp)


def _llama4(c: Config, t: Tally) -> None:
    """Llama4TextDecoderLayer: MoE (router, experts, one shared expert) in moe_layers, else intermediate_size_mlp."""
    h, moe_layers = need(c, "hidden_size"), set(c.get("moe_layers") or [])

    def mlp(i: int) -> None:
        if i not in moe_layers:
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size_mlp")))
        inter = need(c, "intermediate_size")
        moe_mlp(c, t, inter=inter, experts=need(c, "num_local_experts"), shared_inter=inter)
    decoder(c, t, lambda i: gqa(c, qkv_bias=bool(c.get("attention_bias"))), mlp)


# What MiMoV2FlashAttention builds for a sliding layer, by the file's own swa_* fields.
_MIMO_SWA = (("swa_num_key_value_heads", lambda c: 2 * c["num_key_value_heads"]),
             ("swa_num_attention_heads", lambda c: c["num_attention_heads"]),
             ("swa_head_dim", lambda c: c["head_dim"]), ("swa_v_head_dim", lambda c: c["v_head_dim"]),
             ("add_swa_attention_sink_bias", lambda c: True),
             ("add_full_attention_sink_bias", lambda c: False))


def _mimo_v2(c: Config, t: Tally) -> None:
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
        moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=need(c, "n_routed_experts"))
    decoder(c, t, attention, mlp)


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


def _gemma4(c: Config, t: Tally) -> None:
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


def _gemma3n_layer(c: Config, t: Tally, i: int, reuse: bool) -> None:
    """Gemma3nTextDecoderLayer: attention (q/k norms; no k/v, k_norm in KV-shared layers; v_norm has no
    weight), a gated MLP of intermediate_size[i], 4 norms, AltUp (output scale, correction and prediction
    coefficients, router and its norm), Laurel (low-rank left/right, norm), the per-layer input gate,
    projection and norm."""
    h, heads, d = need(c, "hidden_size"), need(c, "num_attention_heads"), need(c, "head_dim")
    kv, bias = need(c, "num_key_value_heads"), bool(c.get("attention_bias"))
    n = 2 * h * heads * d + d + (heads * d + h if bias else 0)  # q, o, q_norm
    if not reuse:
        n += 2 * kv * d * (h + (1 if bias else 0)) + d  # k, v, k_norm
    t.add("attention", n)
    t.add("mlp", gated_mlp(h, need(c, "intermediate_size")[i]))
    alt, rank, per_layer = need(c, "altup_num_inputs"), need(c, "laurel_rank"), need(c, "hidden_size_per_layer_input")
    t.add("mlp", alt * alt + alt * alt ** 2 + h * alt + 2 * h * rank + 2 * h * per_layer)
    t.add("norms", 4 * h + h + h + h + h)  # the 4, AltUp's output scale and router norm, Laurel's, per-layer input's


def _gemma3n(c: Config, t: Tally) -> None:
    """Gemma3nTextModel (transformers models/gemma3n/modeling_gemma3n.py): the layers (the last
    num_kv_shared_layers reuse KV: Gemma3nTextConfig.kv_sharing_modes), per-layer embeddings
    (vocab_size_per_layer_input x layers x hidden_size_per_layer_input), their projection from hidden
    and norm, and altup_num_inputs - 1 AltUp projections and unembedding projections.

    Raises:
        ValueError: KV-shared layers of a layer type no earlier layer computes (transformers refuses too).
    """
    h, n, types = need(c, "hidden_size"), need(c, "num_hidden_layers"), need(c, "layer_types")
    shared = c.get("num_kv_shared_layers") or 0
    first_shared = n - shared if shared else n
    if set(types[:first_shared]) != set(types):
        raise ValueError(f"count_params: gemma3n_text num_kv_shared_layers={shared} leaves a layer type "
                         f"({sorted(set(types) - set(types[:first_shared]))}) without a layer computing its KV")
    for i in range(n):
        _gemma3n_layer(c, t, i, reuse=i >= first_shared)
    per_layer = need(c, "hidden_size_per_layer_input")
    t.add("embedding", need(c, "vocab_size_per_layer_input") * n * per_layer)
    t.add("mlp", h * n * per_layer + 2 * (need(c, "altup_num_inputs") - 1) * h * h)
    t.add("norms", per_layer)


_FAMILIES: dict[str, Callable[[Config, Tally], None]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
    "gemma2": lambda c, t: _gemma(c, t, qk_norm=False),
    "gemma3_text": lambda c, t: _gemma(c, t, qk_norm=True),
    "mixtral": _mixtral, "gpt_oss": _gpt_oss,
    "qwen2_moe": lambda c, t: _qwen_moe(c, t, qk_norm=False, qkv_bias=True, shared=True),
    "qwen3_moe": lambda c, t: _qwen_moe(c, t, qk_norm=True, qkv_bias=False, shared=False),
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "deepseek_v32": _deepseek,
    "glm_moe_dsa": _glm_moe_dsa,
    "llama4_text": _llama4, "mimo_v2_flash": _mimo_v2, "gemma4_text": _gemma4,
    "gemma3n_text": _gemma3n,
    **HYBRID_FAMILIES,
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
    t = Tally()
    h, vocab = need(config, "hidden_size"), need(config, "vocab_size")
    tied = bool(config.get("tie_word_embeddings"))
    t.add("embedding", vocab * h * (1 if tied else 2))
    t.add("norms", h)  # the final norm
    family(config, t)
    return t.counts()

"""The roofline's extra figures of a model read from its own config.json:
attention FLOPs per (query, attended position) pair and its routed experts.

Bundled models take these from `sim/data/compute.json` (`sim.models`); a
user's config gets them here, from the fields transformers' modeling code
reads (`num_attention_heads`, `num_key_value_heads`, `head_dim`, the expert
counts), checked against the KV bytes unikv derived for each layer kind.
A config whose layers do not fit the plain rule (K and V of `head_dim`
each, one KV-head count for every layer: MLA, per-kind head counts or
dims, asymmetric K / V) gets no attention term, and the reason is
recorded: the roofline then charges no attention FLOPs for it, as before.

MLA (`kv_lora_rank`: DeepSeek-V2/V3/R1, Kimi-K2) has its own rule, the forms
engines run (docs/cost_model.md, "The roofline"): prefill in the non-absorbed
(MHA) form, per head q.k over qk_nope_head_dim + qk_rope_head_dim and p.v over
v_head_dim, with every cached latent token up-projected by kv_b_proj again
(vLLM `MLACommonImpl._compute_prefill_context`, SGLang `forward_normal_*`);
decode in the absorbed form, per head q.k over kv_lora_rank +
qk_rope_head_dim and p.v over kv_lora_rank (the absorption's W_UK / W_UV
products are kv_b_proj's parameters once per token, already in 2 x params).
A sparse-attention indexer (`index_topk`: DeepSeek-V3.2, GLM-5) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unikv.sim.model_spec import FP4_KV_CACHE_DTYPES, KV_CACHE_DTYPES, ModelSpec, kv_token_bytes

EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "top_k_experts")  # the last: Gemma-4 (params._gemma4)


def _first(config: Mapping[str, Any], names: tuple[str, ...]):
    return next((config[n] for n in names if isinstance(config.get(n), int) and config[n] > 0), None)


def attention_pairs(config: Mapping[str, Any], spec: ModelSpec) -> tuple[tuple[int, int] | None, str]:
    """((full, window) FLOPs per attended pair summed over the layers, or
    None, why): 2 x layers x query heads x (Dk + Dv) per kind, window kinds
    (sliding, chunked) summed apart."""
    heads: Any = config.get("num_attention_heads")
    kv: Any = config.get("num_key_value_heads") or heads
    hidden = config.get("hidden_size")
    if not all(isinstance(x, int) and x > 0 for x in (heads, kv)):
        return None, "no attention term: num_attention_heads / num_key_value_heads missing"
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) else None)
    if not isinstance(head_dim, int) or "kv_lora_rank" in config:
        return None, "no attention term: MLA (see mla_flops) or no head_dim (the plain rule does not describe it)"
    full = window = 0
    for kind in spec.token_kinds:
        if kind.bytes_per_token_per_layer != _kv_bytes_or_none(kv, head_dim, kind.dtype):
            return None, (f"no attention term: layer kind {kind.name!r} holds {kind.bytes_per_token_per_layer} "
                          f"bytes per token per layer, not {kv} KV heads x 2 x head_dim {head_dim} "
                          "(per-kind heads or dims, or asymmetric K / V)")
        pairs = 2 * kind.layers * heads * 2 * head_dim
        if kind.window_tokens is None:
            full += pairs
        else:
            window += pairs
    return (full, window), f"attention FLOPs from the config: 2 x layers x {heads} heads x 2 x head_dim {head_dim}"


def mla_flops(config: Mapping[str, Any], spec: ModelSpec) -> tuple[tuple[int, int, int] | None, str]:
    """((prefill pair, decode pair, cached token) FLOPs summed over the MLA
    layers, or None, why) of an MLA config (one with `kv_lora_rank`).

    Per MLA layer, with H query heads: a prefill pair costs
    2 H (qk_nope + qk_rope + v_head_dim), a decode pair 2 H (2 kv_lora_rank +
    qk_rope), and a cached token a prefill chunk attends costs
    2 kv_lora_rank H (qk_nope + v_head_dim) to up-project (kv_b_proj).
    """
    arch = (config.get("architectures") or ["?"])[0]
    if config.get("index_topk") is not None:
        return None, (f"no attention term: {arch} sparse attention (index_topk={config['index_topk']}: an "
                      "indexer scores every cached key, then MLA over the top-k) is not described")
    names = ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    bad = [n for n in names if not (isinstance(config.get(n), int)
                                    and config[n] >= (0 if n == "qk_rope_head_dim" else 1))]  # rope 0: NoPE
    if bad:
        return None, f"no attention term: {arch} MLA config without a usable {bad[0]}"
    heads, rank, nope, rope, v = (config[n] for n in names)
    kinds = spec.token_kinds
    if len(kinds) != 1 or kinds[0].name != "mla_latent" or kinds[0].window_tokens is not None:
        return None, (f"no attention term: {arch} MLA with layer kinds {[k.name for k in kinds]} "
                      "(only MLA layers are described)")
    layers = kinds[0].layers
    return ((2 * layers * heads * (nope + rope + v), 2 * layers * heads * (2 * rank + rope),
             2 * layers * rank * heads * (nope + v)),
            f"MLA attention FLOPs from the config: {layers} layers x {heads} heads; prefill (MHA form) "
            f"q.k {nope}+{rope}, p.v {v}, each cached token up-projected {rank} -> {nope}+{v}; "
            f"decode (absorbed) q.k {rank}+{rope}, p.v {rank}")


def _attention_fields(config: Mapping[str, Any], spec: ModelSpec) -> tuple[dict[str, Any], str]:
    """The attention fields of ModelSpec, MLA or plain, and why."""
    if "kv_lora_rank" in config:
        mla, why = mla_flops(config, spec)
        if mla is None:
            return {}, why
        return {"attention_pair_flops": (mla[0], 0), "mla_flops": (mla[1], mla[2])}, why
    pairs, why = attention_pairs(config, spec)
    return ({} if pairs is None else {"attention_pair_flops": pairs}), why


def compute_fields(config: Mapping[str, Any], spec: ModelSpec, *, routed: bool) -> tuple[dict[str, Any], str]:
    """(ModelSpec fields for the roofline, the source note) of a parsed config.

    Args:
        routed: the model has routed-expert layers (its counted active
            parameters are fewer than its total): a config class's default
            expert fields on a dense model (Nemotron-H-56B's) are ignored.
    """
    out, why = _attention_fields(config, spec)
    experts, per_token = _first(config, EXPERTS), _first(config, PER_TOKEN)
    if routed and experts is not None and experts > 1:
        if per_token is None:
            why += f"; {experts} routed experts but no experts-per-token field: every expert charged"
        else:
            out.update(routed_experts=experts, experts_per_token=per_token)
            why += f"; MoE: {per_token} of {experts} routed experts per token"
    return out, why


def _kv_bytes_or_none(kv_heads: int, head_dim: int, dtype: str) -> int | None:
    """K + V bytes of a plain `kv_heads x head_dim` layer in `dtype` (None: not a K/V dtype)."""
    if dtype not in KV_CACHE_DTYPES and dtype not in FP4_KV_CACHE_DTYPES:
        return None
    try:
        return kv_token_bytes(kv_heads, head_dim, head_dim, dtype)
    except ValueError:
        return None

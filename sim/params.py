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


def _need(c: Config, key: str) -> Any:
    value = c.get(key)
    if value is None:
        raise ValueError(f"count_params: missing field {key!r} (model_type {c.get('model_type')!r})")
    return value


# -- blocks ------------------------------------------------------------------------

def _gqa(c: Config, *, qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
         gated_q: bool = False, heads: int | None = None, kv_heads: int | None = None,
         head_dim: int | None = None) -> int:
    """q/k/v/o projections (LlamaAttention and its kin), optional biases, q/k RMSNorm, doubled q (output gate)."""
    h = _need(c, "hidden_size")
    heads = heads or _need(c, "num_attention_heads")
    kv = kv_heads or c.get("num_key_value_heads") or heads
    d = head_dim or c.get("head_dim") or h // heads
    q_out = heads * d * (2 if gated_q else 1)
    n = h * q_out + 2 * h * kv * d + heads * d * h
    if qkv_bias:
        n += q_out + 2 * kv * d
    if o_bias:
        n += h
    return n + (2 * d if qk_norm else 0)


def _mla(c: Config) -> int:
    """DeepseekV3Attention: low-rank q (q_a, norm, q_b) or full q, joint kv_a (+rope), kv norm, kv_b, o."""
    h, heads = _need(c, "hidden_size"), _need(c, "num_attention_heads")
    nope, rope, v = _need(c, "qk_nope_head_dim"), _need(c, "qk_rope_head_dim"), _need(c, "v_head_dim")
    kv_rank, q_rank = _need(c, "kv_lora_rank"), c.get("q_lora_rank")
    qk = nope + rope
    q = h * heads * qk if q_rank is None else h * q_rank + q_rank + q_rank * heads * qk
    kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    return q + kv + heads * v * h


def _dsa_indexer(c: Config) -> int:
    """DeepseekV32 indexer: wq_b from the q latent, wk, a LayerNorm (weight + bias) on k, per-head weights."""
    h, q_rank = _need(c, "hidden_size"), _need(c, "q_lora_rank")
    heads, d = _need(c, "index_n_heads"), _need(c, "index_head_dim")
    return q_rank * heads * d + h * d + 2 * d + h * heads


def _gated_mlp(h: int, inter: int, bias: bool = False) -> int:
    return 3 * h * inter + (2 * inter + h if bias else 0)


def _mamba2(c: Config, *, heads: str, head_dim: str, state: str, proj_bias: str) -> int:
    """Mamba2Mixer: in_proj (z, x, B, C, dt), depthwise conv (+bias), dt_bias, A_log, D, gated norm, out_proj."""
    h, n_heads, d_head = _need(c, "hidden_size"), _need(c, heads), _need(c, head_dim)
    groups, d_state, kernel = _need(c, "n_groups"), _need(c, state), _need(c, "conv_kernel")
    inner = n_heads * d_head
    conv_dim = inner + 2 * groups * d_state
    bias = bool(c.get(proj_bias))
    n = h * (inner + conv_dim + n_heads) + (inner + conv_dim + n_heads if bias else 0)
    n += conv_dim * kernel + (conv_dim if c.get("use_conv_bias", True) else 0)
    return n + 3 * n_heads + inner + inner * h + (h if bias else 0)


def _gated_deltanet(c: Config) -> int:
    """Qwen3NextGatedDeltaNet: q/k/v/z and b/a projections, conv over q/k/v, dt_bias, A_log, norm, out."""
    h = _need(c, "hidden_size")
    nk, dk = _need(c, "linear_num_key_heads"), _need(c, "linear_key_head_dim")
    nv, dv = _need(c, "linear_num_value_heads"), _need(c, "linear_value_head_dim")
    conv_dim = 2 * nk * dk + nv * dv
    return (h * (conv_dim + nv * dv) + h * 2 * nv + conv_dim * _need(c, "linear_conv_kernel_dim")
            + 2 * nv + dv + nv * dv * h)


def _lightning(c: Config) -> int:
    """MiniMaxLightningAttention: qkv, output norm, output gate, out projection."""
    h, heads = _need(c, "hidden_size"), _need(c, "num_attention_heads")
    d = c.get("head_dim") or h // heads
    return h * 3 * heads * d + heads * d + h * heads * d + heads * d * h


# -- families ----------------------------------------------------------------------

def _layers(c: Config) -> range:
    return range(_need(c, "num_hidden_layers"))


def _moe_every(c: Config, i: int) -> bool:
    """Qwen2/3-MoE, Qwen3-Next: MoE unless in mlp_only_layers; every decoder_sparse_step-th layer."""
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    return (i not in (c.get("mlp_only_layers") or []) and experts > 0
            and (i + 1) % c.get("decoder_sparse_step", 1) == 0)


def _decoder(c: Config, t: _Tally, attention: Callable[[int], int], mlp: Callable[[int], None],
             norms_per_layer: int = 2) -> None:
    h = _need(c, "hidden_size")
    for i in _layers(c):
        t.add("attention", attention(i))
        mlp(i)
        t.add("norms", norms_per_layer * h)


def _dense(c: Config, t: _Tally, bias: bool = False) -> Callable[[int], None]:
    return lambda i: t.add("mlp", _gated_mlp(_need(c, "hidden_size"), _need(c, "intermediate_size"), bias))


def _llama(c: Config, t: _Tally) -> None:
    bias = bool(c.get("attention_bias"))
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=bias, o_bias=bias), _dense(c, t, bool(c.get("mlp_bias"))))


def _qwen2(c: Config, t: _Tally) -> None:
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=True), _dense(c, t))


def _qwen3(c: Config, t: _Tally) -> None:
    bias = bool(c.get("attention_bias"))
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=bias, o_bias=bias, qk_norm=True), _dense(c, t))


def _gemma(c: Config, t: _Tally, qk_norm: bool) -> None:
    bias = bool(c.get("attention_bias"))
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=bias, o_bias=bias, qk_norm=qk_norm), _dense(c, t),
             norms_per_layer=4)  # input, post-attention, pre- and post-feedforward


def _moe_mlp(c: Config, t: _Tally, *, inter: int, experts: int, shared_inter: int = 0,
             shared_gate: bool = False, gated: bool = True) -> None:
    """Router (no bias) + routed experts + optional shared expert (and its sigmoid gate)."""
    h = _need(c, "hidden_size")
    per_expert = (3 if gated else 2) * h * inter
    t.experts(experts, per_expert, _need(c, "num_experts_per_tok"))
    t.add("mlp", experts * h + (3 if gated else 2) * h * shared_inter + (h if shared_gate else 0))


def _qwen_moe(c: Config, t: _Tally, *, qk_norm: bool, qkv_bias: bool, shared: bool) -> None:
    experts = c.get("num_experts") or _need(c, "num_local_experts")

    def mlp(i: int) -> None:
        if not _moe_every(c, i):
            return t.add("mlp", _gated_mlp(_need(c, "hidden_size"), _need(c, "intermediate_size")))
        _moe_mlp(c, t, inter=_need(c, "moe_intermediate_size"), experts=experts,
                 shared_inter=c.get("shared_expert_intermediate_size") or 0 if shared else 0,
                 shared_gate=shared)
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=qkv_bias, qk_norm=qk_norm), mlp)


def _mixtral(c: Config, t: _Tally) -> None:
    _decoder(c, t, lambda i: _gqa(c), lambda i: _moe_mlp(
        c, t, inter=_need(c, "intermediate_size"), experts=_need(c, "num_local_experts")))


def _gpt_oss(c: Config, t: _Tally) -> None:
    """GptOssAttention (biases, per-head sinks) + GptOssMLP (router with bias, experts with biases)."""
    h, experts, inter = _need(c, "hidden_size"), _need(c, "num_local_experts"), _need(c, "intermediate_size")

    def mlp(i: int) -> None:
        t.experts(experts, 3 * h * inter + 2 * inter + h, _need(c, "num_experts_per_tok"))
        t.add("mlp", experts * h + experts)
    heads = _need(c, "num_attention_heads")
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=True, o_bias=True) + heads, mlp)


def _deepseek(c: Config, t: _Tally) -> None:
    """DeepseekV2/V3(V3.2): MLA; dense MLPs before first_k_dense_replace, then MoE every moe_layer_freq-th."""
    h, first, freq = _need(c, "hidden_size"), c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
    indexer = c.get("model_type") == "deepseek_v32"

    def mlp(i: int) -> None:
        if i < first or i % freq:
            return t.add("mlp", _gated_mlp(h, _need(c, "intermediate_size")))
        inter = _need(c, "moe_intermediate_size")
        _moe_mlp(c, t, inter=inter, experts=_need(c, "n_routed_experts"),
                 shared_inter=inter * (c.get("n_shared_experts") or 0))
    _decoder(c, t, lambda i: _mla(c) + (_dsa_indexer(c) if indexer else 0), mlp)


def _llama4(c: Config, t: _Tally) -> None:
    """Llama4TextDecoderLayer: MoE (router, experts, one shared expert) in moe_layers, else intermediate_size_mlp."""
    h, moe_layers = _need(c, "hidden_size"), set(c.get("moe_layers") or [])

    def mlp(i: int) -> None:
        if i not in moe_layers:
            return t.add("mlp", _gated_mlp(h, _need(c, "intermediate_size_mlp")))
        inter = _need(c, "intermediate_size")
        _moe_mlp(c, t, inter=inter, experts=_need(c, "num_local_experts"), shared_inter=inter)
    _decoder(c, t, lambda i: _gqa(c, qkv_bias=bool(c.get("attention_bias"))), mlp)


def _hybrid_linear(c: Config, t: _Tally, block: Callable[[Config], int], gated_q: bool,
                   qk_norm: bool, moe: Callable[[int], None]) -> None:
    """Qwen3-Next / Qwen3.5 / MiniMax: full-attention layers among linear-attention layers."""
    types = _need(c, "layer_types")

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return _gqa(c, gated_q=gated_q, qk_norm=qk_norm)
        t.add("recurrent", block(c))
        return 0
    _decoder(c, t, mixer, moe)


def _qwen3_next(c: Config, t: _Tally) -> None:
    experts = c.get("num_experts") or _need(c, "num_local_experts")

    def mlp(i: int) -> None:
        if not _moe_every(c, i):
            return t.add("mlp", _gated_mlp(_need(c, "hidden_size"), _need(c, "intermediate_size")))
        _moe_mlp(c, t, inter=_need(c, "moe_intermediate_size"), experts=experts,
                 shared_inter=_need(c, "shared_expert_intermediate_size"), shared_gate=True)
    _hybrid_linear(c, t, _gated_deltanet, gated_q=True, qk_norm=True, moe=mlp)


def _qwen3_5_dense(c: Config, t: _Tally) -> None:
    _hybrid_linear(c, t, _gated_deltanet, gated_q=True, qk_norm=True, moe=_dense(c, t))


def _minimax(c: Config, t: _Tally) -> None:
    _hybrid_linear(c, t, _lightning, gated_q=False, qk_norm=False, moe=lambda i: _moe_mlp(
        c, t, inter=_need(c, "intermediate_size"), experts=_need(c, "num_local_experts")))


def _nemotron_h(c: Config, t: _Tally) -> None:
    """NemotronHBlock: one norm, then one mixer: Mamba-2, attention, relu2 MLP or relu2 MoE (+shared)."""
    h = _need(c, "hidden_size")
    for kind in _need(c, "layers_block_type"):
        t.add("norms", h)
        if kind == "linear_attention":
            t.add("recurrent", _mamba2(c, heads="mamba_num_heads", head_dim="mamba_head_dim",
                                       state="ssm_state_size", proj_bias="use_bias"))
        elif kind == "full_attention":
            t.add("attention", _gqa(c, qkv_bias=bool(c.get("attention_bias")),
                                    o_bias=bool(c.get("attention_bias"))))
        elif kind == "mlp":
            t.add("mlp", 2 * h * _need(c, "intermediate_size"))
        elif kind == "moe":
            _moe_mlp(c, t, inter=_need(c, "moe_intermediate_size"), experts=_need(c, "n_routed_experts"),
                     shared_inter=_need(c, "moe_shared_expert_intermediate_size")
                     * (c.get("n_shared_experts") or 0), gated=False)
        else:
            raise ValueError(f"count_params: nemotron_h layer kind {kind!r} is not supported")


def _mamba2_model(c: Config, t: _Tally) -> None:
    h = _need(c, "hidden_size")
    for _ in _layers(c):
        t.add("norms", h)
        t.add("recurrent", _mamba2(c, heads="num_heads", head_dim="head_dim", state="state_size",
                                   proj_bias="use_bias"))


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
    "mamba2": _mamba2_model,
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
    h, vocab = _need(config, "hidden_size"), _need(config, "vocab_size")
    tied = bool(config.get("tie_word_embeddings"))
    t.add("embedding", vocab * h * (1 if tied else 2))
    t.add("norms", h)  # the final norm
    family(config, t)
    return t.counts()

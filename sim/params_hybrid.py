"""Parameter counts of the hybrid and recurrent families (Mamba, gated DeltaNet, lightning, KDA, short conv,
Zamba2's shared transformer blocks).

Each function adds one model's layers to a `Tally`, as its
`transformers/models/<x>/modeling_<x>.py` decoder layer builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from unikv.sim.param_blocks import (
    gated_deltanet,
    gated_mlp,
    gqa,
    kda,
    lightning,
    mamba1,
    mamba2,
    mla,
    need,
    short_conv,
    zamba2_mamba,
)
from unikv.sim.param_layers import Tally, decoder, dense, layers, moe_every, moe_mlp

Config = Mapping[str, Any]


def _hybrid_linear(c: Config, t: Tally, block: Callable[[Config], int], gated_q: bool,
                   qk_norm: bool, moe: Callable[[int], None]) -> None:
    """Qwen3-Next / Qwen3.5 / MiniMax: full-attention layers among linear-attention layers."""
    types = need(c, "layer_types")

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return gqa(c, gated_q=gated_q, qk_norm=qk_norm)
        t.add("recurrent", block(c))
        return 0
    decoder(c, t, mixer, moe)


def _qwen3_next(c: Config, t: Tally) -> None:
    experts = c.get("num_experts") or need(c, "num_local_experts")

    def mlp(i: int) -> None:
        if not moe_every(c, i):
            return t.add("mlp", gated_mlp(need(c, "hidden_size"), need(c, "intermediate_size")))
        moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=experts,
                 shared_inter=need(c, "shared_expert_intermediate_size"), shared_gate=True)
    _hybrid_linear(c, t, gated_deltanet, gated_q=True, qk_norm=True, moe=mlp)


def _qwen3_5_dense(c: Config, t: Tally) -> None:
    _hybrid_linear(c, t, gated_deltanet, gated_q=True, qk_norm=True, moe=dense(c, t))


def _minimax(c: Config, t: Tally) -> None:
    _hybrid_linear(c, t, lightning, gated_q=False, qk_norm=False, moe=lambda i: moe_mlp(
        c, t, inter=need(c, "intermediate_size"), experts=need(c, "num_local_experts")))


def _nemotron_h(c: Config, t: Tally) -> None:
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
            moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=need(c, "n_routed_experts"),
                     shared_inter=need(c, "moe_shared_expert_intermediate_size")
                     * (c.get("n_shared_experts") or 0), gated=False)
        else:
            raise ValueError(f"count_params: nemotron_h layer kind {kind!r} is not supported")


def _mamba2_model(c: Config, t: Tally) -> None:
    h = need(c, "hidden_size")
    for _ in layers(c):
        t.add("norms", h)
        t.add("recurrent", mamba2(c, heads="num_heads", head_dim="head_dim", state="state_size"))


def _jamba(c: Config, t: Tally) -> None:
    """JambaDecoderLayer: Mamba-1 or attention, then MoE where i % expert_layer_period == offset, else dense."""
    h, types = need(c, "hidden_size"), need(c, "layer_types")
    period, offset = need(c, "expert_layer_period"), need(c, "expert_layer_offset")
    experts = c.get("num_experts") or c.get("num_local_experts") or 1

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return gqa(c)
        t.add("recurrent", mamba1(c, jamba=True))
        return 0

    def mlp(i: int) -> None:
        if experts > 1 and i % period == offset:
            return moe_mlp(c, t, inter=need(c, "intermediate_size"), experts=experts)
        t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
    decoder(c, t, mixer, mlp)


def _falcon_h1(c: Config, t: Tally) -> None:
    """FalconH1DecoderLayer: attention and a Mamba-2 mixer in parallel in every layer, then a gated MLP."""
    bias = bool(c.get("attention_bias"))

    def mixer(i: int) -> int:
        t.add("recurrent", mamba2(c, heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state",
                                  groups="mamba_n_groups", kernel="mamba_d_conv",
                                  proj_bias="mamba_proj_bias", conv_bias="mamba_conv_bias",
                                  out_bias="projectors_bias", norm=bool(c.get("mamba_rms_norm"))))
        return gqa(c, qkv_bias=bias, o_bias=bias)
    decoder(c, t, mixer, dense(c, t, bool(c.get("mlp_bias"))))


def _granite_hybrid(c: Config, t: Tally) -> None:
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
            moe_mlp(c, t, inter=need(c, "intermediate_size"), experts=experts)
        t.add("mlp", 3 * h * shared)
    decoder(c, t, mixer, mlp)


def _mamba1_model(c: Config, t: Tally) -> None:
    """MambaBlock: one norm and a Mamba-1 mixer per layer."""
    for _ in layers(c):
        t.add("norms", need(c, "hidden_size"))
        t.add("recurrent", mamba1(c, jamba=False))


def _kimi_linear(c: Config, t: Tally) -> None:
    """KimiLinearDecoderLayer: KDA or MLA by layer_types; dense or MoE (+ shared experts) by mlp_layer_types."""
    h, types, mlps = need(c, "hidden_size"), need(c, "layer_types"), need(c, "mlp_layer_types")

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return mla(c)
        t.add("recurrent", kda(c))
        return 0

    def mlp(i: int) -> None:
        if mlps[i] == "dense":
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
        inter = need(c, "moe_intermediate_size")
        moe_mlp(c, t, inter=inter, experts=need(c, "num_experts"),
                shared_inter=inter * (c.get("num_shared_experts") or 0))
    decoder(c, t, mixer, mlp)


def _lfm2_ff_dim(c: Config) -> int:
    """Lfm2MLP's width: 2/3 of intermediate_size, scaled and rounded up to block_multiple_of when auto-adjusted."""
    inter = need(c, "intermediate_size")
    if c.get("block_auto_adjust_ff_dim"):
        inter = int(2 * inter / 3)
        if c.get("block_ffn_dim_multiplier") is not None:
            inter = int(c["block_ffn_dim_multiplier"] * inter)
            step = need(c, "block_multiple_of")
            inter = step * ((inter + step - 1) // step)
    return inter


def _lfm2(c: Config, t: Tally) -> None:
    """Lfm2DecoderLayer: attention (q/k layernorms) or short conv by layer_types, then a gated MLP."""
    h, types = need(c, "hidden_size"), need(c, "layer_types")

    def mixer(i: int) -> int:
        if types[i] == "full_attention":
            return gqa(c, qk_norm=True)
        t.add("recurrent", short_conv(c))
        return 0
    decoder(c, t, mixer, lambda i: t.add("mlp", gated_mlp(h, _lfm2_ff_dim(c))))


def _lfm2_moe(c: Config, t: Tally) -> None:
    """Lfm2MoeDecoderLayer (transformers models/lfm2_moe/modeling_lfm2_moe.py): attention (q/k layernorms)
    unless layer_types says "conv" (Lfm2MoeShortConv; no default pattern: a config without layer_types
    is refused, as transformers cannot build it); Lfm2MoeMLP of intermediate_size in the first num_dense_layers,
    else Lfm2MoeSparseMoeBlock (router without bias: the expert bias is a buffer; routed experts)."""
    h, types, first_moe = need(c, "hidden_size"), need(c, "layer_types"), need(c, "num_dense_layers")

    def mixer(i: int) -> int:
        if types[i] != "conv":
            return gqa(c, qk_norm=True)
        t.add("recurrent", short_conv(c))
        return 0

    def mlp(i: int) -> None:
        if i < first_moe:
            return t.add("mlp", gated_mlp(h, need(c, "intermediate_size")))
        moe_mlp(c, t, inter=need(c, "moe_intermediate_size"), experts=need(c, "num_experts"))
    decoder(c, t, mixer, mlp)


def _zamba2_shared_block(c: Config, t: Tally, adapters: int) -> None:
    """One Zamba2AttentionDecoderLayer: attention from 2 x hidden (q/k/v/o, no biases), a gelu-gated MLP
    (fused gate_up, biases by add_bias_linear), its 2 norms, and `adapters` applications' low-rank
    adapters: on gate_up always, on q/k/v when use_shared_attention_adapter."""
    h, heads, inter, rank = (need(c, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size",
                                                  "adapter_rank"))
    wide, d, kv = need(c, "attention_hidden_size"), need(c, "attention_head_dim"), need(c, "num_key_value_heads")
    t.add("attention", wide * heads * d + 2 * wide * kv * d + heads * d * h)
    if c.get("use_shared_attention_adapter"):
        t.add("attention", adapters * 3 * 2 * wide * rank)
    bias = 2 * inter + h if c.get("add_bias_linear") else 0
    t.add("mlp", 3 * h * inter + bias + adapters * (h * rank + rank * 2 * inter))
    t.add("norms", wide + h)


def _zamba2(c: Config, t: Tally) -> None:
    """Zamba2Model.get_layers (transformers models/zamba2/modeling_zamba2.py): every layer a
    Zamba2MambaDecoderLayer (mixer + norm); a "hybrid" layer adds its own hidden x hidden linear and
    applies a shared transformer block; the first num_mem_blocks hybrid layers build the blocks, later
    ones are tied to them (block hybrid_index % num_mem_blocks), each block holding the adapters of
    the applications it serves."""
    h, kinds = need(c, "hidden_size"), need(c, "layers_block_type")
    for kind in kinds:
        t.add("norms", h)
        t.add("recurrent", zamba2_mamba(c))
        if kind == "hybrid":
            t.add("attention", h * h)
        elif kind != "linear_attention":
            raise ValueError(f"count_params: zamba2 layer kind {kind!r} is not supported")
    applications, blocks = kinds.count("hybrid"), need(c, "num_mem_blocks")
    for block in range(min(blocks, applications)):
        _zamba2_shared_block(c, t, adapters=len(range(block, applications, blocks)))


HYBRID_FAMILIES: dict[str, Callable[[Config, Tally], None]] = {
    "qwen3_next": _qwen3_next, "qwen3_5_moe_text": _qwen3_next, "qwen3_5_text": _qwen3_5_dense,
    "minimax": _minimax, "nemotron_h": _nemotron_h, "mamba": _mamba1_model, "mamba2": _mamba2_model,
    "jamba": _jamba, "falcon_h1": _falcon_h1, "granitemoehybrid": _granite_hybrid,
    "kimi_linear": _kimi_linear, "lfm2": _lfm2, "zamba2": _zamba2,
    "lfm2_moe": _lfm2_moe,
}

"""The parameter count of each block transformers builds, one function per module class.

Each function returns the `numel()` sum of one module of
`transformers/models/<x>/modeling_<x>.py` (transformers 5.24.0), read
from a defaults-filled config; `params.count_params` composes them per
layer. A missing field is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Config = Mapping[str, Any]


def need(c: Config, key: str) -> Any:
    """`c[key]`, or a ValueError naming the missing field."""
    value = c.get(key)
    if value is None:
        raise ValueError(f"count_params: missing field {key!r} (model_type {c.get('model_type')!r})")
    return value


def gqa(c: Config, *, qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
         gated_q: bool = False, heads: int | None = None, kv_heads: int | None = None,
         head_dim: int | None = None) -> int:
    """q/k/v/o projections (LlamaAttention and its kin), optional biases, q/k RMSNorm, doubled q (output gate)."""
    h = need(c, "hidden_size")
    heads = heads or need(c, "num_attention_heads")
    kv = kv_heads or c.get("num_key_value_heads") or heads
    d = head_dim or c.get("head_dim") or h // heads
    q_out = heads * d * (2 if gated_q else 1)
    n = h * q_out + 2 * h * kv * d + heads * d * h
    if qkv_bias:
        n += q_out + 2 * kv * d
    if o_bias:
        n += h
    return n + (2 * d if qk_norm else 0)


def mla(c: Config, *, bias: bool = False) -> int:
    """DeepseekV3Attention: low-rank q (q_a, norm, q_b) or full q, joint kv_a (+rope), kv norm, kv_b, o.

    `bias`: q_a (when low-rank), kv_a and o carry biases (attention_bias of DeepseekV2/V3/V32Attention and
    GlmMoeDsaAttention; a full-rank q_proj has none).
    """
    h, heads = need(c, "hidden_size"), need(c, "num_attention_heads")
    nope, rope, v = need(c, "qk_nope_head_dim"), need(c, "qk_rope_head_dim"), need(c, "v_head_dim")
    kv_rank, q_rank = need(c, "kv_lora_rank"), c.get("q_lora_rank")
    qk = nope + rope
    q = h * heads * qk if q_rank is None else h * q_rank + q_rank + q_rank * heads * qk
    kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    biases = (q_rank or 0) + kv_rank + rope + h if bias else 0
    return q + kv + heads * v * h + biases


def dsa_indexer(c: Config) -> int:
    """DeepseekV32 indexer: wq_b from the q latent, wk, a LayerNorm (weight + bias) on k, per-head weights."""
    h, q_rank = need(c, "hidden_size"), need(c, "q_lora_rank")
    heads, d = need(c, "index_n_heads"), need(c, "index_head_dim")
    return q_rank * heads * d + h * d + 2 * d + h * heads


def gated_mlp(h: int, inter: int, bias: bool = False) -> int:
    return 3 * h * inter + (2 * inter + h if bias else 0)


def mamba2(c: Config, *, heads: str, head_dim: str, state: str, groups: str = "n_groups",
           kernel: str = "conv_kernel", proj_bias: str = "use_bias", conv_bias: str = "use_conv_bias",
           out_bias: str | None = None, norm: bool = True) -> int:
    """Mamba2Mixer: in_proj (z, x, B, C, dt), depthwise conv (+bias), dt_bias, A_log, D, gated norm, out_proj.

    The field names differ by family (Mamba-2, Nemotron-H, Falcon-H1,
    Granite-4.0-H); Falcon-H1's width is `mamba_d_ssm` when set and its
    out_proj bias is `projectors_bias` (`out_bias`; default: `proj_bias`).
    """
    h, n_heads, d_head = need(c, "hidden_size"), need(c, heads), need(c, head_dim)
    d_state, n_groups, width = need(c, state), need(c, groups), need(c, kernel)
    inner = c.get("mamba_d_ssm") or n_heads * d_head
    conv_dim = inner + 2 * n_groups * d_state
    bias = bool(c.get(proj_bias))
    n = h * (inner + conv_dim + n_heads) + (inner + conv_dim + n_heads if bias else 0)
    n += conv_dim * width + (conv_dim if c.get(conv_bias, True) else 0)
    n += 3 * n_heads + (inner if norm else 0) + inner * h
    return n + (h if c.get(out_bias or proj_bias) else 0)


def zamba2_mamba(c: Config) -> int:
    """Zamba2MambaMixer: Mamba-2 over int(mamba_expand x hidden) channels; the conv always has a bias
    (use_conv_bias is not read), in_proj and out_proj biases by add_bias_linear."""
    h, heads, d_state = need(c, "hidden_size"), need(c, "n_mamba_heads"), need(c, "mamba_d_state")
    inner = int(need(c, "mamba_expand") * h)
    conv_dim = inner + 2 * need(c, "mamba_ngroups") * d_state
    bias = bool(c.get("add_bias_linear"))
    projection = inner + conv_dim + heads
    n = h * projection + conv_dim * need(c, "mamba_d_conv") + conv_dim + 3 * heads + inner + inner * h
    return n + (projection + h if bias else 0)


def mamba1(c: Config, *, jamba: bool) -> int:
    """MambaMixer / JambaMambaMixer: in_proj (x, z), conv (+bias), x_proj (dt, B, C), dt_proj (+bias), A_log, D,
    out_proj; Jamba adds RMSNorms on dt, B and C and names its fields mamba_*."""
    names = (("mamba_expand", "mamba_d_state", "mamba_d_conv", "mamba_dt_rank", "mamba_proj_bias",
              "mamba_conv_bias") if jamba else
             ("expand", "state_size", "conv_kernel", "time_step_rank", "use_bias", "use_conv_bias"))
    h = need(c, "hidden_size")
    expand, d_state, width, rank = (need(c, k) for k in names[:4])
    inner = int(expand * h)
    bias = bool(c.get(names[4]))
    n = h * 2 * inner + (2 * inner if bias else 0)
    n += inner * width + (inner if c.get(names[5], True) else 0)
    n += inner * (rank + 2 * d_state) + rank * inner + inner + inner * d_state + inner
    return n + inner * h + (h if bias else 0) + (rank + 2 * d_state if jamba else 0)


def kda(c: Config) -> int:
    """KimiLinearDeltaAttention: q/k/v, conv over them (no bias), forget gate (dt_bias, A_log, low-rank f),
    beta projection, low-rank output gate, output norm, o_proj."""
    h, heads, d = need(c, "hidden_size"), need(c, "linear_num_heads"), need(c, "linear_head_dim")
    qkv = heads * d
    conv = 3 * qkv * need(c, "linear_conv_kernel_dim")
    gate = qkv + heads + h * d + d * qkv
    return 3 * h * qkv + conv + gate + h * heads + h * d + d * qkv + d + qkv * h


def short_conv(c: Config) -> int:
    """Lfm2ShortConv: in_proj (B, C, x), depthwise conv over conv_L_cache, out_proj; biases if conv_bias."""
    h, width, bias = need(c, "hidden_size"), need(c, "conv_L_cache"), bool(c.get("conv_bias"))
    return 3 * h * h + h * width + h * h + (3 * h + h + h if bias else 0)


def gated_deltanet(c: Config) -> int:
    """Qwen3NextGatedDeltaNet: q/k/v/z and b/a projections, conv over q/k/v, dt_bias, A_log, norm, out."""
    h = need(c, "hidden_size")
    nk, dk = need(c, "linear_num_key_heads"), need(c, "linear_key_head_dim")
    nv, dv = need(c, "linear_num_value_heads"), need(c, "linear_value_head_dim")
    conv_dim = 2 * nk * dk + nv * dv
    return (h * (conv_dim + nv * dv) + h * 2 * nv + conv_dim * need(c, "linear_conv_kernel_dim")
            + 2 * nv + dv + nv * dv * h)


def lightning(c: Config) -> int:
    """MiniMaxLightningAttention: qkv, output norm, output gate, out projection."""
    h, heads = need(c, "hidden_size"), need(c, "num_attention_heads")
    d = c.get("head_dim") or h // heads
    return h * 3 * heads * d + heads * d + h * heads * d + heads * d * h

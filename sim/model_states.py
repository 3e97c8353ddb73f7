"""Per-request state of recurrent layers, read from a config: `state_kind(c, layers, dtypes)`.

Shapes are vLLM's (`vllm/model_executor/layers/mamba/mamba_utils.py`,
`MambaStateShapeCalculator`, at tensor-parallel size 1):
- Mamba-1 (`mamba1_state_shape`): conv (d_conv-1, d_inner), ssm (d_inner, d_state);
- Mamba-2 (`mamba2_state_shape`): conv (d_conv-1, intermediate + 2 n_groups d_state),
  ssm (n_heads, head_dim, d_state);
- gated DeltaNet (`gated_delta_net_state_shape`): conv (k-1, 2 n_k d_k + n_v d_v),
  ssm (n_v, d_k, d_v);
- KDA (`kda_state_shape`, Kimi-Linear): conv of q, k and v, each (k-1, heads x head_dim),
  recurrent (heads, head_dim, head_dim);
- short conv (`short_conv_state_shape`, LFM2): conv (L_cache-1, conv_dim), no ssm;
- lightning attention (MiniMax, `linear_attention_state_shape`): (heads, head_dim, head_dim).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unikv.sim.model_spec import StateKind

if TYPE_CHECKING:
    from unikv.sim.model_configs import ConfigReader

# Values a config's declared SSM-state dtype field takes, as state element dtypes.
DECLARED_SSM_DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
                       "float16": "fp16", "fp16": "fp16"}
SSM_DTYPE_FIELDS = ("mamba_ssm_cache_dtype", "mamba_ssm_dtype", "ssm_state_dtype")


def state_dtypes(c: ConfigReader, default: tuple[str, str]) -> tuple[str, str]:
    """(conv, ssm) element dtypes: the config's declared SSM dtype, else `default`.

    "auto" (vLLM's "the model dtype") counts as not declared.
    """
    key = next((k for k in SSM_DTYPE_FIELDS if c.has(k) and c.config[k] != "auto"), None)
    if key is None:
        return default
    value = c.config[key]
    if value not in DECLARED_SSM_DTYPES:
        raise ValueError(f"config {c.name!r}: {key}={value!r} is not one of {sorted(DECLARED_SSM_DTYPES)}")
    return default[0], DECLARED_SSM_DTYPES[value]


def state_kind(c: ConfigReader, layers: int, dtypes: tuple[str, str]) -> StateKind:
    """The state kind of `layers` recurrent layers of config `c`.

    Raises:
        ValueError: no known state family, or a missing field (named).
    """
    name, conv, ssm = _family(c)
    return StateKind(name=name, layers=layers, conv_elems=conv, ssm_elems=ssm,
                     conv_dtype=dtypes[0], ssm_dtype=dtypes[1])


def _family(c: ConfigReader) -> tuple[str, int, int]:
    if c.has("linear_attn_config"):
        return ("kda", *_kda(c))
    if c.has("linear_num_value_heads"):
        return ("gated_deltanet", *_gated_deltanet(c))
    if c.has("attn_type_list") or c.model_type.startswith("minimax"):
        heads = c.need("num_attention_heads", what="the lightning-attention state")
        head = c.get("head_dim") or c.need("hidden_size", what="the lightning-attention state") // heads
        return "lightning", 0, heads * head * head
    if c.model_type.startswith("lfm2"):
        what = "LFM2's short-conv state"
        width = c.get("conv_dim") or c.need("hidden_size", what=what)
        return "short_conv", (c.need("conv_L_cache", what=what) - 1) * width, 0
    if c.model_type == "zamba2":
        return ("mamba2", *_zamba2(c))
    if c.model_type == "mamba2":
        return ("mamba2", *_plain_mamba2(c))
    if c.has("mamba_num_heads") or c.has("mamba_n_heads"):
        return ("mamba2", *_mamba2(c))
    if c.model_type in ("mamba", "falcon_mamba"):
        return ("mamba1", *_plain_mamba1(c))
    if c.has("mamba_d_state") and c.has("mamba_expand"):  # Mamba-1 (Jamba, Hymba)
        what = "the Mamba-1 state"
        d_inner = c.config["mamba_expand"] * c.need("hidden_size", what=what)
        d_conv = c.need("mamba_d_conv", "conv_kernel", what=what)
        return "mamba1", (d_conv - 1) * d_inner, d_inner * c.config["mamba_d_state"]
    raise ValueError(
        f"config {c.name!r}: has recurrent-state layers but no state shape; missing field "
        "'linear_num_value_heads' (gated DeltaNet), 'linear_attn_config' (KDA), "
        "'mamba_num_heads'/'mamba_n_heads' (Mamba-2), 'mamba_d_state' with 'mamba_expand' "
        "(Mamba-1), 'conv_L_cache' (LFM2) or 'attn_type_list' (lightning)")


def _kda(c: ConfigReader) -> tuple[int, int]:
    """Kimi-Linear's KDA layer: vLLM `kda_state_shape` with num_k_heads = num_heads."""
    cfg = c.config["linear_attn_config"]
    missing = [k for k in ("num_heads", "head_dim", "short_conv_kernel_size") if cfg.get(k) is None]
    if missing:
        raise ValueError(f"config {c.name!r}: missing field 'linear_attn_config.{missing[0]}' "
                         "(needed for the KDA state)")
    heads, head, kernel = cfg["num_heads"], cfg["head_dim"], cfg["short_conv_kernel_size"]
    return 3 * (kernel - 1) * heads * head, heads * head * head


def _gated_deltanet(c: ConfigReader) -> tuple[int, int]:
    what = "the gated-DeltaNet state"
    n_k, d_k = c.need("linear_num_key_heads", what=what), c.need("linear_key_head_dim", what=what)
    n_v, d_v = c.config["linear_num_value_heads"], c.need("linear_value_head_dim", what=what)
    kernel = c.need("linear_conv_kernel_dim", what=what)
    return (kernel - 1) * (2 * n_k * d_k + n_v * d_v), n_v * d_k * d_v


def _mamba2(c: ConfigReader) -> tuple[int, int]:
    what = "the Mamba-2 state"
    heads = c.get("mamba_num_heads", "mamba_n_heads")
    head_dim = c.need("mamba_head_dim", "mamba_d_head", what=what)
    d_state = c.need("ssm_state_size", "mamba_d_state", "state_size", what=what)
    groups = c.need("mamba_n_groups", "n_groups", what=what)
    d_conv = c.need("conv_kernel", "mamba_d_conv", what=what)
    inner = c.get("mamba_d_ssm", default=heads * head_dim)
    return _mamba2_elems(inner, groups, d_state, d_conv, heads, head_dim)


def _zamba2(c: ConfigReader) -> tuple[int, int]:
    """vLLM `Zamba2MambaDecoderLayer`: intermediate = mamba_expand x hidden_size."""
    what = "Zamba2's Mamba-2 state"
    inner = c.need("mamba_expand", what=what) * c.need("hidden_size", what=what)
    heads = c.need("n_mamba_heads", what=what)
    head_dim = c.get("mamba_headdim", default=inner // heads)
    return _mamba2_elems(inner, c.need("mamba_ngroups", what=what), c.need("mamba_d_state", what=what),
                         c.need("mamba_d_conv", what=what), heads, head_dim)


def _plain_mamba2(c: ConfigReader) -> tuple[int, int]:
    """vLLM `Mamba2ForCausalLM`: intermediate = expand x hidden_size."""
    what = "the Mamba-2 state"
    inner = c.need("expand", what=what) * c.need("hidden_size", what=what)
    return _mamba2_elems(inner, c.need("n_groups", what=what), c.need("state_size", what=what),
                         c.need("conv_kernel", what=what), c.need("num_heads", what=what),
                         c.need("head_dim", what=what))


def _mamba2_elems(inner: int, groups: int, d_state: int, d_conv: int, heads: int,
                  head_dim: int) -> tuple[int, int]:
    return (d_conv - 1) * (inner + 2 * groups * d_state), heads * head_dim * d_state


def _plain_mamba1(c: ConfigReader) -> tuple[int, int]:
    """vLLM `MambaForCausalLM`: d_inner = intermediate_size (expand x hidden_size)."""
    what = "the Mamba-1 state"
    inner = c.get("intermediate_size") or c.need("expand", what=what) * c.need("hidden_size", what=what)
    return (c.need("conv_kernel", what=what) - 1) * inner, inner * c.need("state_size", what=what)

"""Per-token bytes of attention layers, read from a config: `token_kinds(c, counts, kv_dtype)`.

- K/V attention (MHA / GQA / MQA): `kv_heads x (head_dim_k + head_dim_v)`
  elements per token per layer, as vLLM's `FullAttentionSpec` /
  `SlidingWindowSpec` page size (`vllm/v1/kv_cache_interface.py`) and
  SGLang's `MHATokenToKVPool` (`python/sglang/srt/mem_cache/memory_pool.py`).
- MLA latent (DeepSeek-V2/V3/R1, Kimi-K2, Kimi-Linear's MLA layers, GLM-5):
  one `kv_lora_rank + qk_rope_head_dim` vector per token per layer, no
  separate V: SGLang `MLATokenToKVPool` (`kv_cache_dim = kv_lora_rank +
  qk_rope_head_dim`), vLLM `MLAAttentionSpec` (`num_kv_heads=1`,
  `head_size=576`). With a sparse-attention indexer and fp8, vLLM's
  `fp8_ds_mla` layout (`MLAAttentionSpec.real_page_size_bytes`: 656 bytes for
  V3.2) = `kv_lora_rank` fp8 + one fp32 scale per 128 + the RoPE key in bf16.
- Indexer keys (DeepSeek-V3.2, GLM-5 `index_head_dim`): fp8 keys plus one fp32
  scale per 128 elements, whatever the KV dtype: vLLM `DeepseekV32IndexerCache`
  (`head_dim = index_head_dim + index_head_dim // 128 * 4`, uint8;
  `vllm/model_executor/models/deepseek_v2.py`), SGLang `NSATokenToKVPool`
  (`index_k_with_scale_buffer`).
- fp4 KV (`fp4_e2m1`, `nvfp4`): K/V layers only, `model_spec.kv_token_bytes`
  (e2m1 values and a scale byte per 16); MLA latents in fp4 are refused.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from unikv.sim.model_spec import FP4_KV_CACHE_DTYPES, TokenKind, kv_token_bytes

if TYPE_CHECKING:
    from unikv.sim.model_configs import ConfigReader

_SCALE_BLOCK = 128  # elements per fp32 scale in vLLM / SGLang's DeepSeek fp8 layouts


def token_kinds(c: ConfigReader, counts: Counter, kv_dtype: str) -> tuple[TokenKind, ...]:
    """The token kinds of config `c` with `counts` KV-storing layers per kind."""
    kinds = []
    if counts["full"]:
        kinds += _full_kinds(c, counts["full"], kv_dtype)
    windowed = "chunked" if counts["chunked"] else "swa"
    if counts[windowed]:
        if is_mla(c):
            raise ValueError(f"config {c.name!r}: MLA ('kv_lora_rank') with sliding-window "
                             "layers is not described (unsupported)")
        keys = ("attention_chunk_size",) if windowed == "chunked" else ("sliding_window",
                                                                        "sliding_window_size")
        window = c.need(*keys, what=f"the {windowed} layers' window")
        kinds.append(TokenKind(name="chunked" if windowed == "chunked" else "sliding_window",
                               layers=counts[windowed], window_tokens=window, dtype=kv_dtype,
                               bytes_per_token_per_layer=kv_bytes(c, "swa", kv_dtype)))
    return tuple(kinds)


def is_mla(c: ConfigReader) -> bool:
    return c.has("kv_lora_rank")


def _full_kinds(c: ConfigReader, layers: int, kv_dtype: str) -> list[TokenKind]:
    if not is_mla(c):
        nbytes = kv_bytes(c, "full", kv_dtype)
        return [TokenKind(name="full_attention", layers=layers, bytes_per_token_per_layer=nbytes,
                          dtype=kv_dtype)]
    indexed = c.has("index_head_dim")
    out = [_mla_latent(c, layers, kv_dtype, sparse=indexed)]
    indexer_layers = _indexer_layers(c, layers) if indexed else 0
    if indexer_layers:
        out.append(_indexer_keys(c, indexer_layers))
    return out


def _indexer_layers(c: ConfigReader, layers: int) -> int:
    """Layers that run (and cache keys for) their own indexer. GLM-5.x's "shared"
    layers reuse the previous full layer's top-k and hold no indexer
    (transformers `models/glm_moe_dsa`: `GlmMoeDsaConfig.__post_init__` derives
    `indexer_types` from `index_topk_pattern` or `index_topk_freq` /
    `index_skip_topk_offset`; the layer builds no indexer when `"shared"`)."""
    n = c.need("num_hidden_layers", what="the indexer layers")
    types = c.get("indexer_types")
    pattern = c.get("index_topk_pattern")
    if types is None and pattern is not None:
        types = [{"F": "full", "S": "shared"}.get(ch, ch) for ch in pattern]
    if types is None and c.has("index_topk_freq"):
        freq, offset = max(c.config["index_topk_freq"], 1), c.get("index_skip_topk_offset", default=2)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if types is None:
        return layers  # DeepSeek-V3.2: an indexer in every MLA layer
    if len(types) != n or set(types) - {"full", "shared"} or layers != n:
        raise ValueError(f"config {c.name!r}: indexer_types {list(types)[:4]}... must give 'full' or "
                         f"'shared' for each of num_hidden_layers={n} MLA layers")
    return sum(t == "full" for t in types)


def _mla_latent(c: ConfigReader, layers: int, kv_dtype: str, *, sparse: bool) -> TokenKind:
    what = "the MLA latent"
    rank, rope = c.need("kv_lora_rank", what=what), c.need("qk_rope_head_dim", what=what)
    if kv_dtype in FP4_KV_CACHE_DTYPES:
        raise ValueError(f"config {c.name!r}: kv_cache_dtype={kv_dtype!r} for an MLA latent is not "
                         "described: SGLang's MLATokenToKVPoolFP4 keeps (kv_lora_rank + "
                         "qk_rope_head_dim) / 2 bytes plus one scale byte per 16, but vLLM defines "
                         "no fp4 MLA layout, and one ModelSpec serves every layout")
    if kv_dtype == "bf16":
        nbytes, dtype = (rank + rope) * 2, "bf16"
    elif not sparse:
        nbytes, dtype = rank + rope, kv_dtype  # fp8 latent and RoPE key, per-tensor scale
    elif kv_dtype == "fp8_e4m3" and rank % _SCALE_BLOCK == 0:
        nbytes, dtype = rank + rank // _SCALE_BLOCK * 4 + rope * 2, "fp8_ds_mla"
    else:
        raise ValueError(f"config {c.name!r}: kv_cache_dtype={kv_dtype!r} for a sparse-attention "
                         f"MLA latent (kv_lora_rank={rank}) is not described; engines store it as "
                         "fp8_ds_mla (fp8_e4m3, kv_lora_rank a multiple of 128) or bf16")
    return TokenKind(name="mla_latent", layers=layers, bytes_per_token_per_layer=nbytes, dtype=dtype)


def _indexer_keys(c: ConfigReader, layers: int) -> TokenKind:
    dim = c.config["index_head_dim"]
    if dim % _SCALE_BLOCK:
        raise ValueError(f"config {c.name!r}: index_head_dim={dim} is not a multiple of "
                         f"{_SCALE_BLOCK} (the engines' fp8 scale block)")
    return TokenKind(name="indexer_keys", layers=layers, dtype="fp8_e4m3+fp32_scale",
                     bytes_per_token_per_layer=dim + dim // _SCALE_BLOCK * 4)


def kv_bytes(c: ConfigReader, kind: str, kv_dtype: str) -> int:
    """K + V bytes of one token in one layer of `kind` ("full" or "swa"/"chunked"),
    scales included (`model_spec.kv_token_bytes`); an fp4 layout that cannot be
    pinned is refused naming the config."""
    try:
        return kv_token_bytes(*kv_geometry(c, kind), kv_dtype)
    except ValueError as exc:
        raise ValueError(f"config {c.name!r}, {kind} layers: {exc}") from None


def kv_geometry(c: ConfigReader, kind: str) -> tuple[int, int, int]:
    """(KV heads, K head dim, V head dim) of one layer of `kind` ("full" or "swa"/"chunked")."""
    what = "the attention layers' KV bytes"
    if c.model_type.startswith("hymba"):
        return _hymba_kv_geometry(c)
    heads = c.need("num_attention_heads", what=what)
    kv_heads = c.get("num_key_value_heads", default=heads)
    head_k = c.get("head_dim", "attention_head_dim")
    if c.model_type == "zamba2" and not c.has("attention_head_dim"):
        head_k = 2 * c.need("hidden_size", what=what) // heads  # attention on [x, x_orig]: 2 x hidden
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
    return kv_heads, head_k, head_v


def _hymba_kv_geometry(c: ConfigReader) -> tuple[int, int, int]:
    """(KV heads, K head dim, V head dim) of one KV-storing Hymba layer (full and sliding alike)."""
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
    return kv_heads, head_k, head_v

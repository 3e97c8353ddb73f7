"""What one token and one request of a model cost in bytes: `ModelSpec` and its kinds.

A model stores, per token, one or more *token kinds* (full-attention K/V, an
MLA latent, a sparse-attention indexer's keys, sliding-window or chunked
K/V) and, per request, zero or more *state kinds* (Mamba / DeltaNet / KDA
recurrent and conv state, short-conv state). `ModelSpec.from_kinds` derives
the band view the layouts use (`full_*`, `swa_*`, `state_*`): kinds that hold
every token go to the "full" band, windowed kinds to "swa", states to
"mamba". Byte rules and their engine sources: docs/models.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Bytes per element of each KV-cache dtype a ModelSpec accepts. Per-tensor
# scales (vLLM / SGLang fp8 `k_scale`, `v_scale`) are per layer, not per
# token, so an fp8 element costs one byte.
KV_CACHE_DTYPES = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp32": 4}  # fp32: the real executor's CPU tests
# fp4 KV caches: e2m1 values, two per byte, plus one 1-byte scale per 16
# values of each head (SGLang `--kv-cache-dtype fp4_e2m1`: `MHATokenToKVPoolFP4`;
# vLLM `nvfp4`: `nvfp4_kv_cache_full_dim`); the global scale is per layer.
FP4_KV_CACHE_DTYPES = ("fp4_e2m1", "nvfp4")
FP4_SCALE_BLOCK = 16
# Named fp4 variants with no engine KV layout pinned: refused by name.
REFUSED_KV_CACHE_DTYPES = ("fp4", "mxfp4")
STATE_ELEMENT_DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
STATE_DTYPES = ("bf16", "fp32_ssm")
TOKEN_KIND_NAMES = ("full_attention", "mla_latent", "indexer_keys", "sliding_window", "chunked")
STATE_KIND_NAMES = ("mamba1", "mamba2", "gated_deltanet", "kda", "lightning", "short_conv")
AUXILIARY_TOKEN_KINDS = ("indexer_keys",)  # stored in layers another kind already counts


def check_kv_cache_dtype(value: object) -> str:
    """`value` if it is a supported KV-cache dtype; else ValueError naming it."""
    supported = sorted(KV_CACHE_DTYPES) + list(FP4_KV_CACHE_DTYPES)
    if value in REFUSED_KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={value!r} is refused: no engine KV-cache layout is pinned "
                         f"for it (the fp4 layouts are {list(FP4_KV_CACHE_DTYPES)}); supported: {supported}")
    if value not in KV_CACHE_DTYPES and value not in FP4_KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={value!r} is not one of {supported}")
    return str(value)


def kv_token_bytes(kv_heads: int, head_k: int, head_v: int, dtype: str) -> int:
    """Bytes of one token's K and V in one attention layer, scales included.

    Integral dtypes: `kv_heads x (head_k + head_v) x` element bytes. fp4
    (`FP4_KV_CACHE_DTYPES`): each head's K (and V) packs `head / 2` bytes of
    e2m1 values and `head / 16` scale bytes (SGLang
    `python/sglang/srt/mem_cache/memory_pool.py` `MHATokenToKVPoolFP4._create_buffers`;
    vLLM `vllm/utils/torch_utils.py` `nvfp4_kv_cache_full_dim`).

    Raises:
        ValueError: fp4 with K and V head dims that differ (both engines size V
            with K's head dim) or a head dim that is not a multiple of 16.
    """
    if dtype not in FP4_KV_CACHE_DTYPES:
        return kv_heads * (head_k + head_v) * KV_CACHE_DTYPES[check_kv_cache_dtype(dtype)]
    if head_k != head_v:
        raise ValueError(f"kv_cache_dtype={dtype!r} with K head_dim {head_k} and V head_dim {head_v}: "
                         "the engines' fp4 KV pools size V with K's head dim (SGLang "
                         "MHATokenToKVPoolFP4, vLLM nvfp4), so unequal dims are not described")
    if head_k % FP4_SCALE_BLOCK:
        raise ValueError(f"kv_cache_dtype={dtype!r} with head_dim {head_k}: fp4 keeps one scale per "
                         f"{FP4_SCALE_BLOCK} values, and {head_k} is not a multiple of {FP4_SCALE_BLOCK}")
    return kv_heads * 2 * (head_k // 2 + head_k // FP4_SCALE_BLOCK)


@dataclass(frozen=True, kw_only=True)
class TokenKind:
    """One per-token cache a model keeps in some of its layers.

    Attributes:
        name: one of TOKEN_KIND_NAMES.
        layers: layers that store it (a layer reusing another's KV is not counted).
        bytes_per_token_per_layer: bytes of one token in one layer, scales included.
        window_tokens: the window (sliding) or chunk (chunked); None: every token.
        dtype: how the bytes are stored ("bf16", "fp8_e4m3", "fp8_ds_mla", ...).
    """

    name: str
    layers: int
    bytes_per_token_per_layer: int
    window_tokens: int | None = None
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        owner = f"TokenKind {self.name!r}"
        if self.name not in TOKEN_KIND_NAMES:
            raise ValueError(f"{owner}: name={self.name!r} is not one of {TOKEN_KIND_NAMES}")
        check_int(owner, "layers", self.layers, minimum=1)
        check_int(owner, "bytes_per_token_per_layer", self.bytes_per_token_per_layer, minimum=1)
        windowed = self.name in ("sliding_window", "chunked")
        if windowed:
            check_int(owner, "window_tokens", self.window_tokens, minimum=1)
        elif self.window_tokens is not None:
            raise ValueError(f"{owner}: window_tokens={self.window_tokens!r} must be None "
                             "(this kind holds every token)")

    @property
    def band(self) -> str:
        """The band it lives in: "swa" (windowed) or "full" (every token)."""
        return "full" if self.window_tokens is None else "swa"

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.bytes_per_token_per_layer


@dataclass(frozen=True, kw_only=True)
class StateKind:
    """One per-request state a model keeps in some of its layers (vLLM's shapes, tp=1).

    Attributes:
        name: one of STATE_KIND_NAMES.
        layers: layers that hold it.
        conv_elems: conv-state elements of one layer (0: none).
        ssm_elems: recurrent / SSM-state elements of one layer (0: none).
        conv_dtype, ssm_dtype: element dtypes, of STATE_ELEMENT_DTYPES.
    """

    name: str
    layers: int
    conv_elems: int
    ssm_elems: int
    conv_dtype: str = "bf16"
    ssm_dtype: str = "bf16"

    def __post_init__(self) -> None:
        owner = f"StateKind {self.name!r}"
        if self.name not in STATE_KIND_NAMES:
            raise ValueError(f"{owner}: name={self.name!r} is not one of {STATE_KIND_NAMES}")
        check_int(owner, "layers", self.layers, minimum=1)
        check_int(owner, "conv_elems", self.conv_elems, minimum=0)
        check_int(owner, "ssm_elems", self.ssm_elems, minimum=0)
        if self.conv_elems + self.ssm_elems == 0:
            raise ValueError(f"{owner}: conv_elems and ssm_elems are both 0")
        for name in ("conv_dtype", "ssm_dtype"):
            if getattr(self, name) not in STATE_ELEMENT_DTYPES:
                raise ValueError(f"{owner}: {name}={getattr(self, name)!r} is not one of "
                                 f"{sorted(STATE_ELEMENT_DTYPES)}")

    @property
    def bytes_per_layer(self) -> int:
        return (self.conv_elems * STATE_ELEMENT_DTYPES[self.conv_dtype]
                + self.ssm_elems * STATE_ELEMENT_DTYPES[self.ssm_dtype])

    @property
    def bytes_per_request(self) -> int:
        return self.layers * self.bytes_per_layer


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Byte geometry and size of one model (whole model on one rank).

    Build it from kinds with `ModelSpec.from_kinds` (the parser and the
    bundled models do); the band fields below are then derived and checked.
    A spec built from band fields alone (tests, sweeps) has no kinds.

    Attributes:
        name: model id ("gpt-oss-120b") or the config file's stem.
        full_layers: attention layers storing in the "full" band (an
            indexer's keys live in layers the latent already counts).
        swa_layers: sliding-window or chunked-local layers that store KV.
        state_layers: layers with recurrent / conv state.
        window_tokens: the sliding window, or the chunk size when `chunked`.
        chunked: True for chunk-aligned local attention (Llama-4).
        full_token_bytes / swa_token_bytes: bytes of one token over all
            layers of the band.
        state_bytes: state bytes of one request over all state layers.
        state_dtype: "bf16" or "fp32_ssm" (SSM / recurrent state in fp32).
        meta_tokens: learned tokens prepended to every request (Hymba).
        weight_bytes, params_total, params_active, max_context_tokens: sizes
            (None: unknown).
        token_kinds / state_kinds: the kinds the band view came from (empty:
            a spec given by band fields).
        architecture: the config's `architectures[0]` (None: unknown).
        model_type: the config's `model_type` (None: unknown).
        kv_cache_dtype: of KV_CACHE_DTYPES.
        attention_pair_flops: (full, window) FLOPs of one query token on one
            attended position, summed over the band's attention layers (2 x
            query heads x (head_dim_k + head_dim_v) per layer; the roofline's
            attention term, `sim.roofline`); None: unknown. For MLA, the
            prefill (non-absorbed) form's: 2 x query heads x
            (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) per layer.
        mla_flops: an MLA model's (decode pair FLOPs of the absorbed form,
            FLOPs of up-projecting one cached latent token for a prefill
            chunk), summed over the MLA layers (`sim.model_compute`); None:
            not MLA, or unknown.
        routed_experts / experts_per_token: an MoE model's routed experts per
            MoE layer and the top-k each token picks (None: dense or unknown).
        conv_state_dtype / ssm_state_dtype: of STATE_ELEMENT_DTYPES.
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
    token_kinds: tuple[TokenKind, ...] = ()
    state_kinds: tuple[StateKind, ...] = ()
    architecture: str | None = None
    model_type: str | None = None
    kv_cache_dtype: str = "bf16"
    attention_pair_flops: tuple[int, int] | None = None
    mla_flops: tuple[int, int] | None = None
    routed_experts: int | None = None
    experts_per_token: int | None = None
    conv_state_dtype: str = "bf16"
    ssm_state_dtype: str = "bf16"
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        owner = f"ModelSpec {self.name!r}"
        for name in ("full_layers", "swa_layers", "state_layers", "full_token_bytes",
                     "swa_token_bytes", "state_bytes", "meta_tokens"):
            check_int(owner, name, getattr(self, name), minimum=0)
        for name in ("weight_bytes", "params_total", "params_active", "max_context_tokens",
                     "routed_experts", "experts_per_token"):
            if getattr(self, name) is not None:
                check_int(owner, name, getattr(self, name), minimum=1)
        for layers, nbytes in (("full_layers", "full_token_bytes"), ("swa_layers", "swa_token_bytes"),
                               ("state_layers", "state_bytes")):
            if (getattr(self, layers) > 0) != (getattr(self, nbytes) > 0):
                raise ValueError(f"{owner}: {layers}={getattr(self, layers)} but "
                                 f"{nbytes}={getattr(self, nbytes)}; both or neither must be > 0")
        if self.swa_layers:
            check_int(owner, "window_tokens", self.window_tokens, minimum=1)
        if self.chunked and not self.swa_layers:
            raise ValueError(f"{owner}: chunked=True needs swa_layers > 0")
        if self.meta_tokens and not (self.full_layers or self.swa_layers):
            raise ValueError(f"{owner}: meta_tokens={self.meta_tokens} needs attention layers")
        self._check_dtypes(owner)
        if self.attention_pair_flops is not None and not (
                isinstance(self.attention_pair_flops, tuple) and len(self.attention_pair_flops) == 2):
            raise ValueError(f"{owner}: attention_pair_flops={self.attention_pair_flops!r} must be "
                             "(full, window) FLOPs or None")
        for value in self.attention_pair_flops or ():
            check_int(owner, "attention_pair_flops", value, minimum=0)
        self._check_mla_flops(owner)
        if (self.routed_experts is None) != (self.experts_per_token is None) or \
                (self.routed_experts or 0) < (self.experts_per_token or 0):
            raise ValueError(f"{owner}: routed_experts={self.routed_experts!r} and experts_per_token="
                             f"{self.experts_per_token!r} must both be given, top-k <= experts, or neither")
        if (self.params_active or 0) > (self.params_total or float("inf")):
            raise ValueError(f"{owner}: params_active={self.params_active} exceeds "
                             f"params_total={self.params_total}")
        if self.token_kinds or self.state_kinds:
            self._check_band_view(owner)
        object.__setattr__(self, "sources", dict(self.sources))

    def _check_mla_flops(self, owner: str) -> None:
        if self.mla_flops is None:
            return
        if not (isinstance(self.mla_flops, tuple) and len(self.mla_flops) == 2):
            raise ValueError(f"{owner}: mla_flops={self.mla_flops!r} must be (decode pair FLOPs, "
                             "cached-token up-projection FLOPs) or None")
        for value in self.mla_flops:
            check_int(owner, "mla_flops", value, minimum=0)
        if self.attention_pair_flops is None or self.attention_pair_flops[1]:
            raise ValueError(f"{owner}: mla_flops={self.mla_flops!r} needs attention_pair_flops=(prefill "
                             f"pair FLOPs, 0), got {self.attention_pair_flops!r} (MLA has no window layers)")

    def _check_dtypes(self, owner: str) -> None:
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"{owner}: state_dtype={self.state_dtype!r} is not one of {STATE_DTYPES}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        for name in ("conv_state_dtype", "ssm_state_dtype"):
            if getattr(self, name) not in STATE_ELEMENT_DTYPES:
                raise ValueError(f"{owner}: {name}={getattr(self, name)!r} is not one of "
                                 f"{sorted(STATE_ELEMENT_DTYPES)}")

    def _check_band_view(self, owner: str) -> None:
        derived = band_view(self.token_kinds, self.state_kinds, owner,
                            default_state_dtypes=(self.conv_state_dtype, self.ssm_state_dtype))
        for key, value in derived.items():
            if getattr(self, key) != value:
                raise ValueError(f"{owner}: {key}={getattr(self, key)!r} but its kinds give {value!r}")

    @classmethod
    def from_kinds(cls, *, name: str, token_kinds: tuple[TokenKind, ...] = (),
                   state_kinds: tuple[StateKind, ...] = (),
                   state_dtypes: tuple[str, str] = ("bf16", "bf16"), **fields: Any) -> ModelSpec:
        """A spec whose band fields are derived from its kinds (see `band_view`).

        `state_dtypes` (conv, ssm) are recorded when there is no state kind;
        `fields` are the other ModelSpec fields (sizes, kv dtype, sources, ...).
        """
        view = band_view(tuple(token_kinds), tuple(state_kinds), f"ModelSpec {name!r}",
                         default_state_dtypes=state_dtypes)
        return cls(name=name, token_kinds=tuple(token_kinds), state_kinds=tuple(state_kinds),
                   **view, **fields)

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


def band_view(token_kinds: tuple[TokenKind, ...], state_kinds: tuple[StateKind, ...],
              owner: str, *, default_state_dtypes: tuple[str, str] = ("bf16", "bf16"),
              ) -> dict[str, Any]:
    """The band fields kinds give: layers, bytes, window, chunked, state dtypes
    (`default_state_dtypes`, (conv, ssm), when there is no state kind).

    Raises:
        ValueError: windowed kinds with two different windows (or a sliding
            and a chunked kind), or state kinds with different dtypes.
    """
    full = [k for k in token_kinds if k.band == "full"]
    swa = [k for k in token_kinds if k.band == "swa"]
    if len({(k.window_tokens, k.name) for k in swa}) > 1:
        found = sorted({f"{k.name}={k.window_tokens}" for k in swa})
        raise ValueError(f"{owner}: windowed kinds with different windows ({', '.join(found)}); "
                         "one swa band holds one window (unsupported)")
    dtypes = {(s.conv_dtype, s.ssm_dtype) for s in state_kinds}
    if len(dtypes) > 1:
        raise ValueError(f"{owner}: state kinds with different dtypes {sorted(dtypes)} (unsupported)")
    conv, ssm = dtypes.pop() if dtypes else default_state_dtypes
    return {
        "full_layers": sum(k.layers for k in full if k.name not in AUXILIARY_TOKEN_KINDS),
        "full_token_bytes": sum(k.bytes_per_token for k in full),
        "swa_layers": sum(k.layers for k in swa),
        "swa_token_bytes": sum(k.bytes_per_token for k in swa),
        "window_tokens": swa[0].window_tokens if swa else None,
        "chunked": bool(swa) and swa[0].name == "chunked",
        "state_layers": sum(s.layers for s in state_kinds),
        "state_bytes": sum(s.bytes_per_request for s in state_kinds),
        "conv_state_dtype": conv, "ssm_state_dtype": ssm,
        "state_dtype": legacy_state_dtype(conv, ssm, owner),
    }


def legacy_state_dtype(conv: str, ssm: str, owner: str) -> str:
    """The two-valued `state_dtype` a conv / ssm dtype pair reads as."""
    if STATE_ELEMENT_DTYPES[conv] != 2:
        raise ValueError(f"{owner}: conv_state_dtype={conv!r}; only 2-byte conv state is supported")
    return "fp32_ssm" if ssm == "fp32" else "bf16"


def check_int(owner: str, name: str, value, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name}={value!r} must be an integer >= {minimum}")

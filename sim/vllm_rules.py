"""vLLM's hybrid KV-cache rules for a model: groups, block size, sizing, prefix caching.

vLLM's v1 engine puts a hybrid model's layers into KV-cache groups that all
share one page size and one block pool (`unikv.baselines.VllmPool`). The rules
below reproduce how it does that for a `ModelSpec`, each citing the function
it follows. Sources (docs/models.md, "Baselines: vllm"): vllm-project/vllm
`vllm/v1/core/kv_cache_utils.py` and `vllm/v1/kv_cache_interface.py` at
001cabc1be16a59a70d720ed61a13b678c060a18, and
`vllm/model_executor/models/config.py` at
0144dd5b0d2d9ef9ac2651a3ab6efa83d0497ea9 (the v0.11 line, whose defaults
this module takes: prefix caching off for models with mamba layers, one
state block per mamba group and request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from unikv.sim.models import ModelSpec

from unikv import Band

# Attention block sizes are rounded to a multiple of 16 tokens (some backends
# take no other): `HybridAttentionMambaModelConfig.verify_and_update_config`.
BLOCK_ALIGN_TOKENS = 16
KINDS = ("mamba", "swa", "full")  # chain order, as `sim.layouts.model_bands`
# vLLM's `CacheConfig.mamba_cache_mode` (vllm/config/cache.py, `MambaCacheMode`),
# the values modelled: "none" (no mamba prefix caching: v0.11's only behaviour,
# the default here) and "align" (PR #30877, January 2026: the default of later
# releases when prefix caching is on). "all" is refused by name (MAMBA_CACHE_ALL).
MAMBA_CACHE_MODES = ("none", "align")
DEFAULT_MAMBA_CACHE_MODE = "none"
MAMBA_CACHE_ALL = ("'all' is not modelled: vLLM then aligns the block size to the mamba kernel's chunk "
                   "size (Platform._align_hybrid_block_size) and caches a state at every block, which "
                   "the vllm layout's block-size rule (v0.11) does not follow")
_GROWS = {1: ("down",), 2: ("up", "down"), 3: ("up", "float", "down")}


@dataclass(frozen=True, kw_only=True)
class VllmGroups:
    """How vLLM groups one model's layers into KV-cache groups.

    Attributes:
        block_tokens: tokens per block of every attention group.
        group_layers: layers per group (vLLM pads a kind's last group).
        groups: kind ("full", "swa", "mamba") -> number of groups.
        layer_token_bytes: K+V bytes of one token in one attention layer.
        state_layer_bytes: one request's state in one mamba layer, unpadded
            (0 without mamba layers).
        prefix_caching: whether vLLM caches prefix blocks for this model at
            its default `mamba_cache_mode` (`prefix_caching`).
        state_blocks: blocks each mamba group holds per running request.
    """

    block_tokens: int
    group_layers: int
    groups: Mapping[str, int] = field(hash=False)
    layer_token_bytes: int
    state_layer_bytes: int = 0
    prefix_caching: bool = True
    state_blocks: int = 1

    @property
    def page_layer_bytes(self) -> int:
        """Bytes of one block of one layer (every group's page size)."""
        return self.block_tokens * self.layer_token_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over the layers of one group."""
        return self.group_layers * self.page_layer_bytes

    @property
    def num_groups(self) -> int:
        return sum(self.groups.values())

    def num_blocks(self, budget_bytes: int) -> int:
        """Blocks of a `budget_bytes` KV budget (`get_num_blocks`:
        memory // page size // layers per group), the null block included."""
        return max(0, budget_bytes // self.page_layer_bytes // self.group_layers)

    def kv_cache_tokens(self, num_blocks: int) -> int:
        """vLLM's "GPU KV cache size: N tokens" (`_report_kv_cache_config`:
        blocks // groups x smallest block size)."""
        return num_blocks // self.num_groups * self.block_tokens

    def mamba_padding_pct(self) -> float:
        """vLLM's "Padding mamba page size by X%" (0 without mamba layers)."""
        if not self.state_layer_bytes:
            return 0.0
        return 100 * (self.page_layer_bytes - self.state_layer_bytes) / self.state_layer_bytes


def vllm_refusal(model: ModelSpec) -> str | None:
    """Why the vllm layout does not apply to `model` (None: it applies)."""
    if not (model.full_layers or model.swa_layers):
        return f"model {model.name!r} has no attention layers; vllm needs a token band"
    if model.meta_tokens:
        return (f"model {model.name!r} prepends {model.meta_tokens} meta tokens (Hymba); the vllm layout "
                "has no rule for them (not checked against vLLM)")
    per_layer = _layer_token_bytes(model)
    if len(set(per_layer.values())) > 1:
        return (f"model {model.name!r} has per-layer KV bytes {per_layer} per token; vLLM then gives "
                "its groups different block sizes (kv_cache_utils.unify_kv_cache_spec_page_size), "
                "which one page size cannot model")
    return None


def vllm_groups(model: ModelSpec, page_size: int) -> VllmGroups:
    """vLLM's KV-cache groups of `model` with `page_size` as the configured block size.

    Block size: with mamba layers, at least `16 x cdiv(state, 16 x one
    token's K+V)` of one layer, so a page holds a state (the state is then
    padded to the page); otherwise `page_size`
    (`HybridAttentionMambaModelConfig.verify_and_update_config`). Groups:
    layers of one kind in groups of `min` layers over the kinds, or `max`
    when max < 1.5 x min, the last group padded
    (`_get_kv_cache_groups_uniform_page_size`). Prefix caching: off with
    mamba layers (`MambaModelConfig.verify_and_update_config`, v0.11).

    Raises:
        ValueError: `vllm_refusal(model)`, or a bad page size.
    """
    reason = vllm_refusal(model)
    if reason is not None:
        raise ValueError(f"the vllm layout does not apply: {reason}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size={page_size!r} must be a positive integer")
    token = next(iter(_layer_token_bytes(model).values()))
    state = model.state_bytes // model.state_layers if model.state_layers else 0
    block = page_size
    if state:
        block = max(page_size, BLOCK_ALIGN_TOKENS * -(-state // (BLOCK_ALIGN_TOKENS * token)))
    counts = {"mamba": model.state_layers, "swa": model.swa_layers, "full": model.full_layers}
    counts = {k: n for k, n in counts.items() if n}
    size = min(counts.values())
    if max(counts.values()) < 1.5 * size:
        size = max(counts.values())
    groups = {k: -(-n // size) for k, n in counts.items()}
    return VllmGroups(block_tokens=block, group_layers=size, groups=groups, layer_token_bytes=token,
                      state_layer_bytes=state, prefix_caching=prefix_caching(model))


def vllm_bands(model: ModelSpec, groups: VllmGroups) -> tuple[Band, ...]:
    """The model's bands as vLLM holds them: a token band's entry is one token
    over all layers of its kind's groups (padding layers included), so one
    page is one block per group; the mamba band's slot is `state_blocks`
    blocks of every mamba group. Chain and grow directions as
    `sim.layouts.model_bands` (the pool ignores them)."""
    kinds = [k for k in KINDS if groups.groups.get(k)]
    bands = []
    for kind, grow in zip(kinds, _GROWS[len(kinds)]):
        n = groups.groups[kind]
        if kind == "mamba":
            bands.append(Band("mamba", entry_bytes=n * groups.state_blocks * groups.block_bytes,
                              grow=grow, page_size=1, unit="request"))
            continue
        layers = n * groups.group_layers
        bands.append(Band(kind, entry_bytes=layers * groups.layer_token_bytes, grow=grow,
                          page_size=groups.block_tokens, unit="token", blocks_per_page=2 * layers))
    return tuple(bands)


def max_concurrency(model: ModelSpec, groups: VllmGroups, num_blocks: int, *, max_model_len: int,
                    max_num_batched_tokens: int, mamba_cache_mode: str = DEFAULT_MAMBA_CACHE_MODE) -> float:
    """vLLM's "Maximum concurrency for X tokens per request: Yx"
    (`get_max_concurrency_for_kv_cache_config`): blocks over the blocks of
    one request of `max_model_len` tokens, each group's worst case from its
    spec's `max_memory_usage_bytes` (full: every token; sliding window:
    window - 1 + one batch of tokens, plus a block; chunked local: chunk +
    one batch; mamba: `state_blocks`, one more under `mamba_cache_mode="align"`:
    `MambaSpec.max_memory_usage_bytes`, 2 blocks)."""
    bs, page = groups.block_tokens, groups.page_layer_bytes
    window = model.window_tokens or 0
    per_group = {
        "full": -(-max_model_len // bs) * page,
        "swa": ((-(-min(window + max_num_batched_tokens, max_model_len) // bs)) * page if model.chunked
                else (-(-min(window - 1 + max_num_batched_tokens, max_model_len) // bs) + 1) * page),
        "mamba": (groups.state_blocks + (mamba_cache_mode == "align")) * page,
    }
    need = sum(n * per_group[k] for k, n in groups.groups.items())
    return num_blocks / -(-need // page)


def aligned_chunk(computed_tokens: int, chunk_tokens: int, target_tokens: int, block_tokens: int) -> int:
    """The prefill chunk vLLM schedules in `mamba_cache_mode="align"`
    (vllm/v1/core/sched/scheduler.py `Scheduler._mamba_block_aligned_split`).

    A chunk that ends before the prompt's last whole block is cut to whole
    blocks (0: none fits, the request waits a step); a chunk that crosses
    that last block boundary is cut at it, so the state there is cached; the
    tail after it is scheduled as it is.

    Args:
        computed_tokens: positions already computed (a prefix hit included).
        chunk_tokens: the chunk the token budget allows.
        target_tokens: positions the prefill must reach (vLLM's `num_tokens`).
        block_tokens: vLLM's block size.
    """
    last = target_tokens - target_tokens % block_tokens
    end = computed_tokens + chunk_tokens
    if end < last:
        return chunk_tokens // block_tokens * block_tokens
    if computed_tokens < last < end:
        return last - computed_tokens
    return chunk_tokens


def prefix_caching(model: ModelSpec, mamba_cache_mode: str = DEFAULT_MAMBA_CACHE_MODE) -> bool:
    """Whether vLLM caches prefixes of `model` with prefix caching on: always
    for attention-only models; for a model with mamba layers only under
    `mamba_cache_mode="align"` (v0.11 turns it off for every hybrid:
    `MambaModelConfig.verify_and_update_config`)."""
    return not model.state_layers or mamba_cache_mode == "align"


def _layer_token_bytes(model: ModelSpec) -> dict[str, int]:
    out = {}
    if model.full_layers:
        out["full"] = model.full_token_bytes // model.full_layers
    if model.swa_layers:
        out["swa"] = model.swa_token_bytes // model.swa_layers
    return out

"""SGLang's memory split and state rules, as its source sizes them.

Each rule cites the SGLang file and function it reproduces (sgl-project/
sglang; the commits read are in `SOURCES`; docs/models.md, "Baselines:
sglang"). Two parts:

* `pool_sizes`: the pure arithmetic of SGLang's start-up sizing over a byte
  budget (the memory left after weights): the mamba state pool first
  (`--mamba-full-memory-ratio`), then the token pools (one full pool, or a
  full and a sliding-window pool at `--swa-full-tokens-ratio`), and the
  running-request cap the state slots imply.
* `sglang_plan_fractions` / `deployed_model`: the same split for a bundled
  `ModelSpec`, as byte fractions of a `StaticPartitionPool` (SGLang's pools
  are fixed regions sized at start-up; freed slots are reused inside them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from unikv.sim.model_spec import FP4_KV_CACHE_DTYPES, band_view
from unikv.sim.models import ModelSpec

SOURCES = {
    "kv_cache_configurator": "python/sglang/srt/mem_cache/kv_cache_configurator.py@003fca80",
    "pool_configurator": "python/sglang/srt/model_executor/pool_configurator.py@003fca80",
    "model_config": "python/sglang/srt/configs/model_config.py@001adf56",
    "hybrid_arch": "python/sglang/srt/configs/hybrid_arch.py@02e208de",
    "server_args": "python/sglang/srt/server_args.py (dataclass defaults)",
}

# server_args.py defaults: --swa-full-tokens-ratio, --mamba-full-memory-ratio,
# --mamba-ssm-dtype (float32; conv state stays bf16).
SWA_FULL_TOKENS_RATIO = 0.8
MAMBA_FULL_MEMORY_RATIO = 0.9
STATE_DTYPE = "fp32_ssm"

# model_config.is_hybrid_swa_model: the only architectures SGLang gives a
# separate sliding-window pool (SWAKVPool). Every other model keeps every
# token in every layer (one MHATokenToKVPool over all layers), window or not.
HYBRID_SWA_ARCHS = frozenset({
    "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM", "GptOssForCausalLM",
    "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM",
    "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration", "LagunaForCausalLM",
})
# hybrid_arch.mambaish_config: the architectures with a mamba state pool
# (HybridReqToTokenPool + MambaPool). A recurrent model outside it has no
# SGLang deployment to compare with.
MAMBA_ARCHS = frozenset({
    "FalconH1ForCausalLM", "NemotronHForCausalLM", "GraniteMoeHybridForCausalLM",
    "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "KimiLinearForCausalLM", "Lfm2ForCausalLM",
})
MAMBA_STRATEGIES = ("no_buffer", "extra_buffer", "extra_buffer_lazy")


def state_slots_per_request(*, radix_cache: bool = True, strategy: str = "extra_buffer",
                            overlap_schedule: bool = True) -> int:
    """Mamba state slots SGLang reserves per running request.

    As `KVCacheConfigurator._calculate_mamba_ratio`: 1 with the radix cache
    off; else 3 (live state + radix retention) plus the ping-pong track
    buffer of the extra-buffer strategies: +2 with overlap scheduling, +1
    without it or when lazy (`SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK` off).

    Raises:
        ValueError: an unknown strategy, or the lazy strategy without overlap
            scheduling (SGLang refuses it too).
    """
    if strategy not in MAMBA_STRATEGIES:
        raise ValueError(f"mamba_cache_strategy={strategy!r} is not one of {MAMBA_STRATEGIES}")
    if strategy == "extra_buffer_lazy" and not overlap_schedule:
        raise ValueError("mamba_cache_strategy='extra_buffer_lazy' needs overlap_schedule=True "
                         "(SGLang: lazy extra buffer requires overlap schedule)")
    if not radix_cache:
        return 1
    if strategy == "no_buffer":
        return 3
    return 3 + (2 if overlap_schedule and strategy == "extra_buffer" else 1)


@dataclass(frozen=True, kw_only=True)
class PoolSizes:
    """SGLang's pools over one budget (what its boot log prints).

    Attributes:
        state_slots: `max_mamba_cache_size` (usable slots; one more padding
            slot is allocated); 0 without state layers.
        state_bytes: bytes the state pool takes, padding slot included.
        full_tokens: `full_max_total_num_tokens` (or `max_total_num_tokens`).
        swa_tokens: `swa_max_total_num_tokens` (0 without a window pool).
        max_running_requests: the running cap: min(requested, full tokens // 2,
            state_slots // slots per request).
    """

    state_slots: int
    state_bytes: int
    full_tokens: int
    swa_tokens: int
    max_running_requests: int


def pool_sizes(*, rest_bytes: int, full_token_bytes: int, swa_token_bytes: int = 0,
               state_bytes_per_slot: int = 0, page_size: int = 1, split_swa: bool = False,
               mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO,
               swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO,
               slots_per_request: int = 1, max_running_requests: int = 4096) -> PoolSizes:
    """SGLang's start-up split of `rest_bytes` (bytes after weights and slack).

    State first (`KVCacheConfigurator._handle_max_mamba_cache`, ratio path):
    K = (rest r/(1+r) - s) // s slots of s bytes, K + 1 allocated. Tokens
    from the rest (`pool_configurator`): with a window pool
    (`HybridSWAPoolConfigurator`) full = rest // (F + r_s S) page-aligned and
    swa = int(full r_s) page-aligned; else tokens = rest // F page-aligned
    (`DefaultPoolConfigurator`; F, S: bytes of one token over every layer of
    each pool). The cap: `KVCacheConfigurator.resolve_max_num_reqs`.

    Args:
        rest_bytes: bytes for the KV and state pools.
        full_token_bytes / swa_token_bytes: bytes per token over the layers
            of each pool (fold unsplit window layers into full_token_bytes).
        state_bytes_per_slot: one request's state over all state layers.
        split_swa: the architecture gets a window pool (`HYBRID_SWA_ARCHS`).
        slots_per_request: `state_slots_per_request`.
        max_running_requests: the requested cap (`--max-running-requests`).

    Raises:
        ValueError: the budget holds no state slot or no token page.
    """
    state_slots = state_total = 0
    if state_bytes_per_slot:
        budget = rest_bytes * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
        state_slots = int((budget - state_bytes_per_slot) // state_bytes_per_slot)
        if state_slots <= 0:
            raise ValueError(f"a budget of {rest_bytes} bytes holds no state slot of "
                             f"{state_bytes_per_slot} bytes at mamba_full_memory_ratio="
                             f"{mamba_full_memory_ratio}")
        state_total = (state_slots + 1) * state_bytes_per_slot
    rest = rest_bytes - state_total
    cell = full_token_bytes + (swa_full_tokens_ratio * swa_token_bytes if split_swa else 0)
    full = int(rest // cell) // page_size * page_size
    swa = int(full * swa_full_tokens_ratio) // page_size * page_size if split_swa else 0
    if full <= 0:
        raise ValueError(f"a budget of {rest_bytes} bytes holds no {page_size}-token page "
                         f"after {state_total} state bytes")
    cap = min(max_running_requests, full // 2)
    if state_slots:
        cap = min(cap, state_slots // slots_per_request)
    return PoolSizes(state_slots=state_slots, state_bytes=state_total, full_tokens=full,
                     swa_tokens=swa, max_running_requests=cap)


def architecture(model: ModelSpec) -> str:
    """The model's Hugging Face architecture (`ModelSpec.architecture`: the
    bundled entry's, or `architectures[0]` of the config.json it was read
    from).

    Raises:
        ValueError: the model names none.
    """
    if model.architecture:
        return model.architecture
    raise ValueError(f"model {model.name!r}: no architecture known (a bundled name or a "
                     "config.json with 'architectures' is needed for the sglang layout)")


def unsupported_reason(model: ModelSpec) -> str | None:
    """Why SGLang cannot deploy `model` as the simulator describes it (None: it can)."""
    try:
        arch = architecture(model)
    except ValueError as exc:
        return str(exc)
    if model.state_layers and arch not in MAMBA_ARCHS:
        return (f"SGLang has no mamba state pool for {arch} (model {model.name!r}; "
                "hybrid_arch.mambaish_config)")
    split = model.state_layers or (model.swa_layers and arch in HYBRID_SWA_ARCHS)
    if model.kv_cache_dtype in FP4_KV_CACHE_DTYPES and split:
        return (f"kv_cache_dtype={model.kv_cache_dtype!r} on {arch} (model {model.name!r}): SGLang "
                "builds its fp4 pool (MHATokenToKVPoolFP4, with scale buffers) only for a plain "
                "token pool (model_runner_kv_cache_mixin._init_pools); its window and mamba-hybrid "
                "pools (SWAKVPool, HybridLinearKVPool) are other classes whose fp4 bytes are not pinned")
    return None


def deployed_model(model: ModelSpec) -> ModelSpec:
    """`model` as SGLang stores it: window layers of an architecture outside
    `HYBRID_SWA_ARCHS` hold every token, so they join the full pool (the
    window still bounds their attention, not their memory)."""
    if not model.swa_layers or architecture(model) in HYBRID_SWA_ARCHS:
        return model
    if not model.token_kinds:  # a spec given by its band view only
        return dataclasses.replace(
            model, full_layers=model.full_layers + model.swa_layers,
            full_token_bytes=model.full_token_bytes + model.swa_token_bytes,
            swa_layers=0, swa_token_bytes=0, window_tokens=None, chunked=False)
    kinds = tuple(dataclasses.replace(k, name="full_attention", window_tokens=None) if k.band == "swa" else k
                  for k in model.token_kinds)
    view = band_view(kinds, model.state_kinds, f"ModelSpec {model.name!r}",
                     default_state_dtypes=(model.conv_state_dtype, model.ssm_state_dtype))
    return dataclasses.replace(model, token_kinds=kinds, **view)


def plan_sizes(model: ModelSpec, *, budget_bytes: int, page_size: int) -> PoolSizes:
    """`pool_sizes` for a `deployed_model` over the whole `budget_bytes` (the
    running cap is left to `LayoutPlan.max_running`, which knows the slots
    per request; a window-only model has its tokens in the window pool)."""
    split = bool(model.swa_layers and model.full_layers)
    return pool_sizes(rest_bytes=budget_bytes,
                      full_token_bytes=model.full_token_bytes or model.swa_token_bytes,
                      swa_token_bytes=model.swa_token_bytes if split else 0,
                      state_bytes_per_slot=model.state_bytes if model.state_layers else 0,
                      page_size=page_size, split_swa=split, max_running_requests=1 << 62)


def plan_fractions(model: ModelSpec, sizes: PoolSizes, usable_bytes: int) -> dict[str, float]:
    """Byte fractions (of `usable_bytes`, the buffer past the sink) that give a
    `StaticPartitionPool` SGLang's regions: K state slots (the padding slot
    stays unused), the full and window token pools. `model`: deployed."""
    regions = {"mamba": sizes.state_slots * model.state_bytes,
               "swa": sizes.swa_tokens * model.swa_token_bytes,
               "full": sizes.full_tokens * model.full_token_bytes}
    if not (model.full_layers and model.swa_layers) and model.swa_layers:
        regions["swa"] = sizes.full_tokens * model.swa_token_bytes  # a window-only model
    return {k: regions[k] / usable_bytes for k in model.kinds}

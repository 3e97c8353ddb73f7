"""Engine rules: the per-request state demand a run is held to.

State demand belongs to the scheduler, not to the layout: every layout of a
comparison (the engine's own baseline, the unified layouts, the oracle) runs
under the same rules, so the comparison is like for like. A rule set gives
the state slots each running request holds and the dtype of the recurrent
state; `SchedulerConfig.engine` selects one, `state_slots_per_request`
overrides its slot count.
"""

from __future__ import annotations

from dataclasses import dataclass

from unikv.sim import sglang
from unikv.sim.prefix_cache import cache_block_tokens
from unikv.sim.vllm_rules import DEFAULT_MAMBA_CACHE_MODE, prefix_caching, vllm_groups

ENGINES = (
    "sglang",
    "vllm",
)
# The engine each engine-baseline layout is deployed under (`unikv compare`
# runs the other layouts under the same rules).
ENGINE_OF_LAYOUT = {
    "sglang": "sglang",
    "vllm": "vllm",
}


@dataclass(frozen=True, kw_only=True)
class EngineRules:
    """The state demand of one run.

    Attributes:
        engine: the engine whose rules these are (None: unikv's own: one
            slot per request, state in the model dtype).
        state_slots_per_request: state slots a running request holds.
        state_dtype: `sim.models.STATE_DTYPES` entry the state is kept in.
        mamba_cache_mode: vLLM's `mamba_cache_mode` ("none", "align"; None
            under another engine's rules), after vLLM's own reset to "none"
            when prefix caching is off.
    """

    engine: str | None
    state_slots_per_request: int
    state_dtype: str
    mamba_cache_mode: str | None = None


@dataclass(frozen=True, kw_only=True)
class PrefixCacheRule:
    """How a run caches prefixes (`prefix_cache`).

    Attributes:
        block_tokens: the prefix cache's block size (None: no prefix cache).
        align_tokens: vLLM's block size when its `mamba_cache_mode="align"`
            rules apply (a model with state layers): prefill chunks cut to
            whole blocks, states cached only at block-aligned chunk ends, one
            more state block from the second chunk on (`sim.memory.Memory`);
            None otherwise.
    """

    block_tokens: int | None
    align_tokens: int | None = None


def effective_engine(engine: str | None, layout: str) -> str | None:
    """`engine`, or when None the engine a baseline `layout` is deployed under."""
    return engine if engine is not None else ENGINE_OF_LAYOUT.get(layout)


def rules(scheduler, layout: str) -> EngineRules:
    """The rules a run of `layout` under `scheduler` (a `SchedulerConfig`) uses.

    sglang: slots by `sim.sglang.state_slots_per_request` (the radix cache
    is on when `prefix_cache` is), fp32 SSM state (`--mamba-ssm-dtype`
    default). vllm: one slot (one block per mamba group and request,
    `mamba_cache_mode="none"`: vllm/v1/core/single_type_kv_cache_manager.py
    `MambaManager`), state in the model dtype (`mamba_ssm_cache_dtype="auto"`).
    None: one slot, bf16 state. Under every engine a config's declared SSM
    dtype wins (`sim.models.load_model`), as vLLM's per-model hooks resolve
    "auto" for NemotronH (the config's value, float32 when silent) and
    Qwen3.5 (vllm/model_executor/models/config.py
    `NemotronHForCausalLMConfig`, `Qwen3_5ForConditionalGenerationConfig`).
    An explicit
    `state_slots_per_request` replaces the engine's count.

    vllm: `mamba_cache_mode` is `scheduler.mamba_cache_mode`, else vLLM's
    default in the v0.11 line the vllm layout follows ("none"), and "none"
    whenever the prefix cache is off (vLLM resets it then:
    vllm/model_executor/models/config.py `MambaModelConfig`). Other engines'
    rules do not read the setting (as vLLM's do not read SGLang's
    `mamba_cache_strategy`), so one config drives both engines' groups of
    `unikv compare`; their mode is None.
    """
    engine = effective_engine(scheduler.engine, layout)
    mode = None
    if engine == "vllm":
        mode = scheduler.mamba_cache_mode or DEFAULT_MAMBA_CACHE_MODE
        mode = mode if scheduler.prefix_cache else "none"
    if engine == "sglang":
        slots = sglang.state_slots_per_request(radix_cache=scheduler.prefix_cache,
                                               strategy=scheduler.mamba_cache_strategy,
                                               overlap_schedule=scheduler.overlap_schedule)
        dtype = sglang.STATE_DTYPE
    else:
        slots, dtype = 1, "bf16"
    if scheduler.state_slots_per_request is not None:
        slots = scheduler.state_slots_per_request
    return EngineRules(engine=engine, state_slots_per_request=slots, state_dtype=dtype, mamba_cache_mode=mode)


def prefix_cache(rules: EngineRules, model, *, layout: str, page_size: int, requested: int | None,
                 trace_block: int | None, enabled: bool,
                 prefill_tokens_per_step: int | None = None) -> PrefixCacheRule:
    """The prefix cache a run of `model` on `layout` under `rules` keeps.

    The vllm layout of a model vLLM keeps no prefix cache for
    (`vllm_rules.prefix_caching`: one with mamba layers unless
    `mamba_cache_mode="align"`) runs without one; the other layouts keep
    the simulator's own. Otherwise, without vLLM's align rules: the block
    size `sim.prefix_cache.cache_block_tokens` gives (`requested`, else the
    trace's). Under `mamba_cache_mode="align"`
    on a model with state layers, vLLM hashes and hits whole blocks of its
    own block size B (`vllm_groups(model, page_size).block_tokens`;
    `MambaManager.find_longest_cache_hit` keeps a hit only at a block whose
    state is cached), so the cache's block is B and `align_tokens` = B.

    Args:
        rules: the run's engine rules.
        model: the run's `ModelSpec`.
        layout: the run's layout kind (`sim.layouts.LAYOUT_KINDS`).
        page_size: the run's configured page (vLLM's `block_size`) in tokens.
        requested, trace_block, enabled: as `cache_block_tokens` takes them.
        prefill_tokens_per_step: the chunk budget (None: not checked).

    Raises:
        ValueError: what `cache_block_tokens` refuses; under align, a
            `requested` block other than B, a chunk budget below B (no
            chunk before a prompt's last block could run), or a model
            vLLM's rules refuse.
    """
    if rules.mamba_cache_mode != "align" or not model.state_layers:
        block = cache_block_tokens(requested, trace_block, enabled=enabled)
        if layout == "vllm" and not prefix_caching(model, rules.mamba_cache_mode or DEFAULT_MAMBA_CACHE_MODE):
            block = None
        return PrefixCacheRule(block_tokens=block)
    try:
        block = vllm_groups(model, page_size).block_tokens
    except ValueError as exc:
        raise ValueError(f"scheduler.mamba_cache_mode='align' needs vLLM's block size: {exc}") from None
    if prefill_tokens_per_step is not None and prefill_tokens_per_step < block:
        raise ValueError(f"scheduler.prefill_tokens_per_step={prefill_tokens_per_step} is below vLLM's block "
                         f"size for {model.name!r} ({block} tokens): with mamba_cache_mode='align' no "
                         "prefill chunk before a prompt's last block could be scheduled")
    if requested is not None and requested != block:
        raise ValueError(f"scheduler.block_tokens={requested} does not apply with mamba_cache_mode='align': "
                         f"vLLM caches {model.name!r} in blocks of its block size, {block} tokens")
    cached = cache_block_tokens(None, trace_block, enabled=enabled)
    if requested is not None and cached is None:
        cache_block_tokens(requested, trace_block, enabled=enabled)  # raises: no cache, or no hashes
    return PrefixCacheRule(block_tokens=block if cached is not None else None, align_tokens=block)

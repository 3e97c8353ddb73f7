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
    """

    engine: str | None
    state_slots_per_request: int
    state_dtype: str


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
    None: one slot, bf16 state. An explicit
    `state_slots_per_request` replaces the engine's count.
    """
    engine = effective_engine(scheduler.engine, layout)
    if engine == "sglang":
        slots = sglang.state_slots_per_request(radix_cache=scheduler.prefix_cache,
                                               strategy=scheduler.mamba_cache_strategy,
                                               overlap_schedule=scheduler.overlap_schedule)
        dtype = sglang.STATE_DTYPE
    else:
        slots, dtype = 1, "bf16"
    if scheduler.state_slots_per_request is not None:
        slots = scheduler.state_slots_per_request
    return EngineRules(engine=engine, state_slots_per_request=slots, state_dtype=dtype)

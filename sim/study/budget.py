"""KV budgets as serving engines derive them from GPU memory.

Both engines size the KV pool once at start-up from what is left of the
GPU after the weights and the activations:

* **SGLang** (`python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`,
  `ModelRunner.profile_max_num_token`, v0.5.8):
  `rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)`,
  where `available_gpu_memory` is measured after the weights are loaded. So
  KV = HBM x `mem_fraction_static` - weights - whatever else was allocated
  before the measurement; the `1 - mem_fraction_static` share left over is
  SGLang's room for activations and CUDA graphs. Default fraction: 0.88,
  the tp-1 default of `ServerArgs.__post_init__` in SGLang 0.4 (0.5's
  `_handle_gpu_memory_settings` computes it from a reserve per GPU: pass
  `mem_fraction` to match a given deployment); default reserve: 0 (the
  fraction already leaves the activations out).
* **vLLM** (`vllm/v1/worker/gpu_worker.py`, `Worker.determine_available_memory`):
  `requested_memory = total_memory * gpu_memory_utilization` and
  `available_kv_cache_memory = requested_memory - non_kv_cache_memory`, where
  the profiled non-KV memory is the weights + the peak activation of a
  dummy forward at `max_num_batched_tokens` + non-torch allocations. So KV =
  HBM x utilization - weights - activation reserve. Default utilization:
  0.9 (`CacheConfig.gpu_memory_utilization`); the activation peak is a
  profiled figure vLLM does not publish as a constant, so the default
  reserve here (1 GiB) is an assumption and a study should state its own.

The simulator cannot profile, so the reserve is an input either way.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30

ENGINE_DEFAULTS = {
    "sglang": {"mem_fraction": 0.88, "activation_reserve_gib": 0.0},
    "vllm": {"mem_fraction": 0.9, "activation_reserve_gib": 1.0},
}
"""Per engine: its default memory fraction, and the activation reserve this
module charges when a study gives none (see the module docstring)."""


@dataclass(frozen=True, kw_only=True)
class DerivedBudget:
    """A KV budget and the figures it came from.

    Attributes:
        rule: "explicit", "sglang" or "vllm".
        kv_budget_bytes: the KV buffer, bytes.
        hbm_capacity_bytes, weight_bytes, activation_reserve_bytes: the
            figures a derived budget charged (None for explicit).
        mem_fraction: the fraction of HBM the engine claims (None for explicit).
    """

    rule: str
    kv_budget_bytes: int
    hbm_capacity_bytes: int | None = None
    weight_bytes: int | None = None
    activation_reserve_bytes: int | None = None
    mem_fraction: float | None = None

    @property
    def kv_budget_gib(self) -> float:
        return self.kv_budget_bytes / GIB


def explicit_budget(gib: float) -> DerivedBudget:
    return DerivedBudget(rule="explicit", kv_budget_bytes=int(round(gib * GIB)))


def derive_budget(engine: str, *, hbm_capacity_bytes: int, weight_bytes: int | None, model: str,
                  mem_fraction: float | None = None,
                  activation_reserve_gib: float | None = None) -> DerivedBudget:
    """KV bytes `engine` would give `model` on a GPU of `hbm_capacity_bytes`.

    Args:
        engine: "sglang" or "vllm".
        hbm_capacity_bytes: the GPU's memory, bytes.
        weight_bytes: the model's weight bytes (`ModelSpec.weight_bytes`).
        model: the model's name, for messages.
        mem_fraction: `mem_fraction_static` / `gpu_memory_utilization`;
            None: the engine's default.
        activation_reserve_gib: activation memory charged, GiB; None: the
            default of `ENGINE_DEFAULTS`.

    Returns:
        The budget, with every figure it charged.

    Raises:
        ValueError: an unknown engine, unknown weight bytes, or weights
            (plus reserve) that leave no KV memory: naming the figures.
    """
    if engine not in ENGINE_DEFAULTS:
        raise ValueError(f"derive={engine!r}; expected one of {list(ENGINE_DEFAULTS)}")
    defaults = ENGINE_DEFAULTS[engine]
    fraction = defaults["mem_fraction"] if mem_fraction is None else mem_fraction
    reserve_gib = defaults["activation_reserve_gib"] if activation_reserve_gib is None else activation_reserve_gib
    if weight_bytes is None:
        raise ValueError(f"model {model!r}: its weight bytes are unknown, so a {engine} budget cannot be "
                         "derived; give the budget in GiB")
    reserve = int(round(reserve_gib * GIB))
    claimed = int(hbm_capacity_bytes * fraction)
    kv = claimed - weight_bytes - reserve
    if kv <= 0:
        raise ValueError(
            f"model {model!r} does not fit: {engine} claims {fraction:g} x {hbm_capacity_bytes / GIB:.1f} GiB "
            f"= {claimed / GIB:.1f} GiB, but the weights take {weight_bytes / GIB:.1f} GiB and the "
            f"activation reserve {reserve_gib:g} GiB, leaving {kv / GIB:.1f} GiB for KV")
    return DerivedBudget(rule=engine, kv_budget_bytes=kv, hbm_capacity_bytes=hbm_capacity_bytes,
                         weight_bytes=weight_bytes, activation_reserve_bytes=reserve, mem_fraction=fraction)

"""Step-time cost of one engine step on one GPU: the roofline or a measured profile.

    step = overhead + max(compute, hbm) + move        (the roofline, `sim.roofline`)
    step = non_forward + forward(shape) + move        (a profile, `sim.profile`)

The roofline's coefficients are package data with their provenance
(`sim.hardware.HardwareSpec`, `sim/data/hardware/<gpu>.json`); a profile is
measured step times of one model on one GPU (`sim/data/profiles/`), used by
default where one exists for the run's (model, GPU): `step_cost_model`.
docs/cost_model.md has the formulas, the sources and the formats.
"""

from __future__ import annotations

from pathlib import Path

from unikv.sim.hardware import COEFFICIENTS, HardwareSpec, gpu_names, hardware_names, load_gpu
from unikv.sim.models import ModelSpec
from unikv.sim.roofline import Roofline, StepCost, StepShape

__all__ = ["COEFFICIENTS", "EngineStepCost", "HardwareSpec", "StepCost", "StepShape", "gpu_names",
           "hardware_names", "load_gpu", "step_cost", "step_cost_model", "step_time_s"]


def step_cost(model: ModelSpec, hw: HardwareSpec, *, prefill_tokens: int, decode_tokens: int,
              kv_bytes_read: int, moved_bytes: int, params_active: int | None = None,
              weight_bytes: int | None = None, shape: StepShape | None = None) -> StepCost:
    """The roofline terms of one step's time (`sim.roofline`).

    Args:
        prefill_tokens / decode_tokens: tokens the forward processes.
        kv_bytes_read: KV (and state) bytes the attention reads this step.
        moved_bytes: bytes compaction copied this step (page bytes x moves).
        params_active / weight_bytes: override the model's figures.
        shape: the step's chunks and contexts, for the attention FLOPs
            (None: none charged).

    A step with no token runs no forward: it costs only its moves.

    Raises:
        ValueError: a negative count, or a model without params_active /
            weight_bytes and no override (naming the field).
    """
    for name, value in (("prefill_tokens", prefill_tokens), ("decode_tokens", decode_tokens),
                        ("kv_bytes_read", kv_bytes_read), ("moved_bytes", moved_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name}={value!r} must be a non-negative number")
    roof = Roofline(model, hw)
    if prefill_tokens + decode_tokens == 0:
        return roof.cost(prefill_tokens=0, decode_tokens=0, kv_bytes_read=0, moved_bytes=moved_bytes,
                         params_active=0, weight_bytes=0, shape=None)
    return roof.cost(prefill_tokens=prefill_tokens, decode_tokens=decode_tokens, kv_bytes_read=kv_bytes_read,
                     moved_bytes=moved_bytes, params_active=_model_figure(model, "params_active", params_active),
                     weight_bytes=_model_figure(model, "weight_bytes", weight_bytes), shape=shape)


def step_time_s(model: ModelSpec, hw: HardwareSpec, *, prefill_tokens: int, decode_tokens: int,
                kv_bytes_read: int, moved_bytes: int, **overrides) -> float:
    """Seconds one engine step takes: `step_cost(...).total_s`."""
    return step_cost(model, hw, prefill_tokens=prefill_tokens, decode_tokens=decode_tokens,
                     kv_bytes_read=kv_bytes_read, moved_bytes=moved_bytes, **overrides).total_s


def _model_figure(model: ModelSpec, name: str, override: int | None) -> float:
    value = getattr(model, name) if override is None else override
    if value is None or isinstance(value, bool) or not value > 0:
        why = model.sources.get("params")  # how load_model sized a config file, or why it could not
        raise ValueError(f"model {model.name!r} has {name}={value!r}" + (f" ({why})" if why else "")
                         + f"; pass {name}=... (or load a bundled model that has it)")
    return value


class EngineStepCost:
    """The roofline of one model on one accelerator, as the engine calls it
    every step: `(prefill_tokens, decode_tokens, kv_bytes_read, moved_bytes,
    shape) -> seconds`, `shape` from `shape_of(plan, memory)` (the executor
    asks for it). The same arithmetic as `step_cost`, with the model's
    figures looked up once (the engine's counts are non-negative integers by
    construction, so the per-call argument checks are skipped)."""

    name = "roofline"

    def __init__(self, model: ModelSpec, hw: HardwareSpec) -> None:
        self.model, self.hw = model, hw
        self.roofline = Roofline(model, hw)
        try:
            self._active = _model_figure(model, "params_active", None)
            self._weights = _model_figure(model, "weight_bytes", None)
            self._missing = None
        except ValueError as exc:  # raised by the first step that runs a forward, as step_cost does
            self._missing = exc

    def __call__(self, prefill_tokens: int, decode_tokens: int, kv_bytes_read: int,
                 moved_bytes: int, shape: StepShape | None = None) -> float:
        if prefill_tokens + decode_tokens == 0:
            return self.move_time_s(moved_bytes)
        if self._missing is not None:
            raise self._missing
        return self.roofline.cost(prefill_tokens=prefill_tokens, decode_tokens=decode_tokens,
                                  kv_bytes_read=kv_bytes_read, moved_bytes=moved_bytes,
                                  params_active=self._active, weight_bytes=self._weights, shape=shape).total_s

    def decode_s(self, decode_tokens: int, decode_context_tokens: int, decode_window_tokens: int,
                 kv_bytes_read: int, moved_bytes: int) -> float:
        """`self(0, decode_tokens, kv_bytes_read, moved_bytes, shape)` of a
        step that only decodes, `shape` being `StepShape((),
        decode_context_tokens, decode_window_tokens)`, with no shape built
        (the executor's path for such steps)."""
        if decode_tokens == 0:
            return self.move_time_s(moved_bytes)
        if self._missing is not None:
            raise self._missing
        return self.roofline.decode_s(decode_tokens, decode_context_tokens, decode_window_tokens,
                                      kv_bytes_read, moved_bytes, self._active, self._weights)

    @property
    def window_tokens(self) -> int | None:
        """The window `shape_of` caps the decoders' contexts at (None: no window layers)."""
        return self.roofline.window

    def shape_of(self, plan, memory) -> StepShape:
        """The step's chunks and contexts (`sim.roofline.shape_of`), which the executor passes back."""
        return self.roofline.shape_of(plan, memory)

    def move_time_s(self, moved_bytes):
        """Seconds the page moves take (an int or an array of byte counts)."""
        return 2 * moved_bytes / self.hw.move_bytes_per_s


def step_cost_model(model: ModelSpec, hw: HardwareSpec, gpu: str | None,
                    profiles_dir: Path | None = None):
    """The step cost a run uses, and its name for the summary.

    A profile measured for (model, GPU), `<profiles_dir>/<model>__<gpu>.json`
    (default: the bundled `sim/data/profiles/`), wins; otherwise the roofline.

    Args:
        model, hw: the run's model and accelerator.
        gpu: the bundled GPU name the accelerator was loaded as (None: a
            user's hardware file, which no bundled profile matches).
        profiles_dir: where to look for profiles.

    Returns:
        (callable, step_time_model): an `EngineStepCost` and "roofline", or
        a `sim.profile.ProfileStepCost` and "profile:<file name>".

    Raises:
        ValueError: a profile file exists but is invalid (named).
    """
    from unikv.sim.profile import ProfileStepCost, StepProfile, padding_routes_as_one, profile_path

    path = profile_path(model.name, gpu, profiles_dir) if gpu is not None else None
    if path is None or not path.is_file():
        return EngineStepCost(model, hw), "roofline"
    profile = StepProfile.load(path)
    if (profile.model, profile.gpu) != (model.name, gpu):
        raise ValueError(f"profile {str(path)!r}: model={profile.model!r}, gpu={profile.gpu!r}, but it is "
                         f"the file of model {model.name!r} on gpu {gpu!r}")
    routes = padding_routes_as_one(model)
    if profile.decode_buckets and profile.decode_padding_routes_as_one != routes:
        raise ValueError(f"profile {str(path)!r}: decode_padding_routes_as_one="
                         f"{str(profile.decode_padding_routes_as_one).lower()}, but model {model.name!r} "
                         + ("routes tokens through experts and keeps no state" if routes
                            else "has no routed experts or keeps recurrent state")
                         + " (sim.profile.padding_routes_as_one)")
    window = model.window_tokens if model.swa_layers else None
    return ProfileStepCost(profile, hw, window), f"profile:{path.name}"

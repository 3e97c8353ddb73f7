"""Step-time cost model of one engine step on one GPU, and its hardware coefficients.

    step = overhead + max(compute, hbm) + move
    compute = 2 * params_active * tokens / (peak_flops * mfu)
    hbm     = (weight_bytes + kv_bytes_read) / (hbm_bytes_per_s * mbu)
    move    = 2 * moved_bytes / move_bytes_per_s

A roofline: a step is bound by its matmul FLOPs or by the bytes it reads,
plus the page moves compaction made (each moved byte read once and written
once; `move_bytes_per_s` counts read + written bytes). The coefficients are
package data with their provenance (`HardwareSpec.h200()`); each one's
source and caveats are in docs/cost_model.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from unikv.sim.models import ModelSpec

COEFFICIENTS = ("peak_flops", "hbm_bytes_per_s", "mfu", "mbu", "move_bytes_per_s", "step_overhead_s",
                "hbm_capacity_bytes")
"""The numbers a hardware file gives, in the order of its `coefficients`
(all but hbm_capacity_bytes are step-time terms; the capacity sizes KV budgets)."""


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One accelerator's cost coefficients, each with where it came from.

    The bundled accelerators are package data (`sim/data/hardware/<name>.json`,
    `HardwareSpec.h200()`, `HardwareSpec.load(name_or_path)`); there are no
    defaults in code, so a checkout and a wheel install charge the same.

    Attributes:
        name: a label for results tables.
        peak_flops: dense bf16 peak, FLOP/s.
        hbm_bytes_per_s: peak HBM bandwidth, bytes/s.
        mfu: achievable fraction of peak_flops (0, 1].
        mbu: achievable fraction of hbm_bytes_per_s (0, 1].
        move_bytes_per_s: page-move bandwidth, bytes read + written per second.
        step_overhead_s: fixed time per step (scheduling, launches), seconds.
        hbm_capacity_bytes: the accelerator's HBM, bytes (the datasheet's
            "GB" of HBM are binary: 141 GB on an H200 is 141 * 2**30 bytes;
            see docs/cost_model.md).
        provenance: per coefficient, where it came from: at least `source`
            (a sentence), and for measured ones the benchmark, command,
            machine, date, file and rows it was derived from.
        description: one line about the accelerator.
    """

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    mfu: float
    mbu: float
    move_bytes_per_s: float
    step_overhead_s: float
    hbm_capacity_bytes: int
    provenance: Mapping[str, Mapping[str, Any]] = field(hash=False)
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"HardwareSpec: name={self.name!r} must be a non-empty string")
        for name in ("peak_flops", "hbm_bytes_per_s", "move_bytes_per_s"):
            _check_number(name, getattr(self, name), low=0.0, open_low=True)
        for name in ("mfu", "mbu"):
            _check_number(name, getattr(self, name), low=0.0, open_low=True, high=1.0)
        _check_number("step_overhead_s", self.step_overhead_s, low=0.0)
        if isinstance(self.hbm_capacity_bytes, bool) or not isinstance(self.hbm_capacity_bytes, int) \
                or self.hbm_capacity_bytes <= 0:
            raise ValueError(f"HardwareSpec: hbm_capacity_bytes={self.hbm_capacity_bytes!r} "
                             "must be a positive integer (bytes)")
        for name in COEFFICIENTS:
            entry = self.provenance.get(name) if isinstance(self.provenance, Mapping) else None
            if not isinstance(entry, Mapping) or not isinstance(entry.get("source"), str):
                raise ValueError(f"HardwareSpec: provenance of {name} must be an object with a 'source' string")
        object.__setattr__(self, "provenance", {k: dict(self.provenance[k]) for k in COEFFICIENTS})

    @classmethod
    def h200(cls) -> HardwareSpec:
        """One NVIDIA H200 SXM (`sim/data/hardware/h200.json`)."""
        return cls.load("h200")

    @classmethod
    def load(cls, name_or_path: str | Path) -> HardwareSpec:
        """A bundled accelerator by name (`hardware_names()`), or a hardware JSON file.

        A string naming no bundled accelerator is read as a path. The file's
        schema is the bundled files' (docs/cost_model.md): `name`,
        `description`, and `coefficients` mapping each of COEFFICIENTS to
        `{"value": number, "source": "...", ...provenance}`.

        Raises:
            ValueError: an unknown name, a file that is not JSON, or a field
                missing, unknown or out of range (the message names it).
        """
        if isinstance(name_or_path, str) and name_or_path in hardware_names():
            text = _hardware_dir().joinpath(f"{name_or_path}.json").read_text()
            where = f"bundled hardware {name_or_path!r}"
        else:
            path = Path(name_or_path)
            if not path.is_file():
                raise ValueError(f"hardware {str(name_or_path)!r} is neither a bundled name "
                                 f"{hardware_names()} nor a file")
            text, where = path.read_text(), f"hardware file {str(path)!r}"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareSpec:
        """The spec `as_dict()` wrote (the hardware file schema).

        Raises:
            ValueError: a missing, unknown or out-of-range field, named.
        """
        if not isinstance(data, Mapping):
            raise ValueError("the top level must be a JSON object")
        unknown = sorted(set(data) - {"name", "description", "coefficients"})
        if unknown:
            raise ValueError(f"unknown fields {unknown}; valid: ['name', 'description', 'coefficients']")
        coeffs = data.get("coefficients")
        if not isinstance(coeffs, Mapping):
            raise ValueError("missing field 'coefficients'" if coeffs is None
                             else f"coefficients={coeffs!r} must be an object")
        missing = [c for c in COEFFICIENTS if c not in coeffs]
        extra = sorted(set(coeffs) - set(COEFFICIENTS))
        if missing or extra:
            raise ValueError(f"coefficients: missing {missing}" if missing else f"unknown coefficients {extra}")
        values, provenance = {}, {}
        for name in COEFFICIENTS:
            entry = coeffs[name]
            if not isinstance(entry, Mapping) or "value" not in entry:
                raise ValueError(f"coefficients.{name} must be an object with a 'value'")
            values[name] = entry["value"]
            provenance[name] = {k: v for k, v in entry.items() if k != "value"}
        label, description = data.get("name"), data.get("description", "")
        if not isinstance(label, str) or not isinstance(description, str):
            bad = "name" if not isinstance(label, str) else "description"
            raise ValueError(f"{bad}={data.get(bad)!r} must be a string")
        return cls(name=label, description=description, provenance=provenance, **values)

    def as_dict(self) -> dict[str, Any]:
        """Every coefficient with its provenance, in the hardware file schema
        (`from_dict(spec.as_dict()) == spec`); written into every summary.json."""
        return {"name": self.name, "description": self.description,
                "coefficients": {c: {"value": getattr(self, c), **self.provenance[c]} for c in COEFFICIENTS}}

    def with_(self, **coefficients: float) -> HardwareSpec:
        """A copy with some coefficients replaced, their provenance saying so."""
        bad = sorted(set(coefficients) - set(COEFFICIENTS))
        if bad:
            raise ValueError(f"HardwareSpec.with_: unknown coefficients {bad}; valid: {list(COEFFICIENTS)}")
        marked = {k: {"source": f"override of {self.name}'s {self.provenance[k]['source']!r}"}
                  for k in coefficients}
        changes: dict[str, Any] = {**coefficients, "provenance": {**self.provenance, **marked}}
        return replace(self, **changes)


def hardware_names() -> list[str]:
    """The bundled accelerators (`sim/data/hardware/*.json`), by name."""
    return sorted(p.name[:-len(".json")] for p in _hardware_dir().iterdir() if p.name.endswith(".json"))


def _hardware_dir():
    return resources.files("unikv.sim").joinpath("data").joinpath("hardware")


def _check_number(name: str, value, *, low: float, open_low: bool = False,
                  high: float = math.inf) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and value <= high
    if not ok:
        bound = f"in ({low}, {high}]" if high < math.inf else (f"> {low}" if open_low else f">= {low}")
        raise ValueError(f"HardwareSpec: {name}={value!r} must be a finite number {bound}")


@dataclass(frozen=True)
class StepCost:
    """One step's time, by term (seconds)."""

    overhead_s: float
    compute_s: float
    hbm_s: float
    move_s: float

    @property
    def total_s(self) -> float:
        return self.overhead_s + max(self.compute_s, self.hbm_s) + self.move_s


def step_cost(model: ModelSpec, hw: HardwareSpec, *, prefill_tokens: int, decode_tokens: int,
              kv_bytes_read: int, moved_bytes: int, params_active: int | None = None,
              weight_bytes: int | None = None) -> StepCost:
    """The terms of one step's time (see module docstring).

    Args:
        prefill_tokens / decode_tokens: tokens the forward processes.
        kv_bytes_read: KV (and state) bytes the attention reads this step.
        moved_bytes: bytes compaction copied this step (page bytes x moves).
        params_active / weight_bytes: override the model's figures.

    A step with no token runs no forward: it costs only its moves.

    Raises:
        ValueError: a negative count, or a model without params_active /
            weight_bytes and no override (naming the field).
    """
    for name, value in (("prefill_tokens", prefill_tokens), ("decode_tokens", decode_tokens),
                        ("kv_bytes_read", kv_bytes_read), ("moved_bytes", moved_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name}={value!r} must be a non-negative number")
    move_s = 2 * moved_bytes / hw.move_bytes_per_s
    tokens = prefill_tokens + decode_tokens
    if tokens == 0:
        return StepCost(0.0, 0.0, 0.0, move_s)
    active = _model_figure(model, "params_active", params_active)
    weights = _model_figure(model, "weight_bytes", weight_bytes)
    compute_s = 2 * active * tokens / (hw.peak_flops * hw.mfu)
    hbm_s = (weights + kv_bytes_read) / (hw.hbm_bytes_per_s * hw.mbu)
    return StepCost(hw.step_overhead_s, compute_s, hbm_s, move_s)


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
    """`step_time_s` of one model on one accelerator, as the engine calls it
    every step: `(prefill_tokens, decode_tokens, kv_bytes_read, moved_bytes)
    -> seconds`. The same arithmetic as `step_cost`, with the coefficients
    looked up once (the engine's counts are non-negative integers by
    construction, so the per-call argument checks are skipped)."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec) -> None:
        self.model, self.hw = model, hw
        self._flops = hw.peak_flops * hw.mfu
        self._hbm = hw.hbm_bytes_per_s * hw.mbu
        try:
            self._active = _model_figure(model, "params_active", None)
            self._weights = _model_figure(model, "weight_bytes", None)
            self._missing = None
        except ValueError as exc:  # raised by the first step that runs a forward, as step_cost does
            self._missing = exc

    def __call__(self, prefill_tokens: int, decode_tokens: int, kv_bytes_read: int,
                 moved_bytes: int) -> float:
        move_s = self.move_time_s(moved_bytes)
        tokens = prefill_tokens + decode_tokens
        if tokens == 0:
            return move_s
        if self._missing is not None:
            raise self._missing
        compute_s = 2 * self._active * tokens / self._flops
        hbm_s = (self._weights + kv_bytes_read) / self._hbm
        return self.hw.step_overhead_s + max(compute_s, hbm_s) + move_s

    def move_time_s(self, moved_bytes: int) -> float:
        return 2 * moved_bytes / self.hw.move_bytes_per_s


"""Step-time cost model of one engine step on an H200-class GPU.

    step = overhead + max(compute, hbm) + move
    compute = 2 * params_active * tokens / (peak_flops * mfu)
    hbm     = (weight_bytes + kv_bytes_read) / (hbm_bytes_per_s * mbu)
    move    = 2 * moved_bytes / move_bytes_per_s

A roofline: a step is bound by its matmul FLOPs or by the bytes it reads,
plus the page moves compaction made (each moved byte read once and written
once; `move_bytes_per_s` counts read + written bytes). Every coefficient, its
source and its caveats are in docs/cost_model.md.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from unikv.sim.models import ModelSpec

_H200_SOURCES = {
    "peak_flops": "NVIDIA H200 SXM: BF16 Tensor Core 1,979 TFLOPS with 2:4 sparsity, so 989 TFLOPS "
                  "dense (docs/cost_model.md)",
    "hbm_bytes_per_s": "NVIDIA H200 SXM: 4.8 TB/s HBM3e",
    "mfu": "assumption: typical achieved fraction of dense peak for prefill GEMMs",
    "mbu": "assumption: well-tuned serving stacks reach ~60-85% of peak bandwidth in decode",
    "move_bytes_per_s": "project measurement on its H200: device-to-device copy ~4.3 TB/s "
                        "(bytes read + written)",
    "step_overhead_s": "assumption: scheduler + launch overhead per step, not measured",
}


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One accelerator's cost coefficients (defaults: one NVIDIA H200 SXM).

    Attributes:
        name: a label for results tables.
        peak_flops: dense bf16 peak, FLOP/s.
        hbm_bytes_per_s: peak HBM bandwidth, bytes/s.
        mfu: achievable fraction of peak_flops (0, 1].
        mbu: achievable fraction of hbm_bytes_per_s (0, 1].
        move_bytes_per_s: page-move bandwidth, bytes read + written per second.
        step_overhead_s: fixed time per step (scheduling, launches), seconds.
        sources: where each coefficient came from.
    """

    name: str = "H200-SXM"
    peak_flops: float = 989e12
    hbm_bytes_per_s: float = 4.8e12
    mfu: float = 0.5
    mbu: float = 0.7
    move_bytes_per_s: float = 4.3e12
    step_overhead_s: float = 2e-3
    sources: Mapping[str, str] = field(default_factory=lambda: dict(_H200_SOURCES), hash=False)

    def __post_init__(self) -> None:
        for name in ("peak_flops", "hbm_bytes_per_s", "move_bytes_per_s"):
            _check_number(name, getattr(self, name), low=0.0, open_low=True)
        for name in ("mfu", "mbu"):
            _check_number(name, getattr(self, name), low=0.0, open_low=True, high=1.0)
        _check_number("step_overhead_s", self.step_overhead_s, low=0.0)
        object.__setattr__(self, "sources", dict(self.sources))

    @classmethod
    def from_results(cls, path: str | Path = "results/kernels", *, impl: str | None = None,
                     **overrides) -> HardwareSpec:
        """Defaults (plus `overrides`), with move_bytes_per_s from a measured CSV if present.

        `path` is a CSV file or a folder of them (long format with columns
        'impl', 'page_bytes', 'pages', 'bytes_per_s'; an 'op'/'kernel'/'bench'
        column, if any, must say move_pages). Rows of `impl` (default: the
        impl with the highest median bandwidth) at the largest transfer
        (page_bytes x pages) give the median bytes_per_s. A missing file or
        column, or no usable row, keeps the default.
        """
        hw = cls(**overrides)
        if "move_bytes_per_s" in overrides:
            return hw
        found = _measured_move_bandwidth(Path(path), impl)
        if found is None:
            return hw
        value, where = found
        return replace(hw, move_bytes_per_s=value,
                       sources=hw.sources | {"move_bytes_per_s": f"measured: {where}"})


def _check_number(name: str, value, *, low: float, open_low: bool = False,
                  high: float = math.inf) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and value <= high
    if not ok:
        bound = f"in ({low}, {high}]" if high < math.inf else (f"> {low}" if open_low else f">= {low}")
        raise ValueError(f"HardwareSpec: {name}={value!r} must be a finite number {bound}")


def _measured_move_bandwidth(path: Path, impl: str | None) -> tuple[float, str] | None:
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path] if path.is_file() else []
    rows = [row for f in files for row in _move_rows(f)]
    if not rows:
        return None
    by_impl: dict[str, list] = {}
    for row in rows:
        by_impl.setdefault(row[0], []).append(row)
    if impl is None:  # the project's own move kernel when measured, else the fastest
        impl = "triton" if "triton" in by_impl else max(
            by_impl, key=lambda k: statistics.median(r[2] for r in by_impl[k]))
    chosen = by_impl.get(impl)
    if not chosen:
        return None
    largest = max(r[1] for r in chosen)
    value = statistics.median(r[2] for r in chosen if r[1] == largest)
    return value, f"{', '.join(map(str, files))} impl={impl} at {largest} bytes per move"


def _move_rows(path: Path) -> list[tuple[str, int, float]]:
    """(impl, page_bytes * pages, bytes_per_s) of the move_pages rows of one CSV."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            cols = set(reader.fieldnames or ())
            impl_col = next((c for c in ("impl", "method") if c in cols), None)
            bw_col = next((c for c in ("bytes_per_s", "gbps") if c in cols), None)
            if impl_col is None or bw_col is None or not {"page_bytes", "pages"} <= cols:
                return []
            scale = 1e9 if bw_col == "gbps" else 1.0  # bench_kernels.py writes GB/s
            op_col = next((c for c in ("op", "kernel", "bench") if c in cols), None)
            out = []
            for row in reader:
                if op_col and "move" not in str(row[op_col]):
                    continue
                try:
                    size = int(float(row["page_bytes"])) * int(float(row["pages"]))
                    bw = float(row[bw_col]) * scale
                except (TypeError, ValueError):
                    continue
                if bw > 0 and math.isfinite(bw):
                    out.append((row[impl_col], size, bw))
            return out
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


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
        raise ValueError(f"model {model.name!r} has {name}={value!r}; pass {name}=... "
                         "(or load a bundled model that has it)")
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


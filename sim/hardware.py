"""An accelerator as the cost model sees it: `HardwareSpec`, package data with provenance.

The bundled accelerators are JSON files in `sim/data/hardware/` (one per
GPU: the H200 with its measured page-move bandwidth, the others from their
datasheets), loaded by name or from a user's file of the same schema
(docs/cost_model.md, "Hardware files").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

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


def gpu_names() -> list[str]:
    """The bundled GPUs `--gpu` selects (the same as `hardware_names()`)."""
    return hardware_names()


def load_gpu(name: str) -> HardwareSpec:
    """The bundled spec of GPU `name` (`--gpu NAME`).

    Raises:
        ValueError: an unknown name, in one line listing the known ones.
    """
    if not isinstance(name, str) or name not in gpu_names():
        raise ValueError(f"gpu={name!r} is not a bundled GPU; known: {', '.join(gpu_names())}")
    return HardwareSpec.load(name)


def spec_source(name_or_path: str | Path) -> str:
    """Where a spec `HardwareSpec.load(name_or_path)` reads comes from, for
    summaries: "bundled sim/data/hardware/<name>.json" or the file's path."""
    if isinstance(name_or_path, str) and name_or_path in hardware_names():
        return f"bundled sim/data/hardware/{name_or_path}.json"
    return str(Path(name_or_path).resolve())

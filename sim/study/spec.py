"""The study file: a TOML grid of traces, models, a GPU, KV budgets,
layouts, scheduler settings, objectives and seeds (docs/studies.md).

Validated with pydantic v2; every error names the field path
(`traces[0].rates_rps`, `budgets[1].mem_fraction`). Unknown keys are
errors. This module imports pydantic: only `unikv study` loads it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from unikv.sim.config import COMPACTIONS, LAYOUTS, OVERSIZE, SchedulerConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # the study extra installs tomli there
    import tomli as tomllib

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(ge=1, strict=True)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceSpec(_Strict):
    """One trace and the loads it is replayed at."""

    trace: str = Field(min_length=1, description="bundled sample name or a trace file path")
    window_s: tuple[Annotated[float, Field(ge=0, allow_inf_nan=False)], Positive] | None = None
    rate_scales: list[Positive] | None = None
    rates_rps: list[Positive] | None = None
    rate_rps: Positive | None = None
    spread_s: Positive | None = None
    max_requests: PositiveInt | None = None
    max_context_tokens: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_rate_form(self) -> TraceSpec:
        if self.rate_scales is not None and self.rates_rps is not None:
            raise ValueError("give rate_scales or rates_rps, not both")
        for name in ("rate_scales", "rates_rps"):
            if getattr(self, name) == []:
                raise ValueError(f"{name} is empty; give at least one value or leave it out")
        if self.window_s is not None and not self.window_s[0] < self.window_s[1]:
            raise ValueError(f"window_s={list(self.window_s)}: start must be < end (seconds)")
        return self


class ModelsSpec(_Strict):
    names: list[str] = Field(min_length=1, description="bundled model names or config.json paths")
    kv_cache_dtype: Literal["bf16", "fp8_e4m3", "fp8_e5m2"] = "bf16"


class GpuSpec(_Strict):
    name: str = Field(default="h200", min_length=1, description="hardware name or JSON file")
    hbm_capacity_gib: Positive | None = Field(default=None, description="override the spec's HBM, GiB")


class BudgetSpec(_Strict):
    """One KV budget: explicit GiB, or derived as an engine derives it."""

    gib: Positive | None = None
    derive: Literal["sglang", "vllm"] | None = None
    mem_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    activation_reserve_gib: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> BudgetSpec:
        if (self.gib is None) == (self.derive is None):
            raise ValueError("give exactly one of gib (explicit) or derive ('sglang' or 'vllm')")
        if self.gib is not None and (self.mem_fraction is not None or self.activation_reserve_gib is not None):
            raise ValueError("mem_fraction and activation_reserve_gib apply only with derive")
        return self


class LayoutsSpec(_Strict):
    kinds: list[Literal[LAYOUTS]] = Field(min_length=1)  # type: ignore[valid-type]
    fixed_ratios: list[Positive] = Field(default_factory=list)
    compactions: list[Literal[COMPACTIONS]] = Field(default_factory=lambda: ["lazy"])  # type: ignore[valid-type]
    page_size: PositiveInt = 16
    oversize: Literal[OVERSIZE] = "reject"  # type: ignore[valid-type]
    # With both engine baselines in kinds and scheduler.engine unset, the other
    # layouts run under each engine's rules (labels "...@sglang", "...@vllm");
    # this names the one engine they run under instead (labels untagged).
    others_engine: Literal["sglang", "vllm"] | None = None

    @model_validator(mode="after")
    def _ratios(self) -> LayoutsSpec:
        if "fixed_ratio" in self.kinds and not self.fixed_ratios:
            raise ValueError("kinds names fixed_ratio: give fixed_ratios (e.g. [0.5, 1.0])")
        if self.fixed_ratios and "fixed_ratio" not in self.kinds:
            raise ValueError("fixed_ratios given but kinds does not name fixed_ratio")
        return self


class SchedulerSpec(_Strict):
    """`sim.config.SchedulerConfig`'s fields; its own checks run too."""

    max_running: PositiveInt | None = None
    prefill_tokens_per_step: PositiveInt | None = None
    prefix_cache: bool | None = None
    block_tokens: PositiveInt | None = None
    reserve_init: float | None = None
    reserve_min: float | None = None
    reserve_decay: float | None = None
    engine: str | None = None
    state_slots_per_request: PositiveInt | None = None
    mamba_cache_strategy: str | None = None
    overlap_schedule: bool | None = None

    @model_validator(mode="after")
    def _engine_checks(self) -> SchedulerSpec:
        self.config()  # SchedulerConfig's messages already name scheduler.<field>
        return self

    def config(self) -> SchedulerConfig:
        """The `SchedulerConfig` these settings give (unset: its defaults)."""
        return SchedulerConfig(**self.model_dump(exclude_none=True))


class SearchSpec(_Strict):
    """`[search]`: bisect each cell's rate scale for the highest one whose
    objectives hold (`unikv.sim.study.answers.max_rate`), starting from the
    rates the grid ran."""

    rate_scale_lo: Positive
    rate_scale_hi: Positive
    rel_tol: Annotated[float, Field(gt=0, le=3, allow_inf_nan=False)] = 0.1

    @model_validator(mode="after")
    def _range(self) -> SearchSpec:
        if not self.rate_scale_lo < self.rate_scale_hi:
            raise ValueError(f"rate_scale_lo={self.rate_scale_lo!r} must be below "
                             f"rate_scale_hi={self.rate_scale_hi!r}")
        return self


class StudyHeader(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="names the output folder")
    seeds: list[Annotated[int, Field(ge=0, strict=True)]] = Field(default_factory=lambda: [0], min_length=1)


class Study(_Strict):
    """A whole study file."""

    study: StudyHeader
    traces: list[TraceSpec] = Field(min_length=1)
    models: ModelsSpec
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    budgets: list[BudgetSpec] = Field(min_length=1)
    layouts: LayoutsSpec
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    objectives: dict[str, Positive] = Field(default_factory=dict)
    search: SearchSpec | None = None

    @model_validator(mode="after")
    def _search_needs_objectives(self) -> Study:
        if self.search is not None and not self.objectives:
            raise ValueError("search: a rate search needs [objectives] (what the highest rate must meet)")
        return self

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, value: dict[str, float]) -> dict[str, float]:
        if value:
            from unikv.sim.objectives import Objectives
            Objectives.from_mapping(value)  # its messages name objectives.<key>
        return value


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: ValidationError) -> str:
    """The first error of `error`, one line, naming its field path."""
    # an unknown key first: a misspelt table also leaves its real name missing
    first = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    where = _path(tuple(p for p in first["loc"] if not str(p).startswith(("function-", "literal["))))
    text = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        text = "unknown key (docs/studies.md lists the keys of each table)"
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f"={value!r}"
    more = len(error.errors()) - 1
    return f"{where or 'study'}{shown}: {text}" + (f" (and {more} more error(s))" if more else "")


def parse_study(data: dict) -> Study:
    """A `Study` from a TOML document's mapping.

    Raises:
        ValueError: one line naming the first bad field's path, its value
            and what was expected.
    """
    try:
        return Study.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"study file: {_message(exc)}") from None


def load_study(path: str | Path) -> Study:
    """Read and validate a study file.

    Raises:
        OSError: the file cannot be read.
        ValueError: not TOML (with the line), or a bad field (`parse_study`).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not a valid TOML file: {exc}") from None
    try:
        return parse_study(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


"""A study expanded into runs, each with a content-addressed id.

The runs are traces x loads x models x budgets x seeds x the layout cells
`unikv compare` would run (`sim.cli.grid`: layouts x compactions x fixed
ratios, under each engine's rules). A run id is 16 hex digits of SHA-256
over the canonical JSON of every input that changes the row (`run_inputs`
and the objectives, whose columns the row holds; docs/studies.md, "Run
ids"): the same inputs give the same id in any process, wherever the
files live.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from unikv.sim.config import RunConfig
from unikv.sim.study.budget import DerivedBudget, derive_budget, explicit_budget
from unikv.sim.study.spec import BudgetSpec, Study, TraceSpec

import unikv
from unikv import traces


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run of a study.

    Attributes:
        run_id: the content address (`run_id_of(run_inputs(...))`).
        config: what `sim.run.run` replays; None when the run cannot be set
            up (`problem` says why).
        columns: the identity columns known before the run (docs/studies.md).
        problem: why the run is inapplicable before it starts, or None.
        objectives: the study's targets (`unikv.sim.objectives` names).
    """

    run_id: str
    config: RunConfig | None
    columns: dict
    problem: str | None = None
    objectives: dict = field(default_factory=dict)


def canonical_json(value) -> str:
    """Sorted keys, no spaces, non-JSON values as strings: one text per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_id_of(inputs: dict) -> str:
    return sha256_text(canonical_json(inputs))[:16]


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, memoised per (path, size, modification time)."""
    st = os.stat(path)
    return _file_sha256(str(path), st.st_size, st.st_mtime_ns)


@cache
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def trace_file(trace: str) -> Path:
    """The file behind a bundled sample name or a path.

    Raises:
        ValueError: neither a sample nor an existing file.
    """
    if trace in traces.samples.names():
        return traces.samples.path(trace)
    if Path(trace).is_file():
        return Path(trace)
    raise ValueError(f"trace {trace!r} is neither a file nor a bundled sample "
                     f"({', '.join(traces.samples.names())})")


UNSET_OMITTED = ("mamba_cache_mode",)
"""Scheduler settings whose unset value (None) leaves a run as it was
before the setting existed, so it stays out of the run id."""


def run_inputs(config: RunConfig, *, trace_sha256: str, model_sha256: str, gpu_sha256: str,
               profile_sha256: str | None = None) -> dict:
    """Every input of `config` that changes the result, for the run id.

    A scheduler setting added after studies were run (`UNSET_OMITTED`)
    enters only when set: unset, it keeps the behaviour runs had before it
    existed, so their ids stay valid.

    The trace, model and GPU enter by content hash, not by name or path, and
    so does the measured step-time profile of the model on the GPU when one
    is bundled (`sim/data/profiles/`; absent: the roofline, and no key, so
    the ids of unprofiled models do not change when another model gains a
    profile); `check_every` does not change a replay's numbers and stays out."""
    inputs = config.as_dict()
    for name in ("trace", "model", "hardware", "check_every"):
        inputs.pop(name)
    for name in UNSET_OMITTED:
        if inputs["scheduler"].get(name) is None:
            inputs["scheduler"].pop(name, None)
    for name in ("compile_decode", "compile_prefill", "prefill_graphs"):  # added after studies were run: off, runs are as before
        if not inputs.get(name):
            inputs.pop(name, None)
    inputs["kv_budget_bytes"] = round(inputs.pop("kv_budget_gib") * (1 << 30))
    inputs.update(trace_sha256=trace_sha256, model_sha256=model_sha256, gpu_sha256=gpu_sha256,
                  unikv_version=unikv.__version__)
    if profile_sha256 is not None:
        inputs["profile_sha256"] = profile_sha256
    return inputs


def profile_sha256(model_name: str, gpu: str) -> str | None:
    """The content hash of the step-time profile a replay of `model_name` on
    `gpu` uses (`sim.cost.step_cost_model`), or None when there is none."""
    from unikv.sim.profile import profile_path

    path = profile_path(model_name, gpu)
    return file_sha256(path) if path.is_file() else None


def _natural_rate(base: RunConfig) -> float:
    """Requests per second of the trace slice `base` selects (rate scale 1).

    Raises:
        ValueError: fewer than two requests, or all at one instant.
    """
    from unikv.sim.run import load_trace

    df = load_trace(base)
    span = float(df["arrival_s"].max() - df["arrival_s"].min())
    if len(df) < 2 or span <= 0:
        raise ValueError(f"trace {base.trace!r}: rates_rps needs arrival times spread over time "
                         f"({len(df)} request(s) over {span:g} s); give rate_scales")
    return len(df) / span


def _loads(spec: TraceSpec, base: RunConfig) -> list[tuple[float, float | None]]:
    """(rate_scale, target_rate_rps) for each load the trace is replayed at."""
    if spec.rates_rps is not None:
        natural = _natural_rate(base)
        return [(rate / natural, rate) for rate in spec.rates_rps]
    return [(scale, None) for scale in spec.rate_scales or [1.0]]


def _trace_base(spec: TraceSpec, seed: int) -> RunConfig:
    start, end = spec.window_s if spec.window_s is not None else (0.0, None)
    return RunConfig(trace=spec.trace, trace_start_s=start, trace_end_s=end, rate_rps=spec.rate_rps,
                     spread_s=spec.spread_s, max_requests=spec.max_requests,
                     max_context_tokens=spec.max_context_tokens, seed=seed)


def _budget(spec: BudgetSpec, model, hbm: int) -> DerivedBudget:
    """Raises ValueError: a derived budget that cannot be (unknown weights, weights that do not fit)."""
    if spec.gib is not None:
        return explicit_budget(spec.gib)
    assert spec.derive is not None  # BudgetSpec: exactly one of gib / derive
    return derive_budget(spec.derive, hbm_capacity_bytes=hbm, weight_bytes=model.weight_bytes,
                         model=model.name, mem_fraction=spec.mem_fraction,
                         activation_reserve_gib=spec.activation_reserve_gib)


def _budget_columns(spec: BudgetSpec, budget: DerivedBudget | None) -> dict:
    if budget is None:
        return {"budget_rule": spec.derive or "explicit", "mem_fraction": spec.mem_fraction}
    return {"budget_rule": budget.rule, "mem_fraction": budget.mem_fraction,
            "weight_bytes": budget.weight_bytes, "activation_reserve_bytes": budget.activation_reserve_bytes,
            "kv_budget_bytes": budget.kv_budget_bytes, "kv_budget_gib": budget.kv_budget_gib}


def _sched_columns(config: RunConfig) -> dict:
    return {f"sched_{k}": v for k, v in config.as_dict()["scheduler"].items()}


def expand(study: Study) -> list[RunSpec]:
    """Every run of `study`, in a stable order, without duplicates.

    Raises:
        ValueError: a trace, model or GPU the loaders refuse, or a load
            (`rates_rps`) that cannot be derived: bad input for the whole study.
    """
    from unikv.sim.cli import grid
    from unikv.sim.cost import HardwareSpec
    from unikv.sim.models import load_model

    hw = HardwareSpec.load(study.gpu.name)
    hbm = (round(study.gpu.hbm_capacity_gib * (1 << 30)) if study.gpu.hbm_capacity_gib
           else hw.hbm_capacity_bytes)
    gpu_sha = sha256_text(canonical_json(hw.as_dict()))
    models = {name: load_model(name, kv_cache_dtype=study.models.kv_cache_dtype) for name in study.models.names}
    model_sha = {n: sha256_text(canonical_json(dataclasses.asdict(m))) for n, m in models.items()}
    profile_sha = {n: profile_sha256(m.name, study.gpu.name) for n, m in models.items()}
    common = {"study": study.study.name, "gpu": study.gpu.name, "gpu_spec_sha256": gpu_sha,
              "hbm_capacity_bytes": hbm, "executor": "sim", "unikv_version": unikv.__version__}
    out: dict[str, RunSpec] = {}
    for tspec in study.traces:
        trace_sha = file_sha256(trace_file(tspec.trace))
        for seed in study.study.seeds:
            base = _trace_base(tspec, seed)
            for scale, target in _loads(tspec, base):
                for name, model in models.items():
                    cell = base.with_(rate_scale=scale, model=name, kv_cache_dtype=study.models.kv_cache_dtype,
                                      page_size=study.layouts.page_size, oversize=study.layouts.oversize,
                                      hardware=study.gpu.name, scheduler=study.scheduler.config())
                    cells = _under_one_engine(grid(cell, study.layouts.kinds, study.layouts.compactions,
                                                   study.layouts.fixed_ratios or [None]),
                                              study.layouts.others_engine)
                    head = {**common, "trace": tspec.trace, "trace_sha256": trace_sha, "target_rate_rps": target,
                            "model": name, "model_config_sha256": model_sha[name],
                            "profile_sha256": profile_sha[name]}
                    for bspec in study.budgets:
                        for spec in _budget_runs(bspec, model, hbm, study, cells, head):
                            out.setdefault(spec.run_id, spec)
    return list(out.values())


def _under_one_engine(cells: list[tuple[str, RunConfig]], engine: str | None) -> list[tuple[str, RunConfig]]:
    """`cells` with the non-baseline layouts kept only under `engine`'s rules
    (`layouts.others_engine`; None: all kept), their "@engine" tag dropped."""
    from unikv.sim.engines import ENGINE_OF_LAYOUT

    if engine is None:
        return cells
    out = []
    for label, cfg in cells:
        if cfg.layout in ENGINE_OF_LAYOUT:
            out.append((label, cfg))
        elif cfg.scheduler.engine == engine:
            out.append((label.removesuffix(f"@{engine}"), cfg))
    return out


def _budget_runs(bspec: BudgetSpec, model, hbm, study: Study, cells, head: dict) -> list[RunSpec]:
    """The runs of one budget over the layout cells `cells` [(label, config)]."""
    try:
        budget: DerivedBudget | None = _budget(bspec, model, hbm)
        problem = None
    except ValueError as exc:
        budget, problem = None, str(exc)
    runs = []
    for label, cfg in cells:
        columns = {**head, "label": label, **_config_columns(cfg), **_budget_columns(bspec, budget)}
        hashes = {"trace_sha256": head["trace_sha256"], "model_sha256": head["model_config_sha256"],
                  "gpu_sha256": head["gpu_spec_sha256"], "profile_sha256": head["profile_sha256"]}
        if budget is None:
            inputs = {**run_inputs(cfg, **hashes), "kv_budget_bytes": None, "objectives": study.objectives,
                      "budget": bspec.model_dump(), "hbm_capacity_bytes": hbm}
            runs.append(RunSpec(run_id=run_id_of(inputs), config=None, columns=columns, problem=problem,
                                objectives=dict(study.objectives)))
            continue
        cfg = cfg.with_(kv_budget_gib=budget.kv_budget_gib)
        inputs = {**run_inputs(cfg, **hashes), "objectives": study.objectives}
        runs.append(RunSpec(run_id=run_id_of(inputs), config=cfg, columns=columns,
                            objectives=dict(study.objectives)))
    return runs


def _config_columns(cfg: RunConfig) -> dict:
    return {"trace_start_s": cfg.trace_start_s, "trace_end_s": cfg.trace_end_s,
            "max_requests": cfg.max_requests, "max_context_tokens": cfg.max_context_tokens,
            "rate_rps": cfg.rate_rps, "spread_s": cfg.spread_s, "rate_scale": cfg.rate_scale,
            "kv_cache_dtype": cfg.kv_cache_dtype, "layout": cfg.layout, "static_ratio": cfg.static_ratio,
            "compaction": cfg.compaction, "page_size": cfg.page_size, "oversize": cfg.oversize,
            "seed": cfg.seed, **_sched_columns(cfg)}


def at_rate(spec: RunSpec, rate_scale: float) -> RunSpec:
    """`spec` replayed at another rate scale: the run `expand` makes for a
    study that lists that scale (the same content address), so a search
    point the grid already ran is found, not rerun."""
    if spec.config is None:
        raise ValueError(f"run {spec.run_id}: an inapplicable run has no rate to change")
    cfg = spec.config.with_(rate_scale=float(rate_scale))
    c = spec.columns
    hashes = {"trace_sha256": c["trace_sha256"], "model_sha256": c["model_config_sha256"],
              "gpu_sha256": c["gpu_spec_sha256"], "profile_sha256": c["profile_sha256"]}
    inputs = {**run_inputs(cfg, **hashes), "objectives": spec.objectives}
    columns = {**c, "rate_scale": cfg.rate_scale, "target_rate_rps": None}
    return RunSpec(run_id=run_id_of(inputs), config=cfg, columns=columns, objectives=dict(spec.objectives))


def rate_group(spec: RunSpec) -> str:
    """What a rate search holds fixed: every input of `spec` but its rate
    (the run id it would have at rate scale 1)."""
    return at_rate(spec, 1.0).run_id

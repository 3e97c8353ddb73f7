"""Analyses over many runs: capacity over time, eager vs lazy, layouts compared.

The notebooks under `notebooks/` and `python -m unikv.sim.results_cmd` call these
functions (as `from unikv.sim import analyses as an`) and only plot what they
return. A `TraceSpec` names one slice of a real trace (window, rate scale,
Poisson rate for length-only traces, context clip: the `RunConfig` trace
fields, loaded by `sim.run.load_trace`); a `Case` is a trace slice x model x
KV budget. Every table row carries its case (trace label, model, budget) and
its run's parameters, so a row can be reproduced with
`run_case(case, layout=..., ...)`.

Modules, one concept each:

* `slices`   - `TraceSpec`, `Case`, `run_case`, `capacity_over_time`;
* `rows`     - one run -> one row (`result_row`, `step_extras`, `band_demand`);
* `jobs`     - tables of runs over worker processes (`Job`, `run_jobs`);
* `budgets`  - size the buffer so that memory binds (`calibrate`, ...);
* `ratios`   - static split ratios (`Ratio`, `matched_ratio`);
* `sweep`    - layouts compared, static ratio sweep (`layout_runs`, ...);
* `views`    - table views (`headline`, `sweep_view`, `eager_lazy_view`);
* `headline` - the headline set of slices x models, and its studies;
* `plots`    - figures of the tables (they read tables, never run anything).

Runs go through `sim.run.run` (one torch thread each). `n_jobs > 1` spreads
the runs of one table over worker processes (spawned, so a parent that
already used torch is safe); results do not depend on `n_jobs`.
"""

from unikv.sim.analyses.budgets import (
                                  UNBOUNDED_GIB,
                                  budget_floor_gib,
                                  calibrate,
                                  demand,
                                  holds_longest,
                                  suggest_budget_gib,
)
from unikv.sim.analyses.headline import (
                                  HEADLINE_MODELS,
                                  HEADLINE_TRACES,
                                  SMALL_MAX_REQUESTS,
                                  SMALL_WINDOW_S,
                                  calibrated_cases,
                                  capacity_study,
                                  eager_vs_lazy,
                                  headline_pairs,
                                  small,
)
from unikv.sim.analyses.jobs import Job, run_jobs
from unikv.sim.analyses.plots import (
                                  LABEL_COLORS,
                                  plot_capacity_compared,
                                  plot_eager_lazy,
                                  plot_layouts,
                                  plot_sweep,
)
from unikv.sim.analyses.ratios import Ratio, matched_ratio
from unikv.sim.analyses.rows import GIB, SUMMARY_KEYS, _move_bytes_per_s, band_demand, result_row, step_extras
from unikv.sim.analyses.slices import Case, TraceSpec, capacity_over_time, run_case
from unikv.sim.analyses.sweep import (
                                  SWEEP_EXTEND,
                                  SWEEP_FACTORS,
                                  SWEEP_REFINE,
                                  SWEEP_STEP,
                                  _clamp,
                                  _default_factor,
                                  _extension,
                                  _refinement,
                                  _spread,
                                  _static_points,
                                  feasible_factors,
                                  layout_comparison,
                                  layout_runs,
                                  static_ratio_sweep,
)
from unikv.sim.analyses.views import (
                                  CASE_KEYS,
                                  EAGER_LAZY_COLUMNS,
                                  HEADLINE_COLUMNS,
                                  SWEEP_COLUMNS,
                                  _with_efficiency,
                                  best_static,
                                  eager_lazy_view,
                                  headline,
                                  sweep_view,
)
from unikv.sim.models import load_model

__all__ = [
    "CASE_KEYS", "EAGER_LAZY_COLUMNS", "GIB", "HEADLINE_COLUMNS", "HEADLINE_MODELS",
    "HEADLINE_TRACES", "LABEL_COLORS", "SMALL_MAX_REQUESTS", "SMALL_WINDOW_S", "SUMMARY_KEYS",
    "SWEEP_COLUMNS", "SWEEP_EXTEND", "SWEEP_FACTORS", "SWEEP_REFINE", "SWEEP_STEP", "UNBOUNDED_GIB",
    "Case", "Job", "Ratio", "TraceSpec", "band_demand", "best_static", "budget_floor_gib",
    "calibrate", "calibrated_cases", "capacity_over_time", "capacity_study", "demand",
    "eager_lazy_view", "eager_vs_lazy", "feasible_factors", "headline", "headline_pairs",
    "holds_longest", "layout_comparison", "layout_runs", "load_model", "matched_ratio",
    "plot_capacity_compared", "plot_eager_lazy", "plot_layouts", "plot_sweep", "result_row",
    "run_case", "run_jobs", "small", "static_ratio_sweep", "step_extras", "suggest_budget_gib",
    "sweep_view",
    # internals the tests exercise
    "_clamp", "_default_factor", "_extension", "_move_bytes_per_s", "_refinement", "_spread",
    "_static_points", "_with_efficiency",
]

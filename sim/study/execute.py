"""One study run: replay it and turn the result into its dataset row.

A run that cannot be set up for its cell (the layout does not apply to the
model, the budget cannot hold the longest request, the weights do not fit)
is `inapplicable`; one whose replay raises is `failed`; both rows carry a
one-line reason and no metrics. Ctrl-C (KeyboardInterrupt) is not caught.
"""

from __future__ import annotations

import math
import time

from unikv.sim.study.grid import RunSpec

OK, FAILED, INAPPLICABLE = "ok", "failed", "inapplicable"


def _one_line(exc: BaseException) -> str:
    from unikv.cli import one_line

    return f"{type(exc).__name__}: {one_line(exc)}"


def _clean(value):
    """NaN -> None (JSON null); everything else as is."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _offered_rate(df) -> float | None:
    """Requests replayed / span of their arrivals (None for < 2 requests or one instant)."""
    span = float(df["arrival_s"].max() - df["arrival_s"].min()) if len(df) else 0.0
    return len(df) / span if len(df) > 1 and span > 0 else None


def _result_columns(result, df, objectives: dict) -> dict:
    """Identity the replay knows, every summary metric, the objective columns."""
    ident = result.identity
    rules = ident["engine_rules"]
    cols = {"conv_state_dtype": ident["dtypes"]["conv_state"], "ssm_state_dtype": ident["dtypes"]["ssm_state"],
            "page_size": ident["page_size"], "bands": "|".join(ident["bands"]), "engine": rules["engine"],
            "state_dtype": rules["state_dtype"], "state_slots_per_request": rules["state_slots_per_request"],
            "max_running_cap": rules["max_running"], "git_revision": ident["git_revision"],
            "offered_rate_rps": _offered_rate(df), "violations": len(result.violations)}
    cols.update({k: _clean(v) for k, v in result.summary.items()})
    if objectives:
        from unikv.sim.objectives import Objectives, evaluate

        cols.update({f"target_{k}": v for k, v in objectives.items()})
        scores = evaluate(result.requests, Objectives.from_mapping(objectives),
                          duration_s=result.summary["sim_time_s"])
        cols.update({k: _clean(v) for k, v in scores.items()})
    return cols


def _replay(spec: RunSpec) -> tuple[str, str | None, dict]:
    """(status, reason, columns) of a run that has a config."""
    from unikv.sim.cli import cell_problem
    from unikv.sim.cost import HardwareSpec
    from unikv.sim.run import load_trace, run

    config = spec.config
    assert config is not None
    try:
        hw = HardwareSpec.load(config.hardware)
        df = load_trace(config)
        problem = cell_problem(config, df)
        if problem is not None:
            return INAPPLICABLE, problem, {}
        result = run(config, trace_df=df, hw=hw)
        return OK, None, _result_columns(result, df, spec.objectives)
    except Exception as exc:  # noqa: BLE001 - any failure is this run's row, and the study goes on
        return FAILED, _one_line(exc), {}


def execute(spec: RunSpec) -> dict:
    """Run `spec` and return its row (docs/studies.md, "Dataset schema").

    Returns:
        The row: `spec.columns`, run id, status, reason, the replay's
        identity and metrics when it ran, `wall_s` and `finished_at`.
    """
    t0 = time.perf_counter()
    if spec.problem is not None:
        status, reason, cols = INAPPLICABLE, spec.problem, {}
    else:
        status, reason, cols = _replay(spec)
    return make_row(spec, status, reason, cols, wall_s=time.perf_counter() - t0)


def make_row(spec: RunSpec, status: str, reason: str | None, cols: dict, *, wall_s: float) -> dict:
    """The row of `spec` with its outcome (the runner's, for a task whose worker died)."""
    row = {"run_id": spec.run_id, **spec.columns, "status": status, "reason": reason, **cols}
    row["wall_s"] = wall_s
    row["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return row

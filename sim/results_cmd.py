"""`python -m unikv.sim.results_cmd`: regenerate the committed headline tables and figures.

Runs the headline set of `sim.analyses` (real trace slices x real hybrid
models, budgets calibrated so that memory binds) and writes, under `--out`:

* `calibration.*`  - each (slice, model): unconstrained demand, budget floor, budget;
* `layouts.*`      - static split (default and best swept ratio) vs unified vs oracle;
* `static_sweep.*` - every static ratio run;
* `eager_vs_lazy.*`- compaction cost and admission of the unified layout per mode;
* `layout_runs.csv`- every run of the comparison (long format);
* figures: `layouts.png`, `static_sweep.png`, `eager_vs_lazy.png`,
  `capacity_<model>.png` / `frontiers_<model>.png` / `capacity_compared_<model>.png`.

Each table is a CSV, a markdown rendering whose header holds the exact
command, traces, models and parameters, and a JSON sidecar with the same
metadata. Plots only read those tables (and the capacity runs' steps).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from unikv.sim import analyses as an
from unikv.sim import figures
from unikv.sim.config import RunConfig
from unikv.sim.run import git_revision

import unikv

CAPACITY_TRACE = "azure_conv"
CAPACITY_MODELS = ("gemma-3-12b", "nemotron-3-nano-30b-a3b")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m unikv.sim.results_cmd", description=__doc__.splitlines()[0])
    p.add_argument("--traces-dir", type=Path, default=None,
                   help="read each slice from the full upstream file in this folder "
                        "(e.g. ../shared/traces) instead of the bundled sample")
    p.add_argument("--out", type=Path, default=Path("results/analyses"), help="output folder")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--budget-fraction", type=float, default=0.6,
                   help="budget = this share of the unconstrained mean live KV bytes (default 0.6)")
    p.add_argument("--small", action="store_true", help="tiny slices and a one-point sweep (a smoke run)")
    p.add_argument("--replot", action="store_true",
                   help="only redraw layouts.png, static_sweep.png and eager_vs_lazy.png "
                        "from the tables in --out")
    return p


def plot_tables(out: Path) -> list[Path]:
    """The figures drawn from the saved tables (no run)."""
    table = pd.read_csv(out / "layouts.csv")
    return [an.plot_layouts(table, out / "layouts.png"),
            an.plot_sweep(pd.read_csv(out / "static_sweep.csv"), table, out / "static_sweep.png"),
            an.plot_eager_lazy(pd.read_csv(out / "eager_vs_lazy.csv"), out / "eager_vs_lazy.png")]


def _slices(pairs) -> list[dict]:
    """Each trace's slice once: its spec, size and transforms (the rate scale
    apart), and the rate scale each model replays it at."""
    out = {}
    for spec, model in pairs:
        if spec.name not in out:
            d = spec.describe()
            d["history"] = [h for h in d["history"] if not h.startswith("scale_rate")]
            d["rate_scale_by_model"] = {}
            out[spec.name] = d
        out[spec.name]["rate_scale_by_model"][model] = spec.rate_scale
    for d in out.values():
        del d["rate_scale"]
    return list(out.values())


def _metadata(args: argparse.Namespace, argv: Sequence[str], pairs, calibration, started: float) -> dict:
    defaults = RunConfig()
    return {
        "command": " ".join(["python -m unikv.sim.results_cmd", *(shlex.quote(a) for a in argv)]),
        "generated_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "wall_s": round(time.perf_counter() - started, 1),
        "git_revision": git_revision(), "unikv_version": unikv.__version__,
        "traces": _slices(pairs),
        "models": sorted({m for _, m in pairs}),
        "budgets_gib": [{"trace": t.name, "model": m, "rate_scale": t.rate_scale, "kv_budget_gib": b}
                        for (t, m), b in zip(pairs, calibration["budget_gib"])],
        "budget_rule": f"budget = max({args.budget_fraction} x the unconstrained oracle's time-mean "
                       "live KV bytes (128 GiB buffer, prefix cache off), 1.1 x the smallest budget "
                       "whose static default and unified layouts hold the slice's longest request), "
                       "rounded up to 2 significant digits (calibration.md)",
        "sweep": {"factors": list(an.SWEEP_FACTORS), "step": an.SWEEP_STEP,
                  "extend": 0 if args.small else an.SWEEP_EXTEND,
                  "refine": 0 if args.small else an.SWEEP_REFINE,
                  "of": "the static ratio matched to the oracle's time-mean live bytes per band"},
        "page_size": defaults.page_size, "scheduler": asdict(defaults.scheduler),
        "seed": defaults.seed, "hardware": "H200 cost model (sim/cost.py, docs/cost_model.md)",
    }


def write_table(df: pd.DataFrame, out: Path, name: str, title: str, meta: dict, note: str = "") -> Path:
    """`name`.csv, `name`.md (header: command + parameters) and `name`.json."""
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv", index=False)
    slices = "\n".join(
        f"- `{t['name']}` ({t['file'].rsplit('/', 1)[-1]}): {t['requests']} requests; "
        + "; ".join(t["history"][1:]) + f"; prefix cache {'on' if t['prefix_cache'] else 'off'}; "
        f"rate_scale by model {t['rate_scale_by_model']}" for t in meta["traces"])
    sweep = meta["sweep"]
    header = (f"# {title}\n\n{note}\n\nProduced by `{meta['command']}` on {meta['generated_utc']} UTC "
              f"in {meta['wall_s']} s (git {meta['git_revision']}, unikv {meta['unikv_version']}). "
              f"Models: {', '.join(meta['models'])}. Page size {meta['page_size']}, seed {meta['seed']}, "
              f"scheduler defaults {meta['scheduler']}, {meta['hardware']}.\n\n"
              f"Budget rule: {meta['budget_rule']}.\n\nStatic sweep: multiples {sweep['factors']} of "
              f"{sweep['of']}, extended by x{sweep['step']} while the best ratio is at an end (at most "
              f"{sweep['extend']} rounds), then {sweep['refine']} round(s) of midpoints next to the best."
              f"\n\nTrace slices (the bundled samples are byte-exact prefixes of the public files):\n"
              f"{slices}\n\n")
    (out / f"{name}.md").write_text(header + _markdown(df) + "\n")
    sidecar = {"table": f"{name}.csv", "title": title, "note": note, "columns": list(df.columns), **meta}
    (out / f"{name}.json").write_text(json.dumps(sidecar, indent=2, default=str))
    return out / f"{name}.csv"


def _markdown(df: pd.DataFrame) -> str:
    try:
        return df.to_markdown(index=False, floatfmt=".4g")
    except ImportError:  # tabulate is not installed: a fixed-width block instead
        return "```\n" + df.to_string(index=False, float_format=lambda x: f"{x:.4g}") + "\n```"


def capacity_figures(cases: Sequence[an.Case], out: Path) -> list[dict]:
    """Capacity-over-time figures of the CAPACITY_TRACE cases of CAPACITY_MODELS."""
    rows = []
    for case in cases:
        if case.trace.name != CAPACITY_TRACE or case.model not in CAPACITY_MODELS:
            continue
        runs = an.capacity_study(case.trace, case.model, case.kv_budget_gib)
        unified = next(k for k in runs if "/" in k)
        name = (f"{case.model} | {unified} | {case.trace.name} x{case.trace.rate_scale:g} | "
                f"{case.kv_budget_gib:g} GiB")
        steps = runs[unified].steps
        figures.capacity_over_time(steps, f"capacity over time: {name}", out / f"capacity_{case.model}.png")
        figures.frontiers_over_time(steps, f"band frontiers: {name}", out / f"frontiers_{case.model}.png")
        an.plot_capacity_compared(runs, out / f"capacity_compared_{case.model}.png",
                                  f"{case.model} | {case.trace.name} | {case.kv_budget_gib:g} GiB")
        rows.extend({**case.labels(), "rate_scale": case.trace.rate_scale, "label": k, **an.result_row(r)}
                    for k, r in runs.items())
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    out = args.out
    if args.replot:
        for path in plot_tables(out):
            print(f"figure: {path}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    pairs = an.headline_pairs(small_slices=args.small, traces_dir=args.traces_dir)
    log = lambda msg: print(f"[{time.perf_counter() - started:6.0f} s] {msg}", flush=True)  # noqa: E731
    log(f"calibrating budgets for {len(pairs)} (slice, model) pairs")

    def progress(row: dict) -> None:
        role = row.get("role", "demand")
        extra = {"static_sweep": f" x{row.get('sweep_factor', 0):.3g}",
                 "unified": f" {row.get('compaction')}"}.get(role, "")
        log(f"  {row['trace']} | {row['model']} | {row['kv_budget_gib']:g} GiB | {role}{extra}: "
            f"{row.get('steps', 0)} steps, {row.get('wall_s', 0):.1f} s")

    calibration = an.calibrate(pairs, fraction=args.budget_fraction, n_jobs=args.jobs, progress=progress)
    cases = an.calibrated_cases(pairs, calibration)
    sweep = (1.0,) if args.small else an.SWEEP_FACTORS
    log(f"layout comparison: {len(cases)} cases")
    runs = an.layout_runs(cases, sweep=sweep, extend=0 if args.small else an.SWEEP_EXTEND,
                          refine=0 if args.small else an.SWEEP_REFINE, n_jobs=args.jobs,
                          progress=progress)
    log("capacity-over-time runs")
    capacity = pd.DataFrame(capacity_figures(cases, out))
    meta = _metadata(args, argv, pairs, calibration, started)
    table, sweep_t, eager = an.headline(runs), an.sweep_view(runs), an.eager_lazy_view(runs)
    cal = calibration.assign(mean_live_gib=calibration["mean_live_bytes"] / an.GIB,
                             peak_live_gib=calibration["peak_live_bytes"] / an.GIB)
    write_table(cal[["trace", "model", "rate_scale", "arrived", "mean_running", "ttft_p90_s",
                     "mean_live_gib", "peak_live_gib", "floor_gib", "budget_gib"]],
                out, "calibration", "Budget calibration: unconstrained demand per slice x model", meta)
    write_table(table, out, "layouts", "Layouts compared: static split vs unified pool vs oracle", meta,
                "capacity_efficiency = mean running requests / the oracle's; the best static ratio is "
                "chosen in hindsight on the same slice (see static_sweep).")
    write_table(sweep_t, out, "static_sweep", "Static split ratio sweep", meta)
    write_table(eager, out, "eager_vs_lazy", "Eager vs lazy compaction of the unified layout", meta,
                "move_time_all_s charges every moved byte at the cost model's bandwidth; move_time_s is "
                "what the engine charged to step times (it misses moves made while freeing).")
    if len(capacity):
        write_table(capacity, out, "capacity_runs", "Capacity-over-time runs (figures capacity_*.png)", meta)
    runs.to_csv(out / "layout_runs.csv", index=False)
    plot_tables(out)
    bad = int(runs["violations"].fillna(0).sum()) if "violations" in runs else 0
    log(f"done: {out} ({len(runs)} comparison runs, {bad} invariant violations)")
    with pd.option_context("display.width", 200, "display.max_columns", 12):
        print(table[["trace", "model", "kv_budget_gib", "label", "capacity_efficiency",
                     "ttft_p90_s", "retractions", "rejected"]].to_string(index=False))
    return 1 if bad else 0


if __name__ == "__main__":
    from unikv.cli import guarded  # the CLI's error policy: one line for bad input, exit 2

    sys.exit(guarded(main, sys.argv[1:]))

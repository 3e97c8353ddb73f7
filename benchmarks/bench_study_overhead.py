"""The study runner's Ray overhead per run, against the same runs done directly.

Usage: ``python benchmarks/bench_study_overhead.py [--runs N] [--window-s S] [--repeats R]``

Expands a small study (azure_conv, gemma-3-12b, end_end / oracle, one
budget) into N runs, then times them two ways in one process, alternating,
R times each: directly (``execute(spec)`` one after another in this process)
and through the study runner's Ray path (``runner.run_on_ray`` on a local Ray
of one CPU, so its tasks also run one after another). Ray is started once,
before the timed part; its start-up is timed and reported apart. The
overhead per run is (Ray wall - direct wall) / N, also as a share of the
direct run's wall time. Prints one markdown table; issue 18 item 6 asks for
<= 5 % per run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from unikv.sim.study.execute import execute
from unikv.sim.study.grid import expand
from unikv.sim.study.runner import run_on_ray
from unikv.sim.study.spec import parse_study


def _study(runs: int, window_s: float):
    scales = [1.0 + 0.25 * i for i in range((runs + 1) // 2)]
    return parse_study({
        "study": {"name": "overhead"},
        "traces": [{"trace": "azure_conv", "window_s": [0.0, window_s], "rate_scales": scales}],
        "models": {"names": ["gemma-3-12b"]}, "budgets": [{"gib": 4.0}],
        "layouts": {"kinds": ["end_end", "oracle"]}, "objectives": {"ttft_p90_s": 2.0},
    })


def _direct(specs) -> float:
    t0 = time.perf_counter()
    for spec in specs:
        execute(spec)
    return time.perf_counter() - t0


def _via_ray(specs) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_on_ray(specs, Path(tmp), None)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """Time the runs both ways and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6, help="runs per timing (default 6)")
    ap.add_argument("--window-s", type=float, default=120.0, help="trace window, s (default 120)")
    ap.add_argument("--repeats", type=int, default=3, help="timings of each path (default 3)")
    args = ap.parse_args(argv)
    import ray

    specs = expand(_study(args.runs, args.window_s))[: args.runs]
    t0 = time.perf_counter()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    start_s = time.perf_counter() - t0
    _via_ray(specs[:1])  # the worker's first import, not a run's cost
    direct, via = [], []
    for _ in range(args.repeats):
        direct.append(_direct(specs))
        via.append(_via_ray(specs))
    ray.shutdown()
    d, r = statistics.median(direct), statistics.median(via)
    per_run = (r - d) / len(specs)
    print(f"| runs | direct s (median of {args.repeats}) | via Ray s | overhead per run | share of a run | Ray start s |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {len(specs)} | {d:.2f} | {r:.2f} | {per_run * 1e3:.0f} ms | {100 * per_run / (d / len(specs)):.1f} % "
          f"| {start_s:.1f} |")
    print(f"\ndirect: {', '.join(f'{x:.2f}' for x in direct)} s; via Ray: {', '.join(f'{x:.2f}' for x in via)} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Simulator speed: wall time and simulated steps per wall second, per layout,
for a replay of a real production trace (default: the whole hour of the Azure
LLM inference 2023 conversation trace, 19,366 requests).

Not a test: prints a markdown table and appends rows to
results/sim_speed/replay_speed.csv, with a cProfile breakdown of the first
layout in results/sim_speed/profile_<layout>.txt.

    python benchmarks/bench_replay.py --trace ../shared/traces/azure_llm_2023_conv.csv
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import platform
import pstats
import time
from pathlib import Path

import torch
from unikv.sim.config import RunConfig
from unikv.sim.run import git_revision, run

OUT = Path(__file__).resolve().parents[1] / "results" / "sim_speed"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trace", default=str(Path(__file__).resolve().parents[2] / "shared" / "traces"
                                          / "azure_llm_2023_conv.csv"))
    p.add_argument("--model", default="gemma-3-12b")
    p.add_argument("--kv-budget-gib", type=float, default=8.0)
    p.add_argument("--layouts", nargs="+", default=["fixed_ratio", "end_end", "oracle"])
    p.add_argument("--end-s", type=float, default=None, help="replay only the first END_S seconds")
    p.add_argument("--profile", action="store_true", help="cProfile the first layout")
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, layout in enumerate(args.layouts):
        cfg = RunConfig(trace=args.trace, trace_end_s=args.end_s, model=args.model,
                        kv_budget_gib=args.kv_budget_gib, layout=layout)
        prof = cProfile.Profile() if args.profile and i == 0 else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        res = run(cfg)
        if prof:
            prof.disable()
        wall = time.perf_counter() - t0
        s = res.summary
        rows.append(dict(layout=layout, model=args.model, kv_budget_gib=args.kv_budget_gib,
                         trace=Path(args.trace).name, requests=s["arrived"], steps=s["steps"],
                         sim_time_s=round(s["sim_time_s"], 1), wall_s=round(wall, 2),
                         steps_per_wall_s=round(s["steps"] / wall), us_per_step=round(1e6 * wall / s["steps"], 1),
                         profiled=bool(prof), machine=platform.processor() or platform.machine(),
                         torch=torch.__version__, git=git_revision(), date=time.strftime("%Y-%m-%d")))
        print(rows[-1], flush=True)
        if prof:
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
            (OUT / f"profile_{layout}.txt").write_text(buf.getvalue())
    path = OUT / "replay_speed.csv"
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    print("\n| layout | requests | steps | wall s | steps / wall s | µs / step |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['requests']} | {r['steps']} | {r['wall_s']} | {r['steps_per_wall_s']} | {r['us_per_step']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

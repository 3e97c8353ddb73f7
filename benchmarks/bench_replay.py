"""Simulator speed: wall time, process time and simulated steps per second,
per layout, for a replay of a real production trace (default: the whole
hour of the Azure LLM inference 2023 conversation trace, 19,366 requests).

Not a test: prints a markdown table and appends rows to
results/sim_speed/replay_speed.csv, with a cProfile breakdown of the first
layout in results/sim_speed/profile_<layout>.txt (`--profile`).

`--before DIR` measures a speedup in one sitting: each replay runs in a
fresh process, alternately on DIR (a checkout of the starting revision
whose unikv/ holds links sim -> ../sim and traces -> ../traces, so that
`PYTHONPATH=DIR` imports it instead of this tree) and on this tree, in
ABBA order per round; both the process time (`time.process_time`: the
CPU this process used, robust to the other jobs sharing the cores) and
the wall time are kept. Every child prints the `unikv` it imported.

    python benchmarks/bench_replay.py
    python benchmarks/bench_replay.py --layouts end_end --before /tmp/simspeed_before --rounds 2
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "sim_speed"
TRACE = "azure_llm_2023_conv.csv"


def default_trace() -> str:
    """The shared trace folder beside the checkout (or beside its parent:
    a worktree one level further down)."""
    for base in (ROOT.parent, ROOT.parent.parent):
        path = base / "shared" / "traces" / TRACE
        if path.exists():
            return str(path)
    return str(ROOT.parent / "shared" / "traces" / TRACE)


def replay(args, layout: str, model: str, budget: float, profile: bool = False) -> dict:
    """One replay in this process: its summary counts and times."""
    from unikv.sim.config import RunConfig
    from unikv.sim.run import git_revision, run

    import unikv
    extra = {} if args.oversize is None else {"oversize": args.oversize}
    cfg = RunConfig(trace=args.trace, trace_end_s=args.end_s, model=model, kv_budget_gib=budget,
                    layout=layout, **extra)
    prof = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    res = run(cfg)
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
        (OUT / f"profile_{layout}.txt").write_text(buf.getvalue())
    s = res.summary
    return dict(layout=layout, model=model, kv_budget_gib=budget, trace=Path(args.trace).name,
                requests=s["arrived"], steps=s["steps"], sim_time_s=round(s["sim_time_s"], 1),
                wall_s=round(wall, 2), cpu_s=round(cpu, 2), us_per_step=round(1e6 * wall / s["steps"], 1),
                cpu_us_per_step=round(1e6 * cpu / s["steps"], 1), profiled=profile,
                machine=platform.processor() or platform.machine(), git=git_revision(),
                unikv=str(Path(unikv.__file__).parent), date=time.strftime("%Y-%m-%d"))


def child(args, layout: str, model: str, budget: float, before: str | None) -> dict:
    """`replay` in a fresh process, on `before` (a PYTHONPATH) or this tree."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if before:
        env["PYTHONPATH"] = before
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--trace", args.trace,
           "--layouts", layout, "--model", model, "--kv-budget-gib", str(budget)]
    if args.end_s is not None:
        cmd += ["--end-s", str(args.end_s)]
    if args.oversize is not None:
        cmd += ["--oversize", args.oversize]
    out = subprocess.run(cmd, env=env, cwd="/" if before else ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{'before' if before else 'after'} {layout} on {model} failed:\n{out.stderr[-2000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["version"] = "before" if before else "after"
    return row


def cases(args) -> list[tuple[str, str, float]]:
    """(layout, model, budget): `--layouts` on `--model`, then `--float-model`'s float layout."""
    out = [(layout, args.model, args.kv_budget_gib) for layout in args.layouts]
    if args.float_model:
        out.append(("end_float_end", args.float_model, args.float_budget_gib))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=default_trace())
    p.add_argument("--model", default="gemma-3-12b")
    p.add_argument("--kv-budget-gib", type=float, default=8.0)
    p.add_argument("--layouts", nargs="*", default=["fixed_ratio", "end_end", "oracle"])
    p.add_argument("--float-model", default=None, help="also end_float_end on this (three-kind) model")
    p.add_argument("--float-budget-gib", type=float, default=1.0)
    p.add_argument("--end-s", type=float, default=None, help="replay only the first END_S seconds")
    p.add_argument("--oversize", default=None, help="RunConfig.oversize (default: its default)")
    p.add_argument("--profile", action="store_true", help="cProfile the first layout")
    p.add_argument("--before", default=None, help="a checkout to compare against (see above)")
    p.add_argument("--rounds", type=int, default=1, help="alternations per case with --before")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(replay(args, args.layouts[0], args.model, args.kv_budget_gib)), flush=True)
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (layout, model, budget) in enumerate(cases(args)):
        if args.before is None:
            rows.append(replay(args, layout, model, budget, profile=args.profile and i == 0))
            print(rows[-1], flush=True)
            continue
        for r in range(args.rounds):
            order = [args.before, None] if r % 2 == 0 else [None, args.before]  # ABBA
            for before in order:
                rows.append(child(args, layout, model, budget, before))
                print(rows[-1], flush=True)
    write(rows)
    return 0


def write(rows: list[dict]) -> None:
    """Append `rows` to replay_speed.csv (its header on creation; a new
    column set goes to a file of its own) and print the table."""
    fields = list(rows[0])
    path = OUT / "replay_speed.csv"
    if path.exists() and path.read_text().splitlines()[0].split(",") != fields:
        path = OUT / "replay_speed_cpu.csv"
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerows(rows)
    print("\n| version | layout | model | steps | wall s | cpu s | wall µs / step | cpu µs / step |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.get('version', '')} | {r['layout']} | {r['model']} | {r['steps']} | {r['wall_s']} | "
              f"{r['cpu_s']} | {r['us_per_step']} | {r['cpu_us_per_step']} |")


if __name__ == "__main__":
    raise SystemExit(main())

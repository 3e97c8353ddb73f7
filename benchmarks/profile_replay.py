"""Where a replay's time goes: microseconds per engine step in each pool
call and each engine phase, for one layout (not a test).

Every public pool method and the engine's step phases are wrapped with a
timer (inclusive times: a phase includes the pool calls it makes; the
wrappers add ~0.3 µs per call). Prints a table sorted by time per step.
`--flush-cases` times only the lazy END flush instead, by case (band,
holes and pending pages at entry, pages moved).

    python benchmarks/profile_replay.py --layout end_end --end-s 300
    python benchmarks/profile_replay.py --layout end_end --end-s 300 --flush-cases
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from pathlib import Path

from unikv.sim.config import RunConfig
from unikv.sim.engine import Simulation
from unikv.sim.executor import CostModelExecutor
from unikv.sim.memory import Memory
from unikv.sim.run import run
from unikv.sim.scheduler import Scheduler

from unikv import OraclePool, StaticPartitionPool, UnifiedPool
from unikv.bands import EndBand

POOL = ("flush", "available_size", "available_size_bound", "alloc_decode", "alloc_extend", "take_pages",
        "release", "release_pages", "free", "free_pages", "alloc_state", "free_state", "translate", "sample",
        "set_inflight_forward", "set_inflight_pages")
SCHEDULER = ("plan", "_decode", "_continue_prefills", "_admit", "complete")
MEMORY = ("decode", "extend", "ratchet", "finish", "retract", "take_hit", "evict_some", "begin_forward",
          "sample")


def instrument(totals: collections.Counter, calls: collections.Counter) -> None:
    def wrap(cls, name: str, label: str) -> None:
        f = cls.__dict__[name]

        @functools.wraps(f)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                totals[label] += time.perf_counter() - t0
                calls[label] += 1

        setattr(cls, name, timed)

    for name in POOL:
        wrap(UnifiedPool, name, f"pool.{name}")
    for cls in (OraclePool, StaticPartitionPool):  # overrides, if any
        for name in POOL:
            if name in cls.__dict__:
                wrap(cls, name, f"pool.{name}")
    for name in SCHEDULER:
        wrap(Scheduler, name, f"scheduler.{name}")
    wrap(Simulation, "_record", "engine._record")
    for name in ("launch", "duration_s", "done"):
        wrap(CostModelExecutor, name, f"executor.{name}")
    for name in MEMORY:
        wrap(Memory, name, f"memory.{name}")


def instrument_flush(totals: collections.Counter, calls: collections.Counter) -> None:
    """Time each END band flush under a key of its case."""
    real = EndBand.flush

    @functools.wraps(real)
    def timed(self, urgent):
        key = (self.name, len(self.holes) > 0, bool(self.pending))
        t0 = time.perf_counter()
        moves = real(self, urgent)
        key += (moves > 0,)
        totals[key] += time.perf_counter() - t0
        calls[key] += 1
        return moves

    EndBand.flush = timed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(Path(__file__).resolve().parents[2] / "shared" / "traces"
                                          / "azure_llm_2023_conv.csv"))
    p.add_argument("--model", default="gemma-3-12b")
    p.add_argument("--kv-budget-gib", type=float, default=8.0)
    p.add_argument("--layout", default="end_end")
    p.add_argument("--compaction", default="lazy")
    p.add_argument("--end-s", type=float, default=300.0, help="replay the first END_S seconds")
    p.add_argument("--flush-cases", action="store_true", help="time the lazy END flush by case instead")
    args = p.parse_args()
    totals, calls = collections.Counter(), collections.Counter()
    (instrument_flush if args.flush_cases else instrument)(totals, calls)
    cfg = RunConfig(trace=args.trace, trace_end_s=args.end_s, model=args.model,
                    kv_budget_gib=args.kv_budget_gib, layout=args.layout, compaction=args.compaction)
    t0 = time.perf_counter()
    res = run(cfg)
    wall = time.perf_counter() - t0
    steps = res.summary["steps"]
    if args.flush_cases:
        print(f"{args.layout}: {steps} steps; END band flushes by case\n")
        print("| band | holes | pending | moved | calls | µs / call | µs / step |\n|---|---|---|---|---|---|---|")
        for key in sorted(totals):
            name, holes, pending, moved = key
            print(f"| {name} | {'yes' if holes else 'no'} | {'yes' if pending else 'no'} | "
                  f"{'yes' if moved else 'no'} | {calls[key]} | {1e6 * totals[key] / calls[key]:.1f} | "
                  f"{1e6 * totals[key] / steps:.2f} |")
        print(f"\nall: {1e6 * sum(totals.values()) / steps:.2f} µs per step")
        return 0
    print(f"{args.layout} ({args.model}, {args.kv_budget_gib:g} GiB, first {args.end_s:g} s): "
          f"{steps} steps, {wall:.2f} s, {1e6 * wall / steps:.1f} µs per step (instrumented)")
    pool = sum(v for k, v in totals.items() if k.startswith("pool."))
    print(f"pool calls: {1e6 * pool / steps:.1f} µs per step in all\n")
    print("| where | µs / step | calls / step | µs / call |\n|---|---|---|---|")
    for label, total in totals.most_common():
        print(f"| {label} | {1e6 * total / steps:.1f} | {calls[label] / steps:.2f} | "
              f"{1e6 * total / calls[label]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

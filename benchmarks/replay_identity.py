"""Does a change leave replays' outputs identical? (for pure speedups)

Replays a fixed set of cases on the bundled trace samples and stores their
step and request tables, summaries and violations (`save`), or replays them
again and compares with what was stored (`check`: exit status 1 on any
difference). The cases cover the three Gemma layouts, eager compaction,
Hymba's float, prefix-cached Mooncake runs and tight budgets with
retractions and evictions. Not a test: run `save` before a change and
`check` after it.

    python benchmarks/replay_identity.py save --dir /tmp/replays
    python benchmarks/replay_identity.py check --dir /tmp/replays
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
import time
from pathlib import Path

from unikv.sim.config import RunConfig
from unikv.sim.run import run

HYMBA = dict(model="hymba-1.5b-base", kv_budget_gib=1.0)
CASES = {
    "end_end": dict(trace="azure_conv", trace_end_s=300, layout="end_end"),
    "fixed_ratio": dict(trace="azure_conv", trace_end_s=300, layout="fixed_ratio"),
    "oracle": dict(trace="azure_conv", trace_end_s=300, layout="oracle"),
    "eager": dict(trace="azure_conv", trace_end_s=120, layout="end_end", compaction="eager"),
    "hymba_float": dict(trace="azure_conv", trace_end_s=120, layout="end_float_end", **HYMBA),
    "mooncake_cache": dict(trace="mooncake_conversation", layout="end_end", max_requests=400,
                           oversize="reject"),
    "mooncake_cache_hymba": dict(trace="mooncake_conversation", layout="end_float_end", max_requests=300,
                                 oversize="reject", **HYMBA),
    "tight_end_end": dict(trace="azure_conv", trace_end_s=120, layout="end_end", kv_budget_gib=0.6,
                          oversize="reject"),
    "tight_fixed_ratio": dict(trace="azure_conv", trace_end_s=120, layout="fixed_ratio", kv_budget_gib=0.6,
                              oversize="reject"),
    "tight_mooncake": dict(trace="mooncake_conversation", layout="end_end", max_requests=300,
                           kv_budget_gib=0.5, oversize="reject"),
    "tight_hymba": dict(trace="azure_conv", trace_end_s=60, layout="end_float_end",
                        model="hymba-1.5b-base", kv_budget_gib=0.25, oversize="reject"),
}
# Cases renamed since a store was saved: their outputs are looked up under the
# old name too (the layout "static" became "fixed_ratio", numbers unchanged).
STORED_AS = {"fixed_ratio": "static", "tight_fixed_ratio": "tight_static"}


def outputs(case: dict) -> tuple:
    """What a replay produced: (steps, requests, summary, violations)."""
    res = run(RunConfig(**case))
    return res.steps, res.requests, dict(res.summary), list(res.violations)


def differences(stored: tuple, now: tuple) -> list[str]:
    """What differs between two `outputs` (NaN equals NaN in the summary)."""
    out = []
    for name, a, b in (("steps", stored[0], now[0]), ("requests", stored[1], now[1])):
        if not a.equals(b):
            out.append(f"{name} table")
    same = lambda x, y: x == y or (isinstance(x, float) and isinstance(y, float)  # noqa: E731
                                   and math.isnan(x) and math.isnan(y))
    keys = set(stored[2]) | set(now[2])
    out += [f"summary[{k!r}]" for k in sorted(keys) if not same(stored[2].get(k), now[2].get(k))]
    if stored[3] != now[3]:
        out.append("violations")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("save", "check"))
    p.add_argument("--dir", required=True, help="where the stored outputs live")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = p.parse_args(argv)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name in args.cases:
        t0 = time.perf_counter()
        now = outputs(CASES[name])
        wall = time.perf_counter() - t0
        path = folder / f"{name}.pkl"
        if args.mode == "check" and not path.exists() and name in STORED_AS:
            path = folder / f"{STORED_AS[name]}.pkl"
        if args.mode == "save":
            path.write_bytes(pickle.dumps(now))
            print(f"{name}: saved ({now[2]['steps']} steps, {wall:.1f} s)")
            continue
        if not path.exists():
            print(f"{name}: nothing stored at {path}; run 'save' first")
            bad += 1
            continue
        diff = differences(pickle.loads(path.read_bytes()), now)
        bad += bool(diff)
        print(f"{name}: {'identical' if not diff else 'DIFFERS: ' + ', '.join(diff[:6])} ({wall:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The headline slices again, with the `sglang` baseline: before / after.

Before: the old "static (SGLang default)" column, i.e. `fixed_ratio` at
SGLang's default ratios with one state slot per request and bf16 state,
scored against the oracle under the same (unikv) rules. After: `sglang`
(SGLang's own split, its state slots per request, fp32 SSM state) and the
unified layout, both scored against the oracle under SGLang's rules.
Capacity efficiency = mean running requests / the oracle's.

    python results/baselines/sglang_headline.py --out results/baselines
    python results/baselines/sglang_headline.py --out results/baselines --render-only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from unikv.sim.analyses.headline import HEADLINE_MODELS, HEADLINE_TRACES
from unikv.sim.analyses.slices import Case
from unikv.sim.run import run

MODELS = ("gemma-3-12b", "nemotron-3-nano-30b-a3b")
# The calibrated budgets of results/analyses/layouts.csv (GiB) for these slices.
BUDGETS = {
    ("azure_conv", "gemma-3-12b"): 8.1, ("azure_conv", "nemotron-3-nano-30b-a3b"): 0.83,
    ("azure_code", "gemma-3-12b"): 7.8, ("azure_code", "nemotron-3-nano-30b-a3b"): 0.28,
    ("mooncake_conversation", "gemma-3-12b"): 17.0,
    ("mooncake_conversation", "nemotron-3-nano-30b-a3b"): 0.86,
    ("sharegpt_lengths", "gemma-3-12b"): 4.3, ("sharegpt_lengths", "nemotron-3-nano-30b-a3b"): 0.72,
}
RUNS = (  # label, layout, engine
    ("fixed_ratio (before)", "fixed_ratio", None), ("oracle (before)", "oracle", None),
    ("sglang", "sglang", "sglang"), ("unified (sglang rules)", "unified", "sglang"),
    ("oracle (sglang rules)", "oracle", "sglang"),
)


def _case(trace, model: str) -> Case:
    from dataclasses import replace
    spec = replace(trace, rate_scale=trace.rate_scale * HEADLINE_MODELS[model])
    return Case(trace=spec, model=model, kv_budget_gib=BUDGETS[(trace.name, model)])


def rows() -> list[dict]:
    out = []
    for trace in HEADLINE_TRACES:
        for model in MODELS:
            case = _case(trace, model)
            got = {}
            for label, layout, engine in RUNS:
                kind = ("end_end" if layout == "unified" else layout)
                try:
                    res = run(case.config(layout=kind, engine=engine, compaction="lazy"))
                    got[label] = (res.summary["mean_running"], res.identity["engine_rules"], None)
                except ValueError as exc:
                    got[label] = (float("nan"), None, str(exc))
                print(f"{trace.name} {model} {label}: {got[label][0]:.3f}", file=sys.stderr, flush=True)
            for label, _, engine in RUNS:
                running, rules_, error = got[label]
                oracle = got["oracle (before)" if engine is None else "oracle (sglang rules)"][0]
                out.append({"trace": trace.name, "model": model, "kv_budget_gib": case.kv_budget_gib,
                            "label": label, "mean_running": running,
                            "capacity_efficiency": running / oracle if oracle else float("nan"),
                            "state_slots_per_request": rules_ and rules_["state_slots_per_request"],
                            "state_dtype": rules_ and rules_["state_dtype"],
                            "max_running": rules_ and rules_["max_running"], "error": error})
    return out


def render(table: pd.DataFrame) -> str:
    """The before / after table (markdown) from the rows `rows` made."""
    key = ["trace", "model", "kv_budget_gib"]
    eff = table.pivot(index=key, columns="label", values="capacity_efficiency")
    running = table.pivot(index=key, columns="label", values="mean_running")
    eff["sglang vs the oracle (before)"] = running["sglang"] / running["oracle (before)"]
    eff["oracle (sglang rules) / oracle (before)"] = (running["oracle (sglang rules)"]
                                                      / running["oracle (before)"])
    cols = ["fixed_ratio (before)", "sglang", "unified (sglang rules)",
            "sglang vs the oracle (before)", "oracle (sglang rules) / oracle (before)"]
    order = table[key].drop_duplicates().itertuples(index=False, name=None)
    return eff.loc[list(order), cols].round(3).reset_index().to_markdown(index=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--render-only", action="store_true",
                   help="print the table from the CSV already in --out (no runs)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.render_only:
        table = pd.read_csv(args.out / "sglang_headline.csv")
    else:
        table = pd.DataFrame(rows())
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "sglang_headline.csv", index=False)
    print(render(table))
    print(f"\n{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Table views over a table of runs: efficiency vs the oracle, headline, sweep, eager vs lazy."""

from __future__ import annotations

import pandas as pd
from unikv.sim.analyses.rows import GIB

CASE_KEYS = ["trace", "model", "kv_budget_gib", "rate_scale"]


def _with_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    oracle = runs[runs["role"] == "oracle"].set_index(CASE_KEYS)
    key = pd.MultiIndex.from_frame(runs[CASE_KEYS])
    for col, base in (("capacity_efficiency", "mean_running"), ("throughput_efficiency", "throughput_tok_s")):
        runs[col] = runs[base].to_numpy() / oracle[base].reindex(key).to_numpy()
    runs["layout"] = runs["layout"].fillna("fixed_ratio")
    runs["compaction"] = runs.get("compaction", pd.Series(index=runs.index, dtype=object)).where(
        runs["layout"].isin(["end_end", "end_float_end"]))
    return runs


def best_static(runs: pd.DataFrame) -> pd.DataFrame:
    """Per case, the static run (default or swept) that holds the most running
    requests among those that reject the fewest; ties: lowest TTFT p90."""
    static = runs[runs["role"].isin(["static_default", "static_sweep"]) & runs["error"].isna()]
    fewest = static.groupby(CASE_KEYS)["rejected"].transform("min")
    static = static[static["rejected"] == fewest]
    order = static.sort_values(["mean_running", "ttft_p90_s"], ascending=[False, True])
    return order.groupby(CASE_KEYS, sort=False).head(1)


HEADLINE_COLUMNS = ["trace", "model", "kv_budget_gib", "rate_scale", "label", "layout", "compaction",
                    "static_swa_full_tokens", "static_mamba_full_memory", "capacity_efficiency",
                    "throughput_efficiency", "mean_running", "throughput_tok_s", "admission_rate",
                    "ttft_p50_s", "ttft_p90_s", "retractions", "rejected", "stall_time_frac",
                    "mean_unusable_free_ratio", "moves", "compaction_overhead"]


def headline(runs: pd.DataFrame) -> pd.DataFrame:
    """Per case: oracle, static at the default ratio, static at the best ratio
    of the sweep, and the unified layout in each compaction mode."""
    best = best_static(runs).assign(label="static (best of sweep)")
    parts = [runs[runs["role"] == "oracle"].assign(label="oracle"),
             runs[runs["role"] == "static_default"].assign(label="static (default)"), best,
             runs[runs["role"] == "unified"].pipe(
                 lambda d: d.assign(label=d["layout"] + "/" + d["compaction"]))]
    out = pd.concat(parts, ignore_index=True)
    cases = runs[CASE_KEYS].drop_duplicates().reset_index(drop=True).reset_index(names="_case")
    out = out.merge(cases, on=CASE_KEYS, how="left")
    out["_label"] = out["label"].map({"static (default)": 0, "static (best of sweep)": 1,
                                      "oracle": 9}).fillna(5)
    out = out.sort_values(["_case", "_label", "label"], kind="stable")
    return out[[c for c in HEADLINE_COLUMNS if c in out.columns]].reset_index(drop=True)


SWEEP_COLUMNS = ["trace", "model", "kv_budget_gib", "rate_scale", "role", "sweep_factor",
                 "static_swa_full_tokens", "static_mamba_full_memory", "error", "capacity_efficiency",
                 "throughput_efficiency", "mean_running", "ttft_p90_s", "rejected", "retractions",
                 "mean_unusable_free_ratio"]


def sweep_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The static runs of `layout_runs` (default ratio and sweep), best marked."""
    static = runs[runs["role"].isin(["static_default", "static_sweep"])].copy()
    static["best"] = static.index.isin(best_static(runs).index)
    return static[[c for c in SWEEP_COLUMNS if c in static.columns] + ["best"]].reset_index(drop=True)


EAGER_LAZY_COLUMNS = ["trace", "model", "kv_budget_gib", "rate_scale", "layout", "compaction",
                      "moves", "moved_gib", "move_time_all_s", "compaction_overhead_all",
                      "move_time_s", "compaction_overhead", "step_overhead_p99",
                      "step_overhead_max", "flushes", "urgent_flushes", "relocations",
                      "mean_step_time_ms", "admission_rate", "mean_running", "throughput_tok_s",
                      "ttft_p90_s", "retractions", "stall_time_frac"]


def eager_lazy_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The unified runs of a table of runs, one row per case x compaction mode."""
    out = runs[runs["layout"].isin(["end_end", "end_float_end"])].copy()
    out["moved_gib"] = out["moved_bytes"] / GIB
    return out[[c for c in EAGER_LAZY_COLUMNS if c in out.columns]].reset_index(drop=True)

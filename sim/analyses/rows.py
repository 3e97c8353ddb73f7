"""One run -> one table row: its summary, step extras and band demand (docs/results.md)."""

from __future__ import annotations

import math

import pandas as pd
from unikv.sim.run import RunResult

GIB = float(1 << 30)


SUMMARY_KEYS = ("arrived", "admitted", "finished", "rejected", "retractions", "admission_rate",
                "steps", "sim_time_s", "busy_time_s", "mean_running", "throughput_tok_s",
                "queue_delay_p90_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s",
                "prefix_hit_ratio",
                "mean_available_tokens", "mean_hole_ratio", "mean_unusable_free_ratio",
                "moves", "moved_bytes", "flushes", "urgent_flushes", "relocations",
                "move_time_s", "compaction_overhead")


def step_extras(steps: pd.DataFrame) -> dict:
    """Per-step numbers the run summary lacks (defined in docs/results.md).

    stall_time_frac: share of simulated time spent in admission stalls:
    steps that begin with requests waiting (the previous step ended with
    some) and admit none; step_overhead_p99 / _max: the 99th
    percentile and the maximum of the per-step compaction overhead;
    mean_step_time_ms.
    """
    if steps.empty:
        return dict.fromkeys(("stall_time_frac", "step_overhead_p99", "step_overhead_max",
                              "mean_step_time_ms"), math.nan)
    admitted = steps["admitted"].diff().fillna(steps["admitted"].iloc[0])
    stalled = (steps["waiting"].shift(1, fill_value=0) > 0) & (admitted == 0)
    dt = steps["step_time_s"]
    return {"stall_time_frac": float(dt[stalled].sum() / dt.sum()),
            "step_overhead_p99": float(steps["compaction_overhead"].quantile(0.99)),
            "step_overhead_max": float(steps["compaction_overhead"].max()),
            "mean_step_time_ms": float(1e3 * dt.mean())}


def band_demand(steps: pd.DataFrame) -> dict:
    """Time-weighted mean live bytes per band (`<band>_mean_live_bytes`), of all
    bands (`mean_live_bytes`), and the peak of all live bytes."""
    dt = steps["step_time_s"]
    total = float(dt.sum()) or 1.0
    bands = [c for c in steps.columns if c.endswith("live_bytes")]
    out = {f"{c[:-len('live_bytes')]}mean_live_bytes": float((steps[c] * dt).sum() / total)
           for c in bands}
    out["peak_live_bytes"] = float(steps["live_bytes"].max()) if len(steps) else 0.0
    return out


def result_row(result: RunResult) -> dict:
    """The summary numbers of one run, its step extras and band demand."""
    s = result.summary
    row = {k: s.get(k) for k in SUMMARY_KEYS}
    row.update(step_extras(result.steps))
    row.update(band_demand(result.steps))
    # All bytes moved over the run, charged at the cost model's move bandwidth:
    # the engine's per-step move_time_s misses moves made while freeing (eager).
    row["move_time_all_s"] = 2 * row["moved_bytes"] / _move_bytes_per_s(result.identity)
    busy = s.get("busy_time_s") or math.nan
    row["compaction_overhead_all"] = row["move_time_all_s"] / busy
    row.update(wall_s=result.wall_s, violations=len(result.violations),
               git_revision=result.identity["git_revision"])
    return row


def _move_bytes_per_s(identity: dict | None = None) -> float:
    """The page-move bandwidth a run was charged at (its identity's hardware,
    bytes read + written per second); no identity: the bundled H200's."""
    if identity is None:
        from unikv.sim.cost import HardwareSpec

        return HardwareSpec.h200().move_bytes_per_s
    return identity["hardware"]["coefficients"]["move_bytes_per_s"]["value"]

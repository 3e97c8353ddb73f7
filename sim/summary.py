"""A run's summary, computed from its step and request tables (METRICS.md)."""

from __future__ import annotations

import math

import pandas as pd


def _pct(series: pd.Series, q: float) -> float:
    s = series.dropna()
    return float(s.quantile(q)) if len(s) else math.nan


def _mean(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.mean()) if len(s) else math.nan


def _time_mean(steps: pd.DataFrame, column: str) -> float:
    """Mean of a per-step quantity weighted by step duration."""
    if steps.empty or steps["step_time_s"].sum() <= 0:
        return math.nan
    return float((steps[column] * steps["step_time_s"]).sum() / steps["step_time_s"].sum())


def summarize(steps: pd.DataFrame, requests: pd.DataFrame, pool_stats: dict) -> dict:
    """Admission, service, capacity, fragmentation and compaction numbers."""
    sim_time = float(steps["t_s"].iloc[-1]) if len(steps) else 0.0
    busy = float(steps["step_time_s"].sum()) if len(steps) else 0.0
    finished = requests["finished_s"].notna()
    arrived = len(requests)
    admitted = int(requests["admitted_s"].notna().sum())
    out_tokens = int(requests.loc[finished, "output_tokens"].sum())
    move_time = float(steps["move_time_s"].sum()) if len(steps) else 0.0
    return {
        "arrived": arrived,
        "admitted": admitted,
        "finished": int(finished.sum()),
        "rejected": int(requests["rejected"].sum()),
        "retractions": int(requests["retractions"].sum()),
        "admission_rate": admitted / arrived if arrived else math.nan,
        "steps": int(len(steps)),
        "sim_time_s": sim_time,
        "busy_time_s": busy,
        "mean_running": _time_mean(steps, "running"),
        "throughput_tok_s": out_tokens / sim_time if sim_time else math.nan,
        "queue_delay_p50_s": _pct(requests["queue_delay_s"], 0.5),
        "queue_delay_p90_s": _pct(requests["queue_delay_s"], 0.9),
        "ttft_mean_s": _mean(requests["ttft_s"]),
        "ttft_p50_s": _pct(requests["ttft_s"], 0.5),
        "ttft_p90_s": _pct(requests["ttft_s"], 0.9),
        "ttft_p99_s": _pct(requests["ttft_s"], 0.99),
        "tpot_mean_s": _mean(requests["tpot_s"]),
        "tpot_p90_s": _pct(requests["tpot_s"], 0.9),
        "prefix_hit_ratio": (float(requests["hit_tokens"].sum() / requests["prompt_tokens"].sum())
                             if arrived else math.nan),
        "mean_available_tokens": _time_mean(steps, "available_tokens"),
        "mean_hole_ratio": _time_mean(steps, "hole_ratio"),
        "mean_unusable_free_ratio": _time_mean(steps, "unusable_free_ratio"),
        "mean_page_slack_ratio": _time_mean(steps, "page_slack_ratio"),
        "moves": int(pool_stats.get("moves", 0)),
        "moved_bytes": int(pool_stats.get("moved_bytes", 0)),
        "flushes": int(pool_stats.get("flushes", 0)),
        "urgent_flushes": int(pool_stats.get("urgent_flushes", 0)),
        "relocations": int(pool_stats.get("relocations", 0)),
        "move_time_s": move_time,
        "compaction_overhead": move_time / busy if busy else 0.0,
        "evicted_nodes": int(steps["evicted_nodes"].iloc[-1]) if len(steps) else 0,
    }


def capacity_efficiency(summary: dict, oracle: dict) -> dict:
    """A layout's mean running requests and throughput over the oracle's."""
    def ratio(key: str) -> float:
        o = oracle.get(key)
        return summary[key] / o if o and not math.isnan(o) else math.nan

    return {"capacity_efficiency": ratio("mean_running"),
            "throughput_efficiency": ratio("throughput_tok_s")}

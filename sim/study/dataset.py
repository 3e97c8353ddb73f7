"""A study's rows: one JSON file per finished run, and the one Parquet
dataset built from them (docs/studies.md, "Dataset schema").

The columns are declared once here (`COLUMNS`); the objective columns
(`target_*`, `objective_*`, ...) follow the study's `[objectives]` table.
This module imports pyarrow: only `unikv study` loads it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1

_S, _F, _I, _I32, _B = pa.string(), pa.float64(), pa.int64(), pa.int32(), pa.bool_()
IDENTITY = [
    ("schema_version", _I32), ("run_id", _S), ("study", _S), ("status", _S), ("reason", _S),
    ("trace", _S), ("trace_sha256", _S), ("trace_start_s", _F), ("trace_end_s", _F),
    ("max_requests", _I), ("max_context_tokens", _I), ("rate_rps", _F), ("spread_s", _F),
    ("rate_scale", _F), ("target_rate_rps", _F), ("offered_rate_rps", _F),
    ("model", _S), ("model_config_sha256", _S), ("kv_cache_dtype", _S), ("conv_state_dtype", _S),
    ("ssm_state_dtype", _S), ("gpu", _S), ("gpu_spec_sha256", _S), ("profile_sha256", _S),
    ("hbm_capacity_bytes", _I),
    ("budget_rule", _S), ("mem_fraction", _F), ("weight_bytes", _I), ("activation_reserve_bytes", _I),
    ("kv_budget_bytes", _I), ("kv_budget_gib", _F), ("label", _S), ("layout", _S), ("static_ratio", _F),
    ("compaction", _S), ("page_size", _I32), ("bands", _S), ("engine", _S), ("state_dtype", _S),
    ("state_slots_per_request", _I32), ("max_running_cap", _I32),
    ("sched_max_running", _I32), ("sched_prefill_tokens_per_step", _I32), ("sched_prefix_cache", _B),
    ("sched_block_tokens", _I32), ("sched_reserve_init", _F), ("sched_reserve_min", _F),
    ("sched_reserve_decay", _F), ("sched_engine", _S), ("sched_state_slots_per_request", _I32),
    ("sched_mamba_cache_strategy", _S), ("sched_overlap_schedule", _B), ("sched_mamba_cache_mode", _S),
    ("oversize", _S), ("seed", _I), ("executor", _S), ("unikv_version", _S), ("git_revision", _S),
    ("wall_s", _F), ("finished_at", _S),
]
_INT_METRICS = ("arrived", "admitted", "finished", "rejected", "retractions", "steps", "moves", "moved_bytes",
                "flushes", "urgent_flushes", "relocations", "evicted_nodes", "max_request_tokens", "violations")
_FLOAT_METRICS = ("admission_rate", "sim_time_s", "busy_time_s", "mean_running", "throughput_tok_s",
                  "queue_delay_p50_s", "queue_delay_p90_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                  "ttft_p99_s", "tpot_mean_s", "tpot_p90_s", "prefix_hit_ratio", "mean_available_tokens",
                  "mean_hole_ratio", "mean_unusable_free_ratio", "mean_page_slack_ratio", "move_time_s",
                  "compaction_overhead", "capacity_efficiency", "throughput_efficiency")
METRICS = [(n, _I) for n in _INT_METRICS] + [(n, _F) for n in _FLOAT_METRICS]
COLUMNS = IDENTITY + METRICS
"""Every column a dataset always has, in order, with its Arrow type."""
VOLATILE = ("wall_s", "finished_at", "git_revision")
"""Columns that differ between two runs of the same inputs (not in the run id)."""
ORACLE_KEY = ("trace_sha256", "trace_start_s", "trace_end_s", "max_requests", "max_context_tokens",
              "rate_rps", "spread_s", "rate_scale", "model_config_sha256", "kv_cache_dtype", "gpu_spec_sha256",
              "kv_budget_bytes", "page_size", "sched_max_running", "sched_prefill_tokens_per_step",
              "sched_prefix_cache", "sched_block_tokens", "sched_reserve_init", "sched_reserve_min",
              "sched_reserve_decay", "sched_engine", "sched_state_slots_per_request",
              "sched_mamba_cache_strategy", "sched_overlap_schedule", "sched_mamba_cache_mode", "oversize",
              "seed")
"""What a layout's row shares with the oracle row it is compared with (`capacity_efficiency`)."""


def _objective_type(name: str) -> pa.DataType:
    if name == "met_requests":
        return _I
    return _B if name == "objectives_met" else _F


def _is_objective(name: str) -> bool:
    return name.startswith(("target_", "objective_")) or name in ("met_requests", "goodput_rps", "objectives_met")


def write_row(rows_dir: Path, row: dict) -> Path:
    """Write `row` as `rows_dir/<run_id>.json` atomically (temp file + rename):
    a row file exists whole or not at all."""
    rows_dir.mkdir(parents=True, exist_ok=True)
    final = rows_dir / f"{row['run_id']}.json"
    fd, tmp = tempfile.mkstemp(dir=rows_dir, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(row, fh, allow_nan=True)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def read_row(rows_dir: Path, run_id: str) -> dict | None:
    """The row file of `run_id` in `rows_dir`, or None when the run has none."""
    path = rows_dir / f"{run_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_rows(rows_dir: Path, run_ids: Iterable[str] | None = None) -> list[dict]:
    """The row files of `rows_dir` (only `run_ids` when given), sorted by run id."""
    wanted = None if run_ids is None else set(run_ids)
    out = []
    for path in sorted(rows_dir.glob("*.json")) if rows_dir.is_dir() else []:
        if path.name.startswith(".tmp-") or (wanted is not None and path.stem not in wanted):
            continue
        out.append(json.loads(path.read_text(encoding="utf-8")))
    return out


def _efficiencies(rows: list[dict]) -> None:
    """Fill `capacity_efficiency` / `throughput_efficiency` from each row's oracle row."""
    oracles = {tuple(r.get(k) for k in ORACLE_KEY): r for r in rows
               if r.get("layout") == "oracle" and r.get("status") == "ok"}
    for row in rows:
        oracle = oracles.get(tuple(row.get(k) for k in ORACLE_KEY))
        for col, key in (("capacity_efficiency", "mean_running"), ("throughput_efficiency", "throughput_tok_s")):
            mine, theirs = row.get(key), (oracle or {}).get(key)
            ok = row.get("status") == "ok" and mine is not None and theirs and not math.isnan(theirs)
            row[col] = mine / theirs if ok else None


def table(rows: list[dict]) -> pa.Table:
    """The dataset of `rows`: `COLUMNS`, then the objective columns present."""
    rows = [dict(r, schema_version=SCHEMA_VERSION) for r in rows]
    _efficiencies(rows)
    known = {n for n, _ in COLUMNS}
    extra = sorted({k for r in rows for k in r if _is_objective(k) and k not in known})
    fields = COLUMNS + [(n, _objective_type(n)) for n in extra]
    schema = pa.schema([pa.field(n, t) for n, t in fields])
    data = {n: [_value(r.get(n), t) for r in rows] for n, t in fields}
    return pa.table(data, schema=schema)


def _value(value, kind: pa.DataType):
    if kind == _F and value is not None:
        return float(value)
    return value


def write_dataset(path: Path, rows: list[dict]) -> Path:
    """Write `rows` as one Parquet file at `path`, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    pq.write_table(table(rows), tmp)
    os.replace(tmp, path)
    return path

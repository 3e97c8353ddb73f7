"""Metric rows appended through hooks; columns declared once (METRICS.md).

The engine appends per step one row of its raw counters (`RAW_COLUMNS`)
and one pool sample (`UnifiedPool.sample()`: the numbers the pool's bytes
and capacity follow from). When the table is read, the samples become the
pool columns (`POOL_COLUMNS` and each band's `BAND_COLUMNS`, through
`UnifiedPool.sample_columns`), and the chain totals and the ratios
(`DERIVED_COLUMNS`) are computed over the whole table, with the same
arithmetic a per-step computation would use.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

# Chain-wide step columns, in table order; per-band columns are added from the layout.
STEP_COLUMNS = (
    "step", "t_s", "step_time_s", "running", "waiting", "prefill_tokens", "decode_tokens",
    "admitted", "finished", "retracted", "rejected", "evicted_nodes", "cache_pages",
    "available_tokens", "free_bytes", "gap_bytes", "live_bytes", "hole_bytes",
    "pending_bytes", "occupied_bytes", "hole_ratio", "unusable_free_ratio",
    "slack_tokens", "allocated_token_slots", "page_slack_ratio",
    "moves", "moved_bytes", "move_time_s", "compaction_overhead",
)
BAND_COLUMNS = ("live_bytes", "hole_bytes", "pending_bytes", "occupied_bytes", "low_byte", "high_byte")
# What the engine counts per step; the pool columns come from its samples,
# the rest of STEP_COLUMNS is derived.
RAW_COLUMNS = (
    "step", "t_s", "step_time_s", "running", "waiting", "prefill_tokens", "decode_tokens",
    "admitted", "finished", "retracted", "rejected", "evicted_nodes", "cache_pages",
    "slack_tokens", "allocated_token_slots", "moves", "moved_bytes",
)
POOL_COLUMNS = ("available_tokens", "free_bytes", "gap_bytes")
DERIVED_COLUMNS = tuple(c for c in STEP_COLUMNS if c not in RAW_COLUMNS + POOL_COLUMNS)
FLOAT_COLUMNS = frozenset({"t_s", "step_time_s"})  # the other raw columns are integers

REQUEST_COLUMNS = (
    "rid", "arrival_s", "prompt_tokens", "output_tokens", "hit_tokens", "admitted_s",
    "first_token_s", "finished_s", "queue_delay_s", "ttft_s", "tpot_s", "retractions", "rejected",
)


class Recorder:
    """Collects one row per engine step and one per request.

    Args:
        band_names: the pool's bands, in chain order.
        pool_columns: a list of the steps' pool samples -> the columns
            `POOL_COLUMNS` and "<band>_<BAND_COLUMNS>" (int64 arrays);
            `UnifiedPool.sample_columns`.
        token_entry_bytes: bytes of one token of a coupled alloc (all token
            bands): available_tokens x this is the free room the joint
            alloc can use.
        move_time_s: moved bytes -> seconds (the cost model's move term).
        is_oracle: the unusable-free ratio is 0 by definition.
    """

    def __init__(self, band_names, pool_columns: Callable, *, token_entry_bytes: int = 0,
                 move_time_s: Callable = lambda moved: 0.0 * moved, is_oracle: bool = False) -> None:
        self.band_names = tuple(band_names)
        self.band_columns = tuple(f"{b}_{c}" for b in self.band_names for c in BAND_COLUMNS)
        self.columns = STEP_COLUMNS + self.band_columns
        self.raw_columns = RAW_COLUMNS
        self.pool_columns = pool_columns
        self.token_entry_bytes = token_entry_bytes
        self.move_time_s = move_time_s
        self.is_oracle = is_oracle
        self._steps: list[tuple] = []
        self._samples: list[tuple] = []
        self._requests: list[tuple] = []

    def step(self, row: tuple, sample: tuple) -> None:
        """One step's raw values (in `raw_columns` order) and its pool sample."""
        if len(row) != len(self.raw_columns):
            raise ValueError(f"step row of {len(row)} values; expected {len(self.raw_columns)} "
                             "raw columns")
        self._steps.append(row)
        self._samples.append(sample)

    def request(self, req) -> None:
        queue = None if req.admitted_s is None else req.admitted_s - req.arrival_s
        ttft = None if req.first_token_s is None else req.first_token_s - req.arrival_s
        tpot = None
        if req.finished_s is not None and req.first_token_s is not None and req.output_tokens > 1:
            tpot = (req.finished_s - req.first_token_s) / (req.output_tokens - 1)
        self._requests.append((
            req.rid, req.arrival_s, req.prompt_tokens, req.output_tokens, req.hit_tokens,
            req.admitted_s, req.first_token_s, req.finished_s, queue, ttft, tpot,
            req.retractions, req.rejected,
        ))

    def steps_frame(self) -> pd.DataFrame:
        """The step table: raw counters, chain totals and ratios (METRICS.md)."""
        df = self._raw_frame()
        for name, values in self.pool_columns(self._samples).items():
            df[name] = values
        for col in ("live_bytes", "hole_bytes", "pending_bytes", "occupied_bytes"):
            parts = [df[f"{b}_{col}"] for b in self.band_names]
            df[col] = sum(parts[1:], parts[0]) if parts else 0
        with np.errstate(divide="ignore", invalid="ignore"):
            df["hole_ratio"] = _ratio(df["hole_bytes"], df["occupied_bytes"])
            free = df["free_bytes"]
            unusable = np.maximum(0.0, 1 - (df["available_tokens"] * self.token_entry_bytes) / free)
            df["unusable_free_ratio"] = 0.0 if self.is_oracle else np.where(free > 0, unusable, 0.0)
            df["page_slack_ratio"] = _ratio(df["slack_tokens"], df["allocated_token_slots"])
            df["move_time_s"] = self.move_time_s(df["moved_bytes"]).astype(float)
            df["compaction_overhead"] = _ratio(df["move_time_s"], df["step_time_s"])
        return df[list(self.columns)]

    def _raw_frame(self) -> pd.DataFrame:
        """The raw rows as a frame: one float64 array for all, then the
        integer columns cast back (exact: every count and byte total is far
        below 2**53; checked), several times faster than `from_records`."""
        width = len(self.raw_columns)
        table = np.array(self._steps, dtype=np.float64).reshape(-1, width)
        if len(table) and np.abs(table).max() >= 2.0**53:  # cannot happen below 8 PiB
            return pd.DataFrame.from_records(self._steps, columns=list(self.raw_columns))
        return pd.DataFrame({
            name: table[:, i] if name in FLOAT_COLUMNS else table[:, i].astype(np.int64)
            for i, name in enumerate(self.raw_columns)})

    def requests_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self._requests, columns=list(REQUEST_COLUMNS))
        return df.sort_values("rid", kind="stable").reset_index(drop=True)


def _ratio(num: pd.Series, den: pd.Series) -> np.ndarray:
    """num / den where den is non-zero, else 0.0 (as float64)."""
    return np.where(den != 0, num / den, 0.0)

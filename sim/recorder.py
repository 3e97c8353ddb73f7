"""Metric rows appended through hooks; columns declared once (METRICS.md)."""

from __future__ import annotations

import pandas as pd

# Chain-wide step columns; per-band columns are added from the layout.
STEP_COLUMNS = (
    "step", "t_s", "step_time_s", "running", "waiting", "prefill_tokens", "decode_tokens",
    "admitted", "finished", "retracted", "rejected", "evicted_nodes", "cache_pages",
    "available_tokens", "free_bytes", "gap_bytes", "live_bytes", "hole_bytes",
    "pending_bytes", "occupied_bytes", "hole_ratio", "unusable_free_ratio",
    "slack_tokens", "allocated_token_slots", "page_slack_ratio",
    "moves", "moved_bytes", "move_time_s", "compaction_overhead",
)
BAND_COLUMNS = ("live_bytes", "hole_bytes", "pending_bytes", "occupied_bytes", "low_byte", "high_byte")

REQUEST_COLUMNS = (
    "rid", "arrival_s", "prompt_tokens", "output_tokens", "hit_tokens", "admitted_s",
    "first_token_s", "finished_s", "queue_delay_s", "ttft_s", "tpot_s", "retractions", "rejected",
)


class Recorder:
    """Collects one row per engine step and one per request."""

    def __init__(self, band_names) -> None:
        self.band_names = tuple(band_names)
        self.band_columns = tuple(f"{b}_{c}" for b in self.band_names for c in BAND_COLUMNS)
        self.columns = STEP_COLUMNS + self.band_columns
        self._steps: list[tuple] = []
        self._requests: list[tuple] = []

    def step(self, row: tuple) -> None:
        """One step's values, in `columns` order."""
        if len(row) != len(self.columns):
            raise ValueError(f"step row of {len(row)} values; expected {len(self.columns)} columns")
        self._steps.append(row)

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
        return pd.DataFrame.from_records(self._steps, columns=list(self.columns))

    def requests_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self._requests, columns=list(REQUEST_COLUMNS))
        return df.sort_values("rid", kind="stable").reset_index(drop=True)

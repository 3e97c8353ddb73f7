"""sim.recorder: raw step counters and pool samples in, METRICS.md columns out (by hand)."""

import numpy as np
import pytest
from unikv.sim.recorder import BAND_COLUMNS, DERIVED_COLUMNS, RAW_COLUMNS, STEP_COLUMNS, Recorder


def fake_pool_columns(bands):
    """Samples here are (available_tokens, free, gap, *band values); the
    real ones come from UnifiedPool.sample_columns."""
    def columns(samples):
        table = np.array(samples, dtype=np.int64).reshape(-1, 3 + 6 * len(bands))
        out = {"available_tokens": table[:, 0], "free_bytes": table[:, 1], "gap_bytes": table[:, 2]}
        for k, b in enumerate(bands):
            for i, c in enumerate(BAND_COLUMNS):
                out[f"{b}_{c}"] = table[:, 3 + 6 * k + i]
        return out
    return columns


def step(rec, n, *, avail, free, gap, slack, slots, moved, dt, bands):
    values = dict(step=n, t_s=float(n), step_time_s=dt, running=1, waiting=0, prefill_tokens=0,
                  decode_tokens=1, admitted=1, finished=0, retracted=0, rejected=0, evicted_nodes=0,
                  cache_pages=0, slack_tokens=slack, allocated_token_slots=slots, moves=moved // 100,
                  moved_bytes=moved)
    rec.step(tuple(values[c] for c in RAW_COLUMNS), (avail, free, gap) + tuple(v for b in bands for v in b))


def test_derived_columns_by_hand():
    rec = Recorder(["swa", "full"], fake_pool_columns(["swa", "full"]), token_entry_bytes=10,
                   move_time_s=lambda b: 2 * b / 1e3)
    # band tuples: live, hole, pending, occupied, low, high
    step(rec, 1, avail=30, free=600, gap=100, slack=3, slots=16, moved=200, dt=2.0,
         bands=[(100, 50, 0, 150, 0, 150), (200, 0, 50, 250, 750, 1000)])
    step(rec, 2, avail=0, free=0, gap=0, slack=0, slots=0, moved=0, dt=0.0, bands=[(0,) * 6, (0,) * 6])
    df = rec.steps_frame()
    assert list(df.columns) == list(STEP_COLUMNS) + [f"{b}_{c}" for b in ("swa", "full") for c in BAND_COLUMNS]
    first = df.iloc[0]
    assert (first["live_bytes"], first["hole_bytes"], first["pending_bytes"], first["occupied_bytes"]) \
        == (300, 50, 50, 400)
    assert (first["available_tokens"], first["free_bytes"], first["gap_bytes"]) == (30, 600, 100)
    assert first["hole_ratio"] == 50 / 400
    assert first["unusable_free_ratio"] == 1 - 300 / 600  # 30 tokens x 10 B usable of 600 free
    assert first["page_slack_ratio"] == 3 / 16
    assert first["move_time_s"] == 0.4 and first["compaction_overhead"] == 0.4 / 2.0
    # empty pool, idle step: every ratio is 0, not NaN
    assert df.iloc[1][list(DERIVED_COLUMNS)].tolist() == [0] * 4 + [0.0] * 5


def test_oracle_has_no_unusable_free_bytes_and_rows_are_checked():
    rec = Recorder(["full"], fake_pool_columns(["full"]), token_entry_bytes=10, is_oracle=True)
    step(rec, 1, avail=1, free=600, gap=0, slack=0, slots=0, moved=0, dt=1.0, bands=[(0,) * 6])
    assert rec.steps_frame()["unusable_free_ratio"].tolist() == [0.0]
    with pytest.raises(ValueError, match="raw columns"):
        rec.step((1, 2, 3), ())


def test_integer_columns_stay_exact_integers():
    rec = Recorder(["full"], fake_pool_columns(["full"]), token_entry_bytes=10)
    step(rec, 1, avail=3, free=7, gap=7, slack=2**40 + 1, slots=2**41, moved=0, dt=0.5, bands=[(1,) * 6])
    df = rec.steps_frame()
    assert df["slack_tokens"].dtype == "int64" and df["slack_tokens"].iloc[0] == 2**40 + 1
    assert df["t_s"].dtype == "float64" and df["step_time_s"].iloc[0] == 0.5
    # past float64's exact integers (8 PiB) the rows are read as Python ints instead
    step(rec, 2, avail=3, free=7, gap=7, slack=2**60 + 1, slots=2**61, moved=0, dt=0.5, bands=[(1,) * 6])
    assert rec.steps_frame()["slack_tokens"].tolist() == [2**40 + 1, 2**60 + 1]

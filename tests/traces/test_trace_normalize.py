"""Tests for traces.normalize: parsing raw values, drops and sorting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from unikv.traces.formats import FORMATS
from unikv.traces.normalize import (
    _hash_list,
    check_hash_lengths,
    drop_unusable,
    parse,
    sort_by_arrival,
)
from unikv.traces.readers import RawTable
from unikv.traces.schema import TraceFormatError, TraceWarning

P = Path("x.csv")


def _raw(**cols) -> RawTable:
    n = len(next(iter(cols.values())))
    return RawTable(columns={k: list(v) for k, v in cols.items()}, lines=list(range(2, n + 2)))


def test_parse_burstgpt_rezeroes_on_earliest_row():
    raw = _raw(**{"Timestamp": ["7", "5", "9"], "Request tokens": ["1", "2", "3"], "Response tokens": ["1", "0", "1"]})
    parsed = parse(P, FORMATS["burstgpt"], raw)
    assert parsed.arrival_s.tolist() == [2.0, 0.0, 4.0] and parsed.origin == "5"


def test_drop_counts_failed_separately_from_nonpositive():
    raw = _raw(**{"Timestamp": ["0", "1", "2"], "Request tokens": ["0", "2", "3"], "Response tokens": ["1", "0", "1"]})
    with pytest.warns(TraceWarning):
        kept, dropped = drop_unusable(P, FORMATS["burstgpt"], parse(P, FORMATS["burstgpt"], raw))
    assert dropped == {"failed_responses": 1, "nonpositive_lengths": 1}
    assert kept.prompt.tolist() == [3] and kept.lines.tolist() == [4]


def test_zero_output_is_not_a_failure_outside_burstgpt():
    raw = _raw(arrived_at=["0"], num_prefill_tokens=["3"], num_decode_tokens=["0"])
    with pytest.warns(TraceWarning):
        _, dropped = drop_unusable(P, FORMATS["vidur"], parse(P, FORMATS["vidur"], raw))
    assert dropped == {"failed_responses": 0, "nonpositive_lengths": 1}


def test_sort_is_stable_and_reports():
    raw = _raw(arrived_at=["1", "0", "1"], num_prefill_tokens=["1", "2", "3"], num_decode_tokens=["1", "1", "1"])
    with pytest.warns(TraceWarning, match="line 3"):
        rows, moved = sort_by_arrival(P, parse(P, FORMATS["vidur"], raw))
    assert moved and rows.prompt.tolist() == [2, 1, 3]


def test_hash_list_forms():
    assert _hash_list("1 2 3") == [1, 2, 3]
    assert _hash_list("[4, 5]") == [4, 5]
    assert _hash_list("") == []
    assert _hash_list([True]) is None and _hash_list("1 x") is None and _hash_list(3) is None


def test_hash_lengths_need_a_block_size():
    raw = _raw(timestamp=[0], input_length=[5], output_length=[1], hash_ids=[[1]])
    parsed = parse(P, FORMATS["mooncake"], raw)
    with pytest.raises(TraceFormatError, match="no block size"):
        check_hash_lengths(P, parsed, None)
    check_hash_lengths(P, parsed, 512)


def test_large_integers_stay_exact():
    raw = _raw(arrived_at=["0"], num_prefill_tokens=["123456789"], num_decode_tokens=["1"])
    assert parse(P, FORMATS["vidur"], raw).prompt.dtype == np.int64
    assert parse(P, FORMATS["vidur"], raw).prompt[0] == 123456789


@pytest.mark.parametrize("value", ["99999999999999999999999", True, "1e400", None])
def test_out_of_range_or_non_numeric_lengths_are_rejected(value):
    raw = _raw(arrived_at=["0"], num_prefill_tokens=[value], num_decode_tokens=["1"])
    with pytest.raises(TraceFormatError, match="line 2: column 'num_prefill_tokens'"):
        parse(P, FORMATS["vidur"], raw)

"""Reading in chunks, one clock for time-zone offsets, and heads that answer like the full read."""

import warnings

import pandas as pd
import pytest
from unikv.sim.config import RunConfig
from unikv.sim.run import load_trace
from unikv.traces import readers
from unikv.traces.schema import TraceFormatError

from unikv import traces


def _quiet_load(path, **opts):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", traces.TraceWarning)
        return traces.load(path, **opts)


@pytest.mark.parametrize("name", traces.samples.names())
def test_chunked_reads_give_the_frame_of_one_read(name, monkeypatch):
    path = traces.samples.path(name)
    whole = _quiet_load(path)
    monkeypatch.setattr(readers, "CHUNK_ROWS", 37)
    chunked = _quiet_load(path)
    pd.testing.assert_frame_equal(whole, chunked)
    assert whole.attrs == chunked.attrs


def test_chunks_keep_the_earliest_row_and_sort_across_chunks(write, monkeypatch):
    monkeypatch.setattr(readers, "CHUNK_ROWS", 2)
    body = "arrived_at,num_prefill_tokens,num_decode_tokens\n5,1,1\n6,2,2\n7,3,3\n2,4,4\n9,5,5\n"
    with pytest.warns(traces.TraceWarning, match="sorted"):
        df = traces.load(write(body))
    assert df["prompt_tokens"].tolist() == [4, 1, 2, 3, 5]
    assert df["arrival_s"].tolist() == [0.0, 3.0, 4.0, 5.0, 7.0] and df.attrs["time_origin"] == "2"


def test_a_chunk_without_hash_ids_after_one_with_them_is_refused(write, monkeypatch):
    monkeypatch.setattr(readers, "CHUNK_ROWS", 1)
    body = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
            '{"timestamp": 1, "input_length": 600, "output_length": 5}\n')
    with pytest.raises(TraceFormatError, match="line 2: column 'hash_ids' = None"):
        traces.load(write(body, "m.jsonl"))


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_rows_with_different_offsets_are_put_on_one_clock(write):
    # 08:00:05+08:00 is 00:00:05 UTC: five seconds after the first row, not eight hours.
    body = AZURE + "2024-05-10 00:00:00+00:00,10,5\n2024-05-10 08:00:05+08:00,20,5\n2024-05-10 00:00:07Z,30,5\n"
    df = traces.load(write(body))
    assert df["arrival_s"].tolist() == [0.0, 5.0, 7.0]


@pytest.mark.parametrize("rows, line", [
    (["2024-05-10 00:00:00+00:00", "2024-05-10 00:00:02"], 3),   # aware, then naive
    (["2024-05-10 00:00:00", "2024-05-10 08:00:02+08:00"], 3),   # naive, then aware
])
def test_naive_and_aware_timestamps_in_one_file_are_refused(write, rows, line):
    body = AZURE + "".join(f"{r},10,5\n" for r in rows)
    with pytest.raises(TraceFormatError, match=rf"line {line}: timestamp .* UTC offset, but line 2's"):
        traces.load(write(body))


def test_naive_and_aware_rows_in_different_chunks_are_refused(write, monkeypatch):
    monkeypatch.setattr(readers, "CHUNK_ROWS", 1)
    body = AZURE + "2024-05-10 00:00:00+00:00,10,5\n2024-05-10 00:00:01+00:00,10,5\n2024-05-10 00:00:02,10,5\n"
    with pytest.raises(TraceFormatError, match="line 4: timestamp '2024-05-10 00:00:02' has no UTC offset"):
        traces.load(write(body))


@pytest.mark.parametrize("name, window", [
    ("azure_conv", (0.0, 300.0)), ("azure_conv", (100.0, 250.0)), ("mooncake_conversation", (0.0, None)),
    ("mooncake_synthetic", (10.0, 20.0)), ("azure_code", (500.0, None)),
])
@pytest.mark.parametrize("n", [1, 50, 5000])
def test_a_head_gives_the_requests_of_the_full_read(name, window, n, monkeypatch):
    monkeypatch.setattr(readers, "CHUNK_ROWS", 200)
    monkeypatch.setattr(traces.loaders, "HEAD_MIN_ROWS", 8)  # heads shorter than the samples
    cfg = RunConfig(trace=str(traces.samples.path(name)), trace_start_s=window[0], trace_end_s=window[1],
                    max_requests=n)
    full = load_trace(cfg.with_(max_requests=None)).iloc[:n].reset_index(drop=True)
    head = load_trace(cfg)
    pd.testing.assert_frame_equal(full, head, check_like=False)


def test_a_head_reads_only_the_start_of_a_large_file(write, monkeypatch):
    body = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{i},5,5\n" for i in range(50_000))
    path = write(body)
    read = []
    original = readers.csv_chunks

    def counting(*args, **kwargs):
        read.append(kwargs.get("max_rows"))
        return original(*args, **kwargs)

    monkeypatch.setattr(traces.loaders, "csv_chunks", counting)
    head = traces.load_head(path, 10)
    assert read == [4096] and head.attrs["rows_read"] == 4096
    assert head["arrival_s"].iloc[:10].tolist() == [float(i) for i in range(10)]


def test_poisson_arrivals_of_a_head_are_those_of_the_full_read():
    cfg = RunConfig(trace=str(traces.samples.path("sharegpt_lengths")), rate_rps=3.0, seed=5, trace_end_s=None,
                    max_requests=30)
    full = load_trace(cfg.with_(max_requests=None)).iloc[:30].reset_index(drop=True)
    pd.testing.assert_frame_equal(full, load_trace(cfg))


def test_an_out_of_order_head_falls_back_to_the_full_read(write):
    rows = [f"{i},5,5\n" for i in range(5000)] + ["-1,7,7\n"]  # the earliest row comes last
    path = write("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(rows[:10]) + "-2,9,9\n"
                 + "".join(rows[10:]))
    with pytest.warns(traces.TraceWarning, match="sorted"):
        head = traces.load_head(path, 3)
    assert head["prompt_tokens"].iloc[0] == 9 and head.attrs["rows_read"] == 5002

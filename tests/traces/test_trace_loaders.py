"""Tests for traces.loaders.load on tiny fixtures of every format, good and bad."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from unikv.traces import TraceFormatError, TraceWarning, load, validate


def _load_quiet(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean file must load without warnings
        return load(path, **kw)


@pytest.mark.parametrize("gz", [False, True])
def test_azure_2023(write, texts, gz):
    df = _load_quiet(write(texts["azure_2023"], gz=gz))
    assert validate(df) == []
    np.testing.assert_allclose(df["arrival_s"], [0.0, 4.314579, 4.541877])
    assert df["prompt_tokens"].tolist() == [374, 396, 879] and df["output_tokens"].tolist() == [44, 109, 55]
    assert df.attrs["format"] == "azure_2023" and df.attrs["time_origin"] == "2023-11-16 18:15:46.6805900"


def test_azure_2024_with_utc_offsets(write, texts):
    df = _load_quiet(write(texts["azure_2024"]))
    assert df.attrs["format"] == "azure_2024"
    np.testing.assert_allclose(df["arrival_s"], [0.0, 1.5])


def test_mooncake_bursts_by_default_and_keeps_hashes(write, texts):
    df = _load_quiet(write(texts["mooncake"], "m.jsonl"))
    assert df["arrival_s"].tolist() == [0.0, 0.0, 3.0]
    assert df["prefix_hashes"].tolist() == [[0, 1], [0, 1, 2], [3]]
    assert df.attrs["block_tokens"] == 512 and validate(df) == []


def test_mooncake_spread_is_seeded_and_keeps_bucket_order(write, texts):
    path = write(texts["mooncake"], "m.jsonl")
    a, b = load(path, spread_s=3.0, seed=7), load(path, spread_s=3.0, seed=7)
    assert a["arrival_s"].tolist() == b["arrival_s"].tolist()
    t = a["arrival_s"].to_numpy()
    assert 0 <= t[0] <= t[1] < 3.0 <= t[2] < 6.0
    assert a["prompt_tokens"].tolist() == [600, 1100, 512]  # order inside the bucket kept
    assert "spread_buckets(width_s=3.0, seed=7)" in a.attrs["history"]


def test_burstgpt_drops_failed_responses_with_a_count(write, texts):
    with pytest.warns(TraceWarning, match=r"dropped 1 failed response\(s\).*first at line 3"):
        df = load(write(texts["burstgpt"]))
    assert df["prompt_tokens"].tolist() == [472, 417]
    assert df["arrival_s"].tolist() == [0.0, 105.5]
    assert df.attrs["dropped"] == {"failed_responses": 1, "nonpositive_lengths": 0}
    assert df.attrs["rows_read"] == 3


def test_lengths_only_at_zero_or_poisson(write, texts):
    path = write(texts["lengths"])
    assert _load_quiet(path)["arrival_s"].tolist() == [0.0, 0.0, 0.0]
    a, b = load(path, rate_rps=2.0, seed=3), load(path, rate_rps=2.0, seed=3)
    assert a["arrival_s"].tolist() == b["arrival_s"].tolist()
    assert a["arrival_s"].iloc[0] == 0.0 and np.all(np.diff(a["arrival_s"]) > 0)
    assert load(path, rate_rps=2.0, seed=4)["arrival_s"].tolist() != a["arrival_s"].tolist()


def test_rate_on_a_timed_format_is_refused(write, texts):
    with pytest.raises(TraceFormatError, match="rate_rps applies to formats without timestamps"):
        load(write(texts["vidur"]), rate_rps=1.0)


def test_vidur(write, texts):
    df = _load_quiet(write(texts["vidur"]))
    assert df.attrs["format"] == "vidur" and df["arrival_s"].tolist() == [0.0, 4.314579, 4.541877]


def test_generic_csv_with_mapping_and_units(write):
    path = write("t_ms,in,out,h\n1000,4,2,7 8\n1500,2,1,9\n")
    cols = {"arrival_s": "t_ms", "prompt_tokens": "in", "output_tokens": "out", "prefix_hashes": "h"}
    df = _load_quiet(path, columns=cols, time_unit="ms", block_tokens=2)
    assert df["arrival_s"].tolist() == [0.0, 0.5] and df["prefix_hashes"].tolist() == [[7, 8], [9]]
    assert df.attrs["format"] == "csv" and df.attrs["time_origin"] == "1000"


def test_generic_jsonl_with_datetimes(write):
    text = '{"when": "2024-01-01T00:00:00", "p": 3, "o": 4}\n{"when": "2024-01-01T00:00:02.5", "p": 5, "o": 6}\n'
    df = _load_quiet(
        write(text, "g.jsonl"), columns={"arrival_s": "when", "prompt_tokens": "p", "output_tokens": "o"},
        time_unit="datetime",
    )
    assert df["arrival_s"].tolist() == [0.0, 2.5]


def test_generic_needs_columns(write, texts):
    with pytest.raises(TraceFormatError, match="needs columns"):
        load(write(texts["vidur"]), format="csv")


def test_missing_column_names_found_and_expected(write):
    path = write("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        load(path)
    with pytest.raises(TraceFormatError, match=r"missing column\(s\) \['GeneratedTokens'\]; found \['TIMESTAMP', "):
        load(path, format="azure_2023")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.00,abc,5\n", "line 3: column 'ContextTokens' = 'abc'"),
        ("2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.00,3.5,5\n", "line 3: column 'ContextTokens' = '3.5'"),
        ("2023-11-16 18:15:46.68,374,44\nnot a time,3,5\n", "line 3: column 'TIMESTAMP' = 'not a time'"),
        ("2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.00,3\n", "line 3: expected 3 fields"),
        ("2023-11-16 18:15:46.68,374,\n", "line 2: column 'GeneratedTokens' = ''"),
    ],
)
def test_malformed_rows_name_their_line(write, body, match):
    path = write("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(TraceFormatError, match=match):
        load(path)


def test_malformed_gzip_row_names_its_line(write, texts):
    path = write(texts["vidur"] + "5.0,x,1\n", "v.csv.gz", gz=True)
    with pytest.raises(TraceFormatError, match="line 5"):
        load(path)


def test_zero_lengths_are_dropped_and_counted_and_negative_ones_refused(write):
    body = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,1\n1,0,5\n2,5,0\n3,7,7\n"
    with pytest.warns(TraceWarning, match=r"2 row\(s\) with prompt or output tokens <= 0 \(first at line 3\)"):
        df = load(write(body))
    assert df["prompt_tokens"].tolist() == [10, 7]
    assert df.attrs["dropped"]["nonpositive_lengths"] == 2
    negative = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,1\n2,5,-1\n"
    with pytest.raises(TraceFormatError, match=r"line 3: column 'num_decode_tokens' = '-1', expected an integer"):
        load(write(negative))


def test_unsorted_rows_are_sorted_with_a_warning(write):
    body = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n5,2,2\n3,3,3\n3,4,4\n"
    with pytest.warns(TraceWarning, match=r"1 row\(s\) arrive earlier.*line 4"):
        df = load(write(body))
    assert df["arrival_s"].tolist() == [0.0, 3.0, 3.0, 5.0]
    assert df["prompt_tokens"].tolist() == [1, 3, 4, 2]  # stable
    assert df.attrs["resorted"] is True


def test_hash_count_mismatch_names_the_line(write):
    text = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]}\n'
    with pytest.raises(TraceFormatError, match=r"line 1: 1 hash ids for 600 prompt tokens; expected ceil\(600/512\)"):
        load(write(text, "m.jsonl"))


def test_bad_hash_ids_name_the_line(write):
    text = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n' \
           '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": "x"}\n'
    with pytest.raises(TraceFormatError, match="line 2: column 'hash_ids'"):
        load(write(text, "m.jsonl"))


def test_block_tokens_override(write):
    text = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
    assert load(write(text, "m.jsonl"), block_tokens=256).attrs["block_tokens"] == 256


def test_max_rows(write, texts):
    assert len(load(write(texts["azure_2023"]), max_rows=2)) == 2


def test_missing_and_empty_files(write, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        load(tmp_path / "nope.csv")
    with pytest.raises(TraceFormatError, match="empty file"):
        load(write(""))


def test_header_only_file_gives_an_empty_frame(write):
    df = _load_quiet(write("arrived_at,num_prefill_tokens,num_decode_tokens\n"))
    assert len(df) == 0 and validate(df) == []

"""Tests for traces.writers.save: normalized files load back identically."""

from __future__ import annotations

import numpy as np
import pytest
from unikv.traces import TraceFormatError, load, load_sample, save, window


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_round_trip_keeps_rows_hashes_and_metadata(tmp_path, suffix):
    df = window(load_sample("mooncake_conversation"), start_s=31.0, end_s=60.0)
    out = tmp_path / f"t{suffix}"
    written = save(df, out)
    assert written[0] == out and (len(written) == 1) == (suffix == ".parquet")
    back = load(out)
    np.testing.assert_allclose(back["arrival_s"], df["arrival_s"])
    assert back["arrival_s"].iloc[0] > 0  # normalized files keep their times
    assert back["prompt_tokens"].tolist() == df["prompt_tokens"].tolist()
    assert back["prefix_hashes"].tolist() == df["prefix_hashes"].tolist()
    assert back.attrs["block_tokens"] == 512 and back.attrs["format"] == "mooncake"
    assert back.attrs["history"][:-1] == df.attrs["history"]
    assert back.attrs["history"][-1].startswith("reloaded from")


def test_csv_hashes_are_space_separated(tmp_path):
    df = load_sample("mooncake_conversation", max_rows=2)
    save(df, tmp_path / "t.csv")
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0] == "arrival_s,prompt_tokens,output_tokens,prefix_hashes"
    assert lines[1].endswith(",0 1 2 3 4 5 6 7 8 9 10 11 12 13")


def test_csv_without_sidecar_needs_block_tokens(tmp_path):
    df = load_sample("mooncake_conversation", max_rows=3)
    save(df, tmp_path / "t.csv")
    (tmp_path / "t.csv.meta.json").unlink()
    with pytest.raises(TraceFormatError, match="block_tokens"):
        load(tmp_path / "t.csv")
    assert load(tmp_path / "t.csv", block_tokens=512).attrs["format"] == "unikv_csv"


def test_save_refuses_bad_suffix_and_bad_frames(tmp_path):
    df = load_sample("azure_code", max_rows=3)
    with pytest.raises(TraceFormatError, match=r"'\.txt'"):
        save(df, tmp_path / "t.txt")
    bad = df.copy()
    bad["prompt_tokens"] = 0
    with pytest.raises(TraceFormatError, match="prompt_tokens < 1"):
        save(bad, tmp_path / "t.csv")


def test_corrupt_parquet_is_a_format_error(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TraceFormatError, match="Parquet"):
        load(tmp_path / "x.parquet")

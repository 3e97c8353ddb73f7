"""Tests for traces.samples: bundled slices load to their recorded stats and stay byte-exact."""

from __future__ import annotations

import gzip
import hashlib
import warnings

import pytest
from unikv.traces import TraceFormatError, load, load_sample, samples, validate
from unikv.traces.samples.build import CUTS
from unikv.traces.stats import summarize

NAMES = samples.names()


WHOLE = [c.name for c in CUTS if c.gzip]


def test_expected_samples_are_bundled_and_small():
    assert {"azure_conv", "azure_code", "mooncake_conversation", "sharegpt_lengths"} <= set(NAMES)
    assert samples.DEFAULT == "azure_conv"
    assert sum(samples.path(n).stat().st_size for n in NAMES) < 3 * 2**20
    assert all(samples.path(n).stat().st_size < 2**19 for n in NAMES if n not in WHOLE)
    assert all(samples.path(n).stat().st_size < 2**20 for n in WHOLE)


def test_whole_traces_are_bundled_compressed_with_every_row():
    assert len(WHOLE) == 4
    for name in WHOLE:
        data = samples.path(name).read_bytes()
        assert data[:2] == b"\x1f\x8b", name  # gzip magic: the loader decompresses it
        assert "the whole file" in samples.info(name)["cut"]
    assert samples.info("azure_conv_whole")["stats"]["rows"] == 19366  # the manifest's row count
    assert samples.info("azure_conv_whole")["stats"]["span_s"] > 3500


@pytest.mark.parametrize("name", NAMES)
def test_sample_loads_and_matches_recorded_stats(name):
    info = samples.info(name)
    data = samples.path(name).read_bytes()
    assert len(data) == info["bytes"] and hashlib.sha256(data).hexdigest() == info["sha256"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = load_sample(name)
    assert validate(df) == [] and df.attrs["format"] == info["format"]
    assert df.attrs["history"][0].startswith(f"sample {name!r}: first ")
    got, want = summarize(df), info["stats"]
    assert got["rows"] == want["rows"]
    assert got["span_s"] == pytest.approx(want["span_s"])
    for col in ("prompt_tokens", "output_tokens"):
        assert got[col] == pytest.approx(want[col]), col
    if "prefix" in want:
        assert got["prefix"]["block_refs"] == want["prefix"]["block_refs"]
        assert got["prefix"]["infinite_cache_hit_ratio"] == pytest.approx(want["prefix"]["infinite_cache_hit_ratio"])


def test_readme_names_every_sample_with_its_provenance():
    readme = (samples.DIR / "README.md").read_text()
    for name in NAMES:
        info = samples.info(name)
        assert f"`{name}`" in readme and info["file"] in readme
        assert info["source"]["commit"] in readme and info["source"]["path"] in readme


def test_unknown_sample_lists_the_known_ones():
    with pytest.raises(TraceFormatError, match="azure_conv"):
        samples.path("nope")


def test_samples_are_byte_prefixes_cut_as_recorded(shared_dir):
    for cut in CUTS:
        sample = (samples.DIR / cut.file).read_bytes()
        if cut.gzip:
            sample = gzip.decompress(sample)
        source = (shared_dir / cut.source).read_bytes()
        assert source.startswith(sample), cut.name
        if cut.gzip:  # a whole file: every byte of it (azure_llm_2023_code.csv ends without a newline)
            assert sample == source, cut.name
        else:
            assert sample.endswith(b"\n"), cut.name  # a prefix cut: whole lines only
        if cut.first_s is not None:  # the kept rows are exactly those inside the time window
            full = load(shared_dir / cut.source)
            assert int((full["arrival_s"] < cut.first_s).sum()) == samples.info(cut.name)["stats"]["rows"]

"""Tests for traces.formats: detection from the header / first record."""

from __future__ import annotations

import pytest
from unikv.traces import formats
from unikv.traces.readers import peek
from unikv.traces.schema import TraceFormatError


@pytest.mark.parametrize("name", ["azure_2023", "azure_2024", "mooncake", "burstgpt", "lengths", "vidur"])
def test_each_format_is_detected(write, texts, name):
    suffix = "jsonl" if name == "mooncake" else "csv"
    path = write(texts[name], f"t.{suffix}")
    assert formats.detect(path, peek(path)).name == name


def test_unknown_format_lists_the_known_ones(write):
    path = write("foo,bar\n1,2\n")
    with pytest.raises(TraceFormatError) as err:
        formats.detect(path, peek(path))
    message = str(err.value)
    assert "['foo', 'bar']" in message
    for name in ("azure_2023", "mooncake", "burstgpt", "vidur", "lengths"):
        assert name in message


def test_by_name_checks_container(write, texts):
    path = write(texts["mooncake"], "m.jsonl")
    with pytest.raises(TraceFormatError, match="expects csv, but the file is jsonl"):
        formats.by_name("azure_2023", peek(path), path)
    with pytest.raises(TraceFormatError, match="unknown"):
        formats.by_name("nope", peek(path), path)


def test_generic_mapping_is_checked():
    with pytest.raises(TraceFormatError, match="unknown key"):
        formats.generic("csv", {"prompt": "a"}, time_unit="s", block_tokens=None)
    with pytest.raises(TraceFormatError, match="lacks"):
        formats.generic("csv", {"prompt_tokens": "a"}, time_unit="s", block_tokens=None)
    with pytest.raises(TraceFormatError, match="block_tokens"):
        formats.generic(
            "csv", {"prompt_tokens": "a", "output_tokens": "b", "prefix_hashes": "h"}, time_unit="s", block_tokens=None
        )
    with pytest.raises(TraceFormatError, match="time_unit"):
        formats.generic("csv", {"prompt_tokens": "a", "output_tokens": "b"}, time_unit="hours", block_tokens=None)


def test_known_formats_lists_all():
    assert {"azure_2023", "azure_2024", "mooncake", "burstgpt", "vidur", "lengths", "csv", "jsonl", "parquet"} <= set(
        formats.known_formats()
    )

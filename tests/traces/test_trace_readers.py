"""Tests for traces.readers: gzip detection, peeking, raw rows with line numbers."""

from __future__ import annotations

import pytest
from unikv.traces.readers import peek, read_csv, read_jsonl
from unikv.traces.schema import TraceFormatError


@pytest.mark.parametrize("gz", [False, True])
def test_peek_csv_and_jsonl_plain_or_gzip(write, texts, gz):
    csv_peek = peek(write(texts["azure_2023"], gz=gz))
    assert csv_peek.container == "csv" and csv_peek.gzip is gz
    assert csv_peek.fields == ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    assert csv_peek.first["ContextTokens"] == "374"
    js = peek(write(texts["mooncake"], "m.jsonl", gz=gz))
    assert js.container == "jsonl" and "hash_ids" in js.fields


def test_gzip_is_detected_by_magic_not_suffix(write, texts):
    path = write(texts["vidur"], "no_suffix", gz=True)
    assert read_csv(path, ["arrived_at"]).columns["arrived_at"] == ["0.0", "4.314579", "4.541877"]


def test_peek_empty_and_parquet(write, tmp_path):
    assert peek(write("\n\n", "e.csv")).container == "empty"
    (tmp_path / "p").write_bytes(b"PAR1....")
    assert peek(tmp_path / "p").container == "parquet"


def test_read_csv_line_numbers_skip_blank_lines(write):
    path = write("a,b\n1,2\n\n3,4\n")
    table = read_csv(path, ["b"])
    assert table.columns["b"] == ["2", "4"] and table.lines == [2, 4]
    assert len(read_csv(path, ["a"], max_rows=1)) == 1


def test_read_csv_errors_name_columns_and_lines(write):
    expected = r"missing column\(s\) \['c'\]; found \['a', 'b'\]; expected \['a', 'c'\]"
    with pytest.raises(TraceFormatError, match=expected):
        read_csv(write("a,b\n1,2\n"), ["a", "c"])
    with pytest.raises(TraceFormatError, match="line 3: expected 2 fields as in the header, found 3"):
        read_csv(write("a,b\n1,2\n3,4,5\n"), ["a"])
    with pytest.raises(TraceFormatError, match="empty file"):
        read_csv(write(""), ["a"])


def test_read_jsonl_errors_name_lines(write):
    with pytest.raises(TraceFormatError, match="line 2: not valid JSON"):
        read_jsonl(write('{"a": 1}\n{"a": \n', "x.jsonl"), ["a"])
    with pytest.raises(TraceFormatError, match=r"line 2: missing key\(s\) \['a'\]; found \['b'\]"):
        read_jsonl(write('{"a": 1}\n{"b": 2}\n', "x.jsonl"), ["a"])
    with pytest.raises(TraceFormatError, match="line 1: expected a JSON object, got list"):
        read_jsonl(write("[1]\n", "x.jsonl"), ["a"])


def test_read_jsonl_optional_keys_are_none(write):
    table = read_jsonl(write('{"a": 1}\n\n{"a": 2, "h": [1]}\n', "x.jsonl"), ["a"], optional=["h"])
    assert table.columns["h"] == [None, [1]] and table.lines == [1, 3]


def test_undecodable_bytes_and_truncated_gzip(write, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b\n1,\xff\xfe\n")
    with pytest.raises(TraceFormatError, match="UTF-8"):
        read_csv(bad, ["a"])
    gz = write("a,b\n" + "1,2\n" * 1000, "t.csv.gz", gz=True)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gz.read_bytes()[:30])
    with pytest.raises(TraceFormatError, match="gzip"):
        read_csv(cut, ["a"])

"""Tests for traces.cli: describe and convert, on fixtures and on the full real traces."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from unikv.traces import load
from unikv.traces.cli import main

REPO = Path(__file__).resolve().parents[2]


def _requests(text: str) -> int:
    return int(re.search(r"^requests:\s+(\d+)$", text, re.M).group(1))


def _data_rows(path: Path) -> int:
    """Independent count: non-blank lines, minus the header line for CSV."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    return len(lines) - (0 if lines[0].lstrip().startswith(b"{") else 1)


def test_describe_prints_count_span_rate_and_percentiles(write, texts, capsys):
    assert main(["describe", str(write(texts["vidur"]))]) == 0
    out = capsys.readouterr().out
    assert _requests(out) == 3 and "time span:      4.5 s" in out
    assert re.search(r"prompt tokens:\s+mean 549.7\s+p50 396\s+p90 782.4\s+p99 869.3\s+max 879", out)


def test_describe_json_and_prefix_stats(write, texts, capsys):
    assert main(["describe", "--json", str(write(texts["mooncake"], "m.jsonl"))]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 3 and summary["prefix"]["block_refs"] == 6
    assert summary["prefix"]["infinite_cache_hit_ratio"] == pytest.approx(2 / 6)


def test_bad_input_is_one_error_line_and_exit_2(write, capsys):
    assert main(["describe", str(write("a,b\n1,2\n"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Known formats" in err and "Traceback" not in err
    assert main(["describe", "/nonexistent/file.csv"]) == 2
    assert main(["frobnicate"]) == 2


def test_convert_writes_normalized_files(write, texts, tmp_path, capsys):
    src = write(texts["mooncake"], "m.jsonl", gz=True)
    for suffix in (".parquet", ".csv"):
        out = tmp_path / f"o{suffix}"
        assert main(["convert", str(src), str(out)]) == 0
        assert load(out)["prefix_hashes"].tolist() == [[0, 1], [0, 1, 2], [3]]
    assert "wrote 3 requests" in capsys.readouterr().out


def test_cli_load_options(write, texts, capsys):
    path = str(write(texts["lengths"]))
    assert main(["describe", path, "--rate-rps", "2", "--seed", "1"]) == 0
    assert "req/s" in capsys.readouterr().out
    generic = str(write("t,a,b\n0,5,6\n2,7,8\n", "g.csv"))
    assert main(["describe", generic, "--columns", "arrival_s=t,prompt_tokens=a,output_tokens=b"]) == 0
    assert _requests(capsys.readouterr().out) == 2


def test_python_dash_m_entry(write, texts):
    done = subprocess.run(
        [sys.executable, "-m", "traces", "describe", str(write(texts["azure_2023"]))],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0 and _requests(done.stdout) == 3


def test_describe_counts_every_row_of_each_full_trace(shared_dir, capsys):
    files = sorted(p for p in shared_dir.iterdir() if p.suffix in (".csv", ".jsonl"))
    assert files
    for path in files:
        assert main(["describe", str(path)]) == 0, path
        assert _requests(capsys.readouterr().out) == _data_rows(path), path

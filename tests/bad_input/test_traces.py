"""Bad trace files and prefix block sizes, through `unikv replay --trace` and `unikv traces describe`.

Each case: exit code 2, one "error:" line naming the file (or option) and
what is wrong, no traceback, and no partial run folder.
"""

import errno
import os

import pytest
from cli_probe import assert_complete_or_absent, assert_refused, run_cli, run_cli_subprocess

from unikv import traces

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE = traces.samples.path("mooncake_conversation")

# name -> (file content, words the error names besides the file)
BAD_FILES = {
    "latin1.csv": (AZURE.encode() + b"2023-11-16 18:15:46.68,37\xe94,44\n", ["UTF-8"]),
    "list.json": (b'[{"timestamp": 0, "input_length": 5, "output_length": 1}]\n', ["JSON list"]),
    "string.jsonl": (b'"hello"\n', ["JSON string"]),
    "empty.csv": (b"", ["empty"]),
    "blank.csv": (b"\n  \n", ["empty"]),
    "missing.csv": (b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n",
                    ["unknown trace format", "['TIMESTAMP', 'ContextTokens']"]),
    "text_count.csv": (AZURE.encode() + b"2023-11-16 18:15:46.68,abc,44\n", ["line 2", "ContextTokens", "abc"]),
    "float_count.csv": (AZURE.encode() + b"2023-11-16 18:15:46.68,37.5,44\n", ["ContextTokens", "37.5"]),
    "negative.csv": (AZURE.encode() + b"2023-11-16 18:15:46.68,374,-4\n", ["GeneratedTokens", "-4"]),
    "json_text_count.jsonl": (b'{"timestamp": 0, "input_length": "600", "output_length": 5, "hash_ids": [0, 1]}\n',
                              ["input_length", "'600'"]),
    "json_float_count.jsonl": (b'{"timestamp": 0, "input_length": 600.5, "output_length": 5, "hash_ids": [0, 1]}\n',
                               ["input_length", "600.5"]),
    "mixed_tz.csv": (AZURE.encode() + b"2024-05-10 00:00:00+00:00,10,5\n2024-05-10 00:00:02,10,5\n",
                     ["line 3", "UTC offset"]),
    "bad_gzip.csv.gz": (b"\x1f\x8b\x08\x00" + b"\x00" * 12, ["gzip"]),
}


def _replay(trace, tmp_path, *extra):
    out = tmp_path / "run"
    res = run_cli(["replay", "--trace", trace, "--out", out, "--quiet", "--no-figures", "--no-oracle", *extra])
    return res, out


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_malformed_trace_file_is_refused_by_name(name, tmp_path):
    content, words = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    res, out = _replay(path, tmp_path)
    assert_refused(res, name, *words)
    assert_complete_or_absent(out)
    assert_refused(run_cli(["traces", "describe", path]), name, *words)


def test_a_directory_is_named_as_one(tmp_path):
    folder = tmp_path / "traces_dir"
    folder.mkdir()
    res, out = _replay(folder, tmp_path)
    assert_refused(res, "traces_dir", "is a directory")
    assert_complete_or_absent(out)
    assert_refused(run_cli(["traces", "describe", folder]), "traces_dir", "is a directory")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_named_and_never_opened(tmp_path):
    # A reader that opened it would block forever: the child is killed after 60 s.
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    res = run_cli_subprocess(["traces", "describe", fifo], timeout_s=60)
    assert_refused(res, "pipe.csv", "FIFO")
    out = tmp_path / "run"
    res = run_cli_subprocess(["replay", "--trace", fifo, "--out", out, "--quiet", "--no-figures", "--no-oracle"],
                             timeout_s=60)
    assert_refused(res, "pipe.csv", "FIFO")
    assert_complete_or_absent(out)


def test_an_io_error_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "flaky.csv"
    path.write_text(AZURE + "2023-11-16 18:15:46.68,374,44\n")

    class Failing:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(traces.readers, "open_text", lambda p: Failing())
    res, out = _replay(path, tmp_path)
    assert_refused(res, "flaky.csv", "I/O error", "Input/output error")
    assert_complete_or_absent(out)


def test_a_header_only_trace_holds_no_request(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text(AZURE)
    res, out = _replay(path, tmp_path)
    assert_refused(res, "header.csv", "holds no request")
    assert_complete_or_absent(out)
    for command in ("describe", "convert"):  # nothing to describe or convert either
        extra = [str(tmp_path / "out.jsonl")] if command == "convert" else []
        assert_refused(run_cli(["traces", command, path, *extra]), "header.csv", "holds no request")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("value, words", [
    ("0", ["block_tokens=0", "positive integer"]),
    ("-512", ["block_tokens=-512", "positive integer"]),
    ("16", ["block_tokens=16", "cannot be honoured", "512"]),
    ("768", ["block_tokens=768", "multiple"]),
])
def test_a_block_size_the_trace_cannot_honour_is_refused(value, words, tmp_path):
    res, out = _replay(MOONCAKE, tmp_path, "--block-tokens", value, "--max-requests", "5")
    assert_refused(res, *words)
    assert_complete_or_absent(out)


def test_a_block_size_that_does_not_apply_is_refused(tmp_path):
    res, out = _replay("azure_conv", tmp_path, "--block-tokens", "16", "--max-requests", "5")
    assert_refused(res, "block_tokens=16", "no prefix hashes")
    assert_complete_or_absent(out)
    res, out = _replay(MOONCAKE, tmp_path, "--block-tokens", "512", "--no-prefix-cache", "--max-requests", "5")
    assert_refused(res, "block_tokens=512", "prefix cache is off")
    assert_complete_or_absent(out)


def test_describe_refuses_a_nonpositive_block_size():
    assert_refused(run_cli(["traces", "describe", MOONCAKE, "--block-tokens", "0"]), "block_tokens=0", "positive")

"""Bad input for the engine through the CLI: requests no model can run
(issue 14 item 4) and window-only models (item 1)."""

from __future__ import annotations

import json

from cli_probe import assert_complete_or_absent, assert_refused, run_cli, run_cli_subprocess

TRILLION = 10**12


def oversize_trace(path):
    """A two-request Azure-format trace: one of a trillion prompt tokens."""
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    f"2023-11-16 18:15:46.6805900,{TRILLION},10\n"
                    "2023-11-16 18:15:50.9951690,396,109\n")
    return path


def test_a_trillion_token_request_on_a_window_only_model_is_refused_within_seconds(tmp_path):
    trace = oversize_trace(tmp_path / "big.csv")
    res = run_cli_subprocess(["replay", "--trace", trace, "--model", "mistral-7b-v0.1", "--no-figures",
                              "--out", tmp_path / "run", "--quiet"], timeout_s=60)
    assert_refused(res, str(TRILLION + 10), "maximum context", "mistral-7b-v0.1", "32768",
                   "oversize='reject'")
    assert_complete_or_absent(tmp_path / "run")


def test_with_oversize_reject_the_request_past_the_context_is_rejected_and_the_rest_runs(tmp_path):
    trace = oversize_trace(tmp_path / "big.csv")
    res = run_cli_subprocess(["replay", "--trace", trace, "--model", "mistral-7b-v0.1", "--no-figures",
                              "--oversize", "reject", "--out", tmp_path / "run", "--quiet"], timeout_s=60)
    assert res.rc == 0 and "Traceback" not in res.stderr, res.stderr
    assert_complete_or_absent(tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["summary"]["rejected"] == 1 and summary["summary"]["finished"] == 1
    assert summary["summary"]["max_request_tokens"] == 32768


def test_a_window_only_model_replays_a_prefix_cached_slice_checked_every_step(tmp_path):
    # Crashed before ('free: virtual pages ... are not allocated').
    res = run_cli(["replay", "--trace", "mooncake_conversation", "--max-requests", "15",
                   "--model", "mistral-7b-v0.1", "--kv-budget-gib", "1", "--oversize", "reject",
                   "--check-every", "1", "--no-figures", "--no-oracle", "--out", tmp_path / "run", "--quiet"])
    assert res.rc == 0 and "Traceback" not in res.stderr and "VIOLATION" not in res.stderr, res.stderr
    assert_complete_or_absent(tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["violations"] == [] and summary["summary"]["evicted_nodes"] > 0

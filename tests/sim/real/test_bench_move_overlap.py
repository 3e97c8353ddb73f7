"""benchmarks/bench_move_overlap.py: its CPU smoke path, its trace reading,
its mode names and its refusals."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    # Must precede the first import of Triton: the moves then run the Triton kernel, interpreted.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("transformers")

FOLDER = Path(__file__).resolve().parents[3] / "benchmarks"
TINY_GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 64,
               "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "sliding_window": 32, "sliding_window_pattern": 2, "query_pre_attn_scalar": 16,
               "vocab_size": 256, "max_position_embeddings": 1024, "rms_norm_eps": 1e-06}


@pytest.fixture
def bench(monkeypatch):
    """The script as a module (its dataclasses look their module up in sys.modules)."""
    spec = importlib.util.spec_from_file_location("bench_move_overlap", FOLDER / "bench_move_overlap.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_move_overlap", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "DEVICE", module.DEVICE)  # main() rebinds the globals: undone after the test
    monkeypatch.setattr(module, "DTYPE", module.DTYPE)
    return module


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    path = tmp_path / "gemma3" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_GEMMA3))
    return path


def test_smoke_writes_rows_traces_and_config(bench, tiny_config, tmp_path, capsys, one_thread):
    out = tmp_path / "out"
    assert bench.main(["--smoke", str(tiny_config), "--out", str(out)]) == 0
    assert "no CUDA streams on a CPU" in capsys.readouterr().out
    rows = list(csv.DictReader((out / "move_overlap.csv").open()))
    assert [(r["case"], r["mode"]) for r in rows] == [(c, m) for c in ("decode", "prefill")
                                                      for m in ("none", "same", "side-p2", "side-early-p2")] + [
        ("alone", "full-grid"), ("alone", "p2")]
    alone = rows[-2:]
    assert [r["move_programs"] for r in alone] == ["", "2"] and all(float(r["move_us"]) > 0 for r in alone)
    for r in rows[:-2]:
        assert r["status"] == "ok" and r["tables_equal"] == "True", r
        assert int(r["steps"]) == 2
        if r["mode"] == "none":
            assert r["steps_moving"] == "0" and float(r["moved_mb_per_moving_step"]) == 0
        else:  # the churn moves pages every step, the traced one too
            assert r["steps_moving"] == "2" and float(r["moved_mb_per_moving_step"]) > 0
            assert int(r["trace_step_moves"]) > 0
            base = next(b for b in rows if b["case"] == r["case"] and b["mode"] == "none")
            assert float(r["step_added_ms"]) == pytest.approx(float(r["step_ms_moving"]) - float(base["step_ms"]))
        events = json.loads(gzip.decompress((out / "traces" / f"{r['case']}_{r['mode']}.json.gz").read_bytes()))
        assert any(e.get("name") == bench.FORWARD_RANGE for e in events["traceEvents"])
    config = json.loads((out / "config.json").read_text())
    assert config["device"] == "cpu" and config["modes"] == ["none", "same", "side-p2", "side-early-p2"]


def test_bounded_mode_bounds_every_move_launch(bench, tiny_config, tmp_path, monkeypatch, one_thread):
    """side-p2 on the CPU: the pool's moves reach the Triton launcher with max_programs=2."""
    from unikv.kernels.launch import interpreted

    move = pytest.importorskip("unikv.kernels.move.kernel")
    if not interpreted(move._copy_rows_kernel):
        pytest.skip("Triton was imported before TRITON_INTERPRET=1: the moves run the torch reference")
    seen = []
    real = move.copy_rows
    monkeypatch.setattr(move, "copy_rows", lambda *a, **kw: seen.append(kw.get("max_programs")) or real(*a, **kw))
    argv = ["--smoke", str(tiny_config), "--out", str(tmp_path), "--cases", "decode", "--modes", "side-p2"]
    assert bench.main(argv) == 0
    assert seen and set(seen) == {2}


def test_trace_summary_counts_forward_kernels_by_launch_and_overlap(bench):
    """Forward kernels are those launched inside the forward's range (a graph's
    kernels share its launch's correlation); the move's overlap with them is
    measured against their union."""
    fwd = {"cat": "user_annotation", "ph": "X", "name": bench.FORWARD_RANGE, "ts": 100.0, "dur": 50.0}
    launches = [{"cat": "cuda_runtime", "ph": "X", "name": "cudaGraphLaunch", "ts": 110.0, "dur": 5.0,
                 "args": {"correlation": 1}},
                {"cat": "cuda_runtime", "ph": "X", "name": "cudaLaunchKernel", "ts": 160.0, "dur": 5.0,
                 "args": {"correlation": 2}}]

    def kernel(name, ts, dur, corr):
        return {"cat": "kernel", "ph": "X", "name": name, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "grid": [4, 1, 1]}}

    events = [fwd, *launches, kernel("gemm", 200, 10, 1), kernel("norm", 212, 8, 1), kernel("gemm", 215, 10, 1),
              kernel("_copy_rows_kernel", 205, 20, 2), kernel("index_put", 300, 5, 2)]
    got = bench.trace_summary(events)
    assert got["forward_kernels"] == 3 and got["forward_kernel_us"] == 28
    assert got["forward_span_us"] == 25  # 200 .. 225
    assert got["move_kernels"] == 1 and got["move_us"] == 20
    assert got["move_beside_forward_us"] == pytest.approx(5 + 13)  # 205-210, then 212-225 (the union)
    assert json.loads(got["move_grids"]) == ["[4, 1, 1]"]
    assert bench.trace_summary([fwd]) == {}  # a CPU trace: no kernels


def test_later_event_reads_as_not_done_until_recorded(bench):
    """The early flush's done event: an unrecorded event must not read as done
    (the pool would forget the forward's writes and free what it reads)."""
    done = bench.LaterEvent(cuda=False)
    assert done.query() is False
    with pytest.raises(RuntimeError, match="before the forward was launched"):
        done.wait(None)
    done.record()
    assert done.query() is True


def test_modes_parse_and_bad_ones_are_refused(bench, tiny_config, tmp_path, capsys):
    assert bench.parse_mode("side-p16") == bench.Mode("side-p16", side=True, churn=True, programs=16)
    assert bench.parse_mode("none").churn is False and bench.parse_mode("same").side is False
    assert bench.parse_mode("side-early") == bench.Mode("side-early", side=True, churn=True, early=True)
    assert bench.parse_mode("side-early-p4") == bench.Mode("side-early-p4", side=True, churn=True, programs=4,
                                                           early=True)
    for bad in ("side-p0", "side-p", "sidep4", "fast", "side-early-p0", "side-early-p", "early-p4"):
        with pytest.raises(ValueError, match=f"--modes: '{bad}' is not none, same, side, side-pN, side-early"):
            bench.parse_mode(bad)
    assert bench.main(["--smoke", str(tiny_config), "--out", str(tmp_path), "--modes", "side-p0"]) == 2
    assert "side-p0" in capsys.readouterr().err
    assert bench.main(["--smoke", str(tiny_config), "--out", str(tmp_path), "--chunk", "20"]) == 2
    assert "--chunk=20 must be a positive multiple of 16" in capsys.readouterr().err
    assert not (tmp_path / "move_overlap.csv").exists()


def test_refuses_without_cuda(bench, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the benchmark runs")
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_control_leaves_holes_and_the_split_adds_up(bench, tiny_config, tmp_path, one_thread):
    """The control churns as side-early does but never moves a page; every
    step's phases are timed; the moving row's added time is split against
    the control, and the split is written as markdown too."""
    out = tmp_path / "out"
    argv = ["--smoke", str(tiny_config), "--out", str(out), "--cases", "decode", "--modes", "none", "control",
            "side-early-p2", "--alone-mb", "0"]
    assert bench.main(argv) == 0
    rows = {r["mode"]: r for r in csv.DictReader((out / "move_overlap.csv").open())}
    control, moving = rows["control"], rows["side-early-p2"]
    assert control["steps_moving"] == "0" and control["pool_moves"] == "0"  # not one page moved, setup included
    assert control["tables_equal"] == "True" and int(moving["steps_moving"]) == 2
    num = {m: {k: float(v) for k, v in r.items() if "_ms" in k and v} for m, r in rows.items()}
    for m, r in num.items():
        assert all(r[f"{p}_ms"] >= 0 for p in bench.PHASES), m
        assert r["host_ms"] <= r["step_ms"], m  # each step's host phases lie inside its wall time
    assert num["none"]["churn_ms"] < num["control"]["churn_ms"]  # none admits no resident
    assert num["control"]["churn_added_ms"] == pytest.approx(num["control"]["step_ms"] - num["none"]["step_ms"])
    m, c = num["side-early-p2"], num["control"]
    assert m["step_vs_control_ms"] == pytest.approx(m["step_ms_moving"] - c["step_ms"])
    assert m["compaction_host_ms"] == pytest.approx(m["commit_ms"] + m["flush_ms"] - c["commit_ms"] - c["flush_ms"])
    assert m["forward_lost_ms"] == pytest.approx(m["forward_ms_moving"] - c["forward_ms"])
    assert m["step_vs_control_ms"] == pytest.approx(m["compaction_host_ms"] + m["forward_lost_ms"] + m["rest_ms"])
    assert "step_vs_control_ms" not in num["none"] and "churn_added_ms" not in num["side-early-p2"]
    text = (out / "move_overlap.md").read_text()
    assert "## decode" in text and "| control |" in text and "(b) compaction host" in text
    assert f"| side-early-p2 | {m['step_ms_moving']:.3f} |" in text
    assert bench.parse_mode("control") == bench.Mode("control", side=True, churn=True, early=True, flush=False)


def test_against_control_skips_cases_without_a_control(bench):
    rows = [{"case": "decode", "mode": "none", "status": "ok", "step_ms": 10.0},
            {"case": "decode", "mode": "side", "status": "ok", "step_ms": 12.0, "step_ms_moving": 12.0}]
    bench.against_control(rows)
    assert set(rows[1]) == {"case", "mode", "status", "step_ms", "step_ms_moving"}


def test_streams_are_found_and_named_in_the_trace(bench):
    """The forward's kernels and the moves are told apart by stream; the
    trace's GPU rows are renamed after them."""
    fwd = {"cat": "user_annotation", "ph": "X", "name": bench.FORWARD_RANGE, "ts": 100.0, "dur": 50.0}
    launch = {"cat": "cuda_runtime", "ph": "X", "name": "cudaGraphLaunch", "ts": 110.0, "dur": 5.0,
              "args": {"correlation": 1}}

    def kernel(name, ts, stream, corr):
        return {"cat": "kernel", "ph": "X", "name": name, "ts": ts, "dur": 10.0, "pid": 0, "tid": stream,
                "args": {"correlation": corr, "stream": stream, "grid": [1, 1, 1]}}

    old_name = {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}}
    events = [fwd, launch, old_name, kernel("gemm", 200, 7, 1), kernel("_copy_rows_kernel", 195, 13, 2)]
    got = bench.trace_summary(events)
    assert json.loads(got["forward_streams"]) == [7] and json.loads(got["move_streams"]) == [13]
    assert got["moves_off_forward_stream"] is True
    bench.label_streams(events)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {7: "stream 7: forward", 13: "stream 13: page moves"}
    same = [fwd, launch, kernel("gemm", 200, 7, 1), kernel("_copy_rows_kernel", 195, 7, 2)]
    assert bench.trace_summary(same)["moves_off_forward_stream"] is False


def test_trace_problems_name_a_step_that_moved_nothing_or_on_the_forward_stream(bench, capsys):
    ok = {"case": "decode", "mode": "side-early", "status": "ok", "trace_step_moves": 3,
          "moves_off_forward_stream": True}
    rows = [{"case": "decode", "mode": "control", "status": "ok", "trace_step_moves": 0}, ok,
            {**ok, "mode": "side-p4", "trace_step_moves": 0},
            {**ok, "mode": "side-early-p4", "moves_off_forward_stream": False},
            {"case": "alone", "mode": "p4", "status": "ok"}]
    assert bench.trace_problems(rows) == ["decode side-p4: the traced step moved no page",
                                          "decode side-early-p4: the moves ran on the forward's stream, "
                                          "or no move kernel was traced"]
    assert "traces/decode_side-early.json.gz" in capsys.readouterr().out


def test_trace_needs_cuda(bench, tiny_config, tmp_path, capsys):
    """--trace shows streams: on a CPU it is refused in one line naming CUDA, nothing written."""
    assert bench.main(["--smoke", str(tiny_config), "--out", str(tmp_path / "out"), "--trace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace needs a CUDA device" in err[0]
    assert not (tmp_path / "out").exists()

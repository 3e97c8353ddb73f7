"""benchmarks/bench_gemv.py and bench_real_decode.py's kernel kinds: the
shapes a decode step's matmuls read, the refusals, and how kernels are
sorted into kinds (the GPU runs themselves are the device's)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[3] / "benchmarks"
GEMMA = FOLDER / "configs/gemma-3-12b-text_config.json"


def _script(name: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_gemma_shapes_read_the_same_bytes_fused_or_not(monkeypatch):
    gemv = _script("bench_gemv", monkeypatch)
    geo = gemv.shapes(json.loads(GEMMA.read_text()))
    assert geo["layers"] == 48 and geo["head"] == (262208, 3840)
    assert geo["unfused"][:3] == [(4096, 3840), (2048, 3840), (2048, 3840)]
    assert geo["fused"][0] == (8192, 3840) and geo["fused"][2] == (30720, 3840)

    def elements(shapes):
        return sum(a * b for a, b in shapes)

    assert elements(geo["unfused"]) == elements(geo["fused"])
    # 448 MB of weights per layer in bf16: the roofline's ~21.5 GB of layers
    assert 2 * elements(geo["unfused"]) == 448_266_240


def test_gemv_refuses_moe_and_incomplete_configs(monkeypatch, tmp_path, capsys):
    gemv = _script("bench_gemv", monkeypatch)
    with pytest.raises(ValueError, match="num_local_experts=32"):
        gemv.shapes({"num_local_experts": 32, "hidden_size": 8})
    with pytest.raises(ValueError, match="lacks 'intermediate_size'"):
        gemv.shapes({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 4})
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    assert gemv.main(["--config", str(bad), "--out", str(tmp_path / "o.csv")]) == 2
    assert "lacks 'intermediate_size'" in capsys.readouterr().err
    assert gemv.main(["--config", str(GEMMA), "--batch", "0", "--out", str(tmp_path / "o.csv")]) == 2
    assert "--batch 0" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize(("name", "kind"), [
    ("_attention_kernel", "attention"), ("_combine_kernel", "attention"),
    ("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "matmul"), ("void gemv2T_kernel_val<int, int, __nv_bfloat16>", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "matmul"), ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "fused"),
    ("Memcpy DtoD (Device -> Device)", "copy"), ("void at::native::vectorized_elementwise_kernel<4>", "other"),
])
def test_kernel_kinds(monkeypatch, name, kind):
    pytest.importorskip("torch")
    decode = _script("bench_real_decode", monkeypatch)
    assert decode.kernel_kind(name) == kind

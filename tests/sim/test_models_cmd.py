"""`unikv models list / describe`: text and JSON describe the same model."""

import json
from pathlib import Path

from unikv.sim.models import list_models

from unikv.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _run(capsys, *args) -> tuple[int, str]:
    rc = main(["models", *map(str, args)])
    return rc, capsys.readouterr().out


def test_describe_json_of_a_sparse_mla_config(capsys):
    rc, out = _run(capsys, "describe", CONFIGS / "deepseek-ai--DeepSeek-V3.2_config.json",
                   "--kv-cache-dtype", "fp8_e4m3", "--json")
    report = json.loads(out)
    assert rc == 0 and report["architecture"] == "DeepseekV32ForCausalLM"
    kinds = {k["kind"]: (k["layers"], k["bytes_per_token_per_layer"], k["dtype"])
             for k in report["token_kinds"]}
    assert kinds == {"mla_latent": (61, 656, "fp8_ds_mla"), "indexer_keys": (61, 132, "fp8_e4m3+fp32_scale")}
    assert report["bands"] == {"full": {"layers": 61, "bytes": 61 * 788, "per": "token"}}
    assert report["dtypes"]["kv_cache"] == "fp8_e4m3" and report["params"]["total"] == 671_877_929_216
    assert report["applicable_layouts"] == ["fixed_ratio", "sglang", "end_end", "oracle", "vllm"]


def test_describe_text_of_a_bundled_three_band_model(capsys):
    rc, out = _run(capsys, "describe", "hymba-1.5b-base", "--state-dtype", "fp32_ssm")
    assert rc == 0
    assert "sliding_window   14 layers x 1,920 B = 26,880 B/token (bf16, band swa, window 1024)" in out
    assert "mamba1           32 layers x (conv 9,600 bf16 + ssm 51,200 fp32) = 7,168,000 B/request" in out
    assert "parameters: 1,520,000,000 total, 1,520,000,000 active" in out
    assert out.rstrip().endswith("apply: fixed_ratio, end_float_end, oracle")


def test_describe_text_of_an_mxfp4_config_folder_with_fp4_kv(capsys, tmp_path):
    folder = tmp_path / "gpt-oss-20b"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "openai--gpt-oss-20b_config.json").read_text())
    rc, out = _run(capsys, "describe", folder, "--kv-cache-dtype", "nvfp4")
    assert rc == 0 and "weights: 13,761,264,768 B" in out
    assert "full_attention   12 layers x 576 B = 6,912 B/token (nvfp4, band full)" in out
    llama = json.loads((CONFIGS / "meta-llama--Meta-Llama-3.1-8B_config.json").read_text())
    (folder / "config.json").write_text(json.dumps(llama | {"quantization_config": {"quant_method": "awq"}}))
    rc, out = _run(capsys, "describe", folder)
    assert rc == 0 and "weights: unknown" in out


def test_list_names_every_bundled_model(capsys):
    rc, out = _run(capsys, "list", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["name"] for r in rows] == list_models()
    rc, text = _run(capsys, "list")
    assert rc == 0 and len(text.splitlines()) == len(rows)

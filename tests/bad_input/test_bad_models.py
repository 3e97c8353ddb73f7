"""Bad input to `unikv models describe`: refused with one line naming what is wrong."""

from pathlib import Path

from cli_probe import assert_refused, run_cli

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _refused(tmp_path, args, *words):
    result = run_cli(["models", "describe", *map(str, args)], cwd=tmp_path)
    assert_refused(result, *words)
    assert list(tmp_path.iterdir()) == []  # describe writes nothing, even when it refuses


def test_unknown_model_lists_the_bundled_ones(tmp_path):
    _refused(tmp_path, ["no-such-model"], "no-such-model", "llama-3.1-8b")


def test_missing_config_file(tmp_path):
    _refused(tmp_path, [tmp_path / "config.json"], "no such file", "config.json")


def test_deepseek_v4_is_refused_by_architecture_and_field(tmp_path):
    _refused(tmp_path, [CONFIGS / "deepseek-ai--DeepSeek-V4-Flash_config.json"],
             "DeepseekV4ForCausalLM", "compress_ratios")


def test_bad_and_fp4_kv_cache_dtypes(tmp_path):
    _refused(tmp_path, ["llama-3.1-8b", "--kv-cache-dtype", "int8"], "kv_cache_dtype", "int8", "bf16")
    _refused(tmp_path, ["llama-3.1-8b", "--kv-cache-dtype", "mxfp4"], "mxfp4", "no engine KV-cache layout")
    # fp4 where the engines' layout cannot be pinned: refused naming the model and the head dims
    _refused(tmp_path, ["hymba-1.5b-base", "--kv-cache-dtype", "nvfp4"], "hymba-1.5b-base", "head_dim 64",
             "V head_dim 128")


def test_bad_state_dtype(tmp_path):
    _refused(tmp_path, ["llama-3.1-8b", "--state-dtype", "fp8"], "state_dtype", "fp8", "fp32_ssm")

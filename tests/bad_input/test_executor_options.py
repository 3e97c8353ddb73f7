"""`unikv replay --executor real` on bad input: one line naming the problem,
exit code 2, nothing written (issue 16 item 3)."""

from __future__ import annotations

import json
import sys

import pytest
from cli_probe import assert_complete_or_absent, assert_refused, run_cli

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=32, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, intermediate_size=64, num_hidden_layers=1, vocab_size=64,
              max_position_embeddings=512, torch_dtype="float32", bos_token_id=1, eos_token_id=2)
FAST = ["--trace", "azure_conv", "--max-requests", "2", "--max-context-tokens", "16", "--page-size", "4",
        "--kv-budget-gib", "0.001", "--no-oracle", "--no-figures", "-q"]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


def replay(tmp_path, model, *flags):
    out = tmp_path / "out"
    result = run_cli(["replay", "--executor", "real", "--model", model, "--kv-cache-dtype", "fp32",
                      "--out", out, *FAST, *flags])
    return result, out


@pytest.mark.parametrize(("flags", "words"), [
    (["--weights", "/no/such/folder"], ["weights", "/no/such/folder", "not a folder"]),
    (["--layout", "oracle"], ["layout='oracle'", "real executor", "end_end"]),
    (["--layout", "vllm"], ["layout='vllm'", "real executor"]),
    (["--dtype", "bf16"], ["kv_cache_dtype='fp32'", "dtype='bf16'"]),
    (["--dtype", "fp8"], ["dtype='fp8'", "fp32", "bf16"]),
    (["--device", "tpu"], ["device='tpu'", "cuda"]),
    (["--real-clock", "wall"], ["--real-clock", "wall"]),
    (["--compile-decode"], ["compile_decode=True", "decode_graphs=True"]),
])
def test_bad_real_executor_options_are_refused(tmp_path, model, flags, words):
    result, out = replay(tmp_path, model, *flags)
    assert_refused(result, *words)
    assert not out.exists()


def test_real_only_options_need_the_real_executor(tmp_path):
    for flags, word in ((["--weights", str(tmp_path)], "weights"), (["--device", "cuda"], "device"),
                        (["--real-clock", "cost"], "real_clock"), (["--dtype", "bf16"], "dtype"),
                        (["--decode-graphs"], "decode_graphs"), (["--compile-decode"], "compile_decode"),
                        (["--compile-prefill"], "compile_prefill"), (["--prefill-graphs"], "prefill_graphs")):
        result = run_cli(["replay", *flags, "--out", tmp_path / "out", *FAST])
        assert_refused(result, word, "executor='real'")


def test_weights_that_are_not_safetensors_of_the_config_are_refused(tmp_path, model):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    empty = tmp_path / "empty"
    empty.mkdir()
    result, out = replay(tmp_path, model, "--weights", empty)
    assert_refused(result, "weights", "no *.safetensors")
    other = tmp_path / "other"
    other.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(other / "model.safetensors"))
    result, out = replay(tmp_path, model, "--weights", other)
    assert_refused(result, "weights", "not a checkpoint of this config")
    assert_complete_or_absent(out)


def test_cuda_on_a_machine_without_cuda_is_refused(tmp_path, model):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result, out = replay(tmp_path, model, "--device", "cuda")
    assert_refused(result, "device='cuda'", "CUDA is not available")
    assert not out.exists()


def test_the_real_executor_without_transformers_is_refused(tmp_path, model, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    result, out = replay(tmp_path, model)
    assert_refused(result, "executor='real'", "torch and transformers")
    assert not out.exists()


def test_a_config_transformers_cannot_build_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from unikv.sim.real.model import build_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(CONFIG, model_type="no_such_model")))
    with pytest.raises(ValueError, match="transformers cannot build model_type='no_such_model'"):
        build_model(path)


CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "configs"


def nemotron_h(tmp_path):
    """Nemotron-H-56B trimmed to 4 layers (mamba, attention, mamba, attention), fp32."""
    cfg = json.loads((CONFIGS / "nvidia--Nemotron-H-56B-Base-8K_config.json").read_text())
    cfg.pop("auto_map", None)
    cfg.update(hidden_size=64, mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_head_dim=16,
               intermediate_size=128, vocab_size=256, chunk_size=8, hybrid_override_pattern="M*M*",
               num_hidden_layers=4, time_step_rank=8, torch_dtype="float32")
    path = tmp_path / "nemotron_h" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return path


def test_a_recurrent_model_with_prefix_caching_is_refused(tmp_path):
    """A prefix-cache block's state slot holds its request's final state, not
    the state at the block's end: a hit would resume a Mamba layer wrongly."""
    pytest.importorskip("transformers")
    result, out = replay(tmp_path, nemotron_h(tmp_path), "--trace", "mooncake_conversation")  # prefix hashes
    assert_refused(result, "prefix_cache", "recurrent", "--no-prefix-cache")
    assert not out.exists()


def test_a_state_band_of_another_size_than_the_models_state_is_refused(tmp_path):
    """unikv's config reader keeps conv state in 2 bytes; an fp32 model keeps
    it in 4: the views would misread the slots."""
    pytest.importorskip("transformers")
    result, out = replay(tmp_path, nemotron_h(tmp_path), "--no-prefix-cache")
    assert_refused(result, "state band 'mamba' holds", "bytes per request", "float32")
    assert not out.exists()


def test_recurrent_layers_the_executor_cannot_bind_are_refused_by_name(tmp_path):
    """Qwen3-Next's gated DeltaNet layers keep state the binder does not
    gather (it binds Mamba-2 mixers and short-conv layers): refused."""
    pytest.importorskip("transformers")
    cfg = json.loads((CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Thinking_config.json").read_text())
    cfg.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
               moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
               linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
               num_hidden_layers=4, vocab_size=256, torch_dtype="float32")
    path = tmp_path / "qwen3_next" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    result, out = replay(tmp_path, path, "--no-prefix-cache")
    assert_refused(result, "layers [0, 1, 2]", "linear_attention", "qwen3_next", "cannot bind")
    assert not out.exists()

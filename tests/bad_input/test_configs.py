"""Bad input, area "model configs" (issue 14 item 8): each malformed config.json
is refused with one ValueError naming the file and the field, through the API
(`unikv.sim.hf_config.load_config`) and through `unikv replay --model FILE`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_probe import assert_complete_or_absent, assert_refused, run_cli
from unikv.sim.hf_config import defaults_table, load_config, read_config, with_defaults

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
         "intermediate_size": 512, "vocab_size": 1000}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 6, "head_dim": 64}


def _with(base: dict, **fields) -> bytes:
    return json.dumps({**base, **fields}).encode()


# (case id, file bytes, words the one-line error must name besides the file)
FIELD_CASES = [
    ("zero-layers", _with(LLAMA, num_hidden_layers=0), ["num_hidden_layers", "0"]),
    ("negative-heads", _with(LLAMA, num_attention_heads=-4), ["num_attention_heads", "-4"]),
    ("zero-kv-heads", _with(LLAMA, num_key_value_heads=0), ["num_key_value_heads"]),
    ("string-count", _with(LLAMA, num_hidden_layers="32"), ["num_hidden_layers", "'32'"]),
    ("float-count", _with(LLAMA, hidden_size=256.0), ["hidden_size", "256.0"]),
    ("bool-count", _with(LLAMA, num_hidden_layers=True), ["num_hidden_layers", "True"]),
    ("zero-window", _with(GEMMA3, sliding_window=0), ["sliding_window"]),
    ("zero-interval", _with(GEMMA3, sliding_window_pattern=0), ["sliding_window_pattern"]),
    ("zero-full-interval", _with({"model_type": "qwen3_next"}, full_attention_interval=0),
     ["full_attention_interval"]),
    ("pattern-too-short", _with(GEMMA3, layer_types=["full_attention"] * 5),
     ["layer_types", "num_hidden_layers"]),
    ("nemotron-pattern-length", _with({"model_type": "nemotron_h"}, num_hidden_layers=6,
                                      hybrid_override_pattern="M*M"),
     ["hybrid_override_pattern", "num_hidden_layers"]),
    ("nemotron-pattern-char", _with({"model_type": "nemotron_h"}, hybrid_override_pattern="MX*"),
     ["hybrid_override_pattern"]),
    ("minimax-attn-type-list", _with({"model_type": "minimax"}, attn_type_list=[0, 1] * 16),
     ["attn_type_list"]),
    ("remote-code-missing-field", json.dumps({"model_type": "hymba", "num_hidden_layers": 4}).encode(),
     ["hidden_size", "hymba"]),
]
FILE_CASES = [
    ("json-list", b"[1, 2, 3]", ["list", "object"]),
    ("json-string", b'"llama"', ["string", "object"]),
    ("not-json", b'{"model_type": "llama",', ["JSON"]),
    ("not-utf8", b'{"model_type": "\xff\xfe"}', ["UTF-8"]),
    ("text-config-not-object", _with({"model_type": "gemma3"}, text_config=[1]), ["text_config"]),
    ("multimodal-fields-at-top", _with({"model_type": "gemma3"}, num_hidden_layers=48),
     ["num_hidden_layers", "text_config"]),
]


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "config.json"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("case", "data", "words"), FIELD_CASES + FILE_CASES,
                         ids=[c[0] for c in FIELD_CASES + FILE_CASES])
def test_malformed_config_is_one_value_error_naming_file_and_field(tmp_path, case, data, words):
    path = _write(tmp_path, data)
    with pytest.raises(ValueError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    for word in words:
        assert word.lower() in message.lower(), (word, message)


@pytest.mark.parametrize(("what", "make"), [
    ("missing", lambda d: d / "nope.json"),
    ("folder-without-config", lambda d: d),
    ("fifo-like-non-file", lambda d: Path("/dev/null")),
])
def test_a_path_that_is_not_a_config_file_is_named(tmp_path, what, make):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=str(path)):
        load_config(path)


def test_a_good_config_still_reads(tmp_path):
    assert load_config(_write(tmp_path, _with(LLAMA)))["head_dim"] == 64


CLI_CASES = [pytest.param(*c, id=c[0]) for c in FIELD_CASES + FILE_CASES]


@pytest.mark.parametrize(("case", "data", "words"), CLI_CASES)
def test_cli_refuses_a_malformed_config_naming_file_and_field(tmp_path, case, data, words):
    path = _write(tmp_path, data)
    out = tmp_path / "run"
    result = run_cli(["replay", "--model", path, "--out", out, "--quiet"])
    assert_refused(result, str(path), *words)
    assert_complete_or_absent(out)


# Values no count, size or list field may hold; each must give a ValueError, never another error.
_BAD_VALUES = (0, -1, "x", 1.5, True, None, [], {}, [0], "auto")
_KWARG_FIELDS = ("sliding_window_pattern", "full_attention_interval", "hybrid_override_pattern",
                 "linear_attn_config", "compress_ratios", "num_experts", "sliding_window_size",
                 "full_attn_idxs", "tie_embedding", "block_ff_dim", "mamba_n_groups", "attn_type_list")
_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _fuzz_bases():
    for path in sorted(_CONFIGS.glob("*.json")):
        yield path.stem, read_config(path)
    for model_type in sorted(defaults_table()["model_types"]):
        yield model_type, {"model_type": model_type}


@pytest.mark.parametrize(("name", "config"), list(_fuzz_bases()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_malformed_field_is_a_value_error_never_a_crash(name, config):
    key = "text_config" if isinstance(config.get("text_config"), dict) else None
    text = config[key] if key else config
    entry = defaults_table()["model_types"].get(text.get("model_type", config["model_type"]), {})
    fields = sorted((set(text) | set(entry.get("defaults", {})) | set(_KWARG_FIELDS)) - {"model_type"})
    for field in fields:
        for value in _BAD_VALUES:
            bad = {**text, field: value}
            try:
                with_defaults({**config, key: bad} if key else bad, source="cfg.json")
            except ValueError as e:
                assert str(e).startswith("cfg.json: ") and "\n" not in str(e)

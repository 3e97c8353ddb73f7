"""`unikv.sim.hf_config` reads a config.json as transformers' own config classes do."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from unikv.sim import hf_config
from unikv.sim.hf_config import READ_FIELDS, load_config, read_config, with_defaults
from unikv.sim.hf_rules import ALIASES

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("*.json"))
_ABSENT = object()
# Keys that are not model fields, or that transformers pops without reading.
_NOT_TRIMMED = {"model_type", "architectures", "auto_map", "transformers_version", "text_config",
                "vision_config", "audio_config", "quantization_config"}


@pytest.fixture(autouse=True, scope="module")
def _quiet_transformers():
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _hf(config: dict[str, Any]):
    """transformers' config object for `config` (its text config for multimodal ones)."""
    model_type = ALIASES.get(config["model_type"], config["model_type"])
    cls = CONFIG_MAPPING[model_type]
    obj = cls(**{k: v for k, v in config.items() if k != "model_type"})
    return obj.text_config if getattr(obj, "text_config", None) is not None else obj


def _norm(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_norm(v) for v in value]
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if type(value).__module__ == "torch":  # torch.bfloat16 -> "bfloat16"
        return str(value).removeprefix("torch.")
    return value


_GLOBAL_NAMES = {"head_dim": "global_head_dim", "num_key_value_heads": "num_global_key_value_heads"}


def _hf_value(obj, name: str) -> Any:
    """transformers' value of `name`; a per-layer field (Gemma-4) as its list over the layers."""
    try:
        return _norm(getattr(obj, name))
    except AttributeError:
        return _ABSENT
    except Exception as e:  # AmbiguousGlobalPerLayerAttributeError: a heterogeneous config
        if "per-layer" not in str(e):
            raise
        return [_norm(obj.per_layer_config[i].__getattribute__(name))
                for i in range(obj.num_hidden_layers)]


def _ours(filled: dict[str, Any], name: str, per_layer: bool) -> Any:
    if not per_layer:
        return _norm(filled.get(name, _ABSENT))
    full = filled.get(_GLOBAL_NAMES.get(name, name), filled[name])
    return [full if t == "full_attention" else filled[name] for t in filled["layer_types"]]


def assert_matches(config: dict[str, Any]) -> None:
    """with_defaults(config) equals transformers' config on every field unikv reads."""
    ours = with_defaults(config)
    obj = _hf(config)
    checked = 0
    for name in READ_FIELDS:
        theirs = _hf_value(obj, name)
        if theirs is _ABSENT:
            continue
        per_layer = isinstance(theirs, list) and name in _GLOBAL_NAMES
        assert _ours(ours, name, per_layer) == theirs, (config["model_type"], name)
        checked += 1
    assert checked >= 5, f"only {checked} fields compared"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_bundled_config_matches_transformers(path):
    assert_matches(read_config(path))


def _trimmed(config: dict[str, Any]):
    """(dropped key, config without it), over the text config's optional fields."""
    text_key = "text_config" if isinstance(config.get("text_config"), dict) else None
    fields = config[text_key] if text_key else config
    for key in sorted(set(fields) - _NOT_TRIMMED):
        smaller = {k: v for k, v in fields.items() if k != key}
        yield key, ({**config, text_key: smaller} if text_key else smaller)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_trimmed_configs_match_transformers(path):
    compared = 0
    for key, config in _trimmed(read_config(path)):
        try:
            theirs = _hf(config)
        except Exception:  # transformers refuses this trim: unikv must refuse it too
            with pytest.raises((ValueError, KeyError, TypeError)):
                with_defaults(config)
            continue
        text = config.get("text_config") or config
        if theirs.num_hidden_layers != text.get("num_hidden_layers", theirs.num_hidden_layers):
            # transformers silently takes another depth than the file's (Nemotron-H without its
            # pattern): unikv refuses, naming the pattern.
            with pytest.raises(ValueError, match="entries but num_hidden_layers"):
                with_defaults(config)
            continue
        try:
            assert_matches(config)
        except AssertionError as e:
            raise AssertionError(f"{path.name} without {key!r}: {e}") from None
        compared += 1
    assert compared >= 5


@pytest.mark.parametrize("model_type", sorted(hf_config.defaults_table()["model_types"]))
def test_default_config_of_each_model_type_matches(model_type):
    """The class's bare defaults (a config.json holding only model_type) read the same."""
    assert_matches({"model_type": model_type})


def test_gemma3_defaults_are_not_48_sliding_layers_of_head_dim_240():
    # The example: a Gemma-3 config leaving head_dim and sliding_window_pattern out.
    config = {"model_type": "gemma3_text", "hidden_size": 3840, "num_attention_heads": 16,
              "num_key_value_heads": 8, "num_hidden_layers": 48}
    filled = with_defaults(config)
    assert filled["head_dim"] == 256
    assert filled["layer_types"].count("full_attention") == 8
    assert_matches(config)


def test_multimodal_config_fills_its_text_config_and_keeps_architectures():
    filled = with_defaults({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                            "text_config": {"num_hidden_layers": 12}})
    assert filled["model_type"] == "gemma3_text"
    assert filled["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert len(filled["layer_types"]) == 12


def test_with_defaults_returns_a_new_dict_and_leaves_its_input_alone():
    config = {"model_type": "llama", "num_hidden_layers": 2, "layer_types": None}
    before = json.dumps(config)
    filled = with_defaults(config)
    assert filled is not config and json.dumps(config) == before


def test_unknown_model_type_gets_no_defaults_and_names_the_missing_field():
    with pytest.raises(ValueError, match="'hidden_size'.*hymba"):
        with_defaults({"model_type": "hymba", "num_hidden_layers": 32}, source="hymba.json")
    filled = with_defaults({"model_type": "hymba", "num_hidden_layers": 32, "hidden_size": 1600})
    assert "vocab_size" not in filled


def test_kimi_k2_reads_with_deepseek_v3_defaults():
    filled = load_config(CONFIGS / "moonshotai--Kimi-K2-Instruct_config.json")
    assert filled["n_routed_experts"] == 384 and filled["qk_head_dim"] == 192


def test_read_config_accepts_a_model_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert read_config(tmp_path) == {"model_type": "llama"}


def _installed_matches_bundled() -> bool:
    return transformers.__version__ == hf_config.transformers_version()


@pytest.mark.skipif(not _installed_matches_bundled(),
                    reason="installed transformers differs from the version hf_defaults.json "
                           "was derived from; rerun benchmarks/derive_hf_defaults.py to compare")
def test_hf_defaults_json_is_what_the_script_derives():
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "derive_hf_defaults.py"
    spec = importlib.util.spec_from_file_location("derive_hf_defaults", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bundled = (Path(hf_config.__file__).parent / "data" / "hf_defaults.json").read_text()
    assert module.render(module.derive()) == bundled

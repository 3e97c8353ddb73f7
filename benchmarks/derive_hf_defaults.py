"""Derive `sim/data/hf_defaults.json` from the installed transformers.

The base install of unikv has no transformers, so the defaults of
transformers' config classes are shipped as package data: per `model_type`,
the config class (module path and name), the default of every dataclass field
the class declares (fields of `PreTrainedConfig` itself are left out except
`tie_word_embeddings`-style ones a subclass redeclares), its `attribute_map`
(aliases), its class-level `default_*` constants, and the model_type of its
`text_config` sub-config. Attributes that transformers' `__post_init__`
derives from others are not data: `unikv.sim.hf_config` reproduces them as
small per-model_type rules.

Usage:
    python benchmarks/derive_hf_defaults.py            # rewrite the file
    python benchmarks/derive_hf_defaults.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "sim" / "data" / "hf_defaults.json"

# Every model_type of the bundled models and of issue 13's families, plus the
# text sub-configs they nest; a name transformers lacks is skipped (and listed).
MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
    "gpt_oss", "llama4", "llama4_text", "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
    "deepseek_v4", "kimi_linear", "zamba2", "lfm2", "lfm2_moe", "mamba", "mamba2",
    "falcon_h1", "jamba", "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_text",
    "qwen3_5_moe", "qwen3_5_moe_text", "minimax", "granitemoehybrid", "mimo_v2_flash",
)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def _field_defaults(cls: type, base_fields: set[str]) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in base_fields:
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if _jsonable(value):
            out[f.name] = value
    return out


def _class_defaults(cls: type) -> dict[str, Any]:
    """Class constants named `default_*` that `__post_init__` falls back on (DeepSeek-V4)."""
    return {k: getattr(cls, k) for k in sorted(dir(cls))
            if k.startswith("default_") and not callable(getattr(cls, k))
            and _jsonable(getattr(cls, k))}


def _entry(cls: type, base_fields: set[str]) -> dict[str, Any]:
    subs = getattr(cls, "sub_configs_defaults", None) or {}
    text = subs.get("text_config")
    return {
        "config_class": f"{cls.__module__}.{cls.__name__}",
        "defaults": _field_defaults(cls, base_fields),
        "attribute_map": dict(getattr(cls, "attribute_map", {}) or {}),
        "class_defaults": _class_defaults(cls),
        "text_config": getattr(text, "model_type", None),
    }


def derive() -> dict[str, Any]:
    """The defaults table of the installed transformers (see the module docstring)."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.configuration_utils import PreTrainedConfig

    base_fields = {f.name for f in dataclasses.fields(PreTrainedConfig)}
    types = {t: _entry(CONFIG_MAPPING[t], base_fields) for t in MODEL_TYPES if t in CONFIG_MAPPING}
    return {
        "schema_version": 1,
        "generated_by": "benchmarks/derive_hf_defaults.py",
        "transformers_version": transformers.__version__,
        "missing_in_transformers": [t for t in MODEL_TYPES if t not in CONFIG_MAPPING],
        "model_types": types,
    }


def render(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render(derive())
    if args.check:
        stale = not args.out.is_file() or args.out.read_text() != text
        print(f"{args.out}: {'stale' if stale else 'up to date'}")
        return int(stale)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

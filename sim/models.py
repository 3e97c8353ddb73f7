"""Model geometry for the simulator: what one token and one request cost in bytes.

`load_model` reads a bundled model (`sim/data/models.json` + `params.json`) or
parses a Hugging Face `config.json` (`sim.model_configs.parse_config`) into a
`ModelSpec` (`sim.model_spec`): its token kinds (full-attention K/V, MLA
latent, indexer keys, sliding or chunked K/V), its state kinds (Mamba,
DeltaNet, KDA, short-conv), the band view the layouts use, the dtypes and
the parameter counts. Rules and sources: docs/models.md.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from unikv.sim.model_configs import parse_config
from unikv.sim.model_spec import (
    KV_CACHE_DTYPES,
    STATE_DTYPES,
    ModelSpec,
    StateKind,
    TokenKind,
    check_kv_cache_dtype,
)

__all__ = ["KV_CACHE_DTYPES", "STATE_DTYPES", "ModelSpec", "StateKind", "TokenKind", "list_models",
           "load_model", "parse_config"]

# -- bundled models ----------------------------------------------------------

def _read_data(filename: str) -> dict:
    return json.loads(resources.files("unikv.sim").joinpath("data").joinpath(filename).read_text())


@cache
def _bundled() -> tuple[dict[str, dict], dict[str, dict]]:
    models = {m["id"]: m for m in _read_data("models.json")["models"]}
    return models, _read_data("params.json")["models"]


def list_models() -> list[str]:
    """Names of the bundled models, sorted."""
    return sorted(_bundled()[0])


def load_model(name_or_path: str | Path, *, state_dtype: str = "bf16",
               kv_cache_dtype: str = "bf16") -> ModelSpec:
    """A bundled model by name, or a model parsed from a Hugging Face config.json.

    Args:
        name_or_path: a name from `list_models()`, or a path to a config.json
            (a path whose file name matches a bundled model's source config
            also gets that model's name and parameter counts).
        state_dtype: the state dtypes where the model declares none: "bf16"
            (vLLM default: state in the model dtype) or "fp32_ssm" (conv
            state bf16, SSM / recurrent state fp32; SGLang's default). A
            config's declared `mamba_ssm_cache_dtype` / `mamba_ssm_dtype`
            wins (bundled names keep models.json's two figures).
        kv_cache_dtype: "bf16", "fp8_e4m3" or "fp8_e5m2" (fp4 is refused:
            docs/models.md, "Dtypes").

    Raises:
        ValueError: unknown name (listing the valid ones), a missing file, a
            bad dtype, or a config the parser cannot describe exactly
            (naming the architecture and the field).
    """
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype={state_dtype!r} is not one of {STATE_DTYPES}")
    check_kv_cache_dtype(kv_cache_dtype)
    models, params = _bundled()
    key = str(name_or_path)
    if not isinstance(name_or_path, Path) and key in models:
        return _from_entry(models[key], params.get(key, {}), state_dtype, kv_cache_dtype)
    path = Path(name_or_path)
    if path.is_file():
        return _from_config_file(path, state_dtype, kv_cache_dtype)
    if isinstance(name_or_path, Path) or key.endswith(".json"):
        raise ValueError(f"no config file at {key!r}")
    raise ValueError(f"unknown model {key!r}; bundled models are {list_models()} "
                     "(or pass a path to a config.json)")


_ENTRY_TOKEN_KINDS = {"full": "full_attention", "swa": "sliding_window", "chunked": "chunked"}
_ENTRY_STATE_KINDS = {"lightning_linear_attention": "lightning"}


def _from_entry(entry: dict, params: dict, state_dtype: str, kv_cache_dtype: str) -> ModelSpec:
    by_type, pools = entry["layers_by_type"], entry["attention_pools"]
    elem = KV_CACHE_DTYPES[kv_cache_dtype]
    tokens = tuple(
        TokenKind(name=kind, layers=by_type[pool], window_tokens=pools[pool].get("window_tokens"),
                  bytes_per_token_per_layer=pools[pool]["kv_bytes_per_token_per_layer"] // 2 * elem,
                  dtype=kv_cache_dtype)
        for pool, kind in _ENTRY_TOKEN_KINDS.items() if by_type.get(pool))
    dtypes = ("bf16", "fp32") if state_dtype == "fp32_ssm" else ("bf16", "bf16")
    states: tuple[StateKind, ...] = ()
    if "state" in entry:
        st = entry["state"]
        states = (StateKind(name=_ENTRY_STATE_KINDS.get(st["kind"], st["kind"]), layers=st["layers"],
                            conv_elems=st["conv_elems"], ssm_elems=st["ssm_elems"],
                            conv_dtype=dtypes[0], ssm_dtype=dtypes[1]),)
    sources = {f"geometry.{k}": v for k, v in entry["sources"].items()}
    sources["geometry.verification"] = entry["verification"]
    return ModelSpec.from_kinds(
        name=entry["id"], token_kinds=tokens, state_kinds=states, state_dtypes=dtypes,
        meta_tokens=entry.get("meta_tokens", 0), architecture=entry.get("architecture"),
        model_type=entry.get("model_type"), kv_cache_dtype=kv_cache_dtype,
        sources=sources | _param_sources(params), **_param_fields(params))


def _param_fields(params: dict) -> dict[str, Any]:
    """ModelSpec size fields from one params.json entry (empty entry: all None)."""
    total = params.get("params_total")
    weight = params.get("weight_bytes")
    if weight is None and total is not None:
        weight = round(total * params.get("weight_bytes_per_param", 2))
    return {"params_total": total, "params_active": params.get("params_active"),
            "weight_bytes": weight, "max_context_tokens": params.get("max_context_tokens")}


def _param_sources(params: dict) -> dict[str, str]:
    out = {f"params.{k}": v for k, v in params.get("sources", {}).items()}
    if "verification" in params:
        out["params.verification"] = params["verification"]
    return out


def _from_config_file(path: Path, state_dtype: str, kv_cache_dtype: str) -> ModelSpec:
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    models, params = _bundled()
    # Only a distinctive file name ("<org>--<model>_config.json") identifies a bundled model.
    known = None if path.name == "config.json" else next(
        (m["id"] for m in models.values() if f"/{path.name}" in m["sources"].get("config", "")),
        None)
    spec = parse_config(config, name=known or path.stem, state_dtype=state_dtype,
                        kv_cache_dtype=kv_cache_dtype)
    extra = params.get(known, {}) if known else {}
    sizes = {k: v for k, v in _param_fields(extra).items() if v is not None}
    if spec.max_context_tokens is not None:
        sizes.pop("max_context_tokens", None)  # the config's own value wins
    sources = spec.sources | {"config": str(path)} | _param_sources(extra)
    return dataclasses.replace(spec, sources=sources, **sizes)



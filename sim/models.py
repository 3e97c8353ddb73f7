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

from unikv.sim.hf_config import read_config, with_defaults
from unikv.sim.model_compute import compute_fields
from unikv.sim.model_configs import parse_config
from unikv.sim.model_spec import (
    KV_CACHE_DTYPES,
    STATE_DTYPES,
    ModelSpec,
    StateKind,
    TokenKind,
    check_kv_cache_dtype,
    kv_token_bytes,
)
from unikv.sim.model_states import DECLARED_SSM_DTYPES
from unikv.sim.model_weights import checkpoint_weight_bytes
from unikv.sim.params import count_params

__all__ = ["KV_CACHE_DTYPES", "STATE_DTYPES", "ModelSpec", "StateKind", "TokenKind", "list_models",
           "load_model", "parse_config"]

# -- bundled models ----------------------------------------------------------

def _read_data(filename: str) -> dict:
    return json.loads(resources.files("unikv.sim").joinpath("data").joinpath(filename).read_text())


@cache
def _bundled() -> tuple[dict[str, dict], dict[str, dict]]:
    models = {m["id"]: m for m in _read_data("models.json")["models"]}
    return models, _read_data("params.json")["models"]


@cache
def _compute() -> dict[str, dict]:
    return _read_data("compute.json")["models"]


def _compute_fields(model_id: str | None) -> dict[str, Any]:
    """The roofline's extra figures of a bundled model (`sim/data/compute.json`;
    absent: none, and the roofline charges no attention FLOPs, every expert)."""
    entry = _compute().get(model_id or "")
    if entry is None:
        return {}
    pair = entry["attention_pair_flops"]
    moe = entry.get("moe", {})
    return {"attention_pair_flops": (pair["full"], pair["window"]),
            "routed_experts": moe.get("routed_experts"), "experts_per_token": moe.get("experts_per_token")}


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
        kv_cache_dtype: "bf16", "fp8_e4m3", "fp8_e5m2", or fp4 ("fp4_e2m1",
            "nvfp4": K/V layers with equal K and V head dims; docs/models.md, "Dtypes").

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
    if path.exists() or isinstance(name_or_path, Path) or key.endswith(".json") or "/" in key:
        return _from_config_file(path, state_dtype, kv_cache_dtype)  # names a missing file itself
    raise ValueError(f"unknown model {key!r}; bundled models are {list_models()} "
                     "(or pass a path to a config.json)")


_ENTRY_TOKEN_KINDS = {"full": "full_attention", "swa": "sliding_window", "chunked": "chunked"}
_ENTRY_STATE_KINDS = {"lightning_linear_attention": "lightning"}


def _from_entry(entry: dict, params: dict, state_dtype: str, kv_cache_dtype: str) -> ModelSpec:
    by_type, pools = entry["layers_by_type"], entry["attention_pools"]
    tokens = tuple(
        TokenKind(name=kind, layers=by_type[pool], window_tokens=pools[pool].get("window_tokens"),
                  bytes_per_token_per_layer=_entry_kv_bytes(entry["id"], pool, pools[pool], kv_cache_dtype),
                  dtype=kv_cache_dtype)
        for pool, kind in _ENTRY_TOKEN_KINDS.items() if by_type.get(pool))
    dtypes = ("bf16", "fp32") if state_dtype == "fp32_ssm" else ("bf16", "bf16")
    declared = _declared_ssm_dtype(entry)
    if declared is not None:
        dtypes = (dtypes[0], declared)
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
        sources=sources | _param_sources(params), **_param_fields(params), **_compute_fields(entry["id"]))


def _declared_ssm_dtype(entry: dict) -> str | None:
    """The SSM-state element dtype a bundled model's config.json declares, or None.

    models.json records it as `state.config_declared_ssm_state_dtype`, the
    value first ("float32 (mamba_ssm_cache_dtype)"; a NemotronH config that
    leaves the field to transformers' default records that default). The
    parser gives the config the same dtype (`model_states.state_dtypes`), so a
    bundled name and its config.json size the state alike.
    """
    recorded = entry.get("state", {}).get("config_declared_ssm_state_dtype")
    if recorded is None:
        return None
    value = recorded.split()[0]
    if value not in DECLARED_SSM_DTYPES:
        raise ValueError(f"models.json, model {entry['id']!r}: config_declared_ssm_state_dtype={recorded!r} "
                         f"does not start with one of {sorted(DECLARED_SSM_DTYPES)}")
    return DECLARED_SSM_DTYPES[value]


def _entry_kv_bytes(name: str, pool: str, geometry: dict, kv_cache_dtype: str) -> int:
    """One token's K + V bytes in one layer of a bundled model's pool, scales included."""
    try:
        return kv_token_bytes(geometry["num_kv_heads"], geometry["head_dim_k"], geometry["head_dim_v"],
                              kv_cache_dtype)
    except ValueError as exc:
        raise ValueError(f"model {name!r}, {pool} layers: {exc}") from None


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
    """A config.json (or a model folder holding one): read with transformers'
    defaults (`sim.hf_config`), parsed, and sized by `sim.params` unless the
    file is a bundled model's source (then params.json's figures, as for the
    bundled name)."""
    raw = read_config(path)
    filled = with_defaults(raw, source=str(path))  # a multimodal config becomes its text config
    file = path / "config.json" if path.is_dir() else path
    models, params = _bundled()
    # Only a distinctive file name ("<org>--<model>_config.json") identifies a bundled model.
    known = None if file.name == "config.json" else next(
        (m["id"] for m in models.values() if f"/{file.name}" in m["sources"].get("config", "")),
        None)
    name = known or (file.parent.name if file.name == "config.json" else file.stem)
    spec = parse_config(filled, name=name, state_dtype=state_dtype, kv_cache_dtype=kv_cache_dtype)
    extra = params.get(known, {}) if known else {}
    sizes = {k: v for k, v in _param_fields(extra).items() if v is not None}
    sources = spec.sources | {"config": str(file)} | _param_sources(extra)
    if not known:
        counted, why = _counted_sizes(filled)
        sizes.update(counted)
        sources["params"] = why
        active, total = counted.get("params_active"), counted.get("params_total")
        derived, sources["compute"] = compute_fields(filled, spec, routed=bool(active and total and active < total))
        sizes.update(derived)
    if spec.max_context_tokens is not None:
        sizes.pop("max_context_tokens", None)  # the config's own value wins
    # the model's own type (e.g. qwen3_5_moe), not its text config's (qwen3_5_moe_text)
    model_type = raw.get("model_type") if isinstance(raw.get("model_type"), str) else spec.model_type
    return dataclasses.replace(spec, sources=sources, model_type=model_type, **sizes, **_compute_fields(known))


def _counted_sizes(filled: dict) -> tuple[dict[str, Any], str]:
    """ModelSpec size fields from the config itself (`sim.params.count_params`,
    `sim.model_weights`), and where they came from (or why a field is left unknown)."""
    try:
        counts = count_params(filled)
    except ValueError as exc:
        return {}, f"not counted: {exc}"
    out: dict[str, Any] = {"params_total": counts.total, "params_active": counts.active}
    why = "sim.params.count_params of the config (transformers' modules, checked against its meta-device count)"
    weight, how = checkpoint_weight_bytes(filled, counts)
    if weight is not None:
        out["weight_bytes"] = weight
    return out, f"{why}; {how}"

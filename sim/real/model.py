"""Build the transformers causal LM a real replay runs, from a config.json.

`build_model(path, dtype=..., device=..., weights=None, seed=0)` reads the
config (a file, or a folder holding `config.json`), takes the text model of
a multimodal config (Gemma-3's `text_config`: transformers builds it as
`Gemma3ForCausalLM`), drops a `quantization_config` (random or local
unquantized weights are built in `dtype`), and builds the model with
`AutoModelForCausalLM.from_config` (transformers/models/auto/auto_factory.py,
`_BaseAutoModelClass.from_config`). Random weights are seeded and created
directly on the device (`with torch.device(device)`: no host copy); with
`weights`, the model is built on the meta device (no init at all) and the
folder's safetensors are assigned to it, then the non-persistent buffers
(rotary frequencies) are rebuilt on the device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DTYPES = ("fp32", "bf16", "fp16")
# Where a bundled model's config.json copy lives in a checkout (the file
# name models.json's `sources.config` ends with).
_CONFIG_COPIES = Path(__file__).resolve().parents[2] / "tests" / "data" / "configs"


def torch_dtype(name: str):
    """The torch dtype of one of DTYPES.

    Raises:
        ValueError: an unknown name.
    """
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in table:
        raise ValueError(f"dtype={name!r} is not one of {list(DTYPES)}")
    return table[name]


def config_path(model: str) -> Path:
    """The config.json a model name or path stands for.

    A path names a config file or a folder holding `config.json`; a bundled
    model name resolves to its config copy in the checkout's
    `tests/data/configs` (bundled models are otherwise described, not
    shipped as config files).

    Raises:
        ValueError: a missing file, or a bundled name without a config copy.
    """
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return path
    from unikv.sim.models import _bundled

    entry = _bundled()[0].get(model)
    if entry is not None:
        source = str(entry.get("sources", {}).get("config", ""))
        copy = _CONFIG_COPIES / Path(source.split(":")[-1].split(" ")[0]).name
        if source and copy.is_file():
            return copy
        raise ValueError(f"model={model!r}: the real executor needs a config.json and this bundled model "
                         "has no config copy in tests/data/configs; pass --model PATH/config.json")
    raise ValueError(f"model={model!r}: no config.json at this path")


def text_config(raw: dict) -> dict:
    """The causal-LM part of a config dict: a multimodal config's
    `text_config` (with its own model_type), without `quantization_config`."""
    cfg = dict(raw.get("text_config") or raw) if "text_config" in raw else dict(raw)
    if "text_config" in raw and "model_type" not in cfg:
        cfg["model_type"] = f"{raw.get('model_type')}_text"
    cfg.pop("quantization_config", None)
    cfg.pop("architectures", None)
    return cfg


def hf_config(path: Path):
    """The transformers config object of the config.json at `path`.

    Raises:
        ValueError: a file that is not JSON, or a model_type transformers
            does not know.
    """
    from transformers import AutoConfig

    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"model={str(path)!r}: not a readable config.json ({exc})") from None
    cfg = text_config(raw)
    model_type = cfg.pop("model_type", None)
    try:
        return AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"model={str(path)!r}: transformers cannot build model_type={model_type!r} "
                         f"({str(exc).splitlines()[0]})") from None


def build_model(path: Path, *, dtype: str = "fp32", device: str = "cpu", weights: Path | None = None,
                seed: int = 0) -> Any:
    """The causal LM of the config at `path`, in eval mode, on `device`.

    Args:
        dtype: one of DTYPES (weights and activations).
        device: "cpu", "cuda" or "cuda:N".
        weights: a folder of `*.safetensors` for this config; None: random
            weights from `seed` (`torch.manual_seed`).
    Raises:
        ValueError: a config transformers cannot build as a causal LM, or
            weights that are not safetensors for it (naming the tensor).
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config(path)
    dt = torch_dtype(dtype)
    try:
        if weights is None:
            torch.manual_seed(seed)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=dt)
        else:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=dt)
    except (ValueError, TypeError, AssertionError) as exc:
        raise ValueError(f"model={str(path)!r}: transformers cannot build {type(config).__name__} as a "
                         f"causal LM ({str(exc).splitlines()[0]})") from None
    if weights is not None:
        _load_weights(model, Path(weights), device, dt)
    return model.eval()


def check_weights(weights: Path) -> list[Path]:
    """The safetensors files of a weights folder.

    Raises:
        ValueError: not a folder, or a folder without `*.safetensors`.
    """
    weights = Path(weights)
    if not weights.is_dir():
        raise ValueError(f"weights={str(weights)!r} is not a folder (expected a folder of *.safetensors)")
    files = sorted(weights.glob("*.safetensors"))
    if not files:
        raise ValueError(f"weights={str(weights)!r} holds no *.safetensors file")
    return files


def _load_weights(model, weights: Path, device: str, dtype) -> None:
    """Assign the folder's tensors to the meta-built `model`, then rebuild
    the buffers the meta build left empty."""
    from safetensors.torch import load_file

    state: dict = {}
    for f in check_weights(weights):
        state.update(load_file(str(f), device=str(device)))
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in missing if k not in tied]
    extra = [k for k in state if k not in expected]
    if missing or extra:
        what = f"misses tensor {missing[0]!r}" if missing else f"has tensor {extra[0]!r} the model lacks"
        raise ValueError(f"weights={str(weights)!r} {what}: not a checkpoint of this config")
    for k, t in state.items():
        if tuple(t.shape) != tuple(expected[k].shape):
            raise ValueError(f"weights={str(weights)!r}: tensor {k!r} has shape {tuple(t.shape)}, the "
                             f"config needs {tuple(expected[k].shape)}")
        state[k] = t.to(dtype) if t.is_floating_point() else t
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    _rebuild_buffers(model, device)


def _rebuild_buffers(model, device: str) -> None:
    """Non-persistent buffers stayed on the meta device: rebuild each owner
    from what built it (a rotary module from its config, transformers'
    `*RotaryEmbedding.__init__(config)`; a scaled embedding's
    `embed_scale` from its `scalar_embed_scale`) on `device`.

    Raises:
        ValueError: a buffer neither rule rebuilds (named).
    """
    import torch

    for name, module in model.named_modules():
        meta = [n for n, b in module.named_buffers(recurse=False) if b.is_meta]
        if not meta:
            continue
        if hasattr(module, "scalar_embed_scale") and meta == ["embed_scale"]:
            module.register_buffer("embed_scale", torch.tensor(module.scalar_embed_scale, device=device),
                                   persistent=False)
            continue
        if not hasattr(module, "config"):
            raise ValueError(f"buffer {name}.{meta[0]} cannot be rebuilt after loading weights")
        with torch.device(device):  # not every rotary __init__ takes a device (LlamaRotaryEmbedding)
            fresh = type(module)(config=module.config)
        for n, buf in fresh.named_buffers(recurse=False):
            module.register_buffer(n, buf.to(device), persistent=False)

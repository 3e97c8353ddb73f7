"""Stored weight bytes of a checkpoint, from its config.json.

An unquantized checkpoint stores `params_total` parameters in its declared
dtype. A quantized one is sized only where the config pins the stored
layout (docs/models.md, "Weight bytes"):

- `quant_method` "mxfp4" (gpt-oss): the experts of every `GptOssMLP` that
  `modules_to_not_convert` does not name hold e2m1 values, two per byte, and
  one e8m0 scale byte per 32 values along the input dimension; their biases
  and every other module stay in the declared dtype (transformers
  `integrations/mxfp4.py` `replace_with_mxfp4_linear`, `Mxfp4GptOssExperts`;
  `quantizers/quantizer_mxfp4.py` `param_needs_quantization`; vLLM
  `model_executor/layers/quantization/mxfp4.py` `Mxfp4MoEMethod.create_weights`).
- `quant_method` "fp8" with `weight_block_size` (DeepSeek-V3, Kimi-K2): the
  decoder's projections at 1 byte plus one fp32 scale per block, embeddings
  and norms in the declared dtype (approximate: routers and attention norms
  are counted as projections, within 0.1 %).

Any other method is left unknown, and the reason is named.
"""
from __future__ import annotations

import re
from typing import Any

from unikv.sim.params import ParamCounts

# Bytes per parameter of the dtypes a checkpoint declares (`torch_dtype` / `dtype`).
PARAM_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

MXFP4_GROUP = 32  # values per e8m0 scale byte (OCP microscaling block)


def checkpoint_weight_bytes(filled: dict, counts: ParamCounts) -> tuple[int | None, str]:
    """The checkpoint's stored weight bytes, and how they were found.

    Args:
        filled: the config with transformers' defaults (`sim.hf_config.with_defaults`).
        counts: its parameter counts (`sim.params.count_params(filled)`).

    Returns:
        (bytes, how): bytes is None when the layout is not pinned; how says why.

    Raises:
        ValueError: a `quantization_config` field of the wrong type, naming it.
    """
    dtype = str(filled.get("torch_dtype") or filled.get("dtype") or "")
    quant = filled.get("quantization_config")
    if not dtype and quant_method(quant) == "mxfp4":
        # gpt-oss configs declare no dtype; vLLM then reads float32 and its "auto" dtype
        # downcasts it to the GPU's preferred bfloat16 (vllm/config/model.py
        # `_get_and_verify_dtype`, `_resolve_auto_dtype`), the dtype the checkpoint stores too.
        dtype = "bfloat16"
    if dtype not in PARAM_DTYPE_BYTES:
        what = f"quantized checkpoint (quant_method {quant_method(quant)!r}) without a" if quant else "the"
        return None, (f"weight bytes unknown: {what} torch_dtype {dtype or None!r} is not one of "
                      f"{sorted(PARAM_DTYPE_BYTES)}")
    size = PARAM_DTYPE_BYTES[dtype]
    if not quant:
        return counts.total * size, f"weight bytes = params_total x {size} ({dtype})"
    method = quant_method(quant)
    if not isinstance(quant, dict):
        return None, f"weight bytes unknown: quantization_config {quant!r} is not an object"
    if method == "mxfp4":
        return _mxfp4_bytes(filled, counts, quant, size)
    if method == "fp8":
        return _block_fp8_bytes(counts, quant, size)
    return None, f"weight bytes unknown: quantized checkpoint (quant_method {method!r})"


def quant_method(quant: Any) -> Any:
    """A `quantization_config`'s `quant_method` (the value itself when it is not an object)."""
    return quant.get("quant_method") if isinstance(quant, dict) else quant


def _mxfp4_bytes(filled: dict, counts: ParamCounts, quant: dict, size: int) -> tuple[int | None, str]:
    """gpt-oss's MXFP4 experts: e2m1 values + an e8m0 scale per 32 inputs."""
    if filled.get("model_type") != "gpt_oss":
        return None, ("weight bytes unknown: quant_method 'mxfp4' converts only gpt-oss experts "
                      f"(GptOssMLP), not model_type {filled.get('model_type')!r}")
    keep = quant.get("modules_to_not_convert")
    if keep is not None and not (isinstance(keep, list) and all(isinstance(p, str) for p in keep)):
        raise ValueError(f"quantization_config.modules_to_not_convert = {keep!r}: expected a list of "
                         "module-name patterns (strings) or null")
    hidden, inter = filled["hidden_size"], filled["intermediate_size"]
    for field, value in (("hidden_size", hidden), ("intermediate_size", inter)):
        if value % MXFP4_GROUP:
            return None, (f"weight bytes unknown: mxfp4 packs {MXFP4_GROUP} inputs per scale and "
                          f"{field} = {value} is not a multiple of {MXFP4_GROUP}")
    per_layer = filled["num_local_experts"] * 3 * inter * hidden  # gate_up (2I x H) + down (H x I)
    converted = sum(per_layer for i in range(filled["num_hidden_layers"])
                    if not kept_by_pattern(f"model.layers.{i}.mlp.experts", keep or []))
    stored = converted // 2 + converted // MXFP4_GROUP + (counts.total - converted) * size
    return stored, (f"weight bytes = {converted:,} MXFP4 expert weights x (1/2 + 1/{MXFP4_GROUP}) "
                    f"+ the other {counts.total - converted:,} parameters x {size}")


def kept_by_pattern(name: str, patterns: list[str]) -> bool:
    """Whether a `modules_to_not_convert` pattern keeps module `name` unquantized.

    A pattern keeps a module when, read as a regular expression, it matches
    the name from its start up to a module boundary (the end, or a dot after
    or at the end of the match), or when the name ends with it
    (transformers `quantizers/quantizers_utils.py` `should_convert_module`).
    """
    return any(re.fullmatch(rf"(?:{p})(?:(?:\.|(?<=\.)).*)?", name) or name.endswith(p)
               for p in patterns)


def _block_fp8_bytes(counts: ParamCounts, quant: dict, size: int) -> tuple[int | None, str]:
    """Block-wise fp8 projections (DeepSeek-V3 / Kimi-K2), approximate."""
    block = quant.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        return None, "weight bytes unknown: quantized checkpoint (quant_method 'fp8' without weight_block_size)"
    projections = counts.attention + counts.mlp + counts.routed_experts + counts.recurrent
    scales = -(-projections // (block[0] * block[1])) * 4
    kept = (counts.embedding + counts.norms) * size
    return projections + scales + kept, (
        f"weight bytes = projections x 1 (fp8) + one fp32 scale per {block[0]}x{block[1]} block + "
        f"embeddings and norms x {size} (routers and attention norms counted as fp8: "
        "within 0.1 %)")

"""Static split ratios: SGLang's defaults and the ratio matched to the oracle's mix."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd
from unikv.sim.layouts import DEFAULT_MAMBA_FULL_MEMORY_RATIO, DEFAULT_SWA_FULL_TOKENS_RATIO, applicable_kinds
from unikv.sim.models import load_model


@dataclass(frozen=True)
class Ratio:
    """A static split ratio over the bands a model splits with "full" (`bands`:
    "swa" and/or "mamba"); the fields default to SGLang's start-up ratios."""

    bands: tuple
    swa_full_tokens: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_full_memory: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO

    def scaled(self, factor: float) -> Ratio:
        return replace(self, swa_full_tokens=self.swa_full_tokens * factor,
                       mamba_full_memory=self.mamba_full_memory * factor)

    def as_static_ratio(self):
        from unikv.sim.layouts import StaticRatio

        return StaticRatio(swa_full_tokens=self.swa_full_tokens,
                           mamba_full_memory=self.mamba_full_memory)


def _ratio_columns(ratio) -> dict:
    if ratio is None:
        return {}
    return {"static_swa_full_tokens": ratio.swa_full_tokens if "swa" in ratio.bands else math.nan,
            "static_mamba_full_memory": ratio.mamba_full_memory if "mamba" in ratio.bands else math.nan}


def matched_ratio(model: str, oracle_row: dict | pd.Series) -> Ratio | None:
    """The static ratio that matches the oracle's time-mean mix of live bytes
    (swa tokens / full tokens; mamba bytes / full bytes), or None for a
    one-band model."""
    spec = load_model(model)
    split = tuple(k for k in spec.kinds if k != "full")
    if not split or "full" not in spec.kinds:
        return None
    full = oracle_row["full_mean_live_bytes"]
    if not full > 0:
        return None
    out = Ratio(bands=split)
    if "swa" in split:
        swa_tokens = oracle_row["swa_mean_live_bytes"] / spec.swa_token_bytes
        out = replace(out, swa_full_tokens=swa_tokens / (full / spec.full_token_bytes))
    if "mamba" in split:
        out = replace(out, mamba_full_memory=oracle_row["mamba_mean_live_bytes"] / full)
    return out if out.swa_full_tokens > 0 and out.mamba_full_memory > 0 else None


def _static_change(ratio: Ratio | None) -> tuple:
    return () if ratio is None else (("static_ratio", ratio),)


def _unified_kind(model: str) -> str:
    return [k for k in applicable_kinds(load_model(model)) if k in ("end_end", "end_float_end")][0]


def _default_ratio(model: str) -> Ratio | None:
    kinds = load_model(model).kinds
    split = tuple(k for k in kinds if k != "full")
    return Ratio(bands=split) if split and "full" in kinds else None

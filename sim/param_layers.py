"""How `params.count_params` composes blocks into layers: the tally and the shared layer shapes.

`Tally` adds each block's parameters to its part of `ParamCounts` and keeps
the routed-expert parameters a token leaves unused, so `active` follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unikv.sim.param_blocks import gated_mlp, need

Config = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Parameters of one model (whole model, no sharding).

    Attributes:
        total: every parameter.
        active: parameters one token uses (routed experts: top-k only).
        embedding: input embedding plus the output head when untied.
        attention: attention projections, their biases and norms.
        recurrent: Mamba / gated-DeltaNet / lightning blocks.
        mlp: dense MLPs, shared experts and routers.
        routed_experts: all routed experts.
        norms: the layers' and the final norms.
    """

    total: int
    active: int
    embedding: int
    attention: int = 0
    recurrent: int = 0
    mlp: int = 0
    routed_experts: int = 0
    norms: int = 0


@dataclass
class Tally:
    parts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("embedding", "attention", "recurrent", "mlp", "routed_experts", "norms"), 0))
    inactive: int = 0  # routed-expert parameters a token does not use

    def add(self, part: str, n: int) -> None:
        self.parts[part] += n

    def experts(self, n_experts: int, per_expert: int, top_k: int) -> None:
        self.add("routed_experts", n_experts * per_expert)
        self.inactive += max(n_experts - top_k, 0) * per_expert

    def counts(self) -> ParamCounts:
        total = sum(self.parts.values())
        return ParamCounts(total=total, active=total - self.inactive, **self.parts)


def layers(c: Config) -> range:
    """The decoder layer indices."""
    return range(need(c, "num_hidden_layers"))


def moe_every(c: Config, i: int) -> bool:
    """Qwen2/3-MoE, Qwen3-Next: MoE unless in mlp_only_layers; every decoder_sparse_step-th layer."""
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    return (i not in (c.get("mlp_only_layers") or []) and experts > 0
            and (i + 1) % c.get("decoder_sparse_step", 1) == 0)


def decoder(c: Config, t: Tally, attention: Callable[[int], int], mlp: Callable[[int], None],
             norms_per_layer: int = 2) -> None:
    """Every layer: its mixer (`attention(i)` returns what to add to "attention"), its MLP, its norms."""
    h = need(c, "hidden_size")
    for i in layers(c):
        t.add("attention", attention(i))
        mlp(i)
        t.add("norms", norms_per_layer * h)


def dense(c: Config, t: Tally, bias: bool = False) -> Callable[[int], None]:
    """A layer's gated MLP of `intermediate_size` (LlamaMLP), as an `mlp` callback for `decoder`."""
    return lambda i: t.add("mlp", gated_mlp(need(c, "hidden_size"), need(c, "intermediate_size"), bias))


def moe_mlp(c: Config, t: Tally, *, inter: int, experts: int, shared_inter: int = 0,
             shared_gate: bool = False, gated: bool = True) -> None:
    """Router (no bias) + routed experts + optional shared expert (and its sigmoid gate)."""
    h = need(c, "hidden_size")
    per_expert = (3 if gated else 2) * h * inter
    t.experts(experts, per_expert, need(c, "num_experts_per_tok"))
    t.add("mlp", experts * h + (3 if gated else 2) * h * shared_inter + (h if shared_gate else 0))

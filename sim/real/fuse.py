"""Fused projections: the matmuls that read the same input run as one.

transformers' attention modules project the hidden states with three
`nn.Linear` (`q_proj`, `k_proj`, `v_proj`) and its gated MLPs with two
(`gate_proj`, `up_proj`), one matmul each. Serving engines hold each group
as one weight and run one matmul (vLLM's `QKVParallelLinear` and
`MergedColumnParallelLinear` in vllm/model_executor/layers/linear.py;
SGLang's models reuse them): at decode batch sizes the matmul reads its
weight once either way, but three small matmuls leave the GPU's bandwidth
less used than one large one (on the H200, `benchmarks/bench_gemv.py`:
Gemma-3-12B's decode matmuls 7.22 ms as transformers calls them, 6.50 ms
fused, at batch 1).

`fuse_projections(model)` rewrites every module that owns such a group, in
place and without copying a weight twice:

- the group's weights (and biases) are concatenated into one parameter of
  the module (`unikv_fused_weight`, `unikv_fused_bias`), and each member
  `nn.Linear` becomes a `_Part` whose weight is its rows of it (a view: no
  byte is held twice);
- the module's class becomes a subclass whose forward runs the group's one
  matmul on the module's input (its first positional argument or its
  `hidden_states` / `x` keyword) before the original forward, and forgets
  it after;
- a `_Part` called on exactly that input (`is`) returns its columns of the
  fused output; called on anything else it runs its own matmul over its
  rows. The original forward is never edited, so the rewrite is exact
  whatever the module does: where it projects another tensor, the part
  falls back and only the fused matmul's work is wasted.

Each output element is the same dot product either way; cuBLAS may pick
another reduction order for the wider matmul, so results agree to the
dtype's rounding, not bit for bit.

The members must be `nn.Linear` of one input width, dtype and device, all
with a bias or none; a module whose group does not meet that is left as it
is and reported (`skipped`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_CLASSES: dict[type, type] = {}


class _Group:
    """What the module's forward left for its parts: the input the fused
    matmul ran on and its output (None outside the forward)."""

    __slots__ = ("input", "output")

    def __init__(self) -> None:
        self.input: Any = None
        self.output: Any = None


@functools.cache
def _part_class() -> type:
    import torch

    class _Part(torch.nn.Module):
        """One member of a fused group: columns `[lo, hi)` of the group's
        output on the group's input, else its own matmul over its rows."""

        def __init__(self, group: _Group, lo: int, hi: int, weight, bias) -> None:
            super().__init__()
            self.unikv_group, self.lo, self.hi = group, lo, hi
            self.in_features, self.out_features = int(weight.shape[1]), hi - lo
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

        def forward(self, x):
            g = self.unikv_group
            if g.output is not None and x is g.input:
                return g.output[..., self.lo:self.hi]
            return torch.nn.functional.linear(x, self.weight, self.bias)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, fused [{self.lo}:{self.hi})"

    return _Part


def _fused_class(base: type) -> type:
    """`base` with a forward that primes the module's group first (one
    subclass per base class, so layers of a class still share a class)."""
    cls = _CLASSES.get(base)
    if cls is not None:
        return cls
    import torch

    def forward(self, *args, **kwargs):
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
        g = self.unikv_group
        if x is not None:
            g.input, g.output = x, torch.nn.functional.linear(x, self.unikv_fused_weight, self.unikv_fused_bias)
        out = base.forward(self, *args, **kwargs)
        g.input = g.output = None
        return out

    cls = type(f"Fused{base.__name__}", (base,), {"forward": forward, "__module__": __name__,
                                                   "__doc__": f"{base.__name__}, its projections fused."})
    _CLASSES[base] = cls
    return cls


def _why_not(module, names: Sequence[str]) -> str | None:
    """Why `module`'s `names` cannot be fused (None: they can)."""
    import torch

    if getattr(module, "unikv_group", None) is not None:
        return "already fused"
    members = [getattr(module, n, None) for n in names]
    if not all(type(m) is torch.nn.Linear for m in members):
        return f"{'/'.join(names)} are not all torch.nn.Linear"
    if len({(m.in_features, m.weight.dtype, m.weight.device, m.bias is None) for m in members}) != 1:
        return f"{'/'.join(names)} differ in input width, dtype, device or bias"
    return None


def fuse_projections(model) -> dict:
    """Fuse every q/k/v and gate/up group of `model`'s modules, in place.

    Returns:
        {"attention": modules whose q/k/v were fused, "mlp": modules whose
        gate/up were fused, "skipped": {module path: reason}}: the counts a
        run records.
    """
    import torch

    part = _part_class()
    done = {"attention": 0, "mlp": 0, "skipped": {}}
    for path, module in list(model.named_modules()):
        for names in GROUPS:
            if not all(hasattr(module, n) for n in names):
                continue
            why = _why_not(module, names)
            if why is not None:
                done["skipped"][path or type(module).__name__] = why
                continue
            members = [getattr(module, n) for n in names]
            with torch.no_grad():
                weight = torch.cat([m.weight for m in members])
                bias = None if members[0].bias is None else torch.cat([m.bias for m in members])
            group = _Group()
            module.unikv_fused_weight = torch.nn.Parameter(weight, requires_grad=False)
            module.unikv_fused_bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
            module.unikv_group = group
            lo = 0
            for n, m in zip(names, members):
                hi = lo + m.out_features
                setattr(module, n, part(group, lo, hi, weight[lo:hi], None if bias is None else bias[lo:hi]))
                lo = hi
            module.__class__ = _fused_class(type(module))
            done["attention" if names[0] == "q_proj" else "mlp"] += 1
    return done

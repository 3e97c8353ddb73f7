"""The step-time roofline of one engine step on one GPU (docs/cost_model.md).

    step    = overhead + max(compute, hbm) + move
    compute = (2 * params_active * tokens + attention_flops) / (peak_flops * mfu)
    hbm     = (weight_bytes_read + kv_bytes_read) / (hbm_bytes_per_s * mbu)
    move    = 2 * moved_bytes / move_bytes_per_s

`attention_flops` counts the score and value products: per attention layer,
2 x query heads x (head_dim_k + head_dim_v) FLOPs for every (query token,
attended position) pair (`ModelSpec.attention_pair_flops` sums that over a
band's layers). A prefill chunk of c tokens over p cached positions attends
c * p + c (c + 1) / 2 pairs in a full layer; a window bounds each token's
pairs in a window layer; a decoder attends its whole context.

An MLA model (`ModelSpec.mla_flops`) runs the two forms engines run: prefill
chunks pay `attention_pair_flops` per pair (the non-absorbed MHA form) plus
the up-projection of each chunk's cached tokens, decoders pay the absorbed
form's pair FLOPs.

`weight_bytes_read` is what the step's tokens touch: an MoE layer's routed
experts are read only where some token routes to them. N tokens each
choosing top-k of E experts uniformly touch E (1 - (1 - k/E)^N) distinct
experts in expectation; shared experts, attention and dense layers are
always read.
"""

from __future__ import annotations

from dataclasses import dataclass

from unikv.sim.hardware import HardwareSpec
from unikv.sim.models import ModelSpec


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one step's attention works over, beyond its token counts.

    Attributes:
        prefill: per prefilling request, (chunk tokens, cached tokens the
            chunk attends before its own).
        decode_context_tokens: the decoders' contexts summed (each decoder
            attends its whole sequence, its new token included).
        decode_window_tokens: the same, each capped at the model's window
            (0 for a model without window layers).
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode_context_tokens: int = 0
    decode_window_tokens: int = 0


@dataclass(frozen=True)
class StepCost:
    """One step's time, by term (seconds)."""

    overhead_s: float
    compute_s: float
    hbm_s: float
    move_s: float

    @property
    def total_s(self) -> float:
        return self.overhead_s + max(self.compute_s, self.hbm_s) + self.move_s


def window_pairs(start: int, tokens: int, window: int | None) -> int:
    """(query, key) pairs of `tokens` consecutive queries from position
    `start` on, each attending the `window` positions up to itself (None:
    every earlier position, the causal full attention)."""
    return _causal_prefix(start + tokens, window) - _causal_prefix(start, window)


def _causal_prefix(n: int, window: int | None) -> int:
    """Pairs of queries 0..n-1, query q attending min(q + 1, window) keys."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts `tokens` tokens touch, each routing to
    `top_k` of `experts` uniformly: E (1 - (1 - k/E)^N)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


class Roofline:
    """The roofline of one model on one accelerator, looked up once.

    Args:
        model: the model (its params_active / weight_bytes must be known by
            the first step that runs a forward; `attention_pair_flops` and
            the expert counts are optional: without them the step charges
            no attention FLOPs, or reads every expert, and `corrections`
            says so).
        hw: the accelerator.
    """

    def __init__(self, model: ModelSpec, hw: HardwareSpec) -> None:
        self.model, self.hw = model, hw
        self.window = model.window_tokens if model.swa_layers else None
        self.pair_flops = model.attention_pair_flops or (0, 0)
        # (decode pair, cached token) FLOPs: MLA's absorbed decode and re-expanded cache
        self.decode_pair_flops: int
        self.cached_token_flops: int
        self.decode_pair_flops, self.cached_token_flops = model.mla_flops or (self.pair_flops[0], 0)
        self.meta = model.meta_tokens
        self.moe = None
        if model.routed_experts and model.experts_per_token and model.params_total and model.params_active:
            e, k = model.routed_experts, model.experts_per_token
            routed = (model.params_total - model.params_active) * e / (e - k) if e > k else 0.0
            self.moe = (e, k, routed / model.params_total)  # routed share of the weights

    @property
    def corrections(self) -> dict[str, bool]:
        """Which corrections apply to this model: attention FLOPs, MoE expert touch."""
        return {"attention_flops": self.model.attention_pair_flops is not None,
                "moe_expert_touch": self.moe is not None}

    def attention_flops(self, shape: StepShape, decode_tokens: int) -> float:
        """Score + value FLOPs of one step's attention (see module docstring)."""
        return self._attention_flops(shape.prefill, shape.decode_context_tokens, shape.decode_window_tokens,
                                     decode_tokens)

    def _attention_flops(self, prefill_chunks: tuple[tuple[int, int], ...], decode_context_tokens: int,
                         decode_window_tokens: int, decode_tokens: int) -> float:
        """`attention_flops` of a shape given by its fields (`StepShape`)."""
        full_f, swa_f = self.pair_flops
        if not (full_f or swa_f):
            return 0.0
        # every query also attends the shared meta tokens (Hymba), in every layer
        decode = decode_context_tokens + self.meta * decode_tokens
        prefill = cached_total = 0
        swa = decode_window_tokens + self.meta * decode_tokens
        for chunk, cached in prefill_chunks:
            prefill += window_pairs(cached, chunk, None) + self.meta * chunk
            if swa_f:
                swa += window_pairs(cached, chunk, self.window)
            swa += self.meta * chunk
            cached_total += cached
        return (full_f * prefill + self.decode_pair_flops * decode + swa_f * swa
                + self.cached_token_flops * cached_total)

    def weight_bytes_read(self, weights: float, tokens: int) -> float:
        """Weight bytes a step of `tokens` tokens reads (MoE: the touched experts)."""
        if self.moe is None:
            return weights
        e, k, routed = self.moe
        return weights * ((1.0 - routed) + routed * experts_touched(tokens, e, k) / e)

    def cost(self, *, prefill_tokens: int, decode_tokens: int, kv_bytes_read: int, moved_bytes: int,
             params_active: float, weight_bytes: float, shape: StepShape | None) -> StepCost:
        """The terms of one step's time; `shape` None charges no attention FLOPs."""
        tokens = prefill_tokens + decode_tokens
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 2 * moved_bytes / self.hw.move_bytes_per_s)
        attn = 0.0 if shape is None else self.attention_flops(shape, decode_tokens)
        return StepCost(*self._terms(tokens, attn, kv_bytes_read, moved_bytes, params_active, weight_bytes))

    def decode_s(self, decode_tokens: int, decode_context_tokens: int, decode_window_tokens: int,
                 kv_bytes_read: int, moved_bytes: int, params_active: float, weight_bytes: float) -> float:
        """`cost(...).total_s` of a step that only decodes (`decode_tokens` >
        0 decoders, their contexts summed as `StepShape` sums them), with no
        `StepShape` or `StepCost` built: the simulated engine's usual step."""
        attn = self._attention_flops((), decode_context_tokens, decode_window_tokens, decode_tokens)
        overhead_s, compute_s, hbm_s, move_s = self._terms(decode_tokens, attn, kv_bytes_read, moved_bytes,
                                                           params_active, weight_bytes)
        return overhead_s + max(compute_s, hbm_s) + move_s  # StepCost.total_s

    def _terms(self, tokens: int, attn: float, kv_bytes_read: int, moved_bytes: int, params_active: float,
               weight_bytes: float) -> tuple[float, float, float, float]:
        """(overhead, compute, hbm, move) seconds of a step of `tokens` > 0
        tokens and `attn` attention FLOPs."""
        hw = self.hw
        compute_s = (2 * params_active * tokens + attn) / (hw.peak_flops * hw.mfu)
        hbm_s = (self.weight_bytes_read(weight_bytes, tokens) + kv_bytes_read) / (hw.hbm_bytes_per_s * hw.mbu)
        return hw.step_overhead_s, compute_s, hbm_s, 2 * moved_bytes / hw.move_bytes_per_s

    def shape_of(self, plan, memory) -> StepShape:
        """The `StepShape` of a planned step, this model's window applied (`shape_of`)."""
        return shape_of(plan, memory, self.window)


def shape_of(plan, memory, window: int | None) -> StepShape:
    """The `StepShape` of a planned step (`sim.scheduler.StepPlan`), whose
    memory is allocated (each request's `seq` counts this step's tokens).

    A batch of every running request reads the decoders' contexts from the
    totals `memory` keeps (`held_seq`, `held_window`), as
    `sim.run.KVRead.from_totals` does, instead of walking them.

    Args:
        plan: the step.
        memory: the `sim.memory.Memory` it allocated from.
        window: the model's window, tokens (None: no window layers).
    """
    prefill = tuple((chunk, r.seq - chunk) for r, chunk in plan.prefill)
    if plan.whole_batch:
        seq = memory.held_seq - sum(r.seq for r, _ in plan.prefill)
        if window is None:
            return StepShape(prefill, seq, 0)
        if memory.window_cap == window:
            inside = memory.held_window - sum(min(r.seq, window) for r, _ in plan.prefill)
            return StepShape(prefill, seq, inside)
    seqs = [r.seq for r in plan.decode]
    inside = sum([s if s < window else window for s in seqs]) if window is not None else 0
    return StepShape(prefill, sum(seqs), inside)

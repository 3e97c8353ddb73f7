"""Layouts for a model: which bands, in which chain, split how, behind which pool.

`build_layout(model, kv_budget_gib=..., page_size=..., kind=...)` turns a
`ModelSpec` into a `LayoutPlan`: the `Layout` (bands "mamba", "swa", "full"
low byte -> high byte), the pool class that drives it, and, for the fixed
splits, the byte fractions each band's region gets: `fixed_ratio` at given
start-up ratios (`docs/models.md`, "Static split"; for sweeps), `sglang` as
SGLang sizes its pools (`sim.sglang`; docs/models.md, "Baselines: sglang");
for `vllm`, vLLM's KV-cache groups (`sim.vllm_rules`, docs/models.md
"Baselines: vllm").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from unikv.sim import sglang
from unikv.sim.fit import fits_alone, over_context
from unikv.sim.models import ModelSpec
from unikv.sim.vllm_rules import VllmGroups, vllm_bands, vllm_groups, vllm_refusal

from unikv import Band, Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.baselines import VllmPool

LAYOUT_KINDS = (
    "fixed_ratio",
    "sglang",
    "end_end", "end_float_end", "oracle",
    "vllm",
)
# Layouts whose bands own fixed regions (StaticPartitionPool, `fractions`).
FIXED_KINDS = frozenset({"fixed_ratio", "sglang"})

# SGLang defaults (python/sglang/srt/server_args.py): swa pool tokens / full pool
# tokens, and mamba state bytes / full KV bytes. Sources in docs/models.md.
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9

_POOL_CLASSES = {"fixed_ratio": StaticPartitionPool, "sglang": StaticPartitionPool,
                 "end_end": UnifiedPool, "end_float_end": UnifiedPool, "oracle": OraclePool,
                 "vllm": VllmPool}
_GROWS = {1: ("down",), 2: ("up", "down"), 3: ("up", "float", "down")}


class RequestTooLargeError(ValueError):
    """One request of the asked size cannot fit the layout, even alone."""


class ContextTooLongError(RequestTooLargeError):
    """One request is longer than the model's maximum context: no layout
    and no budget can run it."""


@dataclass(frozen=True, kw_only=True)
class StaticRatio:
    """Start-up split ratios of the fixed_ratio layout (SGLang's names and meaning).

    Attributes:
        swa_full_tokens: swa pool tokens / full pool tokens
            (`--swa-full-tokens-ratio`).
        mamba_full_memory: mamba state bytes / full KV bytes
            (`--mamba-full-memory-ratio`).
    """

    swa_full_tokens: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_full_memory: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO

    def __post_init__(self) -> None:
        for name in ("swa_full_tokens", "mamba_full_memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value < math.inf:
                raise ValueError(f"StaticRatio: {name}={value!r} must be a positive finite number")


@dataclass(frozen=True, kw_only=True)
class LayoutPlan:
    """A model's layout of one kind over one KV budget, ready to make its pool.

    Attributes:
        kind: one of LAYOUT_KINDS.
        model: the model it was built for (for "sglang": as SGLang stores
            it, `sim.sglang.deployed_model`).
        layout: the buffer and its bands.
        pool_class: "UnifiedPool", "StaticPartitionPool" or "OraclePool".
        fractions: band -> share of the bytes past the sink (FIXED_KINDS only).
        static_ratio: the ratios the fractions came from (FIXED_KINDS only).
        pool_sizes: SGLang's pool sizes over the budget ("sglang" only).
        vllm: vLLM's KV-cache groups (vllm only; `sim.vllm_rules`).
    """

    kind: str
    model: ModelSpec
    layout: Layout
    pool_class: str
    fractions: Mapping[str, float] | None = field(default=None, hash=False)
    static_ratio: StaticRatio | None = None
    pool_sizes: sglang.PoolSizes | None = None
    vllm: VllmGroups | None = None

    @property
    def page_size(self) -> int:
        return self.layout.page_size

    @property
    def kv_budget_bytes(self) -> int:
        return self.layout.total_bytes

    @property
    def chain(self) -> str:
        """The bands low byte -> high byte, e.g. "mamba(up) | swa(float) | full(down)"."""
        return " | ".join(f"{b.name}({b.grow.value})" for b in self.layout.bands)

    def make_pool(self, backend=None, compaction: str = "lazy", ids: str | None = None):
        """A fresh pool for this plan (compaction applies to UnifiedPool
        only; `ids`: what its allocs return, see `UnifiedPool`)."""
        if self.kind in FIXED_KINDS:
            return StaticPartitionPool(self.layout, backend, fractions=dict(self.fractions), ids=ids)
        if self.kind == "oracle":
            return OraclePool(self.layout, backend, ids=ids)
        if self.vllm is not None:
            return VllmPool(self.layout, backend, block_bytes=self.vllm.block_bytes,
                            prefix_caching=self.vllm.prefix_caching, ids=ids)
        return UnifiedPool(self.layout, backend, compaction=compaction, ids=ids)

    @property
    def metadata(self) -> dict:
        """Run-identity fields for results tables (METRICS.md, "Run identity")."""
        ratio = self.static_ratio
        return {
            "layout": self.kind, "model": self.model.name, "chain": self.chain,
            "pool_class": self.pool_class, "kv_budget_bytes": self.kv_budget_bytes,
            "page_size": self.page_size, "state_dtype": self.model.state_dtype,
            "fractions": dict(self.fractions) if self.fractions else None,
            "swa_full_tokens_ratio": ratio.swa_full_tokens if ratio else None,
            "mamba_full_memory_ratio": ratio.mamba_full_memory if ratio else None,
            "state_slots": self.pool_sizes.state_slots if self.pool_sizes else None,
            "vllm": _vllm_metadata(self) if self.vllm else None,
        }

    def max_running(self, requested: int, slots_per_request: int) -> int:
        """The running cap of this plan: `requested`, and for "sglang" also
        SGLang's cap (`sim.sglang.pool_sizes`: token pool // 2, state slots
        // `slots_per_request`).

        Raises:
            ValueError: the sglang cap is 0 (SGLang would not start).
        """
        sizes = self.pool_sizes
        if sizes is None:
            return requested
        cap = min(requested, sizes.full_tokens // 2)
        if sizes.state_slots:
            cap = min(cap, sizes.state_slots // slots_per_request)
        if cap < 1:  # SGLang refuses to start (resolve_max_num_reqs)
            raise ValueError(f"sglang layout of {self.model.name!r}: the state pool holds "
                             f"{sizes.state_slots} slots, fewer than one request's "
                             f"{slots_per_request}; raise kv_budget_gib")
        return cap


def applicable_kinds(model: ModelSpec) -> tuple[str, ...]:
    """The layout kinds `build_layout` accepts for `model`."""
    if not (model.full_layers or model.swa_layers):
        return ()  # a state-only model (pure Mamba): no token band to lay out yet
    n_bands = len(model.kinds)
    middle = "end_float_end" if n_bands == 3 else "end_end"
    kinds = ["fixed_ratio"]
    if sglang.unsupported_reason(model) is None:
        kinds.append("sglang")
    kinds += [middle, "oracle"]
    if vllm_refusal(model) is None:
        kinds.append("vllm")
    return tuple(kinds)


def model_bands(model: ModelSpec, page_size: int) -> tuple[Band, ...]:
    """The model's bands in chain order with the unified grow directions.

    Token bands ("swa", "full") use `page_size` and blocks_per_page = 2 x
    layers (K and V of every layer, layer-major in a page); the "mamba"
    request band holds one state per slot.
    """
    if not (model.full_layers or model.swa_layers):
        raise ValueError(f"model {model.name!r} has no attention layers; "
                         "a layout needs at least one token band")
    kinds = model.kinds
    bands = []
    for kind, grow in zip(kinds, _GROWS[len(kinds)]):
        if kind == "mamba":
            bands.append(Band("mamba", entry_bytes=model.state_bytes, grow=grow,
                              page_size=1, unit="request"))
            continue
        layers = model.swa_layers if kind == "swa" else model.full_layers
        entry = model.swa_token_bytes if kind == "swa" else model.full_token_bytes
        bands.append(Band(kind, entry_bytes=entry, grow=grow, page_size=page_size,
                          unit="token", blocks_per_page=2 * layers))
    return tuple(bands)


def static_fractions(model: ModelSpec, static_ratio=None) -> dict[str, float]:
    """Byte fractions (of the bytes past the sink) the static split gives each band.

    As SGLang sizes its pools: the mamba band first takes
    r_m / (1 + r_m) of the bytes (r_m = mamba_full_memory); the rest T is
    split so that swa pool tokens = r_s x full pool tokens
    (r_s = swa_full_tokens): full = T F / (F + r_s S), swa = T r_s S / (F + r_s S),
    with F, S the full and swa bytes per token (all layers of each kind).

    Args:
        static_ratio: None (SGLang defaults), a `StaticRatio`, or one float
            for a model with exactly one ratio (full+swa or full+mamba).
    """
    ratio = _resolve_ratio(model, static_ratio)
    kinds = model.kinds
    mamba = ratio.mamba_full_memory / (1 + ratio.mamba_full_memory) if "mamba" in kinds else 0.0
    tokens = 1.0 - mamba
    out = {"mamba": mamba} if "mamba" in kinds else {}
    if "swa" in kinds and "full" in kinds:
        full_b, swa_b = model.full_token_bytes, ratio.swa_full_tokens * model.swa_token_bytes
        out["swa"] = tokens * swa_b / (full_b + swa_b)
        out["full"] = tokens * full_b / (full_b + swa_b)
    else:
        out[next(k for k in kinds if k != "mamba")] = tokens
    return {k: out[k] for k in kinds}


def _resolve_ratio(model: ModelSpec, static_ratio) -> StaticRatio:
    if static_ratio is None:
        return StaticRatio()
    if isinstance(static_ratio, StaticRatio):
        return static_ratio
    if isinstance(static_ratio, bool) or not isinstance(static_ratio, (int, float)):
        raise ValueError(f"static_ratio={static_ratio!r} must be None, a float or a StaticRatio")
    kinds = set(model.kinds)
    if kinds >= {"swa", "full", "mamba"}:
        raise ValueError(f"static_ratio={static_ratio!r} is ambiguous for model {model.name!r} "
                         "(it has swa and mamba bands); pass StaticRatio(swa_full_tokens=..., "
                         "mamba_full_memory=...)")
    if "mamba" in kinds:
        return StaticRatio(mamba_full_memory=static_ratio)
    return StaticRatio(swa_full_tokens=static_ratio)


def build_layout(model: ModelSpec, *, kv_budget_gib: float, page_size: int, kind: str,
                 static_ratio=None) -> LayoutPlan:
    """The `kind` layout of `model` over a buffer of `kv_budget_gib` GiB.

    Chains: one kind -> full(down) (or swa(down)); two -> swa|full or
    mamba|full as up|down; three -> mamba(up) | swa(float) | full(down).
    fixed_ratio, sglang and oracle use the same chain (their pools ignore
    grow); sglang first folds the window layers SGLang does not split into
    the full band (`sim.sglang.deployed_model`).

    Args:
        static_ratio: see `static_fractions`; used by kind="fixed_ratio" only.

    Raises:
        ValueError: an unknown kind (listing LAYOUT_KINDS), a kind the model
            cannot use (naming the missing band, or why SGLang cannot deploy
            it, and the kinds that apply), a bad budget or page size, or a
            budget too small for the bands.
    """
    if kind not in LAYOUT_KINDS:
        hint = " (the 'static' layout is now 'fixed_ratio')" if kind == "static" else ""
        raise ValueError(f"kind={kind!r} is not one of {LAYOUT_KINDS}{hint}")
    if not (model.full_layers or model.swa_layers):
        raise ValueError(f"model {model.name!r} is state-only ({model.state_layers} recurrent layers, "
                         "no attention layer): no layout describes a model without a token band yet")
    _check_kind(model, kind)
    if isinstance(kv_budget_gib, bool) or not isinstance(kv_budget_gib, (int, float)) \
            or not 0 < kv_budget_gib < math.inf:
        raise ValueError(f"kv_budget_gib={kv_budget_gib!r} must be a positive number")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size={page_size!r} must be a positive integer")
    if kind == "sglang":
        return _sglang_plan(model, int(kv_budget_gib * 2**30), page_size)
    groups = vllm_groups(model, page_size) if kind == "vllm" else None
    bands = vllm_bands(model, groups) if groups else model_bands(model, page_size)
    layout = Layout(total_bytes=int(kv_budget_gib * 2**30), bands=bands)
    ratio = fractions = None
    if kind == "fixed_ratio":
        ratio = _resolve_ratio(model, static_ratio)
        fractions = static_fractions(model, ratio)
    return LayoutPlan(kind=kind, model=model, layout=layout,
                      pool_class=_POOL_CLASSES[kind].__name__, fractions=fractions,
                      static_ratio=ratio, vllm=groups)


def _sglang_plan(model: ModelSpec, total_bytes: int, page_size: int) -> LayoutPlan:
    """SGLang's regions over the whole buffer (`sim.sglang`)."""
    deployed = sglang.deployed_model(model)
    layout = Layout(total_bytes=total_bytes, bands=model_bands(deployed, page_size))
    usable = total_bytes - layout.sink_bytes  # the sink page stands for SGLang's padding slot
    sizes = sglang.plan_sizes(deployed, budget_bytes=usable, page_size=page_size)
    fractions = sglang.plan_fractions(deployed, sizes, usable)
    ratio = StaticRatio(swa_full_tokens=sglang.SWA_FULL_TOKENS_RATIO,
                        mamba_full_memory=sglang.MAMBA_FULL_MEMORY_RATIO)
    return LayoutPlan(kind="sglang", model=deployed, layout=layout,
                      pool_class=StaticPartitionPool.__name__, fractions=fractions,
                      static_ratio=ratio, pool_sizes=sizes)


def _check_kind(model: ModelSpec, kind: str) -> None:
    if kind in applicable_kinds(model):
        return
    if kind == "vllm":
        raise ValueError(f"the vllm layout does not apply: {vllm_refusal(model)}; layouts that "
                         f"apply: {applicable_kinds(model)}")
    have = ", ".join(model.kinds) or "none"
    if kind == "sglang":
        raise ValueError(f"sglang layout: {sglang.unsupported_reason(model)}; layouts that "
                         f"apply: {applicable_kinds(model)}")
    if kind == "end_float_end":
        missing = [k for k in ("full", "swa", "mamba") if k not in model.kinds]
        raise ValueError(f"end_float_end needs full, swa and mamba bands; model {model.name!r} "
                         f"has no {' or '.join(missing)} band (it has {have}); layouts that "
                         f"apply: {applicable_kinds(model)}")
    raise ValueError(f"{kind} holds at most two bands; model {model.name!r} has three "
                     f"({have}); layouts that apply: {applicable_kinds(model)}")


def _vllm_metadata(plan: LayoutPlan) -> dict:
    """vLLM's sizing of `plan` as its start-up log states it (`sim.vllm_rules`)."""
    groups = plan.vllm
    assert groups is not None
    blocks = groups.num_blocks(plan.kv_budget_bytes)
    return {"block_tokens": groups.block_tokens, "group_layers": groups.group_layers,
            "groups": dict(groups.groups), "block_bytes": groups.block_bytes, "num_blocks": blocks,
            "kv_cache_tokens": groups.kv_cache_tokens(blocks), "prefix_caching": groups.prefix_caching,
            "state_blocks": groups.state_blocks, "mamba_padding_pct": groups.mamba_padding_pct()}


def worst_case_request_bytes(model: ModelSpec, prompt_tokens: int, output_tokens: int,
                             page_size: int, *,
                             prefill_chunk_tokens: int | None = None) -> dict[str, int]:
    """Peak bytes one request holds in each band, page-rounded.

    full: every token. swa (and chunked-local): the window plus one prefill
    chunk, plus one page of misalignment, capped by every token; a chunk of
    None means the whole prompt in one forward (the coupled alloc binds all
    prompt tokens on every token band before the window ratchet releases
    them). mamba: one state slot.
    """
    for name, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r} must be a non-negative integer")
    tokens = prompt_tokens + output_tokens
    all_pages = -(-tokens // page_size)
    chunk = prompt_tokens if prefill_chunk_tokens is None else prefill_chunk_tokens
    out = {}
    if model.state_layers:
        out["mamba"] = model.state_bytes
    if model.swa_layers:
        swa_pages = -(-(model.window_tokens + max(chunk, 1)) // page_size) + 1
        out["swa"] = min(all_pages, swa_pages) * page_size * model.swa_token_bytes
    if model.full_layers:
        out["full"] = all_pages * page_size * model.full_token_bytes
    return out


def static_region_bytes(plan: LayoutPlan) -> dict[str, int]:
    """Whole-page bytes of each band's static region (as StaticPartitionPool splits)."""
    layout = plan.layout
    usable, start, out = layout.total_bytes - layout.sink_bytes, layout.sink_bytes, {}
    for g in layout:
        end = start + int(usable * plan.fractions[g.band.name])
        lo = max(g.min_page, -(-start // g.page_bytes))
        hi = min(g.num_pages, end // g.page_bytes)
        out[g.band.name] = max(0, hi - lo) * g.page_bytes
        start = end
    return out


def check_fits(plan: LayoutPlan, max_request_tokens: int, *,
               prefill_chunk_tokens: int | None = None, compaction: str = "lazy",
               state_slots_per_request: int = 1) -> dict[str, int]:
    """Raise unless one request of `max_request_tokens` tokens fits `plan` alone.

    The decision is the engine's own: `sim.fit.fits_alone` allocates the
    request (all prompt, in chunks of `prefill_chunk_tokens`, the window
    ratchet between) on an empty pool of `plan`, so a request passes here
    exactly when the engine can hold it (band alignment, sink and page
    rounding included), holding `state_slots_per_request` state slots (the
    engine rules', `sim.engines`). Returns the request's per-band footprint
    (`worst_case_request_bytes`), which also names the band in the error.

    Raises:
        ContextTooLongError: the request is longer than the model's maximum
            context (`ModelSpec.max_context_tokens`), naming both.
        RequestTooLargeError: naming the band (static) or the layout, the
            bytes needed and held.
    """
    model = plan.model
    if over_context(model, max_request_tokens):
        raise ContextTooLongError(
            f"one request of {max_request_tokens} tokens is longer than the maximum context of "
            f"{model.name!r} ({model.max_context_tokens} tokens), so no layout can run it; clip "
            "the trace (max_context_tokens) or pass oversize='reject'")
    need = worst_case_request_bytes(plan.model, max_request_tokens, 0, plan.page_size,
                                    prefill_chunk_tokens=prefill_chunk_tokens)
    if "mamba" in need:
        need["mamba"] *= state_slots_per_request  # the engine rules' slots
    try:
        ok = fits_alone(plan, max_request_tokens, prefill_chunk_tokens=prefill_chunk_tokens,
                        compaction=compaction, state_slots_per_request=state_slots_per_request)
    except ValueError as exc:  # the pool cannot be built at this budget
        raise RequestTooLargeError(f"{plan.kind} layout of {plan.model.name!r}: {exc}; "
                                   "raise kv_budget_gib") from exc
    if not ok:
        raise RequestTooLargeError(_too_large(plan, max_request_tokens, need))
    return need


def _too_large(plan: LayoutPlan, tokens: int, need: dict[str, int]) -> str:
    layout = plan.layout
    what = f"one request of {tokens} tokens on {plan.model.name!r}"
    if plan.kind in FIXED_KINDS:
        have = static_region_bytes(plan)
        band = max(need, key=lambda b: need[b] - have[b])  # the tightest region
        return (f"{what} needs about {need[band]} bytes in band {band!r}, but its static region "
                f"holds {have[band]} bytes ({plan.fractions[band]:.3f} of a "
                f"{layout.total_bytes / 2**30:.3g} GiB budget); raise kv_budget_gib or change "
                "static_ratio")
    usable = layout.total_bytes - layout.sink_bytes
    parts = ", ".join(f"{b}: {n}" for b, n in need.items())
    return (f"{what} needs about {sum(need.values())} bytes ({parts}) with page and band "
            f"alignment, but the {plan.kind} layout has {usable} usable bytes; raise kv_budget_gib")

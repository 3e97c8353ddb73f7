"""vLLM's hybrid KV-cache block pool: one pool of equal blocks shared by every layer group.

vLLM (v1 engine) splits a hybrid model's layers into KV-cache groups of equal
layer count and gives every group the same page size, so one `BlockPool`
(`vllm/v1/core/block_pool.py`, `BlockPool`) of `num_blocks` equal blocks
serves them all: a block of one group is as good as a block of any other.
Here each band stands for the groups of one layer kind, so one page of a band
is a whole number of blocks (the band's groups each take one block per
`page_size` tokens; a state band's slot is every mamba group's blocks of one
request). The pool is a byte budget counted in blocks: any free block serves
any band, nothing moves, and block 0 is vLLM's null block (`BlockPool.__init__`
pops it off the free queue as a placeholder), so it plays the sink.

Which groups a model gets, its block size and how many blocks each kind costs
are the simulator's business (`unikv.sim.vllm_rules`, docs/models.md,
"Baselines: vllm"); this pool takes the block bytes and band geometry as given.
"""

from __future__ import annotations

import math

from unikv.bands import BudgetBand
from unikv.layout import Layout, Unit
from unikv.pool import UnifiedPool


class VllmBlockBand(BudgetBand):
    """A band whose pages are whole blocks of the shared vLLM block pool.

    Args:
        budget_bytes: bytes of the usable blocks (null block excluded), shared
            by every band of the pool.
    """

    def __init__(self, geom, ctx, counters, *, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes  # read by `reset`, which the base constructor calls
        super().__init__(geom, ctx, counters)

    def reset(self) -> None:
        super().reset()
        self._budget_bytes = self.budget_bytes


class VllmPool(UnifiedPool):
    """vLLM's one block pool for every KV-cache group, behind the pool surface.

    Args:
        layout: the buffer (`total_bytes`: the KV memory vLLM is given) and
            its bands; every band's page (a token band's `entry_bytes x
            page_size`, a state band's `entry_bytes`) must be a whole number
            of blocks.
        backend: as for `UnifiedPool`; byte accounting only (a block's place
            in memory is vLLM's business, not modelled), so a materialised
            backend is refused.
        block_bytes: bytes of one block over all layers of one group (vLLM:
            page bytes per layer x layers per group); None: the greatest
            common divisor of the bands' pages.
        prefix_caching: whether vLLM caches prefix blocks for this model at
            its default mode (information only: the simulator's engine rules
            decide a run's prefix cache, `unikv.sim.engines.prefix_cache`).
        ids: as for `UnifiedPool`.
    Raises:
        ValueError: a bad argument, or a band page that is not whole blocks.
    """

    def __init__(self, layout: Layout, backend=None, *, block_bytes: int | None = None,
                 prefix_caching: bool = True, ids: str | None = None, **_ignored) -> None:
        if not isinstance(layout, Layout):
            raise ValueError(f"layout={layout!r} must be a unikv.Layout")
        if backend is not None and getattr(backend, "materialized", False):
            raise ValueError("VllmPool keeps no byte layout; use a backend with materialize=False")
        if not isinstance(prefix_caching, bool):
            raise ValueError(f"prefix_caching={prefix_caching!r} must be True or False")
        self.block_bytes = _check_blocks(layout, block_bytes)
        self.total_blocks = layout.total_bytes // self.block_bytes  # vLLM's num_gpu_blocks
        self.usable_blocks = self.total_blocks - 1  # block 0: the null block
        self.prefix_caching = prefix_caching
        self.budget_layout = layout
        self._page_blocks = {g.band.name: _page_bytes(g.band) // self.block_bytes for g in layout}
        # `layout` already holds a page of every band past its sink (>= one
        # page), so the usable blocks hold one too.
        self.band_classes = {"block": _bound_band(self.usable_blocks * self.block_bytes)}
        self.peak_live_blocks = 0
        super().__init__(_grid_layout(layout, self.block_bytes), backend, ids=ids)

    def _band_kind(self, band):
        return "block"

    # -- blocks --

    def page_blocks(self) -> dict[str, int]:
        """Blocks one page (a state band: one slot) of each band takes."""
        return dict(self._page_blocks)

    def live_blocks(self) -> int:
        """Blocks every band holds live now."""
        return sum([self.bands[n].live * k for n, k in self._page_blocks.items()])

    def free_blocks(self) -> int:
        """Usable blocks no band holds (vLLM's `get_num_free_blocks`, no cache)."""
        return self.usable_blocks - self.live_blocks()

    def _take_token_pages(self, pages: int):
        out = super()._take_token_pages(pages)
        if out is not None and len(out):
            self.peak_live_blocks = max(self.peak_live_blocks, self.live_blocks())
        return out

    def alloc_state(self, band: str, n: int):
        out = super().alloc_state(band, n)
        if out is not None and len(out):
            self.peak_live_blocks = max(self.peak_live_blocks, self.live_blocks())
        return out

    # -- observation --

    def verify(self) -> list[str]:
        """The pool's invariants, then the block budget's ([] when healthy)."""
        out = super().verify()
        live = self.live_blocks()
        if not 0 <= live <= self.usable_blocks:
            out.append(f"[vllm] {live} live blocks outside [0, {self.usable_blocks}] usable blocks")
        if self.peak_live_blocks < live:
            out.append(f"[vllm] peak_live_blocks {self.peak_live_blocks} < live blocks {live}")
        return out

    def stats(self) -> dict:
        """`UnifiedPool.stats()` plus the block pool: `vllm` = total / usable
        blocks, block bytes, blocks per page of each band, peak live blocks."""
        out = super().stats()
        out["vllm"] = {"total_blocks": self.total_blocks, "usable_blocks": self.usable_blocks,
                       "block_bytes": self.block_bytes, "page_blocks": self.page_blocks(),
                       "peak_live_blocks": self.peak_live_blocks}
        return out

    def occupancy(self) -> dict:
        """`UnifiedPool.occupancy()` over the real budget (`total_bytes` as
        given; the sink is the null block) plus the block counts."""
        out = super().occupancy()
        out["total_bytes"] = self.budget_layout.total_bytes
        out["sink_bytes"] = self.block_bytes
        out["blocks"] = {"total": self.total_blocks, "usable": self.usable_blocks,
                         "live": self.live_blocks(), "free": self.free_blocks()}
        return out


def _page_bytes(band) -> int:
    return band.entry_bytes if band.unit is Unit.REQUEST else band.page_bytes


def _check_blocks(layout: Layout, block_bytes) -> int:
    pages = {g.band.name: _page_bytes(g.band) for g in layout}
    if block_bytes is None:
        return math.gcd(*pages.values())
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes <= 0:
        raise ValueError(f"block_bytes={block_bytes!r} must be a positive integer")
    odd = {n: p for n, p in pages.items() if p % block_bytes}
    if odd:
        raise ValueError(f"band page bytes {odd} are not whole {block_bytes}-byte blocks")
    return block_bytes


def _grid_layout(layout: Layout, block_bytes: int) -> Layout:
    """The layout the bands' id grids are cut from: `total - sink` equals the
    budget past the null block (the pool's free bytes are then `total - null
    block - live`, as vLLM counts them). A band's grid may then fall one page
    short of the budget when the sink is not a whole number of its pages (a
    band alone filling the whole pool: never with a coupled alloc)."""
    return Layout(total_bytes=layout.total_bytes + layout.sink_bytes - block_bytes, bands=layout.bands)


def _bound_band(budget_bytes: int):
    """`VllmBlockBand` with its budget bound (the pool builds bands from a
    table of classes called as `cls(geom, ctx, counters)`)."""
    def make(geom, ctx, counters) -> VllmBlockBand:
        return VllmBlockBand(geom, ctx, counters, budget_bytes=budget_bytes)
    return make

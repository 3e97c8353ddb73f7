"""UnifiedPool: coupled token bands and state bands over one byte buffer."""

from __future__ import annotations

import enum
from typing import Any, Mapping, Optional

import torch

from unikv import paged, views
from unikv.backends.sim import SimBackend
from unikv.bands import UNIFIED_BANDS, BandContext
from unikv.chain import Chain
from unikv.extent import Kind
from unikv.hazards import Epoch, Hazards
from unikv.ids import IdSpace, as_ids, check_count, check_range, few
from unikv.layout import Layout, Side, Unit
from unikv.policy import flush_chain, relieve
from unikv.stats import Stats


class Compaction(enum.Enum):
    """How END bands reclaim freed pages."""

    EAGER = "eager"  # compact at every free
    LAZY = "lazy"  # leave holes; compact at flush time


class UnifiedPool:
    """One byte buffer shared by every band of `layout`.

    Token bands are coupled: `alloc` binds one virtual page id on every
    token band, and the id returns to the free list once no band binds it.
    Request (state) bands have their own ids, one slot per request.
    The pool asks, then acts: capacity views are pure; an alloc that does
    not fit returns None and leaves eviction to the caller.

    Args:
        layout: the buffer and its bands.
        backend: a `SimBackend` (default, byte accounting only) or
            `CudaBackend`.
        compaction: "lazy" or "eager" for END bands (floats are always
            holes-first).
        move_cap: most survivor moves one non-urgent flush makes per band.
    """

    band_classes: Mapping = UNIFIED_BANDS

    def __init__(self, layout: Layout, backend=None, compaction: str | Compaction = "lazy",
                 move_cap: int = 4096) -> None:
        if not isinstance(layout, Layout):
            raise ValueError(f"layout={layout!r} must be a unikv.Layout")
        try:
            self.compaction = Compaction(compaction)
        except ValueError:
            raise ValueError(f"compaction={compaction!r} must be 'lazy' or 'eager'") from None
        check_count(move_cap, "move_cap")
        self.layout = layout
        self.backend = backend if backend is not None else SimBackend()
        self.page_size = layout.page_size
        self.epoch = Epoch()
        self.hazards = Hazards(self.backend)
        self.counters = Stats.for_bands(layout.names)
        self.chain = Chain(layout, self.epoch)
        self.buffer = self.backend.make_buffer(layout.total_bytes)
        token_vspace = 1 + sum(g.usable_pages for g in layout if g.band.unit is Unit.TOKEN)
        self.bands: dict[str, Any] = {}
        for g in layout:
            token = g.band.unit is Unit.TOKEN
            ctx = BandContext(self.backend, self.buffer, self.epoch, self.hazards, self.chain,
                              token_vspace if token else g.usable_pages + 1,
                              self.compaction is Compaction.LAZY, move_cap, self._regions())
            cls = self.band_classes[self._band_kind(g.band)]
            self.bands[g.band.name] = cls(g, ctx, self.counters.bands[g.band.name])
        self.chain.bands = list(self.bands.values())
        self.token_names = [b.name for b in layout.token_bands]
        # Alloc order: END bands first, the float last (it can pick a side).
        self.token_order = sorted((self.bands[n].index for n in self.token_names),
                                  key=lambda i: self.chain.bands[i].kind is Kind.FLOAT)
        self.vids = IdSpace(self.backend, token_vspace, len(self.token_names))
        self.state_ids = {b.name: IdSpace(self.backend, layout.geometry(b.name).usable_pages + 1, 1)
                          for b in layout.state_bands}

    # -- construction hooks for the baselines --

    def _band_kind(self, band):
        return band.grow

    def _regions(self) -> Optional[dict]:
        return None

    # -- helpers --

    def _band(self, name: str):
        if name not in self.bands:
            raise ValueError(f"unknown band {name!r}; bands are {list(self.bands)}")
        return self.bands[name]

    def _token_band(self, name: str):
        band = self._band(name)
        if band.geom.band.unit is not Unit.TOKEN:
            raise ValueError(f"band {name!r} is a request (state) band; use free_state/alloc_state")
        return band

    def _state_band(self, name: str):
        band = self._band(name)
        if band.geom.band.unit is not Unit.REQUEST:
            raise ValueError(f"band {name!r} is a token band; alloc_state/free_state need a request band")
        return band

    def _require_tokens(self) -> None:
        if not self.token_names:
            raise ValueError("this layout has no token band; use alloc_state")

    def _ids(self, values, what: str) -> torch.Tensor:
        return as_ids(values, what, self.backend.device)

    # -- capacity views --

    def available_size(self, schedulable: bool = False) -> int:
        """Tokens a coupled `alloc` takes now without moving a page.

        `schedulable=True` also credits holes an urgent flush of the lazy
        END bands would reclaim (what the shortfall ladder can realise).
        """
        if not self.token_names:
            return 0
        return self.chain.joint_pages(self.token_order, schedulable) * self.page_size

    def available_state(self, band: str, schedulable: bool = False) -> int:
        """State slots `alloc_state(band, n)` takes now without moving a page."""
        return self.chain.band_pages(self._state_band(band).index, schedulable)

    # -- token surface --

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        """`n` virtual token ids (n a multiple of page_size), page-structured,
        bound on every token band; None on shortfall (nothing allocated)."""
        self._require_tokens()
        n = check_count(n, "alloc: n", self.page_size)
        pages = self._take_token_pages(n // self.page_size)
        if pages is None:
            return None
        offsets = self.backend.arange(0, self.page_size)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens=None) -> Optional[torch.Tensor]:
        """Tokens `[prefix, seq)` of each request with tail-page reuse.

        Args:
            prefix_lens, seq_lens: int [bs] token counts already held / wanted.
            last_loc: int [bs] virtual id of each request's last prefix token
                (read only where the prefix ends inside a page).
            extend_num_tokens: sum(seq - prefix), checked when given.
        Returns:
            int64 [sum(seq - prefix)] virtual token ids, request-major, or
            None on shortfall (nothing allocated).
        """
        self._require_tokens()
        req = paged.extend_request(self, prefix_lens, seq_lens, last_loc, extend_num_tokens)
        new_pages = self._take_token_pages(req.new_pages)
        if new_pages is None:
            return None
        return self.backend.paged_extend(req.prefix, req.seq, req.last_loc, new_pages, self.page_size,
                                         req.total_tokens)

    def alloc_decode(self, seq_lens, last_loc) -> Optional[torch.Tensor]:
        """One token per request at position `seq - 1` (seq includes it)."""
        self._require_tokens()
        req = paged.decode_request(self, seq_lens, last_loc)
        new_pages = self._take_token_pages(req.new_pages)
        if new_pages is None:
            return None
        return self.backend.paged_decode(req.seq, req.last_loc, new_pages, self.page_size)

    def _take_token_pages(self, pages: int) -> Optional[torch.Tensor]:
        """Fresh virtual pages bound on every token band, or None."""
        if pages == 0:
            return self.backend.arange(0, 0)
        fits = lambda: self.chain.fits_joint(self.token_order, pages)  # noqa: E731
        if not fits():
            demand = {i: pages for i in self.token_order}
            if not relieve(self.chain, demand, fits, self.counters):
                return None
        v_pages = self.vids.take(pages)
        for i in self.token_order:
            band = self.chain.bands[i]
            p_pages = band.take(pages)
            if p_pages is None:  # the capacity view and take share one arithmetic
                raise RuntimeError(f"internal: band {band.name!r} refused {pages} pages it reported free")
            band.bind(v_pages, p_pages)
        return v_pages

    def free(self, ids) -> int:
        """Free token ids on every band still binding them; returns page moves.

        Any id of a page frees the whole page. Raises ValueError (state
        unchanged) for ids out of range or pages not allocated (double free).
        """
        self._require_tokens()
        pages = self._live_token_pages(ids, "free")
        moves = 0
        for name in self.token_names:
            band = self.bands[name]
            moves += self._unbind(band, pages[band.v2p[pages] >= 0])
        self.vids.drop_all(pages)
        return moves

    def release(self, ids, band: str, start_pos: Optional[int] = None) -> int:
        """Tombstone token ids on one band only (window ratchet, SWA eviction).

        Pages already released on `band` and the sink page are skipped.
        `start_pos`: the prefix position of `ids[0]` when `ids` is one
        request's contiguous ascending run; page representatives then come
        from stride arithmetic instead of a dedup. Returns page moves.
        """
        target = self._token_band(band)
        t = self._ids(ids, "release: ids")
        if start_pos is not None:
            start_pos = check_count(start_pos, "release: start_pos")
            t = paged.page_representatives(t, start_pos, self.page_size)
        pages = self._live_token_pages(t, "release", allow_sink=True)
        pages = pages[target.v2p[pages] >= 0]
        moves = self._unbind(target, pages)
        self.vids.drop(pages)
        return moves

    def _live_token_pages(self, ids, op: str, allow_sink: bool = False) -> torch.Tensor:
        """The distinct virtual pages of token `ids`, all allocated."""
        t = self._ids(ids, f"{op}: ids")
        check_range(t, 0, self.vids.size * self.page_size, f"{op}: token ids")
        if t.numel() <= 256:  # few ids: host arithmetic beats a chain of small ops
            host = sorted({x // self.page_size for x in t.tolist()} - ({0} if allow_sink else set()))
            pages = torch.tensor(host, dtype=torch.int64, device=t.device)
        else:
            pages = torch.unique(torch.div(t, self.page_size, rounding_mode="floor"))
            if allow_sink:
                pages = pages[pages > 0]
        dead = pages[self.vids.binds[pages] <= 0]
        if dead.numel():
            raise ValueError(f"{op}: virtual pages {few(dead)} are not allocated "
                             "(never allocated, or already freed)")
        return pages

    def _unbind(self, band, v_pages: torch.Tensor) -> int:
        if v_pages.numel() == 0:
            return 0
        return band.release(band.unbind(v_pages))

    # -- state surface --

    def alloc_state(self, band: str, n: int) -> Optional[torch.Tensor]:
        """`n` state slot ids of request band `band`, or None on shortfall."""
        b = self._state_band(band)
        n = check_count(n, "alloc_state: n")
        if n == 0:
            return self.backend.arange(0, 0)
        fits = lambda: n <= self.chain.band_pages(b.index)  # noqa: E731
        if not fits() and not relieve(self.chain, {b.index: n}, fits, self.counters):
            return None
        ids = self.state_ids[band].take(n)
        pages = b.take(n)
        if pages is None:
            raise RuntimeError(f"internal: band {band!r} refused {n} slots it reported free")
        b.bind(ids, pages)
        return ids

    def free_state(self, band: str, ids) -> int:
        """Free state slot ids; returns page moves. ValueError (state
        unchanged) for ids out of range, repeated, or not allocated."""
        b = self._state_band(band)
        space = self.state_ids[band]
        t = self._ids(ids, "free_state: ids")
        check_range(t, 1, space.size, "free_state: ids")
        if int(torch.unique(t).numel()) != int(t.numel()):
            raise ValueError(f"free_state: ids {few(t)} repeat an id")
        dead = t[space.binds[t] <= 0]
        if dead.numel():
            raise ValueError(f"free_state: ids {few(dead)} are not allocated on {band!r}")
        moves = self._unbind(b, t)
        space.drop_all(t)
        return moves

    # -- translation and hazards --

    def translate(self, ids, band: str, kernel: bool = False) -> torch.Tensor:
        """Physical slot ids of token (or state) ids on `band`.

        `kernel=True` gives kernel-facing ids (page index scaled by
        `page_size * blocks_per_page`). Tombstoned and unbound ids -> 0, the
        sink.
        """
        b = self._band(band)
        t = self._ids(ids, "translate: ids")
        mult = b.geom.band.blocks_per_page if kernel else 1
        if b.geom.band.unit is Unit.REQUEST:
            check_range(t, 0, self.state_ids[band].size, "translate: state ids")
            return self.backend.translate(t, b.v2p, 1, mult)
        check_range(t, 0, self.vids.size * self.page_size, "translate: token ids")
        return self.backend.translate(t, b.v2p, self.page_size, mult)

    def set_inflight_forward(self, done_event, write_ids=None, state_write_ids=None) -> None:
        """Declare the forward just launched: its done event, the virtual
        token ids it writes on the token bands, and per state band the slot
        ids it writes. Moves stop at (or settle) those pages; vacated pages
        wait for the event before reuse."""
        writes: dict[str, torch.Tensor] = {}
        if write_ids is not None:
            t = self._ids(write_ids, "set_inflight_forward: write_ids")
            pages = torch.div(t, self.page_size, rounding_mode="floor")
            writes.update({n: pages for n in self.token_names})
        for name, ids in (state_write_ids or {}).items():
            self._state_band(name)
            writes[name] = self._ids(ids, f"set_inflight_forward: state ids of {name!r}")
        self.hazards.set_forward(done_event, writes)

    # -- maintenance --

    def flush(self, urgent: bool = False) -> int:
        """Flush every band (floats absorb, lazy END bands compact); returns
        page moves. The float keeps holes whose absorption would lower
        `available_size()`."""
        return flush_chain(self.chain, urgent, self.token_order)

    def make_room(self, side: str | Side, min_bytes: int) -> int:
        """Ask the float band to open `min_bytes` on `side`; bytes now open."""
        return self._float().make_room(self._side(side), check_count(min_bytes, "min_bytes"))

    def compact_holes(self, retreat_side: str | Side) -> int:
        """Close every hole of the float band; returns page moves."""
        return self._float().compact_holes(self._side(retreat_side))

    def _float(self):
        i = self.chain.float_index()
        if i is None:
            raise ValueError("this layout has no float band")
        return self.chain.bands[i]

    @staticmethod
    def _side(side) -> Side:
        try:
            return Side(side)
        except ValueError:
            raise ValueError(f"side={side!r} must be 'low' or 'high'") from None

    def clear(self) -> None:
        """Free everything: back to the state of a fresh pool (counters kept)."""
        for b in self.chain.bands:
            b.clear()
        self.vids.reset()
        for space in self.state_ids.values():
            space.reset()
        self.hazards.clear()
        self.chain.forget_memos()

    # -- observation --

    def verify(self) -> list[str]:
        """Invariant violations (empty = healthy)."""
        out = self.chain.order_violations()
        for b in self.chain.bands:
            out += b.violations()
        out += self.chain.memo_violations()
        out += self.vids.violations("token") if self.token_names else []
        for name, space in self.state_ids.items():
            out += space.violations(name)
        out += views.binding_violations(self)
        return out

    def stats(self) -> dict:
        """Cumulative counters: moves, moved_bytes, flushes, relocations, ..."""
        self.counters.settles = self.hazards.settles
        return self.counters.as_dict()

    def occupancy(self) -> dict:
        """Bytes per band (live / holes / pending / occupied, frontiers) and
        the chain's gap and free bytes."""
        return views.occupancy(self)

    def buffer_view(self, band: str) -> torch.Tensor:
        """`[max_slots, entry_bytes]` uint8 view of the buffer on `band`'s grid."""
        b = self._band(band)
        if self.buffer is None:
            raise ValueError(f"{self.backend!r} keeps no bytes; use materialize=True")
        g = b.geom
        return self.buffer[: g.max_slots * g.band.entry_bytes].view(g.max_slots, g.band.entry_bytes)

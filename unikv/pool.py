"""UnifiedPool: coupled token bands and state bands over one byte buffer."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from unikv import paged, samples, views
from unikv.backends.sim import SimBackend
from unikv.bands import UNIFIED_BANDS, BandContext
from unikv.bands.base import EMPTY
from unikv.chain import Chain
from unikv.extent import Extent, Kind, take_all
from unikv.hazards import Epoch, Hazards
from unikv.ids import SMALL, IdSpace, as_ids, check_count, check_range, few, loaded_torch, require_torch
from unikv.layout import Layout, Side, Unit
from unikv.policy import absorb_keeps_room, flush_targets, ladder_joint_pages, slide_plan
from unikv.stats import Stats
from unikv.tables import PageTables

if TYPE_CHECKING:
    import torch


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

    Every decision is made on the host: virtual ids are host data (ids are
    returned as int64 host arrays of the kind `ids` names, and ids passed
    in as CPU tensors, numpy arrays or lists cost no device
    round trip), the page tables' truth is a
    host arena, and the backend mirrors it on its device. The device tables
    are brought up to date by `commit()`, which `translate` and
    `page_table` call first: one upload and one launch per commit, however
    many calls changed the tables since the last one.

    Args:
        layout: the buffer and its bands.
        backend: a `SimBackend` (default, byte accounting only) or
            `CudaBackend`.
        compaction: "lazy" or "eager" for END bands (floats are always
            holes-first).
        move_cap: most survivor moves one non-urgent flush makes per band.
        ids: the host arrays the pool hands out (alloc ids; on a backend
            whose device is the host, also `translate`, `page_table` and
            `buffer_view`): "numpy" (int64 / uint8 arrays) or "torch" (CPU
            tensors sharing the same memory, `torch.from_numpy`). None (the
            default) takes the backend's `native_ids`: "numpy" on
            `SimBackend`, "torch" on `CudaBackend`.
    Raises:
        ValueError: for a bad argument, named.
        ImportError: `ids="torch"` (asked for, or the backend's native
            kind) without torch installed.
    """

    band_classes: Mapping = UNIFIED_BANDS

    def __init__(self, layout: Layout, backend=None, compaction: str | Compaction = "lazy",
                 move_cap: int = 4096, ids: str | None = None) -> None:
        if not isinstance(layout, Layout):
            raise ValueError(f"layout={layout!r} must be a unikv.Layout")
        backend = backend if backend is not None else SimBackend()
        self.ids = backend.native_ids if ids is None else ids
        self._out = _id_wrapper(self.ids)
        try:
            self.compaction = Compaction(compaction)
        except ValueError:
            raise ValueError(f"compaction={compaction!r} must be 'lazy' or 'eager'") from None
        check_count(move_cap, "move_cap")
        self.layout = layout
        self.backend = backend
        self.page_size = layout.page_size
        self.epoch = Epoch()
        self.hazards = Hazards(self.backend)
        self.counters = Stats.for_bands(layout.names)
        self.chain = Chain(layout, self.epoch)
        self.buffer = self.backend.make_buffer(layout.total_bytes)
        token_vspace = 1 + sum(g.usable_pages for g in layout if g.band.unit is Unit.TOKEN)
        vspace = {g.band.name: token_vspace if g.band.unit is Unit.TOKEN else g.usable_pages + 1
                  for g in layout}
        self.tables = PageTables(self.backend, [(g.band.name, vspace[g.band.name], g.num_pages)
                                                for g in layout])
        self.bands: dict[str, Any] = {}
        for g in layout:
            ctx = BandContext(self.backend, self.buffer, self.epoch, self.hazards, self.tables,
                              lazy=self.compaction is Compaction.LAZY, move_cap=move_cap,
                              total_bytes=layout.total_bytes, sink_bytes=layout.sink_bytes,
                              regions=self._regions())
            cls = self.band_classes[self._band_kind(g.band)]
            self.bands[g.band.name] = cls(g, ctx, self.counters.bands[g.band.name])
        self.chain.bands = list(self.bands.values())
        self.token_names = [b.name for b in layout.token_bands]
        self._token_bands = {n: self.bands[n] for n in self.token_names}
        # Alloc order: END bands first, the float last (it can pick a side).
        self.token_order = tuple(sorted((self.bands[n].index for n in self.token_names),
                                        key=lambda i: self.chain.bands[i].kind is Kind.FLOAT))
        self._joint_page_bytes = sum(self.bands[n].page_bytes for n in self.token_names)
        self.vids = IdSpace(token_vspace, len(self.token_names))
        self.state_ids = {b.name: IdSpace(layout.geometry(b.name).usable_pages + 1, 1)
                          for b in layout.state_bands}

    # -- construction hooks for the baselines --

    def _band_kind(self, band):
        return band.grow

    def _regions(self) -> dict | None:
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

    # -- capacity views --

    def available_size(self, schedulable: bool = False) -> int:
        """Tokens a coupled `alloc` takes now without moving a page.

        `schedulable=True` counts what the shortfall ladder can realise:
        holes an urgent flush of the lazy END bands would reclaim, then the
        float slide the ladder would plan (an `alloc` of that many tokens
        succeeds, through the ladder).
        """
        if not self.token_names:
            return 0
        if schedulable:
            return self._ladder_pages() * self.page_size
        return self.chain.joint_pages(self.token_order) * self.page_size

    def _ladder_pages(self, memo: bool = True) -> int:
        """Pages a coupled take gets through the shortfall ladder (urgent END
        flushes, then the float slide it would plan: `_relieve`), memoised
        on the chain's epoch (`memo=False`: a fresh recompute)."""
        chain, order = self.chain, self.token_order
        key = ("ladder", order)
        hint = chain.memo.last(key) if memo else 0  # the search gallops from the last answer
        f = chain.float_index()

        def compute() -> int:
            holes = EMPTY if f is None else chain.bands[f].holes
            return ladder_joint_pages(chain.extents(schedulable=True), order, f, holes,
                                      chain.total_bytes, chain.sink_bytes, hint)
        return chain.memo.get(key, compute) if memo else compute()

    def available_size_floor(self) -> int:
        """A lower bound on `available_size(schedulable=True)`: the joint
        tokens of the urgent flushes' view, without the float slide the
        ladder may add (equal to it on a chain without a float). It is
        where the ladder's search starts, and the search only raises it:
        `ladder_joint_pages` never answers below it. For a caller that only
        needs to know the room suffices: no slide search."""
        if not self.token_names:
            return 0
        if self.chain.float_index() is None:  # the two views are one: the memoised ladder view
            return self.available_size(schedulable=True)
        return self.chain.joint_pages(self.token_order, schedulable=True) * self.page_size

    def available_size_bound(self) -> int:
        """An upper bound on `available_size(schedulable=True)`, from live
        counts only: the bytes no band holds live (past the sink), in whole
        joint pages. A coupled page takes one page on every token band, and
        no flush, slide or eviction-free ladder step makes a live byte free.
        For a caller that only needs to know the room is short: O(bands)."""
        if not self.token_names:
            return 0
        chain = self.chain
        free = chain.total_bytes - chain.sink_bytes - sum([b.live * b.page_bytes for b in chain.bands])
        return max(0, free // self._joint_page_bytes) * self.page_size

    def available_state(self, band: str, schedulable: bool = False) -> int:
        """State slots `alloc_state(band, n)` takes now without moving a page."""
        return self.chain.band_pages(self._state_band(band).index, schedulable)

    # -- token surface --

    def alloc(self, n: int) -> np.ndarray | torch.Tensor | None:
        """`n` virtual token ids (n a multiple of page_size), page-structured,
        bound on every token band; None on shortfall (nothing allocated)."""
        self._require_tokens()
        n = check_count(n, "alloc: n", self.page_size)
        pages = self._take_token_pages(n // self.page_size)
        if pages is None:
            return None
        offsets = np.arange(self.page_size, dtype=np.int64)
        return self._out((pages[:, None] * self.page_size + offsets).reshape(-1))

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens=None) -> np.ndarray | torch.Tensor | None:
        """Tokens `[prefix, seq)` of each request with tail-page reuse.

        Args:
            prefix_lens, seq_lens: int [bs] token counts already held / wanted.
            last_loc: int [bs] virtual id of each request's last prefix token
                (read only where the prefix ends inside a page).
            extend_num_tokens: sum(seq - prefix), checked when given.
        Returns:
            int64 [sum(seq - prefix)] virtual token ids (host), request-major,
            or None on shortfall (nothing allocated).
        """
        self._require_tokens()
        req = paged.extend_request(self.page_size, self.vids.binds, prefix_lens, seq_lens, last_loc,
                                   extend_num_tokens)
        new_pages = self._take_token_pages(req.new_pages)
        if new_pages is None:
            return None
        return self._out(paged.extend_ids(req, new_pages, self.page_size))

    def alloc_decode(self, seq_lens, last_loc) -> np.ndarray | torch.Tensor | None:
        """One token per request at position `seq - 1` (seq includes it)."""
        self._require_tokens()
        seq = as_ids(seq_lens, "alloc_decode: seq_lens")
        last = as_ids(last_loc, "alloc_decode: last_loc")
        if len(seq) <= paged.SMALL_BATCH and len(seq) == len(last):
            # A few requests: checked on Python ints, no PagedRequest.
            opens = paged.small_decode_opens(self.page_size, self.vids.binds, seq, last)
            if opens is not None:
                new_pages = self._take_token_pages(opens.count(True))
                if new_pages is None:
                    return None
                return self._out(paged.decode_ids_of(last, opens, new_pages, self.page_size))
        req = paged.decode_request(self.page_size, self.vids.binds, seq, last)
        new_pages = self._take_token_pages(req.new_pages)
        if new_pages is None:
            return None
        return self._out(paged.decode_ids(req, new_pages, self.page_size))

    def take_pages(self, n: int) -> np.ndarray | torch.Tensor | None:
        """`n` fresh virtual pages (page ids, not token ids), bound on every
        token band: the pages `alloc_decode` or `alloc_extend` takes when
        every position they place opens a page (its first slot is
        `page * page_size`). For a caller that tracks its own pages (the
        simulator's memory layer): no per-token argument to check. None on
        shortfall (nothing allocated)."""
        self._require_tokens()
        pages = self._take_token_pages(check_count(n, "take_pages: n"))
        return None if pages is None else self._out(pages)

    def _take_token_pages(self, pages: int) -> np.ndarray | None:
        """Fresh virtual pages bound on every token band, or None."""
        if pages == 0:
            return np.zeros(0, dtype=np.int64)
        chain, order = self.chain, self.token_order
        bands = chain.bands
        # A band whose holes cover the take drains them (`take_holes`): its
        # frontier stays, so only the bands that must extend are planned (a
        # drain moves no frontier and makes no float transparent, so their
        # plan is the one the whole chain's would be).
        drains = [len(bands[i].holes) >= pages for i in order]
        extend = [i for i, d in zip(order, drains) if not d]
        old: Sequence[Extent] = ()
        plan: list[Extent] = []  # read only for the bands that extend
        if extend:
            old = chain.extents()
            found = take_all(old, extend, pages, chain.total_bytes)
            if found is None:
                fits = lambda: chain.fits_joint(order, pages)  # noqa: E731
                if not self._relieve({i: pages for i in order}, fits):
                    return None
                old = chain.extents()  # the ladder moved pages: plan every band
                found = take_all(old, order, pages, chain.total_bytes)
                if found is None:  # fits and the plan share one arithmetic
                    raise RuntimeError(f"internal: {pages} pages fit but no take plan exists")
                drains = [False] * len(order)
            plan = found
        v_pages = self.vids.take(pages)
        for i, drain in zip(order, drains):
            band = bands[i]
            band.bind(v_pages, band.take_holes(pages) if drain else band.adopt(old[i], plan[i]))
        return v_pages

    def _relieve(self, demand: Mapping[int, int], fits) -> bool:
        """The shortfall ladder, cheapest remedy first: the urgent flushes
        policy picks, re-check (`fits()`), the float relocation it plans to
        fit, re-check. Each step leaves every capacity view at least where
        it was, so a failing ladder never shrinks the room. Never evicts:
        the caller decides that. `demand`: band index -> pages needed."""
        chain = self.chain
        self.counters.ladder_runs += 1
        chain.flush_bands(flush_targets(chain.extents(), demand), urgent=True)
        if fits():
            return True
        f = chain.float_index()
        if f is not None:
            plan = slide_plan(chain.extents(), f, chain.bands[f].holes, demand, chain.total_bytes)
            if plan is not None:
                chain.bands[f].relocate(plan)
                if fits():
                    return True
        self.counters.ladder_failures += 1
        return False

    def free(self, ids) -> int:
        """Free token ids on every band still binding them; returns page moves.

        Any id of a page frees the whole page. Raises ValueError (state
        unchanged) for ids out of range or pages not allocated (double free).
        """
        self._require_tokens()
        return self._free_live(paged.live_pages(ids, "free", self.page_size, self.vids.binds))

    def release(self, ids, band: str, start_pos: int | None = None) -> int:
        """Tombstone token ids on one band only (window ratchet, SWA eviction).

        Pages already released on `band` and the sink page are skipped.
        `start_pos`: the prefix position of `ids[0]` when `ids` is one
        request's contiguous ascending run; page representatives then come
        from stride arithmetic instead of a dedup (the run is checked: a few
        vector passes over `ids`). Returns page moves.

        Raises:
            ValueError (state unchanged): an unknown or state band, ids out
                of range or on pages not allocated, ids that are not the
                contiguous run `start_pos` claims (`paged.check_run`).
        """
        target = self._release_target(band)
        t = as_ids(ids, "release: ids")
        if start_pos is not None:
            start_pos = check_count(start_pos, "release: start_pos")
            t = paged.page_representatives(t, start_pos, self.page_size)
        pages = paged.live_pages(t, "release", self.page_size, self.vids.binds, allow_sink=True,
                                 bound_v2p=target.v2p)
        moves = self._unbind(target, pages)
        self.vids.drop(pages)
        return moves

    def free_pages(self, pages: Sequence[int]) -> int:
        """`free` of whole virtual pages (distinct page ids, as `take_pages`
        hands out): every token band still binding them lets go; returns
        page moves. ValueError (state unchanged) for a page out of range,
        the sink, a repeat, or a page not allocated."""
        self._require_tokens()
        # few_as_list is off: always the int64 array `_free_live` indexes with
        return self._free_live(cast(np.ndarray, self._live_page_array(pages, "free_pages", allow_sink=False)))

    def _free_live(self, pages: np.ndarray) -> int:
        """Unbind allocated virtual `pages` on every token band still binding
        them and return their ids to the free list; page moves."""
        moves = 0
        for name in self.token_names:
            band = self.bands[name]
            moves += self._unbind(band, pages[band.v2p[pages] >= 0])
        self.vids.drop_all(pages)
        return moves

    def release_pages(self, pages: Sequence[int], band: str) -> int:
        """`release` of whole virtual pages (distinct page ids) on one token
        band; pages already released there and the sink are skipped, as
        `release` skips them. Returns page moves. ValueError (state
        unchanged) for an unknown or state band, a page out of range, a
        repeat, or a page not allocated."""
        target = self._release_target(band)
        v = self._live_page_array(pages, "release_pages", allow_sink=True, bound_v2p=target.v2p,
                                  few_as_list=True)
        moves = self._unbind(target, v)
        self.vids.drop(v)
        return moves

    def _release_target(self, band):
        """The token band `band` names (the fast dict lookup; else
        `_token_band`, which names the mistake)."""
        target = self._token_bands.get(band) if isinstance(band, str) else None
        return target if target is not None else self._token_band(band)

    def _live_page_array(self, pages: Sequence[int], op: str, allow_sink: bool,
                         bound_v2p: np.ndarray | None = None,
                         few_as_list: bool = False) -> np.ndarray | list[int]:
        """Distinct allocated virtual `pages`, ascending as `paged.live_pages`
        orders them (the bands' hole order follows it), as int64; of those,
        the ones a band binds when its v2p table is given (`bound_v2p`).
        `allow_sink`: the sink is dropped instead of refused. `few_as_list`:
        at most `ids.SMALL` pages come back as a list of ints (what
        `unbind` and `IdSpace.drop` read without numpy)."""
        values = sorted(pages.tolist() if isinstance(pages, np.ndarray) else pages)
        if allow_sink and values and values[0] == 0:
            del values[0]
        size, binds = self.vids.size, self.vids.binds
        if len(values) <= SMALL:  # a few pages: Python steps beat numpy calls
            prev = -1
            for page in values:
                if not (prev < page < size and binds[page] > 0):
                    break  # the vector checks below name the offender
                prev = page
            else:
                if bound_v2p is not None:
                    values = [p for p in values if bound_v2p[p] >= 0]
                return values if few_as_list else np.array(values, dtype=np.int64)
        v = np.array(values, dtype=np.int64)
        if (len(values) <= paged.SMALL_BATCH and values and values[0] >= 0 and values[-1] < size
                and len(set(values)) == len(values) and 0 not in binds[v].tolist()):
            # A batch's pages, all valid: checked on Python ints read in one gather each.
            if bound_v2p is None:
                return v
            bound = bound_v2p[v]
            return v if min(bound.tolist()) >= 0 else v[bound >= 0]
        if len(v) and (v[0] < 0 or v[-1] >= self.vids.size):
            raise ValueError(f"{op}: pages {few(v[(v < 0) | (v >= self.vids.size)])} are outside "
                             f"[0, {self.vids.size})")
        if len(v) > 1 and bool((v[1:] == v[:-1]).any()):
            raise ValueError(f"{op}: pages {few(v[1:][v[1:] == v[:-1]])} repeat")
        if len(v) and not bool(self.vids.binds[v].all()):
            raise ValueError(f"{op}: virtual pages {few(v[self.vids.binds[v] <= 0])} are not "
                             "allocated (never allocated, or already freed)")
        return v if bound_v2p is None else v[bound_v2p[v] >= 0]

    def _unbind(self, band, v_pages: np.ndarray | list[int]) -> int:
        if len(v_pages) == 0:
            return 0
        return band.release(band.unbind(v_pages))

    # -- state surface --

    def alloc_state(self, band: str, n: int) -> np.ndarray | torch.Tensor | None:
        """`n` state slot ids of request band `band`, or None on shortfall."""
        b = self._state_band(band)
        n = check_count(n, "alloc_state: n")
        if n == 0:
            return self._out(np.zeros(0, dtype=np.int64))
        fits = lambda: n <= self.chain.band_pages(b.index)  # noqa: E731
        if not fits() and not self._relieve({b.index: n}, fits):
            return None
        ids = self.state_ids[band].take(n)
        pages = b.take(self.chain.extents(), n)
        if pages is None:
            raise RuntimeError(f"internal: band {band!r} refused {n} slots it reported free")
        b.bind(ids, pages)
        return self._out(ids)

    def free_state(self, band: str, ids) -> int:
        """Free state slot ids; returns page moves. ValueError (state
        unchanged) for ids out of range, repeated, or not allocated."""
        b = self._state_band(band)
        space = self.state_ids[band]
        t = as_ids(ids, "free_state: ids")
        check_range(t, 1, space.size, "free_state: ids")
        if len(t) > 1 and len(np.unique(t)) != len(t):
            raise ValueError(f"free_state: ids {few(t)} repeat an id")
        dead = t[space.binds[t] <= 0]
        if len(dead):
            raise ValueError(f"free_state: ids {few(dead)} are not allocated on {band!r}")
        moves = self._unbind(b, t)
        space.drop_all(t)
        return moves

    # -- translation and hazards --

    def translate(self, ids, band: str, kernel: bool = False):
        """Physical slot ids of token (or state) ids on `band`, on the
        backend's device (on a host device, of the kind `ids` names).

        `kernel=True` gives kernel-facing ids (page index scaled by
        `page_size * blocks_per_page`). Tombstoned and unbound ids -> 0, the
        sink. Host ids are translated on the host tables (the truth) and the
        result uploaded; device ids are translated on the device tables by
        the backend's kernel (their range check reads the device). Either
        way the device tables are committed first.
        """
        b = self._band(band)
        mult = b.geom.band.blocks_per_page if kernel else 1
        state = b.geom.band.unit is Unit.REQUEST
        ps = 1 if state else self.page_size
        high = self.state_ids[band].size if state else self.vids.size * ps
        what = "translate: state ids" if state else "translate: token ids"
        torch = loaded_torch()
        if torch is not None and isinstance(ids, torch.Tensor) and ids.device.type != "cpu":
            if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
                raise ValueError(f"translate: ids: dtype {ids.dtype} is not an integer dtype")
            t = ids.reshape(-1).to(torch.int64)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= high):
                check_range(t.cpu().numpy(), 0, high, what)
            self.commit()
            return self.backend.translate(t, b.v2p_dev, ps, mult)
        host = as_ids(ids, "translate: ids")
        check_range(host, 0, high, what)
        self.commit()  # the caller reads the device tables next
        return self._device_out(self.backend.upload(paged.translate(host, b.v2p, ps, mult)))

    def page_table(self, band: str):
        """`band`'s device v2p table, up to date (commits first)."""
        b = self._band(band)
        self.commit()
        return self._device_out(b.v2p_dev)

    def _device_out(self, arr):
        """A device array as handed out: a host device's numpy arrays take
        the kind `ids` names; a real device's tensors pass as they are."""
        return self._out(arr) if isinstance(arr, np.ndarray) else arr

    def commit(self) -> None:
        """Bring the device page tables up to date with the host's (one
        upload and one launch; nothing on the sim backend)."""
        self.tables.commit()

    def set_inflight_forward(self, done_event, write_ids=None, state_write_ids=None) -> None:
        """Declare the forward just launched: its done event, the virtual
        token ids it writes on the token bands, and per state band the slot
        ids it writes. Moves stop at (or settle) those pages; vacated pages
        wait for the event before reuse. `done_event=None` with no writes:
        no forward in flight.

        Raises:
            ValueError (state unchanged): writes without a done event (the
                hazards could never be tracked), ids outside the token or
                state id space, an unknown or token band in
                `state_write_ids`. Checks read only the call's own ids.
        """
        writes: dict[str, np.ndarray] = {}
        n_writes = 0
        if write_ids is not None:
            t = as_ids(write_ids, "set_inflight_forward: write_ids")
            n_writes = len(t)
            paged.check_ids(t, self.vids.size * self.page_size, "set_inflight_forward: write_ids")
            writes = dict.fromkeys(self.token_names, paged.page_of(t, self.page_size))  # coupled: one array
        self._declare_forward(done_event, writes, n_writes, state_write_ids)

    def set_inflight_pages(self, done_event, pages: list[int], state_write_ids=None) -> None:
        """`set_inflight_forward` for a caller that knows the virtual pages
        its forward writes on the token bands (`pages`: Python ints, one per
        written token or fewer; repeats allowed): no token id to convert.
        A state band's slots may come as a list of Python ints too (kept
        as they came). The same hazards follow; ValueError (state
        unchanged) as there, naming `pages` or the state band."""
        if pages and not (min(pages) >= 0 and max(pages) < self.vids.size):
            check_range(np.asarray(pages, dtype=np.int64), 0, self.vids.size, "set_inflight_pages: pages")
        ints: dict[str, list[int]] = {}
        arrays = {}
        n_writes = len(pages)
        for name, ids in state_write_ids.items() if state_write_ids else ():
            if type(ids) is not list:
                arrays[name] = ids
                continue
            self._state_band(name)
            size = self.state_ids[name].size
            if ids and not (min(ids) >= 0 and max(ids) < size):
                what = f"set_inflight_pages: state ids of {name!r}"
                check_range(as_ids(ids, what), 0, size, what)
            ints[name] = ids
            n_writes += len(ids)
        self._declare_forward(done_event, {}, n_writes, arrays, (self.token_names, pages), ints)

    def _declare_forward(self, done_event, writes: dict[str, np.ndarray], n_writes: int,
                         state_write_ids, shared: tuple[list[str], list[int]] | None = None,
                         ints: dict[str, list[int]] | None = None) -> None:
        """Check the state writes and the event, then hand the forward to
        the hazards (`shared`: the token bands and the pages they all
        write, as Python ints; `ints`: state slots as Python ints, checked
        already: `Hazards.set_forward`)."""
        for name, ids in state_write_ids.items() if state_write_ids else ():
            self._state_band(name)
            what = f"set_inflight_forward: state ids of {name!r}"
            writes[name] = as_ids(ids, what)
            paged.check_ids(writes[name], self.state_ids[name].size, what)
            n_writes += len(writes[name])
        if done_event is None and n_writes:
            raise ValueError(f"set_inflight_forward: done_event=None but the forward writes {n_writes} "
                             "ids; pass its done event "
                             "(without one the pool cannot protect the pages it writes)")
        self.hazards.set_forward(done_event, writes, shared, ints)

    # -- maintenance --

    def flush(self, urgent: bool = False) -> int:
        """Flush every band (floats absorb, lazy END bands compact); returns
        page moves. The float keeps holes whose absorption would lower
        `available_size()` (`policy.absorb_keeps_room`). ValueError for an
        `urgent` that is not a bool."""
        if not isinstance(urgent, (bool, np.bool_)):
            raise ValueError(f"flush: urgent={urgent!r} must be a bool")
        chain, order = self.chain, self.token_order
        f = chain.float_index()
        moves = chain.flush_bands(chain.non_float_indices(), urgent)
        if f is None:
            return moves
        flt = chain.bands[f]
        span = flt.absorb_span()
        if span is not None and order and not absorb_keeps_room(
                chain.extents(), f, span, order, chain.joint_pages(order), chain.total_bytes):
            return moves
        return moves + flt.flush(urgent)

    def make_room(self, side: str | Side, min_bytes: int) -> int:
        """Ask the float band to open `min_bytes` on `side`; bytes now open."""
        flt = self._float()
        return flt.make_room(self._side(side), check_count(min_bytes, "min_bytes"), self.chain.extents())

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
        self.tables.reset()
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
        out += self._ladder_memo_violations()
        out += self.vids.violations("token") if self.token_names else []
        for name, space in self.state_ids.items():
            out += space.violations(name)
        out += views.binding_violations(self)
        out += self.tables.mirror_violations()
        return out

    def _ladder_memo_violations(self) -> list[str]:
        """The ladder view's memo (kept in the chain's) equals a recompute."""
        cached = self.chain.memo.fresh(("ladder", self.token_order))
        if cached is None or not self.token_names:
            return []
        fresh = self._ladder_pages(memo=False)
        if cached == fresh:
            return []
        return [f"[pool] stale capacity memo ladder: cached {cached}, actual {fresh}"]

    def live_ids(self, band: str | None = None) -> np.ndarray:
        """Live virtual page ids (ascending): token pages bound on any token
        band (`band=None`), or the live slot ids of state band `band`."""
        space = self.vids if band is None else self.state_ids[self._state_band(band).name]
        return np.flatnonzero(space.binds > 0)

    def stats(self) -> dict:
        """Cumulative counters: moves, moved_bytes, flushes, relocations, ..."""
        self.counters.settles = self.hazards.settles
        return self.counters.as_dict()

    def usage(self) -> tuple[int, int, tuple[tuple[int, int, int, int, int, int], ...]]:
        """The byte accounting of `occupancy()` as flat tuples, cheap enough
        to sample every engine step.

        Returns:
            `(free_bytes, gap_bytes, bands)`: free = total - sink - live
            bytes; gap = free bytes between the bands' frontiers; `bands`
            has one `(live_bytes, hole_bytes, pending_bytes, occupied_bytes,
            low_byte, high_byte)` per band in chain order (`layout.names`).
            A transparent float or an oracle band reports low = high = 0.
        """
        return views.usage(self)

    def sample(self) -> tuple[int, ...]:
        """The numbers `usage()` and `available_size()` are computed from,
        as one flat tuple of ints: cheap to keep every engine step, read
        back in bulk by `sample_columns` (see `unikv.samples`)."""
        return samples.sample(self)

    def sample_columns(self, sampled) -> dict[str, np.ndarray]:
        """`usage()` and `available_size()` of every sample taken from this
        pool, as int64 columns (see `unikv.samples.columns`)."""
        return samples.columns(self, sampled)

    def occupancy(self) -> dict:
        """Bytes per band (live / holes / pending / occupied, frontiers) and
        the chain's gap and free bytes, as nested dicts (see `usage`)."""
        return views.occupancy(self)

    def buffer_view(self, band: str):
        """`[max_slots, entry_bytes]` uint8 view of the buffer on `band`'s
        grid (a device tensor, or on a host device the kind `ids` names)."""
        b = self._band(band)
        if self.buffer is None:
            raise ValueError(f"{self.backend!r} keeps no bytes; use materialize=True")
        g = b.geom
        view = self.buffer[: g.max_slots * g.band.entry_bytes].reshape(g.max_slots, g.band.entry_bytes)
        return self._device_out(view)


def _id_wrapper(kind):
    """How host arrays are handed to the caller (no copy either way):
    `torch.from_numpy` for "torch" (torch imported only then), as they are
    for "numpy"."""
    if kind == "torch":
        return require_torch("ids='torch'").from_numpy
    if kind == "numpy":
        return _as_is
    raise ValueError(f"ids={kind!r} must be 'torch', 'numpy' or None (the backend's native kind)")


def _as_is(ids: np.ndarray) -> np.ndarray:
    return ids


"""Request-level memory operations over a pool, with a prefix cache.

The engine speaks requests; the pool speaks virtual ids. This layer keeps
the two in step: which pages a request owns, which it borrows from the
prefix cache, the sliding-window ratchet, eviction of one cached prefix at
a time (the scheduler decides when: `sim.shortfall`), and the accounting
check (`sim.memory_check`). It is the engine's only way to the pool: the
capacity questions, the forward's hazards and flush, the samples and
counters the recorder reads, and the pool's own checks all go through it.
"""

from __future__ import annotations

import numpy as np
from unikv.sim.memory_check import check_holdings
from unikv.sim.prefix_cache import Node, PrefixCache
from unikv.sim.request import Request

# Stands in `Request.pages` and a cache node's pages for a page the memory
# layer no longer holds: the window ratchet released it on the window band,
# and that band was the page's last binding, so the pool took the id back
# (`UnifiedPool.release`) and may hand it to another request. 0 is the
# sink's page, never a live page: translating it reads as unbound.
GONE = 0


def int64_ids(values: list[int]) -> np.ndarray:
    """`values` as a 1-D int64 host array: the pool reads those with no copy
    or conversion (the engine builds several per step)."""
    return np.array(values, dtype=np.int64)


class Memory:
    """Request-level allocation on one pool.

    Args:
        pool: a UnifiedPool / StaticPartitionPool / OraclePool.
        window_tokens: the sliding window (None: no window band).
        block_tokens: prefix-cache block size (None: no prefix cache).
        meta_tokens: learned tokens the model prepends to every request
            (Hymba). Their KV is the same for every request, so one shared
            copy is allocated here, page-rounded on every token band, and
            held for the whole run (the window never evicts it); requests
            then hold only their own tokens.
        state_slots_per_request: state slots a running request holds (the
            engine rules', `sim.engines`): its live state (`req.state`, the
            one the prefix cache may keep) and the rest the engine reserves
            beside it (SGLang: radix retention and ping-pong buffers),
            released when the request stops running.
        align_tokens: vLLM's block size when its `mamba_cache_mode="align"`
            rules apply (`sim.engines.PrefixCacheRule`; ignored without a
            state band): prefill chunks end on whole blocks (`aligned_chunk`),
            a state is cached only where a prefill chunk ends on a block
            boundary of the prompt (never the running state), and a request
            holds one more state slot from its second chunk (or its first
            after a hit) to the end of its prefill (`MambaManager`: the
            previous state block is kept while a step crosses a block).
            The prefix block, when there is a cache, must equal it.
    Raises:
        ValueError: the pool cannot hold the meta tokens, or a bad argument
            (named).
    """

    def __init__(self, pool, *, window_tokens: int | None, block_tokens: int | None,
                 meta_tokens: int = 0, state_slots_per_request: int = 1,
                 align_tokens: int | None = None) -> None:
        if isinstance(state_slots_per_request, bool) or not isinstance(state_slots_per_request, int) \
                or state_slots_per_request < 1:
            raise ValueError(f"state_slots_per_request={state_slots_per_request!r} must be a "
                             "positive integer")
        if align_tokens is not None and (isinstance(align_tokens, bool) or not isinstance(align_tokens, int)
                                         or align_tokens < 1):
            raise ValueError(f"align_tokens={align_tokens!r} must be a positive integer or None")
        self.pool = pool
        self.state_slots = state_slots_per_request
        self.extra_states: dict[int, list[int]] = {}  # rid -> the reserved slots beside req.state
        # rid -> req.state of each request holding memory (the running ones),
        # in the order they took it: the slots a forward writes (`begin_forward`)
        self.running_states: dict[int, int] = {}
        self.ps = pool.page_size
        self.window = window_tokens
        self.swa = "swa" in pool.bands and window_tokens is not None
        # The window band is the only token band (an all-sliding-window
        # model): a ratchet release drops a page's last binding, so the
        # released pages become GONE (see GONE).
        self.release_drops = self.swa and list(pool.token_names) == ["swa"]
        self.state_band = next((b.name for b in pool.layout.state_bands), None)
        # vLLM's align rules bind the state (none without a state band)
        self.align = align_tokens if self.state_band is not None else None
        if block_tokens is not None and block_tokens % self.ps:
            raise ValueError(f"prefix block of {block_tokens} tokens is not a multiple of "
                             f"page_size={self.ps}")
        if self.align is not None and block_tokens is not None and block_tokens != self.align:
            raise ValueError(f"prefix block of {block_tokens} tokens != align_tokens={self.align} "
                             "(vLLM's align rules hash whole blocks)")
        # align: rid -> the state slot held beside req.state while prefilling
        # (also listed in extra_states), and the depths (in blocks) where a
        # prefill chunk ended on a block boundary of the prompt
        self.prefill_states: dict[int, int] = {}
        self.state_depths: dict[int, list[int]] = {}
        self.cache = PrefixCache(block_tokens) if block_tokens else None
        self.evictions = 0
        # Positions and pages (shared ones included) summed over the requests
        # holding memory (the running ones), kept as they change: the step
        # record reads them every step (`check` recomputes them).
        self.held_seq = 0
        self.held_pages = 0
        # ... and their positions inside the window, min(seq, window) summed
        # (what the window band's attention reads; 0 without a window).
        self.window_cap = window_tokens or 0
        self.held_window = 0
        # Decoders whose last decode moved a page boundary out of the window
        # (`window_due`): a decode step changes no other ratchet.
        self.window_due: list[Request] = []
        self._due_slot = (window_tokens - 1) % self.ps if self.swa else -1
        # Bytes per token of each token band, and of a coupled token alloc.
        self.token_bytes = {n: pool.layout.geometry(n).band.entry_bytes for n in pool.token_names}
        self.token_entry_bytes = sum(self.token_bytes.values())
        self.band_names = tuple(pool.bands)  # chain order
        # label -> a forward-done event of the pool's backend (for executors)
        self.new_event = pool.backend.new_event
        self._band_counters = tuple(pool.counters.bands.values())
        self._moved_mark = 0  # bytes moved up to the last forward's accounting
        self._sample: tuple | None = None  # (epoch, pool sample) of the last `sample`
        self.meta_pages: list[int] = []
        if meta_tokens:
            ids = pool.alloc(-(-meta_tokens // self.ps) * self.ps)
            if ids is None:
                raise ValueError(f"the pool cannot hold the model's {meta_tokens} meta tokens")
            self.meta_pages = sorted({t // self.ps for t in ids.tolist()})

    # -- ids --

    def _reps(self, pages) -> np.ndarray:
        ps = self.ps
        return int64_ids([p * ps for p in pages])

    def _free_pages(self, pages: list[int]) -> None:
        """Free the pages this layer still holds (never a GONE one: the pool
        took it back already and may have given it to another request)."""
        # GONE stands only where the ratchet's release drops the last binding
        held = [p for p in pages if p != GONE] if self.release_drops else pages
        if held:
            self.pool.free_pages(held)

    def bound_pages(self, pages: list[int], band: str) -> int:
        """How many of the virtual `pages` are bound on token band `band`."""
        return int((self.pool.translate(self._reps(pages), band) > 0).sum())

    # -- capacity, the forward, observation: the pool as the engine sees it --

    def room_tokens_bound(self) -> int:
        """An upper bound on `room_tokens` from live counts (no search)."""
        return self.pool.available_size_bound()

    def room_tokens_floor(self) -> int:
        """A lower bound on `room_tokens` (the pool's flushed view, no
        float slide search)."""
        return self.pool.available_size_floor()

    def room_tokens(self) -> int:
        """Tokens a coupled alloc can take now, crediting the holes an
        urgent flush would release (the pool's schedulable view)."""
        return self.pool.available_size(schedulable=True)

    def begin_forward(self, event, write_ids: np.ndarray | None, running: list[Request],
                      write_pages: list[int] | None = None) -> int:
        """Declare the forward behind `event` (it writes the virtual token
        ids `write_ids` and the state slots of `running`), then flush
        opportunistically while it runs; returns the bytes moved since the
        last call (moves made between forwards are charged to the next).
        `write_pages`: the page of each written id (`StepPlan`), when
        known: the pool then takes the pages as they are (and `write_ids`
        may be None)."""
        states = {}
        if self.state_band is not None:
            # Python ints, as the pool's page-level call takes them; kept as
            # requests take and give back their state (`running_states`)
            states[self.state_band] = list(self.running_states.values())
        if write_pages is not None:
            self.pool.set_inflight_pages(event, write_pages, states)
        else:
            self.pool.set_inflight_forward(event, write_ids, states)
        self.pool.flush(urgent=False)
        total = sum([c.moved_bytes for c in self._band_counters])
        moved, self._moved_mark = total - self._moved_mark, total
        return moved

    def moves(self) -> int:
        """Page moves so far, every band summed."""
        return sum([c.moves for c in self._band_counters])

    def sample(self) -> tuple:
        """The pool's sample (`UnifiedPool.sample`), taken again only when
        the pool changed since the last one."""
        epoch = self.pool.epoch.value
        if self._sample is None or self._sample[0] != epoch:
            self._sample = (epoch, self.pool.sample())
        return self._sample[1]

    def sample_columns(self, sampled) -> dict[str, np.ndarray]:
        """The samples taken by `sample`, as the pool's columns."""
        return self.pool.sample_columns(sampled)

    # -- eviction --

    def evict_some(self) -> bool:
        """Evict the least recently used cached block; False when none is."""
        node = self.cache.evict_one() if self.cache is not None else None
        if node is None:
            return False
        self._free_pages(node.pages)
        if node.state is not None:
            self.pool.free_state(self.state_band, [node.state])
        self.evictions += 1
        return True

    def evictable_tokens(self) -> int:
        """Tokens of a coupled alloc that evicting every unlocked cached block
        would make room for: the bytes those blocks hold on the token bands
        (a block's pages the window ratchet released hold none on the window
        band) over the bytes of one token on every token band, in whole pages.
        Exact for byte-fungible layouts (unified, oracle) and models without a
        window band; an estimate for the static split of a window model."""
        if self.cache is None or not self.cache.evictable_bytes:
            return 0
        page = self.ps * self.token_entry_bytes
        return self.cache.evictable_bytes // page * self.ps

    # -- admission --

    def usable_hit(self, req: Request) -> list[Node]:
        """The longest cached prefix this request can resume from.

        Whole blocks only, leaving at least one prompt token to compute; on
        a window model the window before the cut must still be bound on the
        window band; on a state model the cut needs a state snapshot.
        """
        if self.cache is None or not req.hashes or req.generated:
            return []
        full_blocks = min(len(req.hashes), (req.prompt_tokens - 1) // self.cache.block_tokens)
        path = self.cache.match(req.hashes[:full_blocks])
        for depth in range(len(path), 0, -1):
            if self._resumable(path, depth):
                return path[:depth]
        return []

    def _resumable(self, path: list[Node], depth: int) -> bool:
        if self.state_band is not None and path[depth - 1].state is None:
            return False
        if not self.swa:
            return True
        end = depth * self.cache.block_tokens
        first = max(0, end - self.window) // self.ps
        pages = [p for node in path[:depth] for p in node.pages][first:]
        if not pages:
            return True
        return bool((self.pool.translate(self._reps(pages), "swa") > 0).all())

    def take_hit(self, req: Request, now: float) -> None:
        """Start an admission: lock the request's cache hit and resume after
        it (no pool call). `retract` undoes it."""
        path = self.usable_hit(req)
        if self.cache is not None:
            self.cache.lock(path, now)
        self._forget(req)
        req.nodes = path
        req.pages = [p for node in path for p in node.pages]
        req.shared_pages = req.swa_released = len(req.pages)
        hit = len(path) * self.cache.block_tokens if path else 0
        req.seq = req.prefilled = req.hit_tokens = hit
        self.held_seq += hit
        self.held_window += min(hit, self.window_cap)
        self.held_pages += len(req.pages)
        req.prefill_target = req.context_tokens

    def take_state(self, req: Request) -> bool:
        """The request's `state_slots_per_request` slots, all or none (no
        eviction): the first is `req.state`, the others are reserved beside
        it until the request stops running; True without a state band."""
        if self.state_band is None:
            return True
        slots = self.pool.alloc_state(self.state_band, self.state_slots)
        if slots is None:
            return False
        ids = [int(s) for s in slots]
        req.state = ids[0]
        self.running_states[req.rid] = ids[0]
        if len(ids) > 1:
            self.extra_states[req.rid] = ids[1:]
        return True

    def _drop_extra_states(self, req: Request) -> None:
        """Free the slots reserved beside `req.state` (none held: no-op)."""
        extra = self.extra_states.pop(req.rid, None)
        if extra:
            self.pool.free_state(self.state_band, extra)

    # -- allocation --

    def extend(self, req: Request, tokens: int) -> bool:
        """Allocate the next `tokens` positions of one request (no eviction).

        The positions fill the tail page, then fresh pages: the pool's
        `alloc_extend` of one request takes exactly those pages, so they
        are taken as pages (`take_pages`), with no token id to build."""
        held, cap, ps = len(req.pages), self.window_cap, self.ps
        took = self.align is not None and req.seq > 0 and req.rid not in self.prefill_states
        if took and not self._take_prefill_state(req):
            return False
        new = -(-(req.seq + tokens) // ps) - held  # pages hold positions [0, seq): ceil(seq / ps)
        if new > 0:
            fresh = self.pool.take_pages(new)
            if fresh is None:
                if took:  # all or nothing: the slot taken for this chunk goes back
                    self.prefill_done(req)
                return False
            req.pages.extend(fresh.tolist())
        self.held_window += min(req.seq + tokens, cap) - min(req.seq, cap)
        req.seq += tokens
        self.held_seq += tokens
        self.held_pages += len(req.pages) - held
        if self.align is not None and req.seq % self.align == 0 and req.seq <= req.prompt_tokens:
            self.state_depths.setdefault(req.rid, []).append(req.seq // self.align)
        return True

    def _take_prefill_state(self, req: Request) -> bool:
        """vLLM align: a chunk after the request's first (or its first after
        a hit) reads the previous state block and writes a new one, so the
        request holds one more slot until its prefill ends; False when none
        is free."""
        slot = self.pool.alloc_state(self.state_band, 1)
        if slot is None:
            return False
        self.prefill_states[req.rid] = int(slot[0])
        self.extra_states.setdefault(req.rid, []).append(int(slot[0]))
        return True

    def prefill_done(self, req: Request) -> None:
        """The request's prefill ended: free the slot `extend` took beside
        its state (vLLM align; no-op otherwise)."""
        slot = self.prefill_states.pop(req.rid, None)
        if slot is None:
            return
        extra = self.extra_states[req.rid]
        extra.remove(slot)
        if not extra:
            del self.extra_states[req.rid]
        self.pool.free_state(self.state_band, [slot])

    def decode(self, reqs: list[Request]) -> list[int] | None:
        """One new position for every request in `reqs` (no eviction): the
        virtual page each new position lies on (the page the forward writes
        it to), in order, or None (nothing allocated, every request as it
        was) on shortfall."""
        # Only requests whose new token opens a page change the pool; the
        # others write into their tail page (the pool's answer for them is
        # last_loc + 1), so they need no call: the pool ends in the same
        # state. One walk: each request's position advances as it is read
        # (undone on a shortfall), openers get their page once the pool answers.
        ps, due_slot, cap = self.ps, self._due_slot, self.window_cap
        inside = 0  # requests whose new position is inside the window
        pages: list[int] = []
        due: list[Request] = []  # position s + 1 puts a page boundary at the window's edge
        opening: list[Request] = []
        spots: list[int] = []  # where the openers' pages go in `pages`
        put = pages.append  # bound once: this loop runs over every decoder, every step
        for r in reqs:
            s = r.seq
            r.seq = s + 1
            m = s % ps
            if m == due_slot:
                due.append(r)
            if s < cap:
                inside += 1
            if m:  # position s on the tail page
                put(r.pages[-1])
            else:
                opening.append(r)
                spots.append(len(pages))
                put(-1)
        if opening:
            # Every opener's new position is its fresh page's first slot:
            # alloc_decode would take one page each (and answer page * ps).
            fresh = self.pool.take_pages(len(opening))
            if fresh is None:
                for r in reqs:
                    r.seq -= 1
                return None
            for r, i, page in zip(opening, spots, fresh.tolist()):
                r.pages.append(page)
                pages[i] = page
            self.held_pages += len(opening)
        self.held_seq += len(reqs)
        self.held_window += inside
        self.window_due = due
        return pages

    def ratchet(self, reqs: list[Request]) -> int:
        """Release on the window band every own page fully out of the window;
        returns pages released.

        Only requests whose positions moved since their last ratchet can
        have such pages: after a step, the step's prefill requests and,
        of its decoders, those in `window_due` (a decode moves the window
        by one position, so a page leaves it only when `(seq - window)`
        crosses a page boundary). Where the window band is the only token
        band the released pages become GONE: the pool took their ids back."""
        if not self.swa:
            return 0
        pages: list[int] = []
        window, ps = self.window, self.ps
        for r in reqs:
            out = (r.seq - window) // ps
            if out > r.swa_released:
                pages += r.pages[r.swa_released:out]
                if self.release_drops:
                    r.pages[r.swa_released:out] = [GONE] * (out - r.swa_released)
                r.swa_released = out
        if pages:
            self.pool.release_pages(pages, "swa")
        return len(pages)

    # -- release --

    def finish(self, req: Request, now: float) -> None:
        """Hand the prompt's whole blocks to the prefix cache, free the rest."""
        own = req.pages[req.shared_pages:]
        state = req.state
        if self.cache is not None:
            self.cache.unlock(req.nodes, now)
            own, state = self._insert(req, now)
        self._free_pages(own)
        if state is not None:
            self.pool.free_state(self.state_band, [state])
        self._forget(req)
        req.pages, req.nodes, req.state = [], [], None

    def _insert(self, req: Request, now: float):
        """Insert the request's own whole prompt blocks; returns the pages
        and the state slot still to free."""
        block = self.cache.block_tokens
        ppb = block // self.ps
        node = req.nodes[-1] if req.nodes else self.cache.root
        own = req.pages[req.shared_pages:]
        n_blocks = min(len(req.hashes), req.prompt_tokens // block, req.seq // block)
        path = list(req.nodes)
        leftover: list[int] = []
        consumed = 0
        for j in range(len(req.nodes), n_blocks):
            pages = own[consumed: consumed + ppb]
            child = node.children.get(req.hashes[j])
            if child is None:
                nbytes = self._block_bytes(req, req.shared_pages + consumed, len(pages))
                child = self.cache.insert(node, req.hashes[j], pages, now, nbytes)
            else:
                leftover.extend(pages)
            consumed += ppb
            node = child
            path.append(node)
        state = req.state
        if self.align is not None:
            self._cache_aligned_states(req, path)
            return leftover + own[consumed:], None
        if state is not None and node is not self.cache.root and node.state is None:
            self.cache.set_state(node, state)
            state = None
        return leftover + own[consumed:], state

    def _cache_aligned_states(self, req: Request, path: list[Node]) -> None:
        """vLLM align: the running state is not kept (it is past the prompt's
        blocks); a state is cached at each depth where a prefill chunk ended
        on a block boundary (vLLM caches those blocks as they fill; held by
        the cache here from the finish on, one free slot each, none evicted
        for them)."""
        if req.state is not None:
            self.pool.free_state(self.state_band, [req.state])
            req.state = None
        for depth in self.state_depths.pop(req.rid, ()):
            node = path[depth - 1] if depth <= len(path) else None
            if node is None or node.state is not None:
                continue
            slot = self.pool.alloc_state(self.state_band, 1)
            if slot is None:
                break
            self.cache.set_state(node, int(slot[0]))

    def _block_bytes(self, req: Request, first: int, n_pages: int) -> int:
        """Bytes the pages `req.pages[first: first + n_pages]` hold on the token
        bands (on the window band only those the ratchet has not released)."""
        total = 0
        for band, entry in self.token_bytes.items():
            bound = n_pages
            if band == "swa" and self.swa:
                bound = max(0, first + n_pages - max(first, req.swa_released))
            total += bound * self.ps * entry
        return total

    def retract(self, req: Request, now: float) -> None:
        """Give back everything the request holds; it will be recomputed."""
        if self.cache is not None:
            self.cache.unlock(req.nodes, now)
        self._free_pages(req.pages[req.shared_pages:])
        if req.state is not None:
            self.pool.free_state(self.state_band, [req.state])
        self._forget(req)
        req.reset_progress()
        req.retractions += 1

    def _forget(self, req: Request) -> None:
        """Take `req`'s positions and pages out of the held totals (its
        pages are about to be dropped or replaced) and free its reserved
        state slots (it stops running)."""
        self._drop_extra_states(req)
        if self.state_band is not None:
            self.running_states.pop(req.rid, None)
        self.prefill_states.pop(req.rid, None)  # freed with the extra states
        self.state_depths.pop(req.rid, None)
        if req.pages:
            self.held_seq -= req.seq
            self.held_window -= min(req.seq, self.window_cap)
        self.held_pages -= len(req.pages)

    # -- accounting --

    def check(self, running: list[Request]) -> list[str]:
        """The pages requests and the cache hold equal the pool's live pages
        (`sim.memory_check.check_holdings`; [] when healthy)."""
        return check_holdings(self, running)

    def verify(self, running: list[Request]) -> list[str]:
        """The pool's invariants, then `check` ([] when healthy)."""
        return self.pool.verify() + check_holdings(self, running)

"""A trivial plain-Python reference model of what a pool holds.

It knows nothing of physical pages: only which virtual pages the engine holds
on which token band, which state slots it holds, which request owns what, and
the stamp of the bytes each written slot must read back. The state machine
and the random driver step it beside the real pool; the checkers of
`unikv.testing.checks` compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Page:
    """One virtual page: its owning request and the token bands binding it."""

    owner: int
    bands: set[str]


@dataclass
class Request:
    """A request: the virtual token id of each position it holds.

    `states` maps a state band to the slot the request owns there (the
    random driver's requests own one per state band; the state machine's
    slots stand alone); positions `[0, released)` (whole pages) are
    released on the window band by the driver's ratchet.
    """

    rid: int
    tokens: list[int] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    released: int = 0


class ChainModel:
    """What the engine believes the pool holds.

    Attributes:
        pages: virtual page -> `Page` for every page bound on >= 1 band.
        stamps: token band -> virtual token id -> stamp of its bytes (only
            slots the engine wrote, on bands that still bind their page).
        states: state band -> slot id -> stamp.
        reqs: request id -> `Request`, in admission order.
    """

    def __init__(self, token_bands: list[str], state_bands: list[str], page_size: int) -> None:
        self.token_bands = list(token_bands)
        self.state_bands = list(state_bands)
        self.ps = page_size
        self.pages: dict[int, Page] = {}
        self.stamps: dict[str, dict[int, int]] = {b: {} for b in token_bands}
        self.states: dict[str, dict[int, int]] = {b: {} for b in state_bands}
        self.reqs: dict[int, Request] = {}
        self.next_rid = 1
        self.next_stamp = 1

    # -- queries --

    def bound(self, band: str) -> set[int]:
        """Virtual pages bound on token band `band`."""
        return {v for v, p in self.pages.items() if band in p.bands}

    def live_pages(self, rid: int) -> list[int]:
        """Pages of request `rid` still bound somewhere, in position order."""
        out: list[int] = []
        for t in self.reqs[rid].tokens:
            v = t // self.ps
            page = self.pages.get(v)
            if page is not None and page.owner == rid and (not out or out[-1] != v):
                out.append(v)
        return out

    def live_positions(self, rid: int) -> list[int]:
        """Positions of `rid` whose page is still bound somewhere."""
        toks = self.reqs[rid].tokens
        return [i for i, t in enumerate(toks) if self.owns(rid, t // self.ps)]

    def owns(self, rid: int, v: int) -> bool:
        page = self.pages.get(v)
        return page is not None and page.owner == rid

    def extendable(self, rid: int) -> bool:
        """Whether `rid` can take more tokens: its tail page, when partly
        filled, must still be bound (its `last_loc` is read)."""
        toks = self.reqs[rid].tokens
        return len(toks) % self.ps == 0 or self.owns(rid, toks[-1] // self.ps)

    def live_tokens(self) -> list[int]:
        """Token ids on pages bound somewhere that the engine wrote."""
        return sorted({t for s in self.stamps.values() for t in s})

    def fresh_pages(self, ids: list[int]) -> list[int]:
        """Pages of `ids` not bound yet, in order of first appearance."""
        return [v for v in dict.fromkeys(t // self.ps for t in ids) if v not in self.pages]

    # -- updates --

    def new_request(self, tokens: list[int] | None = None, states: dict[str, int] | None = None) -> int:
        rid = self.next_rid
        self.next_rid += 1
        self.reqs[rid] = Request(rid, list(tokens or []), dict(states or {}))
        return rid

    def new_stamps(self, n: int) -> list[int]:
        """`n` stamps never handed out before (one per slot written)."""
        out = list(range(self.next_stamp, self.next_stamp + n))
        self.next_stamp += n
        return out

    def bind(self, pages, owner: int) -> None:
        for v in pages:
            assert v not in self.pages, f"model: page {v} bound twice"
            self.pages[v] = Page(owner, set(self.token_bands))

    def write(self, band: str, ids, stamps) -> None:
        """Record the stamps written to `ids` on `band` (token or state)."""
        target = self.states[band] if band in self.states else self.stamps[band]
        target.update(zip(ids, stamps))

    def release(self, band: str, pages) -> None:
        """Tombstone `pages` on `band`; a page no band binds is gone."""
        for v in pages:
            page = self.pages.get(v)
            if page is None or band not in page.bands:
                continue
            page.bands.discard(band)
            self._drop_stamps(band, v)
            if not page.bands:
                del self.pages[v]

    def free(self, pages) -> None:
        for v in pages:
            page = self.pages.pop(v, None)
            if page is not None:
                for band in page.bands:
                    self._drop_stamps(band, v)

    def free_states(self, band: str, slots) -> None:
        for s in slots:
            del self.states[band][s]

    def _drop_stamps(self, band: str, v: int) -> None:
        stamps = self.stamps[band]
        for t in range(v * self.ps, (v + 1) * self.ps):
            stamps.pop(t, None)

    def drop_request(self, rid: int) -> None:
        self.free(self.live_pages(rid))
        del self.reqs[rid]

    def clear(self) -> None:
        self.pages.clear()
        for d in list(self.stamps.values()) + list(self.states.values()):
            d.clear()
        self.reqs.clear()

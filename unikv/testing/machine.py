"""The conformance machine: one hypothesis state machine for every pool kind
and backend.

`ConformanceMachine` draws a layout in its `@initialize`
(`strategies.layouts`), builds a pool of its `kind` on its `backend`, then
plays the serving engine through the public surface: plain, batched extend
and decode allocs with tail-page reuse, frees of whole requests and of page
subsets, releases of one band (window ratchet with and without `start_pos`),
state slots, flushes, the float's relocations (`rules_memory`), in-flight
forwards and their events, including engine steps with overlap scheduling,
probes of the capacity views, rejected calls, drains and clears
(`rules_engine`).

Beside the pool it steps the reference model (`model.ChainModel`) and, on
materialised buffers, the byte shadow (`shadow.ShadowBytes`). After every
rule the invariant `healthy` runs `checks.pool_violations`.

`machine_for(kind, shapes, backend=...)` gives the machine of one pool kind
("eager" and "lazy" `UnifiedPool`, "static" `StaticPartitionPool`, "oracle"
`OraclePool` and "vllm" `VllmPool`: no byte or overlap checks) on one backend (`pools.sim_backend`,
or `pools.cuda_backend(device)`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant

from unikv.testing import checks
from unikv.testing.device import host_ids
from unikv.testing.forward import Forward, Pair, land
from unikv.testing.model import ChainModel
from unikv.testing.pools import BOOKKEEPING_KINDS, KINDS, fit_layout, known_core_bug, make_pool, sim_backend
from unikv.testing.reach import EXAMPLES, REACHED, STEPS
from unikv.testing.rules_engine import EngineRules
from unikv.testing.rules_memory import MemoryRules
from unikv.testing.shadow import ShadowBytes, write_fresh
from unikv.testing.strategies import SHAPES, layouts

if TYPE_CHECKING:
    from unikv.pool import UnifiedPool

_COUNTERS = ("moves", "relocations", "ladder_runs", "ladder_failures", "settles", "absorbed_pages",
             "pending_peak")


class ConformanceMachine(MemoryRules, EngineRules, RuleBasedStateMachine):
    """The engine against one pool, with a reference model beside it.

    Class attributes (set by `machine_for`): `kind` (a `pools.KINDS` entry),
    `shapes` (chain shapes the layouts take, from `strategies.SHAPES`) and
    `backend` (a factory: pool kind -> backend).
    """

    kind = "lazy"
    shapes = SHAPES
    backend = staticmethod(sim_backend)

    def __init__(self) -> None:
        super().__init__()
        self.has_pool = False  # no pool before setup, nor when its assume() rejects the layout

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        EXAMPLES[type(self).__name__] += 1
        self.layout = fit_layout(self.kind, data.draw(layouts(self.shapes), label="layout"))
        bug = known_core_bug(self.kind, self.layout)
        if bug:
            REACHED[f"known bug stepped around: {bug}"] += 1
        assume(bug is None)
        self.move_cap = 4096
        if self.kind == "lazy":
            self.move_cap = data.draw(st.sampled_from([1, 2, 4096]), label="move_cap")
        self.pool = pool = self.new_pool()
        self.has_pool = True
        self.ps = pool.page_size
        self.token_bands = [b.name for b in self.layout.token_bands]
        self.state_bands = [b.name for b in self.layout.state_bands]
        self.has_float = self.kind in ("eager", "lazy") and len(self.layout.bands) == 3
        self.window = "swa" if "swa" in self.token_bands else self.token_bands[0]
        # Pages of a coupled alloc the empty buffer could take (+1: a shortfall).
        self.max_pages = 1 + (self.layout.total_bytes - self.layout.sink_bytes) // sum(
            b.page_bytes for b in self.layout.token_bands)
        self.sizes = {n: pool.vids.size * self.ps for n in self.token_bands}
        self.sizes.update({n: pool.state_ids[n].size for n in self.state_bands})
        self.shadow = ShadowBytes(pool, self.sizes, enabled=self.kind not in BOOKKEEPING_KINDS)
        self.model = ChainModel(self.token_bands, self.state_bands, self.ps)
        self.inflight: Forward | None = None
        self.late: list[str] = []  # violations seen inside event callbacks

    def new_pool(self) -> UnifiedPool:
        """A fresh pool of this machine's kind, layout and backend."""
        return make_pool(self.kind, self.layout, self.move_cap, self.backend)

    # -- helpers --

    def _op(self) -> None:
        STEPS[type(self).__name__] += 1

    def _moves(self) -> int:
        return self.pool.stats()["moves"]

    def _write(self, band: str, ids: list[int]) -> None:
        """Write fresh patterns into `ids` of `band` through translate."""
        write_fresh(self.pool, self.shadow, self.model, band, ids)

    def _new_tokens(self, out, fresh: list[list[int]], rids: list[int], tokens: list[list[int]]) -> None:
        """Record a successful token alloc in the model; write its bytes on
        every token band that binds the page (a tail page may be released)."""
        for rid, pages, toks in zip(rids, fresh, tokens):
            self.model.bind(pages, rid)
            self.model.reqs[rid].tokens += toks
        ids = host_ids(out).tolist()
        for band in self.token_bands:
            self._write(band, [t for t in ids if band in self.model.pages[t // self.ps].bands])

    def _reqs(self, extendable: bool = False, live: bool = False) -> list[int]:
        m = self.model
        return sorted(r for r in m.reqs
                      if (not extendable or m.extendable(r)) and (not live or m.live_pages(r)))

    def _room(self) -> list[int]:
        return [self.pool.available_size()] + [self.pool.available_state(b) for b in self.state_bands]

    def _shortfall(self, room_before: list[int], what: str) -> None:
        """An alloc returned None: the ladder may have moved pages, but must
        not leave less no-move room than it found."""
        room = self._room()
        assert all(a >= b for a, b in zip(room, room_before)), \
            f"a failed {what} shrank the room {room_before} -> {room}"

    def _live_map(self) -> dict[str, list[int]]:
        """band -> physical page of every live page (to see that nothing moved)."""
        return {band: host_ids(self.pool.translate(host_ids(sorted(self.model.bound(band))) * self.ps,
                                                   band)).tolist()
                for band in self.token_bands}

    # -- forwards (the rules that launch and fire them are in rules_engine) --

    def _landed(self, fwd: Forward) -> None:
        """The event fired (from a rule, or a settle inside the pool)."""
        if self.inflight is fwd:
            self.inflight = None
        self.late += land(fwd, self.model, self.shadow)

    def _fire(self) -> None:
        if self.inflight is not None:
            self.inflight.event.fire()

    def _settle_for(self, pages: Iterable[int] = (), states: Iterable[Pair] = ()) -> None:
        """The engine never frees what the running forward touches: it
        waits for the forward first."""
        f = self.inflight
        if f is not None and (f.touches_pages(pages, self.token_bands) or f.touches(states)):
            self._fire()

    # -- after every rule --

    @invariant()
    def healthy(self) -> None:
        if not self.has_pool:
            return
        out, self.late = self.late, []
        # The oracle's and vLLM's physical ids are bookkeeping only: no overlap check.
        overlap = self.kind not in BOOKKEEPING_KINDS
        out += checks.pool_violations(self.pool, self.model, self.shadow, overlap=overlap)
        assert not out, "\n".join(out)

    def teardown(self) -> None:
        if self.has_pool:
            self._fire()
            stats = self.pool.stats()
            REACHED.update({k: stats[k] for k in _COUNTERS})


def machine_for(kind: str, shapes=SHAPES, name: str | None = None, backend=sim_backend) -> type:
    """The state machine for pool `kind` (see `KINDS`) over `shapes` (a
    subset of `SHAPES`) on `backend` (a factory: pool kind -> backend).

    Raises:
        ValueError: for an unknown kind or shape.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}")
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise ValueError(f"shapes={bad!r} are not in {SHAPES}")
    suffix = "" if backend is sim_backend else f"_{getattr(backend, '__name__', 'backend')}"
    return type(name or f"ConformanceMachine_{kind}{suffix}", (ConformanceMachine,),
                {"kind": kind, "shapes": tuple(shapes), "backend": staticmethod(backend)})

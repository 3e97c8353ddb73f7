"""CudaBackend: lockstep differential test against SimBackend, and the
sync-free steady decode loop.

The differential test runs on CUDA when present (gpu marker) and on the CPU
device of the backend everywhere (its Triton kernels through the interpreter
when Triton is installed; torch fallbacks otherwise).
"""

import os
import random
import sys

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first import of Triton (see tests/kernels/conftest.py).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from unikv import Band, Layout, UnifiedPool  # noqa: E402
from unikv.backends import SimBackend  # noqa: E402
from unikv.backends.cuda import CudaBackend  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
PS = 4
WINDOW = 12  # swa window in tokens


def small_layout(total_bytes: int = 48 * 1024) -> Layout:
    return Layout(total_bytes=total_bytes, bands=[
        Band("mamba", entry_bytes=520, grow="up", unit="request"),
        Band("swa", entry_bytes=24, grow="float", page_size=PS, blocks_per_page=2),
        Band("full", entry_bytes=72, grow="down", page_size=PS, blocks_per_page=4),
    ])


class Lockstep:
    """The same operations on a sim pool and a CUDA-backend pool; every
    result and, after each step, every table, frontier and byte must agree."""

    def __init__(self, backend: CudaBackend, compaction: str, seed: int) -> None:
        layout = small_layout()
        self.rng = random.Random(seed)
        # ids="torch": the sim pool answers in tensors, like the CUDA-backend pool.
        self.sim = UnifiedPool(layout, SimBackend(materialize=True), compaction=compaction, ids="torch")
        self.dev = UnifiedPool(layout, backend, compaction=compaction)
        self.sim.buffer[:] = np.random.default_rng(seed).integers(0, 256, self.sim.buffer.shape, dtype=np.uint8)
        self.dev.buffer.copy_(torch.from_numpy(self.sim.buffer))
        self.reqs: list[dict] = []  # tokens (host list), state id, swa-released tokens

    # -- helpers --

    def both(self, op: str, *args, **kw):
        a = getattr(self.sim, op)(*args, **kw)
        b = getattr(self.dev, op)(*args, **kw)
        if isinstance(a, torch.Tensor):
            assert b is not None and torch.equal(a, b.cpu()), f"{op} results differ"
            return a
        assert a == b, f"{op}: {a!r} != {b!r}"
        return a

    def write(self, tokens: list[int], state=None) -> None:
        """Random bytes into newly allocated slots, identically on both."""
        for band in ("swa", "full"):
            slots = self.sim.translate(tokens, band)
            rows = torch.randint(0, 256, (len(tokens), self.sim.buffer_view(band).shape[1]), dtype=torch.uint8)
            self.sim.buffer_view(band)[slots] = rows
            self.dev.buffer_view(band)[slots.to(self.dev.backend.device)] = rows.to(self.dev.backend.device)
        if state is not None:
            slot = self.sim.translate([state], "mamba")
            row = torch.randint(0, 256, (1, 520), dtype=torch.uint8)
            self.sim.buffer_view("mamba")[slot] = row
            self.dev.buffer_view("mamba")[slot.to(self.dev.backend.device)] = row.to(self.dev.backend.device)

    def compare(self, step: str) -> None:
        self.dev.commit()
        for name in self.sim.bands:
            a, b = self.sim.bands[name], self.dev.bands[name]
            assert (a.v2p == b.v2p_dev.cpu().numpy()).all(), f"after {step}: {name} v2p differs"
            assert (a.p2v == b.p2v_dev.cpu().numpy()).all(), f"after {step}: {name} p2v differs"
        assert self.sim.occupancy() == self.dev.occupancy(), f"after {step}: occupancy differs"
        assert np.array_equal(self.sim.buffer, self.dev.buffer.cpu().numpy()), f"after {step}: buffer bytes differ"

    # -- operations --

    def admit(self) -> None:
        n = self.rng.randrange(1, 30)
        state = self.both("alloc_state", "mamba", 1)
        if state is None:
            return
        ids = self.both("alloc_extend", [0], [n], [0], n)
        if ids is None:
            self.both("free_state", "mamba", state)
            return
        tokens = ids.tolist()
        self.write(tokens, int(state[0]))
        self.reqs.append({"tokens": tokens, "state": int(state[0]), "released": 0})

    def decode(self) -> None:
        batch = [r for r in self.reqs if self.rng.random() < 0.7]
        if not batch:
            return
        seq = [len(r["tokens"]) + 1 for r in batch]
        last = [r["tokens"][-1] for r in batch]
        ids = self.both("alloc_decode", seq, last)
        if ids is None:
            return
        for r, t in zip(batch, ids.tolist()):
            r["tokens"].append(t)
        self.write(ids.tolist())

    def extend(self) -> None:
        if not self.reqs:
            return
        r = self.rng.choice(self.reqs)
        k = self.rng.randrange(1, 12)
        n = len(r["tokens"])
        ids = self.both("alloc_extend", [n], [n + k], [r["tokens"][-1]], k)
        if ids is not None:
            r["tokens"] += ids.tolist()
            self.write(ids.tolist())

    def ratchet(self) -> None:
        """Release the swa pages of each request that left its window."""
        for r in self.reqs:
            start = r["released"]
            end = (max(0, len(r["tokens"]) - WINDOW) // PS) * PS
            if end > start:
                self.both("release", r["tokens"][start:end], band="swa", start_pos=start)
                r["released"] = end

    def finish(self) -> None:
        if self.reqs:
            r = self.reqs.pop(self.rng.randrange(len(self.reqs)))
            self.both("free", r["tokens"])
            self.both("free_state", "mamba", [r["state"]])

    def maintain(self) -> None:
        choice = self.rng.random()
        if choice < 0.6:
            self.both("flush", urgent=self.rng.random() < 0.3)
        elif choice < 0.8:
            self.both("compact_holes", self.rng.choice(["low", "high"]))
        else:
            self.both("make_room", self.rng.choice(["low", "high"]), self.rng.randrange(0, 4096))

    def run(self, steps: int) -> None:
        ops = [self.admit, self.admit, self.decode, self.decode, self.extend, self.ratchet, self.finish,
               self.maintain]
        for i in range(steps):
            op = self.rng.choice(ops)
            op()
            self.compare(f"step {i} ({op.__name__})")
        assert self.dev.verify() == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compaction", ["lazy", "eager"])
def test_lockstep_with_sim(device, compaction):
    Lockstep(CudaBackend(device), compaction, seed=7 if compaction == "lazy" else 11).run(steps=120)


@pytest.mark.gpu
@CUDA
def test_lockstep_on_a_side_stream():
    """The backend's own stream: every launch, event and wait on it, the
    pool driven under `torch.cuda.stream(side)` as the docstring asks."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        Lockstep(CudaBackend("cuda", stream=side), "lazy", seed=5).run(steps=80)
    torch.cuda.synchronize()


def test_lockstep_without_triton(monkeypatch):
    """Without Triton the backend runs torch versions of every kernel."""
    import importlib

    for op in ("move", "translate", "tables", "paged"):
        package = importlib.import_module(f"unikv.kernels.{op}")
        monkeypatch.setitem(sys.modules, f"unikv.kernels.{op}.kernel", None)
        monkeypatch.delattr(package, "kernel", raising=False)
    backend = CudaBackend("cuda" if torch.cuda.is_available() else "cpu")
    assert backend.ops.triton is False
    Lockstep(backend, "lazy", seed=3).run(steps=60)


def test_backend_basics_on_cpu():
    b = CudaBackend("cpu")
    assert b.materialized and b.device.type == "cpu" and not b.shares_host_memory
    host = np.full(5, -1, dtype=np.int64)
    table = b.mirror(host)
    host[0] = 7  # the mirror is a copy: commits carry host writes over
    assert table.tolist() == [-1] * 5
    b.scatter(table, np.array([0, 3]), np.array([7, 9]))
    assert table.tolist() == [7, -1, -1, 9, -1]
    assert b.upload(np.array([4, 5])).tolist() == [4, 5]
    event = b.new_event()
    assert b.event_done(event)
    b.wait_event(event)


def test_scatter_under_deterministic_algorithms():
    """torch refuses `put_` when deterministic algorithms are on: the
    scatter then takes `index_put_`, with the same result."""
    b = CudaBackend("cpu")
    table = b.mirror(np.full(6, -1, dtype=np.int64))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        b.scatter(table, np.array([4, 1, 4]), np.array([8, 3, 8]))
    finally:
        torch.use_deterministic_algorithms(was)
    b.scatter(table, np.array([0]), np.array([5]))
    assert table.tolist() == [5, 3, -1, -1, 8, -1]


def test_commit_is_deferred_until_the_tables_are_read():
    """Host decisions reach the device tables at `commit`, which `translate`
    and `page_table` run first; one scatter per commit."""
    pool = UnifiedPool(small_layout(), CudaBackend("cpu"), compaction="lazy")
    v = pool.alloc(2 * PS)
    assert (pool.bands["full"].v2p_dev[1:3] == -1).all() and pool.tables.dirty
    v2p = pool.bands["full"].v2p
    want = [int(v2p[t // PS]) * PS + t % PS for t in v.tolist()]
    assert pool.translate(v, "full").tolist() == want and min(want) > 0
    assert not pool.tables.dirty
    assert torch.equal(pool.page_table("full").cpu(), torch.from_numpy(pool.bands["full"].v2p))
    pool.free(v)
    assert pool.tables.dirty and pool.verify() == []  # verify skips the mirror while dirty
    pool.commit()
    assert pool.verify() == [] and (pool.bands["full"].v2p_dev[1:3] == -1).all()


def test_rejects_cuda_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        CudaBackend("cuda")


@pytest.mark.gpu
@CUDA
def test_events_are_stream_ordered():
    b = CudaBackend()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)
        event = torch.cuda.Event()
        event.record(side)
    assert not b.event_done(event)
    b.wait_event(event)  # a stream wait: returns at once
    after = b.new_event()
    after.synchronize()
    assert b.event_done(event)


# -- the steady decode loop must not sync --


def decode_pool(batch: int, device: str = "cuda"):
    """A 3-band pool with `batch` requests prefilled; returns (pool, state).

    The engine keeps its virtual ids on the host (the pool hands them out
    there), as `req_to_token` rows of a numpy table."""
    mib = 1 << 20
    layout = Layout(total_bytes=1024 * mib, bands=[
        Band("mamba", entry_bytes=64 * 1024, grow="up", unit="request"),
        Band("swa", entry_bytes=4096, grow="float", page_size=16, blocks_per_page=8),
        Band("full", entry_bytes=12288, grow="down", page_size=16, blocks_per_page=24),
    ])
    pool = UnifiedPool(layout, CudaBackend(device), compaction="lazy")
    lens = [100 + 37 * i % 300 for i in range(batch)]
    ids = pool.alloc_extend([0] * batch, lens, [0] * batch, sum(lens)).numpy()
    states = pool.alloc_state("mamba", batch).numpy()
    table = np.zeros((batch, max(lens) + 1024), dtype=np.int64)
    ends = np.cumsum(lens)
    for r, (n, end) in enumerate(zip(lens, ends)):
        table[r, :n] = ids[end - n:end]
    state = {"lens": np.array(lens), "table": table, "released": np.zeros(batch, dtype=np.int64),
             "states": states, "rows": np.arange(batch)}
    return pool, state


def decode_step(pool, state, window: int = 256, finish_every: int = 0, step: int = 0):
    """One engine step: finish one request every `finish_every` steps,
    decode every other request, ratchet the window, flush, then translate
    the new tokens for the forward (which commits the tables). Returns the
    device slot ids."""
    ps = pool.page_size
    rows, lens, table = state["rows"], state["lens"], state["table"]
    if finish_every and step % finish_every == finish_every - 1 and len(rows) > 1:
        r = int(rows[0])  # finished by the previous forward
        rows = state["rows"] = rows[1:]
        pool.free(table[r, :lens[r]])
        pool.free_state("mamba", state["states"][r:r + 1])
    seq = lens[rows] + 1
    new = pool.alloc_decode(seq, table[rows, seq - 2])
    table[rows, seq - 1] = new.numpy()
    lens[rows] = seq
    ends = np.maximum(0, seq - window) // ps * ps
    crossing = np.flatnonzero(ends > state["released"][rows])
    runs = [(int(rows[i]), int(state["released"][rows[i]]), int(ends[i])) for i in crossing]
    if step % 2:  # one call per request, with start_pos
        for r, start, end in runs:
            pool.release(table[r, start:end], band="swa", start_pos=start)
    elif runs:  # one call for the batch: one id per page that left the window
        pool.release(np.concatenate([table[r, start:end:ps] for r, start, end in runs]), band="swa")
    for r, _, end in runs:
        state["released"][r] = end
    pool.flush()
    return pool.translate(new, "full"), pool.translate(new, "swa")


def test_dirty_entries_are_committed_before_they_pile_up(monkeypatch):
    from unikv.tables import PageTables

    monkeypatch.setattr(PageTables, "MAX_PENDING", 8)
    pool = UnifiedPool(small_layout(), CudaBackend("cpu"), compaction="lazy")
    for _ in range(20):  # each alloc marks two batches per token band
        pool.alloc(PS)
        assert len(pool.tables._dirty) < 8
    pool.commit()
    assert pool.verify() == []


@pytest.mark.parametrize("device", DEVICES)
def test_decode_loop_keeps_the_device_tables_mirrored(device):
    pool, state = decode_pool(16, device)
    for step in range(40):
        full, swa = decode_step(pool, state, window=64, finish_every=7, step=step)
        assert full.device.type == pool.backend.device.type
        assert int(full.min()) > 0 and int(swa.min()) > 0  # fresh tokens are bound on both bands
    assert pool.verify() == []  # includes: device tables == host tables


@pytest.mark.gpu
@CUDA
def test_steady_decode_does_not_sync():
    pool, state = decode_pool(64)
    for step in range(3):  # warm up: Triton compiles, allocator caches fill
        decode_step(pool, state, finish_every=2, step=step)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(20):
            decode_step(pool, state, finish_every=5, step=step)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert pool.verify() == []


@pytest.mark.gpu
@CUDA
def test_backend_kernels_do_not_sync():
    """What the backend itself owns is sync-free: mirror updates, uploads,
    translate and a disjoint move."""
    b = CudaBackend()
    host = np.full(200, -1, dtype=np.int64)
    table = b.mirror(host)
    buf = b.make_buffer(100 * 256)

    def ops():
        b.scatter(table, np.array([3, 4, 5]), np.array([10, 11, 12]))
        b.translate(b.upload(np.array([48, 64, 80])), table, 16, 2)
        b.move_pages(buf, 256, np.array([10, 11, 12]), np.array([30, 31, 32]), disjoint=True)
        b.new_event()

    ops()  # compile and warm the pinned-memory pool first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops()
    finally:
        torch.cuda.set_sync_debug_mode(0)

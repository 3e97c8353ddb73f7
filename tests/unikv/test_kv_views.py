"""KVViews: per-layer K / V tensors over the pool's one buffer stay right while pages move."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from unikv import Band, Layout, StaticPartitionPool, UnifiedPool
from unikv.backends import CudaBackend, SimBackend
from unikv.tensors import KVViews, LayerKV

PS = 4
F32 = torch.float32
# full: layers 0 and 2, K and V of equal size (the kernel-facing row grid needs it);
# swa: layer 1 with Dk != Dv.
LAYERS = (LayerKV(0, "full", 2, 4, 4, F32), LayerKV(1, "swa", 1, 8, 4, F32), LayerKV(2, "full", 2, 4, 4, F32))
FULL_ENTRY = 2 * (2 * (4 + 4) * 4)  # 128 B per token
SWA_ENTRY = 1 * (8 + 4) * 4  # 48 B per token


def three_band(total: int = 24_000) -> Layout:
    """mamba(up) | swa(float) | full(down), tight enough that pages move."""
    return Layout(total_bytes=total, bands=[
        Band("mamba", entry_bytes=256, grow="up", unit="request"),
        Band("swa", entry_bytes=SWA_ENTRY, grow="float", page_size=PS, blocks_per_page=2),
        Band("full", entry_bytes=FULL_ENTRY, grow="down", page_size=PS, blocks_per_page=4),
    ])


def make_pool(backend: str, compaction: str, layout: Layout | None = None) -> UnifiedPool:
    be = SimBackend(materialize=True) if backend == "sim" else CudaBackend(backend.removeprefix("cuda-"))
    return UnifiedPool(layout or three_band(), backend=be, compaction=compaction, move_cap=2)


def host(x) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class Driver:
    """Random requests over the pool; the K/V each token was given, kept on the host."""

    def __init__(self, pool: UnifiedPool, views: KVViews, seed: int) -> None:
        self.pool, self.views = pool, views
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.requests: dict[int, dict] = {}
        self.written: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (layer, vid)
        self.next_id = 0

    def new_request(self) -> None:
        pages = int(self.rng.integers(1, 5))
        ids = self.pool.alloc(pages * PS)
        slot = self.pool.alloc_state("mamba", 1)
        if ids is None or slot is None:
            if ids is not None:
                self.pool.free(ids)
            if self.requests:
                self.free(next(iter(self.requests)))
            return
        vids = host(ids)
        for spec in LAYERS:
            k = torch.randn(len(vids), spec.num_kv_heads, spec.head_dim_k, generator=self.gen)
            v = torch.randn(len(vids), spec.num_kv_heads, spec.head_dim_v, generator=self.gen)
            self.views.write(spec.layer, self.pool.translate(ids, spec.band), k, v)
            for i, t in enumerate(vids):
                self.written[spec.layer, int(t)] = (k[i], v[i])
        self.requests[self.next_id] = {"vids": vids, "state": slot, "swa_released": 0}
        self.next_id += 1

    def free(self, rid: int) -> None:
        req = self.requests.pop(rid)
        self.pool.free(req["vids"])
        self.pool.free_state("mamba", req["state"])

    def release_window(self, rid: int) -> None:
        """Tombstone the request's oldest swa page still bound (a window ratchet)."""
        req = self.requests[rid]
        pages = len(req["vids"]) // PS
        if req["swa_released"] < pages - 1:
            start = req["swa_released"] * PS
            self.pool.release(req["vids"][start: start + PS], band="swa")
            req["swa_released"] += 1

    def step(self) -> None:
        op = self.rng.random()
        if op < 0.5 or not self.requests:
            self.new_request()
        elif op < 0.75:
            self.free(list(self.requests)[int(self.rng.integers(len(self.requests)))])
        elif op < 0.9:
            self.release_window(list(self.requests)[int(self.rng.integers(len(self.requests)))])
        else:
            self.pool.flush(urgent=bool(self.rng.random() < 0.5))

    def mismatches(self) -> list[str]:
        """Every live token's K / V read through the views at its translated slot."""
        out = []
        for rid, req in self.requests.items():
            for spec in LAYERS:
                vids = req["vids"][req["swa_released"] * PS:] if spec.band == "swa" else req["vids"]
                slots = torch.as_tensor(host(self.pool.translate(vids, spec.band)))
                k = self.views.k(spec.layer)[slots // PS, slots % PS].cpu()
                v = self.views.v(spec.layer)[slots // PS, slots % PS].cpu()
                want_k = torch.stack([self.written[spec.layer, int(t)][0] for t in vids])
                want_v = torch.stack([self.written[spec.layer, int(t)][1] for t in vids])
                if not (torch.equal(k, want_k) and torch.equal(v, want_v)):
                    out.append(f"request {rid} layer {spec.layer}: K/V differ from what was written")
        return out


def view_identity(views: KVViews) -> list[tuple[int, int, int, int]]:
    return [(id(views.k(s.layer)), views.k(s.layer).data_ptr(), id(views.v(s.layer)),
             views.v(s.layer).data_ptr()) for s in LAYERS]


CUDA = pytest.param("cuda-cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])
BACKENDS = ["sim", "cuda-cpu", CUDA]  # CudaBackend on the CPU, and on a GPU


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compaction", ["lazy", "eager"])
def test_views_read_what_was_written_while_pages_move(backend, compaction):
    pool = make_pool(backend, compaction)
    views = KVViews(pool, LAYERS)
    before = view_identity(views)
    driver = Driver(pool, views, seed=3)
    for i in range(160):
        driver.step()
        if i % 8 == 0:
            assert driver.mismatches() == []
            assert pool.verify() == []
    assert driver.mismatches() == []
    stats = pool.stats()
    assert stats["moves"] > 0 and stats["bands"]["swa"]["relocations"] > 0, stats
    assert view_identity(views) == before  # compaction changed page tables only


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_facing_ids_address_the_same_bytes(backend):
    """On rows of entry_bytes / blocks_per_page bytes, token t's K of the band's
    i-th layer is row kid + 2 i ps and its V row kid + (2 i + 1) ps."""
    pool = make_pool(backend, "lazy")
    views = KVViews(pool, LAYERS)
    driver = Driver(pool, views, seed=5)
    for _ in range(60):
        driver.step()
    vids = np.concatenate([r["vids"] for r in driver.requests.values()])
    row_bytes = FULL_ENTRY // 4
    rows = torch.as_tensor(host(pool.buffer_view("full"))).reshape(-1)
    rows = rows[: len(rows) // row_bytes * row_bytes].reshape(-1, row_bytes)
    kid = torch.as_tensor(host(pool.translate(vids, "full", kernel=True)))
    slots = torch.as_tensor(host(pool.translate(vids, "full")))
    for i, layer in enumerate((0, 2)):
        for j, tensor in enumerate((views.k(layer), views.v(layer))):
            via_views = tensor[slots // PS, slots % PS].reshape(len(vids), -1).view(torch.uint8).cpu()
            assert torch.equal(rows[kid + (2 * i + j) * PS], via_views)


def test_latent_view_of_an_mla_band():
    """MLA: one latent per token per layer; blocks_per_page = layers; the latent
    of layer i is kernel-facing row kid + i ps."""
    d, layers = 12, (LayerKV(0, "full", 1, 12, 0, F32, kind="latent"),
                     LayerKV(1, "full", 1, 12, 0, F32, kind="latent"))
    layout = Layout(total_bytes=20_000, bands=[
        Band("full", entry_bytes=2 * d * 4, grow="down", page_size=PS, blocks_per_page=2)])
    pool = UnifiedPool(layout, backend=SimBackend(materialize=True))
    views = KVViews(pool, layers)
    assert views.latent(1).shape == (layout.geometry("full").num_pages, PS, 1, d)
    ids = pool.alloc(3 * PS)
    lat = [torch.randn(len(ids), 1, d) for _ in layers]
    for spec, x in zip(layers, lat):
        views.write(spec.layer, pool.translate(ids, "full"), x)
    rows = torch.from_numpy(pool.buffer_view("full")).reshape(-1, d * 4)
    kid = torch.from_numpy(pool.translate(ids, "full", kernel=True))
    slots = torch.from_numpy(pool.translate(ids, "full"))
    for i, x in enumerate(lat):
        assert torch.equal(views.latent(i)[slots // PS, slots % PS], x)
        assert torch.equal(rows[kid + i * PS].view(F32).reshape(len(ids), 1, d), x)
    with pytest.raises(ValueError, match="kind='latent'"):
        views.k(0)


def test_block_table_maps_pages_tombstones_and_padding():
    pool = make_pool("sim", "lazy")
    views = KVViews(pool, LAYERS)
    a, b = host(pool.alloc(3 * PS)), host(pool.alloc(PS))
    pool.release(a[:PS], band="swa")  # a's first page left the window
    pages_a, pages_b = list(a[::PS] // PS), list(b[::PS] // PS)
    full = views.block_table([pages_a, pages_b], "full")
    swa = views.block_table([pages_a, pages_b], "swa", width=5)
    assert full.dtype == torch.int32 and full.shape == (2, 3) and swa.shape == (2, 5)
    for table, band in ((full, "full"), (swa, "swa")):
        for row, vids in zip(table, (a, b)):
            want = host(pool.translate(vids[::PS], band)) // PS
            assert row[: len(want)].tolist() == want.tolist()
            assert row[len(want):].tolist() == [0] * (len(row) - len(want))
    assert swa[0, 0] == 0 and full[0, 0] > 0
    with pytest.raises(ValueError, match="width=2"):
        views.block_table([pages_a], "full", width=2)
    with pytest.raises(ValueError, match="band='mamba'"):
        views.block_table([pages_a], "mamba")


def one_line_error(fn, match: str) -> str:
    with pytest.raises(ValueError, match=match) as err:
        fn()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_refusals_name_the_band_and_both_figures():
    pool = make_pool("sim", "lazy")
    msg = one_line_error(lambda: KVViews(pool, LAYERS[:2]), "band 'full'")
    assert str(FULL_ENTRY // 2) in msg and str(FULL_ENTRY) in msg
    bad_blocks = Layout(total_bytes=24_000, bands=[
        Band("swa", entry_bytes=SWA_ENTRY, grow="up", page_size=PS, blocks_per_page=1),
        Band("full", entry_bytes=FULL_ENTRY, grow="down", page_size=PS, blocks_per_page=4)])
    msg = one_line_error(lambda: KVViews(make_pool("sim", "lazy", bad_blocks), LAYERS),
                         "band 'swa'.*2 blocks per page.*blocks_per_page is 1")
    one_line_error(lambda: KVViews(pool, [LayerKV(0, "window", 1, 8, 8, F32)]), "band='window'")
    one_line_error(lambda: KVViews(pool, [LayerKV(0, "mamba", 8, 4, 4, F32)]), "band='mamba'")
    unmaterialised = UnifiedPool(three_band(), backend=SimBackend())
    one_line_error(lambda: KVViews(unmaterialised, LAYERS), "keeps no bytes")
    one_line_error(lambda: KVViews(pool, [LAYERS[0], LAYERS[0]]), r"layers \[0\]")
    one_line_error(lambda: LayerKV(0, "full", 2, 4, 0, F32), "head_dim_v=0")
    one_line_error(lambda: LayerKV(0, "full", 2, 4, 4, F32, kind="latent"), "latent")


def test_write_refuses_bad_shapes_and_slots_and_leaves_bytes():
    pool = make_pool("sim", "lazy")
    views = KVViews(pool, LAYERS)
    ids = pool.alloc(PS)
    slots = pool.translate(ids, "full")
    before = pool.buffer_view("full").copy()
    one_line_error(lambda: views.write(0, slots, torch.zeros(PS, 2, 5), torch.zeros(PS, 2, 4)), r"k is")
    one_line_error(lambda: views.write(0, slots, torch.zeros(PS, 2, 4), None), "v=None")
    one_line_error(lambda: views.write(0, slots + 10**6, torch.zeros(PS, 2, 4), torch.zeros(PS, 2, 4)),
                   "slots range")
    one_line_error(lambda: views.write(7, slots, torch.zeros(PS, 2, 4), torch.zeros(PS, 2, 4)), "layer=7")
    assert np.array_equal(pool.buffer_view("full"), before)


def test_views_over_a_static_partition_pool():
    """The fixed-split baseline's regions sit on the same page grids: the same views serve it."""
    layout = three_band()
    pool = StaticPartitionPool(layout, backend=SimBackend(materialize=True),
                               fractions={"mamba": 0.2, "swa": 0.3, "full": 0.5})
    views = KVViews(pool, LAYERS)
    driver = Driver(pool, views, seed=9)
    for _ in range(60):
        driver.step()
    assert driver.requests and driver.mismatches() == []
    vids = next(iter(driver.requests.values()))["vids"]
    table = views.block_table([vids[::PS] // PS], "full")
    assert table[0].tolist() == (host(pool.translate(vids[::PS], "full")) // PS).tolist()

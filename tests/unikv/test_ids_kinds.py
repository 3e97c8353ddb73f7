"""`ids=`: the array kind a pool hands out; the default is the backend's native kind."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from factories import three_band

from unikv import OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import CudaBackend, SimBackend

KINDS = {"unified": UnifiedPool, "static": StaticPartitionPool, "oracle": OraclePool}


def _drive(p) -> list:
    """The same calls on any pool; every answer it hands out, in order."""
    v = p.alloc(16)
    out = [v, p.alloc_extend([0], [5], [-1], 5), p.alloc_state("mamba", 2)]
    out.append(p.alloc_decode([17], [int(v[-1])]))
    p.release(v[:4], "swa")
    p.free(out[1])
    p.flush(urgent=True)
    for band in ("swa", "full"):
        out += [p.translate(v, band), p.translate(v, band, kernel=True), p.page_table(band)]
    out.append(p.translate(out[2], "mamba"))
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_numpy_and_torch_ids_hand_out_equal_values(kind):
    """Ids, translations and page tables agree; only the array kind differs."""
    materialize = kind != "oracle"
    pools = [KINDS[kind](three_band(page_size=2, total=40_000), SimBackend(materialize), ids=i)
             for i in ("numpy", "torch")]
    answers = [_drive(p) for p in pools]
    for n, t in zip(*answers):
        assert type(n) is np.ndarray and n.dtype == np.int64
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.device.type == "cpu"
        assert t.tolist() == n.tolist()
    assert pools[0].occupancy() == pools[1].occupancy()
    assert pools[0].verify() == pools[1].verify() == []


def test_torch_views_share_the_pool_memory():
    """`ids="torch"` wraps the host arrays (no copy): a byte written through
    the tensor view is in the pool's numpy buffer, and the page table
    tensor follows later moves."""
    p = UnifiedPool(three_band(), SimBackend(materialize=True), ids="torch")
    view = p.buffer_view("swa")
    assert isinstance(view, torch.Tensor) and view.dtype == torch.uint8 and view.shape == (100, 100)
    view[10, 0] = 7
    assert type(p.buffer) is np.ndarray and p.buffer[1000] == 7
    table = p.page_table("full")
    v = p.alloc(3)
    assert table[v // p.page_size].tolist() == p.translate(v, "full").tolist()


def test_default_ids_are_the_backends_native_kind():
    sim = UnifiedPool(three_band(), SimBackend(materialize=True))
    assert sim.ids == SimBackend.native_ids == "numpy"
    assert type(sim.alloc(2)) is np.ndarray and type(sim.buffer_view("full")) is np.ndarray
    for cls in (StaticPartitionPool, OraclePool):
        assert type(cls(three_band()).alloc(2)) is np.ndarray
    cuda = UnifiedPool(three_band(), CudaBackend("cpu"))
    assert cuda.ids == CudaBackend.native_ids == "torch"
    assert isinstance(cuda.alloc(2), torch.Tensor)


def test_numpy_ids_on_the_cuda_backend_keep_device_outputs():
    """`ids` names the host arrays; a real device's outputs stay tensors."""
    p = UnifiedPool(three_band(), CudaBackend("cpu"), ids="numpy")
    v = p.alloc(4)
    assert type(v) is np.ndarray
    assert isinstance(p.translate(v, "full"), torch.Tensor)
    assert isinstance(p.page_table("full"), torch.Tensor)
    assert isinstance(p.buffer_view("full"), torch.Tensor)


def test_tensor_inputs_still_accepted_by_a_numpy_pool():
    p = UnifiedPool(three_band(), SimBackend(materialize=True))
    v = p.alloc(torch.tensor(4))
    t = torch.from_numpy(v)
    assert p.translate(t, "full").tolist() == p.translate(v, "full").tolist()
    with pytest.raises(ValueError, match="not an integer dtype"):
        p.free(t.double())
    p.free(t)
    assert p.verify() == [] and p.available_size() == UnifiedPool(three_band()).available_size()

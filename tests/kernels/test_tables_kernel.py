"""unikv.kernels.tables.kernel: the Triton page-table kernels against their torch references."""

import pytest
import torch

pytest.importorskip("triton")

from unikv.kernels.tables import kernel as triton_tables  # noqa: E402
from unikv.kernels.tables import reference  # noqa: E402

COUNTS = [0, 1, 7, 301, 1025]  # 1025 > one program's BLOCK


def bound_tables(n_bound: int, gen, device, v_size: int = 2701, p_size: int = 2650):
    """Tables with `n_bound` random pairs bound (sink entries 0 <-> 0), and
    the bound virtual / physical pages."""
    v2p = torch.full((v_size,), -1, dtype=torch.int64)
    p2v = torch.full((p_size,), -1, dtype=torch.int64)
    v2p[0] = p2v[0] = 0
    v = torch.randperm(v_size - 1, generator=gen)[:n_bound] + 1
    p = torch.randperm(p_size - 1, generator=gen)[:n_bound] + 1
    v2p[v], p2v[p] = p, v
    return v2p.to(device), p2v.to(device), v.to(device), p.to(device)


def free_pages(table: torch.Tensor, n: int, gen) -> torch.Tensor:
    """`n` random unbound entries of `table` (excluding the sink)."""
    free = (torch.nonzero(table.cpu()[1:] < 0).flatten() + 1)
    return free[torch.randperm(free.numel(), generator=gen)[:n]].to(table.device)


def assert_tables(a, b):
    assert torch.equal(a[0].cpu(), b[0].cpu()), "v2p differs"
    assert torch.equal(a[1].cpu(), b[1].cpu()), "p2v differs"


@pytest.mark.parametrize("n", COUNTS)
def test_bind(n, gen, device):
    v2p, p2v, _, _ = bound_tables(200, gen, device)
    v, p = free_pages(v2p, n, gen), free_pages(p2v, n, gen)
    ref = (v2p.clone(), p2v.clone())
    reference.bind(v, p, *ref)
    triton_tables.bind(v, p, v2p, p2v)
    assert_tables(ref, (v2p, p2v))


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("start_on_device", [False, True])
def test_alloc_bind(n, start_on_device, gen, device):
    v2p, p2v, _, _ = bound_tables(0, gen, device, p_size=2000)
    v = free_pages(v2p, n, gen)
    start = 317
    ref = (v2p.clone(), p2v.clone())
    want = reference.alloc_bind(v, start, *ref)
    arg = torch.tensor([start], device=device) if start_on_device else start
    got = triton_tables.alloc_bind(v, arg, v2p, p2v)
    assert torch.equal(got.cpu(), want.cpu())
    assert torch.equal(got.cpu(), torch.arange(start, start + n))
    assert_tables(ref, (v2p, p2v))


@pytest.mark.parametrize("n", COUNTS)
def test_free_unbind(n, gen, device):
    v2p, p2v, v, _ = bound_tables(1100, gen, device)
    freed = v[torch.randperm(v.numel(), generator=gen)[:n].to(device)]
    ref = (v2p.clone(), p2v.clone())
    want = reference.free_unbind(freed, *ref)
    got = triton_tables.free_unbind(freed, v2p, p2v)
    assert torch.equal(got.cpu(), want.cpu())
    assert_tables(ref, (v2p, p2v))


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("shape", ["disjoint", "shift", "permutation"])
def test_remap_moved(n, shape, gen, device):
    v2p, p2v, _, p = bound_tables(1200, gen, device)
    src = p[:n]
    if shape == "disjoint":
        dst = free_pages(p2v, n, gen)
    elif shape == "shift":  # a packed run slides down over itself
        bound = torch.sort(p.cpu()).values
        src = bound[bound.numel() - n:].to(device)
        dst = torch.arange(1, 1 + n, device=device)
        dst = torch.where(dst < src, dst, src)  # never move up in this shape
    else:  # sources permuted among themselves (cycles)
        dst = src[torch.randperm(n, generator=gen).to(device)]
    ref = (v2p.clone(), p2v.clone())
    want = reference.remap_moved(src, dst, *ref)
    got = triton_tables.remap_moved(src, dst, v2p, p2v)
    assert torch.equal(got.cpu(), want.cpu())
    assert_tables(ref, (v2p, p2v))


def test_checks_name_the_argument(device):
    v2p = torch.full((10,), -1, dtype=torch.int64, device=device)
    p2v = v2p.clone()
    ids = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="p_pages has dtype torch.int32"):
        triton_tables.bind(ids, ids.to(torch.int32), v2p, p2v)
    with pytest.raises(ValueError, match="lengths differ"):
        triton_tables.bind(ids, ids[:2], v2p, p2v)
    with pytest.raises(ValueError, match="2-D|expected 1-D"):
        triton_tables.free_unbind(ids.view(1, 3), v2p, p2v)
    with pytest.raises(ValueError, match="v2p must be contiguous"):
        triton_tables.remap_moved(ids, ids, torch.full((20,), -1, dtype=torch.int64, device=device)[::2], p2v)
    with pytest.raises(ValueError, match="start=-1"):
        triton_tables.alloc_bind(ids, -1, v2p, p2v)
    with pytest.raises(ValueError, match="start has 2 elements"):
        triton_tables.alloc_bind(ids, ids[:2], v2p, p2v)
    with pytest.raises(ValueError, match="v_pages must be a torch.Tensor"):
        triton_tables.free_unbind([1, 2], v2p, p2v)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_checks_name_the_devices():
    v2p = torch.full((10,), -1, dtype=torch.int64, device="cuda")
    p2v, ids = v2p.clone(), torch.arange(3, device="cuda")
    for call in (lambda: triton_tables.bind(ids.cpu(), ids, v2p, p2v),
                 lambda: triton_tables.alloc_bind(ids, torch.tensor([0]), v2p, p2v),
                 lambda: triton_tables.free_unbind(ids, v2p, p2v.cpu()),
                 lambda: triton_tables.remap_moved(ids, ids.cpu(), v2p, p2v)):
        with pytest.raises(ValueError, match="different devices"):
            call()

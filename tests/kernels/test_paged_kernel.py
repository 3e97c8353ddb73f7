"""unikv.kernels.paged.kernel: the Triton paged_decode / paged_extend against their torch references."""

import pytest
import torch

pytest.importorskip("triton")

from unikv.kernels.paged import kernel as triton_paged  # noqa: E402
from unikv.kernels.paged import reference  # noqa: E402

COUNTS = [0, 1, 7, 301, 1025]  # 1025 > one step of the scans (SCAN_BLOCK)
PAGE_SIZES = [1, 5, 16]


def last_locs(prefix: torch.Tensor, page_size: int, gen) -> torch.Tensor:
    """A virtual id at each prefix's last position (random page)."""
    pages = torch.randint(1, 10_000, prefix.shape, generator=gen)
    return pages * page_size + (prefix - 1) % page_size


def fresh_pages(count: int, gen) -> torch.Tensor:
    return torch.randperm(50_000, generator=gen)[:count] + 1


@pytest.mark.parametrize("bs", COUNTS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_paged_decode(bs, page_size, gen, device):
    seq = torch.randint(1, 200, (bs,), generator=gen)
    last = last_locs(seq - 1, page_size, gen)
    pages = fresh_pages(int(reference.new_page_counts(seq - 1, seq, page_size).sum()), gen)
    want = reference.paged_decode(seq, last, pages, page_size)
    got = triton_paged.paged_decode(seq.to(device), last.to(device), pages.to(device), page_size)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("bs", COUNTS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("pass_total", [False, True])
def test_paged_extend(bs, page_size, pass_total, gen, device):
    prefix = torch.randint(0, 100, (bs,), generator=gen)
    prefix[: bs // 3] = 0  # fresh prefills beside continued ones
    ext = torch.randint(0, 40, (bs,), generator=gen)
    seq = prefix + ext
    last = last_locs(prefix, page_size, gen)
    pages = fresh_pages(int(reference.new_page_counts(prefix, seq, page_size).sum()), gen)
    want = reference.paged_extend(prefix, seq, last, pages, page_size)
    total = int(ext.sum()) if pass_total else None
    args = [t.to(device) for t in (prefix, seq, last, pages)]
    got = triton_paged.paged_extend(*args, page_size, total_tokens=total)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(reference.paged_extend(*args, page_size).cpu(), want)


def test_long_extend_spans_many_programs(gen, device):
    prefix = torch.tensor([3, 0, 17])
    seq = prefix + torch.tensor([700, 0, 300])
    last = last_locs(prefix, 16, gen)
    pages = fresh_pages(int(reference.new_page_counts(prefix, seq, 16).sum()), gen)
    want = reference.paged_extend(prefix, seq, last, pages, 16)
    got = triton_paged.paged_extend(*(t.to(device) for t in (prefix, seq, last, pages)), 16)
    assert torch.equal(got.cpu(), want)


def test_checks(device):
    seq = torch.tensor([3, 4], device=device)
    with pytest.raises(ValueError, match="lengths differ"):
        triton_paged.paged_decode(seq, seq[:1], seq, 16)
    with pytest.raises(ValueError, match="page_size=0"):
        triton_paged.paged_decode(seq, seq, seq, 0)
    with pytest.raises(ValueError, match="seq_lens has dtype torch.float32"):
        triton_paged.paged_decode(seq.float(), seq, seq, 16)
    with pytest.raises(ValueError, match="total_tokens=-1"):
        triton_paged.paged_extend(seq, seq, seq, seq, 16, total_tokens=-1)
    with pytest.raises(ValueError, match="new_pages has shape"):
        triton_paged.paged_extend(seq, seq, seq, seq.view(2, 1), 16)
    with pytest.raises(ValueError, match="prefix_lens must be a torch.Tensor"):
        triton_paged.paged_extend([3, 4], seq, seq, seq, 16)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="different devices"):
            triton_paged.paged_decode(seq, seq.cpu(), seq, 16)

"""unikv.kernels.translate.kernel: the Triton translate against its torch reference."""

import pytest
import torch

pytest.importorskip("triton")

from unikv.kernels.translate import kernel as triton_translate  # noqa: E402
from unikv.kernels.translate import reference  # noqa: E402

COUNTS = [0, 1, 7, 301, 1025]  # 1025 > one program's BLOCK
V_PAGES = 701


def table(gen, device) -> torch.Tensor:
    """A v2p of V_PAGES entries: random physical pages, a tenth tombstoned."""
    v2p = torch.randperm(5 * V_PAGES, generator=gen)[:V_PAGES]
    v2p[torch.randperm(V_PAGES, generator=gen)[: V_PAGES // 10]] = -1
    return v2p.to(device)


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("page_size,multiplier", [(1, 1), (16, 1), (16, 6), (5, 3)])
def test_translate(n, page_size, multiplier, gen, device):
    v2p = table(gen, device)
    tokens = torch.randint(0, V_PAGES * page_size, (n,), generator=gen).to(device)
    want = reference.translate(tokens, v2p, page_size, multiplier)
    got = triton_translate.translate(tokens, v2p, page_size, multiplier)
    assert torch.equal(got.cpu(), want.cpu())
    if n:
        assert int(got.min()) >= 0  # tombstones land in the sink


def test_pages_outside_the_table_read_the_sink(device):
    v2p = torch.tensor([0, 5, 6], device=device)
    got = triton_translate.translate(torch.tensor([4, 5, 12, 13], device=device), v2p, 4)
    assert got.tolist() == [20, 21, 0, 0]


def test_checks(device):
    v2p = torch.full((10,), -1, dtype=torch.int64, device=device)
    ids = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="page_size=0"):
        triton_translate.translate(ids, v2p, 0)
    with pytest.raises(ValueError, match="multiplier=-2"):
        triton_translate.translate(ids, v2p, 4, -2)
    with pytest.raises(ValueError, match="v_tokens has dtype torch.int32"):
        triton_translate.translate(ids.to(torch.int32), v2p, 4)
    with pytest.raises(ValueError, match="v2p has shape"):
        triton_translate.translate(ids, v2p.view(2, 5), 4)
    with pytest.raises(ValueError, match="v2p must be contiguous"):
        triton_translate.translate(ids, torch.full((20,), -1, dtype=torch.int64, device=device)[::2], 4)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="different devices"):
            triton_translate.translate(ids.cpu(), v2p, 4)

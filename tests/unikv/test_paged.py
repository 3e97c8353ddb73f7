"""unikv.paged: the host twins of the paged kernels' torch references."""

import numpy as np
import pytest
import torch

from unikv import paged
from unikv.kernels import reference


def random_batch(rng, bs: int, ps: int):
    """prefix / seq lengths, last_loc ids on distinct live pages, fresh pages."""
    prefix = rng.integers(0, 5 * ps, bs)
    seq = prefix + rng.integers(0, 4 * ps, bs)
    tail_pages = rng.permutation(np.arange(1, 10 * bs + 2))[:bs]
    last = tail_pages * ps + (prefix - 1) % ps
    new = int((-(-seq // ps) - -(-prefix // ps)).sum())
    fresh = rng.permutation(np.arange(10 * bs + 2, 30 * bs + 2 + new))[:new]
    return prefix.astype(np.int64), seq.astype(np.int64), last.astype(np.int64), fresh.astype(np.int64)


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("bs", [1, 7, 64])
def test_extend_ids_match_the_reference(ps, bs):
    rng = np.random.default_rng(ps * 100 + bs)
    for _ in range(5):
        prefix, seq, last, fresh = random_batch(rng, bs, ps)
        req = paged.PagedRequest(prefix, seq, last, len(fresh), int((seq - prefix).sum()))
        got = paged.extend_ids(req, fresh, ps)
        want = reference.paged_extend(*(torch.from_numpy(a) for a in (prefix, seq, last, fresh)), ps)
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_decode_ids_match_the_reference(ps):
    rng = np.random.default_rng(ps)
    seq = rng.integers(1, 10 * ps, 50).astype(np.int64)
    prefix = seq - 1
    last = (np.arange(1, 51) * ps + (prefix - 1) % ps).astype(np.int64)
    opens = prefix % ps == 0
    fresh = np.arange(100, 100 + int(opens.sum()), dtype=np.int64)
    req = paged.PagedRequest(prefix, seq, last, len(fresh), len(seq), opens)
    want = reference.paged_decode(torch.from_numpy(seq), torch.from_numpy(last), torch.from_numpy(fresh), ps)
    assert paged.decode_ids(req, fresh, ps).tolist() == want.tolist()


@pytest.mark.parametrize("ps,mult", [(1, 1), (16, 1), (16, 6), (5, 3)])
def test_translate_matches_the_reference(ps, mult):
    rng = np.random.default_rng(ps + mult)
    v2p = rng.integers(-1, 500, 300).astype(np.int64)
    v2p[0] = 0
    ids = rng.integers(0, 300 * ps, 1000).astype(np.int64)
    want = reference.translate(torch.from_numpy(ids), torch.from_numpy(v2p), ps, mult)
    got = paged.translate(ids, v2p, ps, mult)
    assert got.tolist() == want.tolist() and got.min() >= 0


def test_page_representatives_of_a_mid_page_run():
    ids = np.arange(103, 140)  # positions 3.. of a run on page size 16
    reps = paged.page_representatives(ids, 3, 16)
    assert (reps // 16).tolist() == sorted(set((ids // 16).tolist()))

"""DecodeGraphs' static buffers: each step's batch, and padding everywhere else."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unikv.sim.real.graphs import DecodeGraphs  # noqa: E402


def batch(rng, b: int, width: int) -> SimpleNamespace:
    def ints(*shape):
        return torch.from_numpy(rng.integers(1, 1000, shape).astype(np.int64))

    rows = ints(b, width)
    for i in range(b):  # a request's pages end somewhere before the width: 0 past them
        rows[i, int(rng.integers(1, width + 1)):] = 0
    return SimpleNamespace(input_ids=ints(b, 1), position_ids=ints(b, 1), seq_lens=ints(b).to(torch.int32),
                           page_rows=rows, write_vids=ints(b))


def test_each_fill_leaves_the_batch_and_padding_only_whatever_the_steps_before_held():
    """Batches of growing and shrinking size and width through one bucket:
    after every fill the buffers equal the batch in `[:b, :width]` and the
    padding (token 0, position 0, KV length 1, virtual row 0, virtual id 0:
    the sink) everywhere else, though a fill only resets what the last one
    left live."""
    rng = np.random.default_rng(0)
    graphs = DecodeGraphs(None, None, ["full"], device="cpu", max_pages=9, capture=False)
    st = graphs._static(8)
    for _ in range(60):
        b, width = int(rng.integers(1, 9)), int(rng.integers(1, 10))
        x = batch(rng, b, width)
        graphs._fill(st, x, b, width)
        assert torch.equal(st.ids[:b], x.input_ids) and not st.ids[b:].any()
        assert torch.equal(st.pos[:b], x.position_ids) and not st.pos[b:].any()
        assert torch.equal(st.seq_lens[:b], x.seq_lens) and bool((st.seq_lens[b:] == 1).all())
        assert torch.equal(st.vids[:b], x.write_vids) and not st.vids[b:].any()
        assert torch.equal(st.rows[:b, :width], x.page_rows)
        assert not st.rows[:b, width:].any() and not st.rows[b:].any()

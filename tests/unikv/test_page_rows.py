"""PageRows (per-request virtual page rows kept on the device) and their
device translation (`KVViews.translate_pages` / `translate_slots`), held
equal to the readable host path (`KVViews.block_table`, `pool.translate`)
while pages move."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kv_views import BACKENDS, LAYERS, PS, Driver, host, make_pool  # tests/unikv (conftest.py)

from unikv.tensors import KVViews, PageRows


def test_rows_equal_a_host_model_through_opens_closes_and_growth():
    rng = np.random.default_rng(0)
    rows = PageRows("cpu", rows=2, width=3)
    model: dict[int, list[int]] = {}
    for _ in range(300):
        op = rng.random()
        if op < 0.3 or not model:
            model[rows.open()] = []
        elif op < 0.45:
            r = list(model)[int(rng.integers(len(model)))]
            rows.close(r)
            del model[r]
        else:
            r = list(model)[int(rng.integers(len(model)))]
            add = rng.integers(1, 1000, int(rng.integers(1, 6))).tolist()
            rows.write(r, len(model[r]), add)
            model[r] += add
        if rng.random() < 0.3:
            ids = list(model) + [0]
            width = max([len(p) for p in model.values()] + [1])
            got = rows.gather(np.array(ids), width).numpy()
            want = np.zeros((len(ids), width), dtype=np.int64)
            for i, r in enumerate(ids[:-1]):
                want[i, :len(model[r])] = model[r]
            assert (got == want).all()  # closed-then-reopened rows read zero past their pages
    assert rows.table.shape[0] > 3 and rows.width > 3  # both grew
    assert not rows.table[0].any()  # row 0, the padding row, is never handed out


def test_a_row_closed_and_reopened_before_a_flush_keeps_only_its_new_pages():
    rows = PageRows("cpu", rows=1, width=4)
    r = rows.open()
    rows.write(r, 0, [5, 6, 7])
    rows.flush()
    rows.close(r)
    again = rows.open()
    assert again == r
    rows.write(again, 0, [9])
    assert rows.gather([again], 4).tolist() == [[9, 0, 0, 0]]


@pytest.mark.parametrize("call,match", [
    (lambda rows: rows.close(3), "row=3 is not an open row"),
    (lambda rows: rows.write(1, 0, [1]), "row=1 is not an open row"),
    (lambda rows: rows.write(rows.open(), -1, [1]), "first=-1"),
    (lambda rows: rows.gather([0], 0), "width=0"),
    (lambda rows: PageRows("cpu", rows=0), "rows=0"),
    (lambda rows: PageRows("cpu", width=True), "width=True"),
])
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call(PageRows("cpu"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compaction", ["lazy", "eager"])
def test_device_translation_equals_the_host_block_table_while_pages_move(backend, compaction):
    """Rows written once per request (never rebuilt) and translated on the
    device equal `block_table` (every page translated on the host) after
    every step: moves, float relocations and window releases change only
    v2p; released, unbound and padding pages read 0 (the sink)."""
    pool = make_pool(backend, compaction)
    views = KVViews(pool, LAYERS)
    driver = Driver(pool, views, seed=11)
    rows = PageRows(views.device, rows=2, width=2)
    held: dict[int, int] = {}  # request -> row
    checked = released = 0
    for _ in range(200):
        driver.step()
        for rid in [r for r in held if r not in driver.requests]:
            rows.close(held.pop(rid))
        for rid, req in driver.requests.items():
            if rid not in held:
                held[rid] = rows.open()
                rows.write(held[rid], 0, req["vids"][::PS] // PS)
        reqs = list(driver.requests.values())
        pages = [r["vids"][::PS] // PS for r in reqs]
        released += sum(r["swa_released"] for r in reqs)
        width = max([len(p) for p in pages] + [1]) + 1  # one padding column
        order = [held[rid] for rid in driver.requests] + [0]  # and a padding row
        virtual = rows.gather(np.array(order), width)
        views.page_tables()  # commit
        for band in views.bands:
            want = views.block_table(pages + [np.empty(0, np.int64)], band, width=width)
            assert torch.equal(views.translate_pages(virtual, band), want)
            vids = torch.as_tensor(np.concatenate(pages + [[0]]).astype(np.int64) * PS + 1).to(views.device)
            assert torch.equal(views.translate_slots(vids, band).cpu(),
                               torch.as_tensor(host(pool.translate(host(vids), band))).reshape(-1))
            checked += 1
    stats = pool.stats()
    assert checked and released and stats["moves"] > 0 and stats["bands"]["swa"]["relocations"] > 0, stats


def test_the_page_tables_are_the_same_tensors_every_step():
    """A captured graph reads them: they must never be replaced."""
    pool = make_pool("cuda-cpu", "lazy")
    views = KVViews(pool, LAYERS)
    before = {b: (id(t), t.data_ptr()) for b, t in views.page_tables().items()}
    driver = Driver(pool, views, seed=2)
    for _ in range(80):
        driver.step()
    assert {b: (id(t), t.data_ptr()) for b, t in views.page_tables().items()} == before
    for band, table in views.page_tables().items():
        assert torch.equal(table.cpu(), torch.from_numpy(host(pool.page_table(band))).cpu())


def test_translation_refuses_an_unknown_band():
    views = KVViews(make_pool("sim", "lazy"), LAYERS)
    with pytest.raises(ValueError, match="band='mamba'"):
        views.translate_pages(torch.zeros((1, 1), dtype=torch.int64), "mamba")
    with pytest.raises(ValueError, match="band='nope'"):
        views.translate_slots(torch.zeros(1, dtype=torch.int64), "nope")

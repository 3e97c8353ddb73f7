"""sim.fit: one request alone on an empty pool, refused past the model's
context, and answered at a cost that does not grow with its length."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unikv.sim.fit import fits_alone, max_request_tokens
from unikv.sim.layouts import ContextTooLongError, build_layout, check_fits
from unikv.sim.memory import Memory
from unikv.sim.models import ModelSpec, load_model

GIB = 2**30


def window_model(window: int, *, state: bool = False, context: int | None = None) -> ModelSpec:
    """An all-sliding-window model of 64 B per token (and a 4 kB state)."""
    return ModelSpec(name="window-only", full_layers=0, swa_layers=2, window_tokens=window,
                     swa_token_bytes=64, state_layers=1 if state else 0,
                     state_bytes=4096 if state else 0, max_context_tokens=context)


@pytest.fixture
def extends(monkeypatch):
    """Counts `Memory.extend` calls (the walk's steps)."""
    calls = []
    orig = Memory.extend

    def spy(self, req, tokens):
        calls.append(tokens)
        return orig(self, req, tokens)

    monkeypatch.setattr(Memory, "extend", spy)
    return calls


@settings(max_examples=300)
@given(window=st.integers(1, 300), page_size=st.sampled_from([1, 2, 3, 4, 16]),
       chunk=st.integers(1, 96), chunks=st.integers(0, 40), extra=st.integers(0, 95),
       budget_pages=st.integers(2, 60), kind=st.sampled_from(["fixed_ratio", "end_end", "oracle"]),
       compaction=st.sampled_from(["lazy", "eager"]), state=st.booleans())
def test_the_early_stop_answers_as_the_full_walk(window, page_size, chunk, chunks, extra, budget_pages,
                                                 kind, compaction, state):
    model = window_model(window, state=state)
    tokens = window + chunks * chunk + extra % chunk + 1
    budget = (4096 * 3 if state else 0) + 64 * page_size * (budget_pages + 1)
    try:
        plan = build_layout(model, kv_budget_gib=budget / GIB, page_size=page_size, kind=kind)
    except ValueError:
        return  # too small for the bands themselves
    kw = dict(prefill_chunk_tokens=chunk, compaction=compaction)
    assert fits_alone(plan, tokens, **kw) == fits_alone(plan, tokens, full_walk=True, **kw)


def test_the_walk_stops_after_one_period_past_the_window(extends):
    plan = build_layout(window_model(100), kv_budget_gib=64 * 1024 / GIB, page_size=16, kind="end_end")
    assert fits_alone(plan, 10**12, prefill_chunk_tokens=24)
    # The first chunk from s >= 100 is chunk 5 (s = 120); 16 / gcd(24, 16) = 2.
    assert len(extends) == 5 + 2
    extends.clear()
    assert fits_alone(plan, 10**6, prefill_chunk_tokens=24) and len(extends) == 7


@pytest.mark.parametrize("layout", ["fixed_ratio", "end_end", "oracle"])
def test_a_trillion_tokens_on_a_window_only_model_is_answered_fast(layout):
    model = load_model("mistral-7b-v0.1")
    plan = build_layout(model, kv_budget_gib=8.0, page_size=16, kind=layout)
    t0 = time.perf_counter()
    assert not fits_alone(plan, 10**12, prefill_chunk_tokens=8192)  # past the 32768-token context
    assert max_request_tokens(plan, 10**12, prefill_chunk_tokens=8192) == model.max_context_tokens
    unknown = build_layout(window_model(4096), kv_budget_gib=1.0, page_size=16, kind=layout)
    assert fits_alone(unknown, 10**12, prefill_chunk_tokens=8192)  # no context known: the early stop
    assert max_request_tokens(unknown, 10**12, prefill_chunk_tokens=8192) == 10**12
    assert time.perf_counter() - t0 < 5.0


def test_a_model_with_a_full_band_walks_no_further_than_its_pool(extends):
    # No early stop (the full band keeps growing): the walk fails at the pool's capacity.
    plan = build_layout(load_model("gemma-3-12b"), kv_budget_gib=0.5, page_size=16, kind="end_end")
    assert not fits_alone(plan, 10**12, prefill_chunk_tokens=8192)
    n = len(extends)
    assert not fits_alone(plan, 10**9, prefill_chunk_tokens=8192) and len(extends) == 2 * n


def test_check_fits_names_the_request_and_the_models_context():
    model = load_model("mistral-7b-v0.1")
    plan = build_layout(model, kv_budget_gib=8.0, page_size=16, kind="end_end")
    check_fits(plan, 32768, prefill_chunk_tokens=8192)
    with pytest.raises(ContextTooLongError, match=r"one request of 32769 tokens .* maximum context "
                                                  r"of 'mistral-7b-v0.1' \(32768 tokens\)"):
        check_fits(plan, 32769, prefill_chunk_tokens=8192)

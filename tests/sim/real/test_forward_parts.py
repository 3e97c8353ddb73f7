"""benchmarks/validate_real.py's `forward_parts`: a real replay's forwards
taken apart (every prefill chunk and decode batch with its tokens, the
tokens its requests held before it, and each step's forward and step time),
on the CPU with a host clock (the H200 reads CUDA events)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers.DynamicCache, "update_conv_state"):
    pytest.skip("this transformers' cache has no linear-attention API (update_conv_state)",
                allow_module_level=True)

from unikv.sim.real import executor as real_executor  # noqa: E402

from tests.sim.real.test_hybrid_prefill import compiled_replay  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("validate_real", ROOT / "benchmarks" / "validate_real.py")
validate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(validate)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after: the compiled replay's
    graphs would otherwise count against a later test's recompile limit
    (test_fuse.py compiles the same transformers code objects)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_every_chunk_and_decode_batch_of_a_replay_is_a_part_of_its_step(tmp_path, monkeypatch, one_thread,
                                                                         fresh_dynamo):
    plans = []
    split = real_executor.state_plans

    def keeping(plan):  # the executor's own split of each step: (chunk tokens, tokens before), decoders
        plans.append((plan.index + 1, [(n, r.seq - n) for r, n in plan.prefill],
                      sum(r.seq for r in plan.decode) - len(plan.decode), len(plan.decode)))
        return split(plan)

    launch, state = real_executor.RealExecutor.launch, real_executor.RealExecutor._prefill_state
    with validate.forward_parts(time.perf_counter, lambda a, b: b - a) as rows:
        monkeypatch.setattr(real_executor, "state_plans", keeping)  # after forward_parts: replay's own patch wraps it
        res, ex, _, _ = compiled_replay(tmp_path, monkeypatch)
    assert real_executor.RealExecutor.launch is launch and real_executor.RealExecutor._prefill_state is state
    parts = pd.DataFrame(rows, columns=list(validate.PART_COLUMNS))
    steps = parts[parts.part == "step"]
    assert list(steps.step) == [i for i, *_ in plans] == list(res.steps.step)  # numbered as steps.csv
    assert list(steps.ms) == pytest.approx([1e3 * s for s in ex.step_s])
    assert list(parts[parts.part == "forward"].ms) == pytest.approx([1e3 * s for s in ex.forward_s])
    chunks = parts[parts.part == "chunk"]  # no packed graphs here: every chunk through the compiled prefill
    want = [(i, n, c) for i, pre, _, _ in plans for n, c in pre]
    assert list(zip(chunks.step, chunks.tokens, chunks.cached)) == want and (chunks.batch == 1).all()
    assert any(c > 0 for _, _, c in want) and any(c == 0 for _, _, c in want)  # first and continuing chunks
    assert (parts.ms >= 0).all() and set(parts.part) == {"chunk", "forward", "step"}  # decode eager here
    for step, group in parts.groupby("step"):  # a step's parts lie inside its forward
        inside = group[group.part.isin(["chunk", "decode"])].ms.sum()
        assert inside <= group[group.part == "forward"].ms.iloc[0] + 1e-6, step

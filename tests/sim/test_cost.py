"""sim.cost: the step-time roofline and the hardware coefficients."""

import dataclasses

import pytest
from unikv.sim.cost import COEFFICIENTS, HardwareSpec, step_cost, step_time_s
from unikv.sim.models import ModelSpec, load_model

H200 = HardwareSpec.h200()
MOVE = H200.move_bytes_per_s  # the measured page-move bandwidth (sim/data/hardware/h200.json)
LLAMA = load_model("llama-3.1-8b")  # 8,030,261,248 params, bf16 weights
BASE = dict(prefill_tokens=0, decode_tokens=64, kv_bytes_read=10**9, moved_bytes=0)


def test_the_bundled_h200_is_the_documented_figures_each_with_a_source():
    assert (H200.peak_flops, H200.hbm_bytes_per_s, H200.mfu, H200.mbu, H200.move_bytes_per_s,
            H200.step_overhead_s) == (989e12, 4.8e12, 0.5, 0.7, 3.9609e12, 2e-3)
    assert set(H200.provenance) == set(COEFFICIENTS)
    assert all(p["source"] for p in H200.provenance.values())
    assert H200.provenance["move_bytes_per_s"]["file"] == "results/kernels/move_pages.csv"


def test_decode_step_is_memory_bound_by_hand():
    compute = 2 * 8_030_261_248 * 64 / (989e12 * 0.5)
    hbm = (2 * 8_030_261_248 + 10**9) / (4.8e12 * 0.7)
    cost = step_cost(LLAMA, H200, **BASE)
    assert cost.compute_s == pytest.approx(compute) and cost.hbm_s == pytest.approx(hbm)
    assert step_time_s(LLAMA, H200, **BASE) == pytest.approx(2e-3 + hbm)


def test_long_prefill_is_compute_bound_and_moves_add():
    args = dict(BASE, prefill_tokens=8192, decode_tokens=0, moved_bytes=4 * 10**9)
    compute = 2 * 8_030_261_248 * 8192 / (989e12 * 0.5)
    move = 2 * 4e9 / MOVE
    assert step_time_s(LLAMA, H200, **args) == pytest.approx(2e-3 + compute + move)


def test_a_step_without_tokens_costs_only_its_moves():
    args = dict(prefill_tokens=0, decode_tokens=0, kv_bytes_read=0, moved_bytes=10**9)
    assert step_time_s(LLAMA, H200, **args) == pytest.approx(2e9 / MOVE)
    assert step_time_s(LLAMA, H200, **dict(args, moved_bytes=0)) == 0


@pytest.mark.parametrize("arg", ["prefill_tokens", "decode_tokens", "kv_bytes_read", "moved_bytes"])
def test_monotone_in_every_argument(arg):
    times = [step_time_s(LLAMA, H200, **dict(BASE, **{arg: v}))
             for v in (0, 10**3, 10**6, 10**9, 10**11)]
    assert times == sorted(times) and times[-1] > times[0]


PREFILL = dict(BASE, prefill_tokens=4096, moved_bytes=10**9)  # compute-bound
DECODE = dict(BASE, moved_bytes=10**9)  # HBM-bound


@pytest.mark.parametrize("field, better", [("peak_flops", 2e15), ("hbm_bytes_per_s", 9e12),
                                           ("mfu", 0.9), ("mbu", 0.95),
                                           ("move_bytes_per_s", 9e12), ("step_overhead_s", 0.0)])
def test_faster_hardware_never_costs_more(field, better):
    fast = dataclasses.replace(H200, **{field: better})
    times = {name: (step_time_s(LLAMA, fast, **args), step_time_s(LLAMA, H200, **args))
             for name, args in (("prefill", PREFILL), ("decode", DECODE))}
    assert all(f <= s for f, s in times.values())
    binding = "decode" if field in ("hbm_bytes_per_s", "mbu") else "prefill"
    assert times[binding][0] < times[binding][1]


def test_overrides_and_missing_params():
    bare = ModelSpec(name="bare", full_layers=1, full_token_bytes=8)
    with pytest.raises(ValueError, match="params_active"):
        step_time_s(bare, H200, **BASE)
    t = step_time_s(bare, H200, **BASE, params_active=10**9, weight_bytes=2 * 10**9)
    assert t == pytest.approx(2e-3 + 3e9 / (4.8e12 * 0.7))
    with pytest.raises(ValueError, match="moved_bytes"):
        step_time_s(LLAMA, H200, **dict(BASE, moved_bytes=-1))


@pytest.mark.parametrize("field, value", [("mfu", 0), ("mbu", 1.5), ("peak_flops", -1),
                                          ("step_overhead_s", -1e-3), ("hbm_bytes_per_s", float("nan"))])
def test_hardware_spec_validates(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(H200, **{field: value})


def test_engine_step_cost_is_step_time_s_exactly():
    # The engine's per-step callable skips the argument checks; its floats
    # must be step_time_s's, bit for bit (replays stay identical).
    import random

    from unikv.sim.cost import EngineStepCost

    hw = dataclasses.replace(H200, move_bytes_per_s=3.96e12)
    engine = EngineStepCost(LLAMA, hw)
    rng = random.Random(0)
    for _ in range(2000):
        args = dict(prefill_tokens=rng.choice([0, rng.randrange(1, 9000)]),
                    decode_tokens=rng.choice([0, rng.randrange(1, 300)]),
                    kv_bytes_read=rng.randrange(0, 10**11), moved_bytes=rng.choice([0, rng.randrange(1, 10**10)]))
        assert engine(*args.values()) == step_time_s(LLAMA, hw, **args)
    assert engine.move_time_s(10**9) == 2e9 / 3.96e12


def test_engine_step_cost_names_a_missing_model_figure_at_the_first_forward():
    from unikv.sim.cost import EngineStepCost

    bare = dataclasses.replace(LLAMA, params_active=None)
    engine = EngineStepCost(bare, H200)  # building it does not raise
    assert engine(0, 0, 0, 10**9) == 2e9 / MOVE  # no forward, no figure needed
    with pytest.raises(ValueError, match="params_active"):
        engine(0, 1, 0, 0)

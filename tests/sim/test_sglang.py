"""sim.sglang and sim.engines: SGLang's split, its state rules, like-for-like runs."""

import pytest
from unikv.sim import sglang
from unikv.sim.cli import grid
from unikv.sim.config import RunConfig, SchedulerConfig
from unikv.sim.engines import rules
from unikv.sim.layouts import applicable_kinds, build_layout, static_region_bytes
from unikv.sim.memory import Memory
from unikv.sim.models import load_model
from unikv.sim.request import Request
from unikv.sim.run import run

GIB = 2**30


# -- state slots per running request (KVCacheConfigurator._calculate_mamba_ratio) --

@pytest.mark.parametrize("kwargs, slots", [
    (dict(), 5),                                                  # extra_buffer + overlap
    (dict(overlap_schedule=False), 4),                            # ping-pong of one
    (dict(strategy="extra_buffer_lazy"), 4),                      # lazy track buffer
    (dict(strategy="no_buffer"), 3),                              # live + radix retention
    (dict(strategy="no_buffer", overlap_schedule=False), 3),
    (dict(radix_cache=False), 1),                                 # --disable-radix-cache
])
def test_state_slots_per_request_follow_sglang(kwargs, slots):
    assert sglang.state_slots_per_request(**kwargs) == slots


def test_lazy_extra_buffer_without_overlap_is_refused():
    with pytest.raises(ValueError, match="extra_buffer_lazy.*overlap"):
        sglang.state_slots_per_request(strategy="extra_buffer_lazy", overlap_schedule=False)
    with pytest.raises(ValueError, match="mamba_cache_strategy"):
        SchedulerConfig(mamba_cache_strategy="ping")


# -- SGLang's documented boot log --------------------------------------------------

def test_sizing_rebuilds_sglangs_documented_boot_log():
    """The boot log in SGLang's compute-mamba-ratio skill
    (.claude/skills/compute-mamba-ratio/SKILL.md@305c272f, TP8, fp32 SSM +
    fp8 KV, default extra_buffer + overlap): "max_mamba_cache_size: 257,
    conv_state size: 0.46GB, ssm_state size: 13.04GB" and "#tokens: 1167552,
    KV size: 15.03 GB", capped at 51 running requests (its table). The state
    sizes cover the 257 slots plus the pool's padding slot; the memory the
    log states is the two pools together. From those per-slot and per-token
    bytes the sizing must land on the three numbers."""
    state_gib, kv_gib, slots_allocated, tokens = 0.46 + 13.04, 15.03, 258, 1_167_552
    per_slot = state_gib * GIB / slots_allocated
    per_token = kv_gib * GIB / tokens
    sizes = sglang.pool_sizes(rest_bytes=int((state_gib + kv_gib) * GIB),
                              full_token_bytes=per_token, state_bytes_per_slot=per_slot,
                              slots_per_request=sglang.state_slots_per_request())
    assert sizes.state_slots == 257
    assert abs(sizes.full_tokens - tokens) <= 2  # the log's GB have two decimals
    assert sizes.max_running_requests == 51


def test_sizing_by_hand_on_a_window_model():
    """gpt-oss-20b (GptOssForCausalLM is split): full = rest // (F + 0.8 S),
    swa = int(0.8 full), both page-aligned (HybridSWAPoolConfigurator)."""
    model = load_model("gpt-oss-20b")
    rest, ps = 4 * GIB, 16
    sizes = sglang.pool_sizes(rest_bytes=rest, full_token_bytes=model.full_token_bytes,
                              swa_token_bytes=model.swa_token_bytes, page_size=ps, split_swa=True)
    full = int(rest // (24576 + 0.8 * 24576)) // ps * ps
    assert (sizes.full_tokens, sizes.swa_tokens) == (full, int(full * 0.8) // ps * ps)
    assert sizes.state_slots == 0 and sizes.max_running_requests == min(4096, full // 2)


def test_a_budget_without_room_for_one_slot_is_refused():
    with pytest.raises(ValueError, match="no state slot"):
        sglang.pool_sizes(rest_bytes=10_000, full_token_bytes=100, state_bytes_per_slot=10_000)


# -- which models SGLang splits -------------------------------------------------------

def test_gemma_3_keeps_every_token_in_every_layer():
    """Gemma-3 is not in is_hybrid_swa_model's allowlist: one full pool over
    all 48 layers, no window band, no ratchet."""
    model = load_model("gemma-3-12b")
    plan = build_layout(model, kv_budget_gib=8, page_size=16, kind="sglang")
    assert plan.chain == "full(down)"
    assert plan.model.full_layers == 48 and plan.model.swa_layers == 0
    assert plan.model.full_token_bytes == model.full_token_bytes + model.swa_token_bytes
    held = static_region_bytes(plan)["full"] // plan.model.full_token_bytes
    assert held == plan.pool_sizes.full_tokens


def test_allowlisted_window_models_get_a_window_pool():
    plan = build_layout(load_model("gpt-oss-20b"), kv_budget_gib=8, page_size=16, kind="sglang")
    assert plan.chain == "swa(up) | full(down)"
    held = {b: n // plan.layout.geometry(b).band.entry_bytes
            for b, n in static_region_bytes(plan).items()}
    assert held == {"swa": plan.pool_sizes.swa_tokens, "full": plan.pool_sizes.full_tokens}


@pytest.mark.parametrize("name, arch", [("jamba-1.5-mini", "JambaForCausalLM"),
                                        ("hymba-1.5b-base", "HymbaForCausalLM")])
def test_recurrent_models_sglang_has_no_state_pool_for_are_refused(name, arch):
    model = load_model(name)
    assert "sglang" not in applicable_kinds(model)
    with pytest.raises(ValueError, match=f"no mamba state pool for {arch}"):
        build_layout(model, kv_budget_gib=8, page_size=16, kind="sglang")


def test_mamba_split_and_running_cap():
    """nemotron-3-nano (NemotronHForCausalLM), fp32 SSM: K = (B 0.9/1.9 - s) // s
    slots in the state region, and at 5 slots a request the cap is K // 5."""
    model = load_model("nemotron-3-nano-30b-a3b", state_dtype="fp32_ssm")
    plan = build_layout(model, kv_budget_gib=8, page_size=16, kind="sglang")
    usable = plan.layout.total_bytes - plan.layout.sink_bytes
    k = int((usable * 0.9 / 1.9 - model.state_bytes) // model.state_bytes)
    assert plan.pool_sizes.state_slots == k
    assert static_region_bytes(plan)["mamba"] == k * model.state_bytes
    assert plan.max_running(256, 5) == k // 5
    assert plan.max_running(256, 1) == min(256, k)
    tiny = build_layout(model, kv_budget_gib=0.28, page_size=16, kind="sglang")  # one slot
    with pytest.raises(ValueError, match="fewer than one request's 5"):
        tiny.max_running(256, 5)


# -- engine rules belong to the scheduler -------------------------------------------------

def test_engine_rules():
    default = SchedulerConfig()
    assert rules(default, "end_end") == rules(default, "fixed_ratio")
    assert (rules(default, "end_end").state_slots_per_request, rules(default, "end_end").state_dtype) \
        == (1, "bf16")
    sg = rules(default, "sglang")  # the baseline layout brings its engine
    assert (sg.engine, sg.state_slots_per_request, sg.state_dtype) == ("sglang", 5, "fp32_ssm")
    assert rules(SchedulerConfig(engine="sglang"), "end_end") == sg  # like for like
    assert rules(SchedulerConfig(engine="sglang", prefix_cache=False), "oracle").state_slots_per_request == 1
    assert rules(SchedulerConfig(engine="sglang", state_slots_per_request=2), "oracle") \
        .state_slots_per_request == 2
    with pytest.raises(ValueError, match="engine='tgi'"):
        SchedulerConfig(engine="tgi")
    with pytest.raises(ValueError, match="state_slots_per_request=0"):
        SchedulerConfig(state_slots_per_request=0)


def test_take_state_holds_every_slot_and_a_stop_frees_the_reserve():
    plan = build_layout(load_model("nemotron-3-nano-30b-a3b"), kv_budget_gib=2, page_size=16,
                        kind="end_end")
    pool = plan.make_pool()
    mem = Memory(pool, window_tokens=None, block_tokens=None, state_slots_per_request=5)
    a, b = Request(0, 0.0, 40, 4), Request(1, 0.0, 40, 4)
    assert mem.take_state(a) and mem.take_state(b) and mem.extend(a, 40)
    assert len(pool.live_ids("mamba")) == 10 and mem.check([a, b]) == []
    mem.retract(b, 0.0)
    mem.finish(a, 1.0)
    assert len(pool.live_ids("mamba")) == 0 and mem.check([]) == []
    with pytest.raises(ValueError, match="state_slots_per_request"):
        Memory(pool, window_tokens=None, block_tokens=None, state_slots_per_request=0)


def test_a_replay_under_sglang_rules_holds_the_cap_and_records_the_rules():
    cfg = RunConfig(trace="azure_conv", trace_end_s=20.0, model="nemotron-3-nano-30b-a3b",
                    kv_budget_gib=1.0, layout="sglang", rate_scale=3.0, check_every=5)
    res = run(cfg)
    assert res.violations == []
    got = res.identity["engine_rules"]
    plan = build_layout(load_model(cfg.model, state_dtype="fp32_ssm"), kv_budget_gib=1.0,
                        page_size=16, kind="sglang")
    assert got == {"engine": "sglang", "state_dtype": "fp32_ssm", "state_slots_per_request": 5,
                   "max_running": plan.max_running(256, 5)}
    assert res.steps["running"].max() <= got["max_running"] < 256
    assert res.identity["scheduler"]["engine"] is None  # the setting as given; the rules as applied


def test_compare_grid_runs_every_layout_under_the_baselines_engine():
    base = RunConfig(model="gpt-oss-20b")
    runs = grid(base, ["sglang", "end_end", "oracle"], ["lazy"], [None])
    assert [label for label, _ in runs] == ["sglang", "end_end/lazy", "oracle"]
    assert {c.scheduler.engine for _, c in runs} == {"sglang"}
    plain = grid(base, ["fixed_ratio", "end_end", "oracle"], ["lazy"], [None, 0.5])
    assert [label for label, _ in plain] == ["fixed_ratio", "fixed_ratio@0.5", "end_end/lazy", "oracle"]
    assert {c.scheduler.engine for _, c in plain} == {None}


def test_the_old_static_layout_is_refused_naming_its_new_name():
    with pytest.raises(ValueError, match="'static' is now 'fixed_ratio'"):
        RunConfig(layout="static")


def test_the_fit_check_holds_the_rules_state_slots():
    """A request that fits with one state slot but not with five is no fit
    under SGLang's rules (else it would wait forever for its slots)."""
    from unikv.sim.fit import fits_alone
    model = load_model("nemotron-3-nano-30b-a3b", state_dtype="fp32_ssm")
    plan = build_layout(model, kv_budget_gib=0.25, page_size=16, kind="end_end")
    assert fits_alone(plan, 1000, state_slots_per_request=1)
    assert not fits_alone(plan, 1000, state_slots_per_request=5)


# -- bad input through the CLI (the bad-input corpus's probe helpers) -----------------------

@pytest.mark.parametrize("args, words", [
    (["--model", "jamba-1.5-mini", "--layout", "sglang"], ["sglang", "JambaForCausalLM"]),
    (["--model", "nemotron-3-nano-30b-a3b", "--layout", "sglang", "--kv-budget-gib", "0.28"],
     ["state pool", "1 slots", "5", "kv_budget_gib"]),
    (["--engine", "tgi"], ["engine", "tgi", "sglang"]),
    (["--state-slots-per-request", "0"], ["state_slots_per_request", "0"]),
    (["--layout", "static"], ["layout", "static"]),
])
def test_bad_engine_input_is_refused_by_the_cli(args, words, tmp_path):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "bad_input"))
    from cli_probe import assert_complete_or_absent, assert_refused, run_cli

    out = tmp_path / "run"
    result = run_cli(["replay", "--trace-end-s", "5", "--no-figures", "--out", out, *args])
    assert_refused(result, *words)
    assert_complete_or_absent(out)

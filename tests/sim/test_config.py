"""RunConfig / SchedulerConfig refuse every bad number and every option
that does not apply, naming the field and the value (issue 14, item 7)."""

import math

import pytest
from unikv.sim.config import RunConfig, SchedulerConfig

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(("changes", "words"), [
    (dict(kv_budget_gib=INF), ["kv_budget_gib", "inf", "finite"]),
    (dict(kv_budget_gib=NAN), ["kv_budget_gib", "nan"]),
    (dict(kv_budget_gib=-1.0), ["kv_budget_gib", "-1.0", "> 0"]),
    (dict(rate_scale=INF), ["rate_scale", "inf"]),
    (dict(rate_scale=0.0), ["rate_scale", "0.0"]),
    (dict(rate_rps=NAN), ["rate_rps", "nan"]),
    (dict(rate_rps=INF), ["rate_rps", "inf"]),
    (dict(spread_s=INF), ["spread_s", "inf"]),
    (dict(spread_s=-3.0), ["spread_s", "-3.0"]),
    (dict(trace_start_s=NAN), ["trace_start_s", "nan"]),
    (dict(trace_start_s=-INF), ["trace_start_s", "-inf"]),
    (dict(trace_end_s=INF), ["trace_end_s", "inf"]),
    (dict(trace_start_s=10.0, trace_end_s=5.0), ["trace_end_s=5.0", "trace_start_s=10.0"]),
    (dict(trace_start_s=5.0, trace_end_s=5.0), ["trace_end_s", "empty"]),
    (dict(page_size=0), ["page_size", "0"]),
    (dict(page_size=True), ["page_size", "True"]),
    (dict(seed=-1), ["seed", "-1", ">= 0"]),
    (dict(check_every=-1), ["check_every", "-1", ">= 0"]),
    (dict(check_every=1.5), ["check_every", "1.5"]),
    (dict(max_requests=0), ["max_requests", "0"]),
    (dict(max_context_tokens=-5), ["max_context_tokens", "-5"]),
    (dict(layout="fixed_ratio", static_ratio=INF), ["static_ratio", "inf"]),
    (dict(layout="fixed_ratio", static_ratio=0.0), ["static_ratio", "0.0"]),
    (dict(layout="fixed_ratio", static_ratio=NAN), ["static_ratio", "nan"]),
])
def test_a_bad_number_is_refused_and_named(changes, words):
    with pytest.raises(ValueError) as info:
        RunConfig(**changes)
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, (missing, str(info.value))


@pytest.mark.parametrize(("changes", "words"), [
    (dict(reserve_init=1.5), ["scheduler.reserve_init", "1.5", "[0, 1]"]),
    (dict(reserve_init=NAN), ["scheduler.reserve_init", "nan"]),
    (dict(reserve_min=-0.1), ["scheduler.reserve_min", "-0.1"]),
    (dict(reserve_init=0.1, reserve_min=0.5), ["reserve_init=0.1", "reserve_min=0.5", ">="]),
    (dict(reserve_decay=INF), ["scheduler.reserve_decay", "inf"]),
    (dict(reserve_decay=-0.001), ["scheduler.reserve_decay", "-0.001", ">= 0"]),
    (dict(max_running=0), ["scheduler.max_running", "0"]),
    (dict(prefill_tokens_per_step=2.5), ["scheduler.prefill_tokens_per_step", "2.5"]),
])
def test_a_bad_scheduler_number_is_refused_and_named(changes, words):
    with pytest.raises(ValueError) as info:
        SchedulerConfig(**changes)
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, (missing, str(info.value))


def test_with_validates_its_changes_too():
    with pytest.raises(ValueError, match="reserve_decay"):
        RunConfig().with_(reserve_decay=-1.0)


@pytest.mark.parametrize(("changes", "words"), [
    (dict(layout="end_end", static_ratio=0.5), ["static_ratio=0.5", "fixed_ratio", "end_end"]),
    (dict(layout="oracle", static_ratio=0.5), ["static_ratio", "oracle"]),
    (dict(layout="fixed_ratio", compaction="eager"), ["compaction='eager'", "fixed_ratio", "no effect"]),
    (dict(layout="oracle", compaction="eager"), ["compaction='eager'", "oracle"]),
])
def test_an_option_that_does_not_apply_to_the_layout_is_refused(changes, words):
    with pytest.raises(ValueError) as info:
        RunConfig(**changes)
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, (missing, str(info.value))


@pytest.mark.parametrize("changes", [
    dict(), dict(layout="fixed_ratio", static_ratio=0.5), dict(layout="end_float_end", compaction="eager"),
    dict(trace_end_s=None, trace_start_s=-10.0), dict(seed=0, check_every=0), dict(rate_rps=2.0, spread_s=3.0),
])
def test_valid_configs_are_accepted(changes):
    assert RunConfig(**changes).as_dict()["layout"] == changes.get("layout", "end_end")


def test_eager_has_no_effect_on_fixed_split_and_oracle_pools():
    """Why eager is refused there: the pool they build ignores the mode."""
    from unikv.sim.layouts import build_layout
    from unikv.sim.models import load_model

    model = load_model("gpt-oss-20b")
    for kind in ("fixed_ratio", "sglang", "oracle", "vllm"):
        plan = build_layout(model, kv_budget_gib=1, page_size=16, kind=kind)
        lazy, eager = plan.make_pool(compaction="lazy"), plan.make_pool(compaction="eager")
        assert type(lazy) is type(eager) and eager.compaction == lazy.compaction

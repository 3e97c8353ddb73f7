"""Every bundled model replays on every layout that applies to it, accounting checked each step."""

import pandas as pd
import pytest
from unikv.sim.config import RunConfig
from unikv.sim.layouts import applicable_kinds
from unikv.sim.models import list_models, load_model
from unikv.sim.run import run

# A short slice: 20 requests of azure_conv, each clipped to 192 tokens, arriving 20x faster
# so that they overlap; a budget every bundled model's longest request fits.
SLICE = dict(trace="azure_conv", max_requests=20, max_context_tokens=192, rate_scale=20.0,
             kv_budget_gib=2.0, check_every=1, oversize="error")
CASES = [(m, kind) for m in list_models() for kind in applicable_kinds(load_model(m))]


@pytest.mark.parametrize("model, layout", CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_replays_with_the_accounting_check_on(model, layout):
    # Nemotron-H-56B's state slot is 0.9 GB (fp32 SSM, as its config leaves it to
    # NemotronHConfig's default) and SGLang holds 5 per running request, so its state pool
    # needs a larger budget to start at all; elsewhere 4 slots' worth lets every layout start.
    state_gib = load_model(model).state_bytes / (1 << 30)
    budget = 16.0 if layout == "sglang" else max(SLICE["kv_budget_gib"], 4 * state_gib)
    result = run(RunConfig(model=model, layout=layout, **{**SLICE, "kv_budget_gib": budget}))
    assert result.violations == []
    assert result.summary["finished"] == SLICE["max_requests"]


WINDOW_ONLY = [(m, kind) for m, kind in CASES  # sglang stores Mistral's window layers in full
               if load_model(m).swa_layers and not load_model(m).full_layers and kind != "sglang"]


@pytest.mark.parametrize("model, layout", WINDOW_ONLY, ids=[f"{m}-{k}" for m, k in WINDOW_ONLY])
def test_window_only_models_replay_requests_longer_than_the_window(model, layout):
    window = load_model(model).window_tokens
    trace = pd.DataFrame({"arrival_s": [0.05 * i for i in range(12)],
                          "prompt_tokens": [window - 96 + 37 * i for i in range(12)],
                          "output_tokens": [24] * 12})
    config = RunConfig(model=model, layout=layout, kv_budget_gib=2.0, check_every=1)
    result = run(config, trace_df=trace)
    assert result.violations == [] and result.summary["finished"] == 12

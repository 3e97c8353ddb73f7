"""The KV-cache dtype as a run option: validated, applied to the model, recorded in the identity."""

import pytest
from unikv.sim.config import RunConfig
from unikv.sim.models import load_model
from unikv.sim.run import run

SMALL = dict(trace="azure_conv", max_requests=6, max_context_tokens=64, model="qwen3-next-80b-a3b",
             kv_budget_gib=1.0, check_every=1)


def test_fp8_kv_cache_runs_and_is_recorded():
    assert load_model(SMALL["model"], kv_cache_dtype="fp8_e4m3").full_token_bytes * 2 == \
        load_model(SMALL["model"]).full_token_bytes
    bf16, fp8 = run(RunConfig(**SMALL)), run(RunConfig(**SMALL, kv_cache_dtype="fp8_e4m3"))
    assert bf16.identity["dtypes"] == {"kv_cache": "bf16", "conv_state": "bf16", "ssm_state": "bf16"}
    assert fp8.identity["dtypes"]["kv_cache"] == "fp8_e4m3" and fp8.violations == []
    assert RunConfig(**SMALL, kv_cache_dtype="fp8_e5m2").as_dict()["kv_cache_dtype"] == "fp8_e5m2"


@pytest.mark.parametrize("bad", ["fp4", "int8", None])
def test_bad_kv_cache_dtype_is_refused_at_construction(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        RunConfig(kv_cache_dtype=bad)

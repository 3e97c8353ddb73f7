"""Tests for traces.synthetic: seeded arrivals and length distributions."""

from __future__ import annotations

import numpy as np
import pytest
from unikv.traces import (
    EmpiricalLengths,
    FixedLengths,
    LognormalLengths,
    TraceFormatError,
    gamma_arrivals,
    load_sample,
    poisson_arrivals,
    synthetic_trace,
    validate,
)


def _cv(t: np.ndarray) -> float:
    gaps = np.diff(t)
    return float(gaps.std() / gaps.mean())


def test_poisson_rate_and_reproducibility():
    t = poisson_arrivals(20_000, rate_rps=4.0, rng=1)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert len(t) / t[-1] == pytest.approx(4.0, rel=0.03)
    assert _cv(t) == pytest.approx(1.0, rel=0.05)
    assert np.array_equal(t, poisson_arrivals(20_000, rate_rps=4.0, rng=np.random.default_rng(1)))


@pytest.mark.parametrize("cv", [0.0, 0.5, 3.0])
def test_gamma_hits_rate_and_cv(cv):
    t = gamma_arrivals(40_000, rate_rps=2.0, cv=cv, rng=7)
    assert len(t) / t[-1] == pytest.approx(2.0, rel=0.05)
    assert _cv(t) == pytest.approx(cv, abs=0.15 * max(cv, 0.1))


def test_arrival_argument_errors():
    with pytest.raises(TraceFormatError, match="rate_rps"):
        poisson_arrivals(3, rate_rps=0, rng=0)
    with pytest.raises(TraceFormatError, match="cv"):
        gamma_arrivals(3, rate_rps=1, cv=-1, rng=0)
    assert gamma_arrivals(0, rate_rps=1, cv=1, rng=0).size == 0


def test_lognormal_mean_cv_and_fit_round_trip():
    dist = LognormalLengths(prompt_mean_tokens=1000, prompt_cv=1.0, output_mean_tokens=200, output_cv=0.5)
    p, o = dist.sample(50_000, 3)
    assert p.dtype == np.int64 and p.min() >= 1
    assert p.mean() == pytest.approx(1000, rel=0.05) and o.mean() == pytest.approx(200, rel=0.05)
    assert p.std() / p.mean() == pytest.approx(1.0, rel=0.1)
    df = synthetic_trace(20_000, rate_rps=1.0, lengths=dist, seed=2)
    fitted = LognormalLengths.fit(df)
    assert fitted.prompt_mean_tokens == pytest.approx(1000, rel=0.05)
    assert fitted.output_cv == pytest.approx(0.5, rel=0.1)


def test_lognormal_caps_and_validation():
    capped = LognormalLengths(
        prompt_mean_tokens=1000, prompt_cv=2, output_mean_tokens=9, output_cv=1, max_prompt_tokens=50
    )
    assert capped.sample(1000, 0)[0].max() <= 50
    with pytest.raises(TraceFormatError, match="prompt_cv"):
        LognormalLengths(prompt_mean_tokens=1, prompt_cv=0, output_mean_tokens=1, output_cv=1)


def test_empirical_resamples_observed_pairs():
    df = load_sample("azure_conv")
    dist = EmpiricalLengths.fit(df)
    p, o = dist.sample(500, 4)
    pairs = set(zip(df["prompt_tokens"], df["output_tokens"], strict=True))
    assert all((a, b) in pairs for a, b in zip(p, o, strict=True))
    assert np.array_equal(p, dist.sample(500, 4)[0])
    with pytest.raises(TraceFormatError):
        EmpiricalLengths(prompt_tokens=np.array([1, 0]), output_tokens=np.array([1, 1]))


def test_synthetic_trace_is_valid_and_reproducible():
    a = synthetic_trace(100, rate_rps=5.0, lengths=FixedLengths(prompt_tokens=7, output_tokens=3), cv=2.0, seed=9)
    b = synthetic_trace(100, rate_rps=5.0, lengths=FixedLengths(prompt_tokens=7, output_tokens=3), cv=2.0, seed=9)
    assert validate(a) == [] and a.equals(b)
    assert a.attrs["format"] == "synthetic" and "cv=2.0" in a.attrs["history"][0]
    assert set(a["prompt_tokens"]) == {7}

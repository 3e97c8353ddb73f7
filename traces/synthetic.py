"""Seeded synthetic traces: arrival processes and length distributions.

Everything random takes a ``numpy.random.Generator`` (or a seed), so the same
seed gives the same trace. Prefix-sharing workloads (system prompts,
multi-turn conversations) live in :mod:`traces.prefixes`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import pandas as pd
from unikv.traces.schema import OUTPUT, PROMPT, TraceFormatError, TraceMeta, make_frame

Seed = int | np.random.Generator


def as_rng(seed: Seed) -> np.random.Generator:
    """Return ``seed`` if it is a Generator, else ``numpy.random.default_rng(seed)``."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _check_rate(rate_rps: float) -> None:
    if not np.isfinite(rate_rps) or rate_rps <= 0:
        raise TraceFormatError(f"rate_rps={rate_rps}: expected a positive finite rate in requests/s")


def gamma_arrivals(n: int, *, rate_rps: float, cv: float, rng: Seed) -> np.ndarray:
    """Arrival times whose gaps are gamma-distributed (bursty for ``cv > 1``).

    Args:
        n: number of arrivals (>= 0).
        rate_rps: mean rate in requests per second (mean gap ``1/rate_rps``).
        cv: coefficient of variation of the gaps (std / mean); 1 is Poisson,
            0 is evenly spaced, > 1 is burstier than Poisson.
        rng: generator or seed.

    Returns:
        ``n`` non-decreasing times in seconds, the first at 0.0.

    Raises:
        TraceFormatError: for a negative ``n`` or ``cv``, or a bad rate.
    """
    _check_rate(rate_rps)
    if n < 0 or not np.isfinite(cv) or cv < 0:
        raise TraceFormatError(f"gamma_arrivals(n={n}, cv={cv}): expected n >= 0 and finite cv >= 0")
    if n == 0:
        return np.zeros(0)
    if cv == 0:
        gaps = np.full(n - 1, 1.0 / rate_rps)
    else:
        shape = 1.0 / cv**2
        gaps = as_rng(rng).gamma(shape, 1.0 / (rate_rps * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def poisson_arrivals(n: int, *, rate_rps: float, rng: Seed) -> np.ndarray:
    """Poisson arrival times (exponential gaps, mean ``1/rate_rps`` s), the first at 0.0.

    See :func:`gamma_arrivals` (this is ``cv=1``).
    """
    return gamma_arrivals(n, rate_rps=rate_rps, cv=1.0, rng=rng)


class LengthSampler(Protocol):
    """Draws (prompt_tokens, output_tokens) pairs."""

    def sample(self, n: int, rng: Seed) -> tuple[np.ndarray, np.ndarray]:
        """Return two int64 arrays of ``n`` lengths in tokens, each >= 1."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class FixedLengths:
    """Every request has the same lengths (tokens)."""

    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise TraceFormatError(f"FixedLengths{self.prompt_tokens, self.output_tokens}: expected both >= 1")

    def sample(self, n: int, rng: Seed) -> tuple[np.ndarray, np.ndarray]:
        """Return ``n`` copies of the fixed lengths."""
        return np.full(n, self.prompt_tokens, dtype=np.int64), np.full(n, self.output_tokens, dtype=np.int64)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LognormalLengths:
    """Independent lognormal prompt and output lengths.

    Attributes:
        prompt_mean_tokens: mean prompt length in tokens (> 0).
        prompt_cv: coefficient of variation of the prompt length (> 0).
        output_mean_tokens: mean output length in tokens (> 0).
        output_cv: coefficient of variation of the output length (> 0).
        max_prompt_tokens: clip prompts to this many tokens (None: no clip).
        max_output_tokens: clip outputs to this many tokens (None: no clip).
    """

    prompt_mean_tokens: float
    prompt_cv: float
    output_mean_tokens: float
    output_cv: float
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_mean_tokens", "prompt_cv", "output_mean_tokens", "output_cv"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0:
                raise TraceFormatError(f"LognormalLengths.{name}={value}: expected a positive finite number")

    @classmethod
    def fit(cls, df: pd.DataFrame, **clip: int | None) -> LognormalLengths:
        """Fit by maximum likelihood on log lengths of a trace frame.

        Args:
            df: a trace frame with at least two rows.
            **clip: ``max_prompt_tokens`` / ``max_output_tokens`` to store.
        """
        if len(df) < 2:
            raise TraceFormatError(f"LognormalLengths.fit: need >= 2 rows, got {len(df)}")
        (pm, pc), (om, oc) = (_lognormal_moments(df[c].to_numpy()) for c in (PROMPT, OUTPUT))
        return cls(prompt_mean_tokens=pm, prompt_cv=pc, output_mean_tokens=om, output_cv=oc, **clip)

    def sample(self, n: int, rng: Seed) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` pairs, rounded to ints, clipped to ``[1, max]``."""
        rng = as_rng(rng)
        prompt = _lognormal(rng, n, self.prompt_mean_tokens, self.prompt_cv, self.max_prompt_tokens)
        output = _lognormal(rng, n, self.output_mean_tokens, self.output_cv, self.max_output_tokens)
        return prompt, output


def _lognormal_moments(values: np.ndarray) -> tuple[float, float]:
    """Mean and CV of the lognormal whose log has the sample's mean and std."""
    logs = np.log(values.astype(np.float64))
    mu, sigma = float(logs.mean()), max(float(logs.std()), 1e-6)
    return float(np.exp(mu + sigma**2 / 2)), float(np.sqrt(np.expm1(sigma**2)))


def _lognormal(rng: np.random.Generator, n: int, mean: float, cv: float, cap: int | None) -> np.ndarray:
    sigma2 = np.log1p(cv**2)
    draws = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
    return np.clip(np.rint(draws), 1, cap if cap is not None else None).astype(np.int64)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class EmpiricalLengths:
    """Resample (prompt, output) pairs of a real trace, keeping their correlation.

    Attributes:
        prompt_tokens: observed prompt lengths (tokens, >= 1).
        output_tokens: observed output lengths, paired with ``prompt_tokens``.
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        p, o = np.asarray(self.prompt_tokens, np.int64), np.asarray(self.output_tokens, np.int64)
        if p.shape != o.shape or p.ndim != 1 or p.size == 0:
            raise TraceFormatError(f"EmpiricalLengths: need two equal, non-empty 1-D arrays; got {p.shape}, {o.shape}")
        if (p < 1).any() or (o < 1).any():
            raise TraceFormatError("EmpiricalLengths: every length must be >= 1 token")
        object.__setattr__(self, "prompt_tokens", p)
        object.__setattr__(self, "output_tokens", o)

    @classmethod
    def fit(cls, df: pd.DataFrame) -> EmpiricalLengths:
        """Take the pairs of a loaded trace frame."""
        return cls(prompt_tokens=df[PROMPT].to_numpy(), output_tokens=df[OUTPUT].to_numpy())

    def sample(self, n: int, rng: Seed) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` pairs uniformly with replacement."""
        pick = as_rng(rng).integers(0, len(self.prompt_tokens), size=n)
        return self.prompt_tokens[pick], self.output_tokens[pick]


def synthetic_trace(
    n: int, *, rate_rps: float, lengths: LengthSampler, cv: float = 1.0, seed: Seed = 0
) -> pd.DataFrame:
    """A trace of ``n`` requests with gamma arrivals and sampled lengths.

    Args:
        n: number of requests.
        rate_rps: mean arrival rate in requests per second.
        lengths: the length distribution (e.g. ``EmpiricalLengths.fit(df)``).
        cv: gap coefficient of variation (1 = Poisson, > 1 bursty).
        seed: seed or generator; arrivals are drawn before lengths.

    Returns:
        A schema frame without ``prefix_hashes``, first arrival at 0 s.
    """
    rng = as_rng(seed)
    arrival = gamma_arrivals(n, rate_rps=rate_rps, cv=cv, rng=rng)
    prompt, output = lengths.sample(n, rng)
    label = seed if isinstance(seed, int) else "generator"
    meta = TraceMeta(
        source=f"synthetic:{type(lengths).__name__}", format="synthetic", rows_read=n,
        history=(f"synthetic_trace(n={n}, rate_rps={rate_rps}, cv={cv}, seed={label})",),
    )
    return make_frame(arrival, prompt, output, meta=meta)

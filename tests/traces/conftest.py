"""Shared fixtures for the traces tests: tiny files in every format, written to tmp_path."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest

# /work/main/tests/traces/conftest.py -> parents[3] == /work; shared/ sits beside the repo.
SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"

AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.009930+00:00,1000,20
2024-05-10 00:00:01.509930+00:00,2000,30
"""
MOONCAKE = (
    '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
    '{"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}\n'
    '{"timestamp": 3000, "input_length": 512, "output_length": 9, "hash_ids": [3]}\n'
)
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
110.5,GPT-4,417,505,922,API log
"""
LENGTHS = """num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
74,918,992,0.0806100217864923
290,905,1195,0.3204419889502762
1402,711,2113,1.9718706047819967
"""
VIDUR = """arrived_at,num_prefill_tokens,num_decode_tokens
0.0,374,44
4.314579,396,109
4.541877,879,55
"""
SAMPLES = {
    "azure_2023": AZURE_2023, "azure_2024": AZURE_2024, "mooncake": MOONCAKE,
    "burstgpt": BURSTGPT, "lengths": LENGTHS, "vidur": VIDUR,
}


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    """Factory: write(text, name="t.csv", gz=False) -> path of the new file."""

    def _write(text: str, name: str = "t.csv", *, gz: bool = False) -> Path:
        path = tmp_path / name
        data = text.encode("utf-8")
        path.write_bytes(gzip.compress(data) if gz else data)
        return path

    return _write


@pytest.fixture
def texts() -> dict[str, str]:
    """Format name -> a tiny valid file body in that format."""
    return dict(SAMPLES)


@pytest.fixture
def shared_dir() -> Path:
    """The full real traces beside the repository; skips the test when absent."""
    if not (SHARED_TRACES / "manifest.json").is_file():
        pytest.skip(f"real traces not present at {SHARED_TRACES}")
    return SHARED_TRACES

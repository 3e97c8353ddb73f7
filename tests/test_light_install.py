"""The light base install: the library, the sim backend, the simulator and the
trace library run without torch, and never import it.

Each check runs in a fresh interpreter (this process has imported torch).
"Blocked" makes torch unimportable (`sys.modules["torch"] = None`, what a
venv without torch looks like); "unblocked" leaves torch importable and
checks that nothing imports it anyway (a fallback that tries torch first
would pass the blocked check only).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCK = 'import sys; sys.modules["torch"] = None\n'

POOL_AND_REPLAY = '''
import sys
import numpy as np
import unikv, unikv.sim, unikv.traces
from unikv import Band, Layout, OraclePool, StaticPartitionPool, UnifiedPool
from unikv.backends import SimBackend

layout = Layout(total_bytes=200_000, bands=[
    Band("mamba", entry_bytes=1000, grow="up", unit="request"),
    Band("swa", entry_bytes=100, grow="float", page_size=4),
    Band("full", entry_bytes=200, grow="down", page_size=4),
])
for compaction in ("lazy", "eager"):
    p = UnifiedPool(layout, SimBackend(materialize=True), compaction=compaction)
    v = p.alloc(64)
    s = p.alloc_state("mamba", 3)
    assert type(v) is np.ndarray and type(s) is np.ndarray
    view = p.buffer_view("full")
    assert type(view) is np.ndarray and view.dtype == np.uint8
    keep = v[32:]
    rows = np.arange(len(keep) * 200, dtype=np.int64).reshape(len(keep), 200) % 251
    view[p.translate(keep, "full")] = rows
    p.release(list(range(32, 40)), "swa")  # a list: no tensor anywhere
    p.free(v[:32])
    p.free_state("mamba", s[:1])
    p.flush(urgent=True)
    assert np.array_equal(view[p.translate(keep, "full")], rows), compaction
    assert p.stats()["moves"] > 0, compaction  # the check read moved pages
    assert p.verify() == [], p.verify()
    assert type(p.page_table("full")) is np.ndarray
for cls in (StaticPartitionPool, OraclePool):
    q = cls(layout)
    w = q.alloc(16)
    assert type(q.translate(w, "swa")) is np.ndarray
    q.free(w)
    assert q.verify() == []

from unikv.sim.config import RunConfig
from unikv.sim.run import run
result = run(RunConfig(trace_end_s=30))
assert result.violations == [], result.violations
assert len(result.requests) > 0 and len(result.steps) > 0
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton") and sys.modules[m] is not None)
assert loaded == [], loaded
print("ok")
'''


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter run from `tmp_path`, importing this
    checkout (its root first on the path)."""
    prelude = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("blocked", [True, False], ids=["torch-blocked", "torch-unused"])
def test_pool_sim_backend_and_replay_run_without_torch(blocked, tmp_path):
    out = _python((BLOCK if blocked else "") + textwrap.dedent(POOL_AND_REPLAY), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_torch_ids_without_torch_name_the_extra(tmp_path):
    code = BLOCK + textwrap.dedent('''
        from unikv import Band, Layout, OraclePool, UnifiedPool
        layout = Layout(total_bytes=10_000, bands=[Band("full", entry_bytes=100, grow="up")])
        for make in (lambda: UnifiedPool(layout, ids="torch"), lambda: OraclePool(layout, ids="torch")):
            try:
                make()
            except ImportError as exc:
                print(exc)
            else:
                raise SystemExit("ids='torch' without torch built a pool")
    ''')
    out = _python(code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "pip install 'unikv[torch]'" in line and "ids='numpy'" in line, line


def test_cuda_backend_without_torch_fails_at_import_only(tmp_path):
    """`unikv.backends` imports without torch; asking for the CUDA backend
    is what needs it."""
    code = BLOCK + textwrap.dedent('''
        import unikv.backends
        try:
            unikv.backends.CudaBackend
        except ImportError as exc:
            print(exc)
    ''')
    out = _python(code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pip install 'unikv[cuda]'" in out.stdout

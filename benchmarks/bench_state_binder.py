"""Cost of holding Mamba-2 state in the pool: `StateBinder.before` (gather the
batch's slots into a transformers cache) and `after` (scatter it back) per
decode step, for real Nemotron-H state shapes, against one plain copy of the
same bytes on the same device (the floor a gather or a scatter cannot beat).

The model is built on the meta device (no weights), so only the state's
shapes matter: one request's state is `S` bytes (conv in bf16, SSM in fp32),
and a steady step moves the batch's `B * S` bytes twice (gather, scatter),
each a read and a write: 4 * B * S bytes of memory traffic.

    PYTHONPATH=. python benchmarks/bench_state_binder.py --device cuda \\
        --config tests/data/configs/nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json --batch 1 8 64
    PYTHONPATH=. python benchmarks/bench_state_binder.py --device cpu --batch 1 4
"""

from __future__ import annotations

import argparse
import json
import time

import torch

NANO = "tests/data/configs/nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json"


def build_binder(config: str, device: str, batch: int):
    """A pool on `device` with `batch` live state slots, its views and binder."""
    import transformers
    from unikv.sim.real.state import StateBinder, layer_states, state_bytes

    from unikv import Band, Layout, UnifiedPool
    from unikv.backends import CudaBackend, SimBackend
    from unikv.tensors import StateViews

    with open(config) as f:
        raw = json.load(f)
    raw.pop("auto_map", None)
    cfg = transformers.NemotronHConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.NemotronHForCausalLM(cfg).to(torch.bfloat16)
    states = layer_states(model)
    size = state_bytes(states)
    layout = Layout(total_bytes=size * (batch + 2), bands=[
        Band("mamba", entry_bytes=size, grow="up", unit="request")])
    backend = SimBackend(materialize=True) if device == "cpu" else CudaBackend(device)
    pool = UnifiedPool(layout, backend)
    views = StateViews(pool, states)
    if device != "cpu":
        pool.buffer.zero_()  # CudaBackend's buffer is uninitialised
    slots = torch.as_tensor(pool.translate(pool.alloc_state("mamba", batch), "mamba"))
    return StateBinder(model, views), slots, size


def timed(fn, device: str, repeats: int) -> float:
    """Mean seconds of `fn()` over `repeats` calls, after one warm-up call."""
    fn()
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def measure(config: str, device: str, batch: int, repeats: int) -> dict:
    binder, slots, size = build_binder(config, device, batch)
    box = {}

    def step():
        box["cache"] = binder.before(slots)
        binder.after(box["cache"], slots)

    total = timed(step, device, repeats)
    gather = timed(lambda: binder.before(slots), device, repeats)
    src = torch.ones(size * batch, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), device, repeats)
    return {"config": config.rsplit("/", 1)[-1], "device": device, "batch": batch, "state_bytes": size,
            "step_ms": total * 1e3, "gather_ms": gather * 1e3, "per_request_us": total / batch * 1e6,
            "copy_ms": copy * 1e3, "step_over_copy": total / copy,
            "traffic_GBps": 4 * size * batch / total / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=NANO)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core: comparable on a shared machine
    for b in args.batch:
        print(json.dumps(measure(args.config, args.device, b, args.repeats)))


if __name__ == "__main__":
    main()

"""One Mamba-2 layer's chunked scan (SSD) on the GPU: unikv's Triton kernels
against their einsum reference and transformers' own `mamba2_chunk_scan`.

The shapes are a bundled model's mixer (default Nemotron-3-Nano-30B-A3B:
64 heads of 64, 8 groups, state 128, chunks of 128 tokens), bf16 inputs
as the mixer hands them over (strided views of one projection), one
sequence of each `--tokens` with and without an initial state. Each
variant is timed with CUDA events over `--reps` calls after 3 warm-ups
(median); the kernels' result is checked against the reference's first.
The bytes the kernels must move (inputs read once, fp32 output and state
written) over the time give an effective bandwidth, against about 4.3 TB/s
for a device-to-device copy on the H200.

    python benchmarks/bench_ssd.py --out results/real/h200/ssd.csv

Prints one line per (tokens, initial, variant); writes them as CSV.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

VARIANTS = ("kernels", "einsum", "transformers")


def mixer_shape(model: str) -> tuple[int, int, int, int, int]:
    """(heads, head dim, groups, state, chunk) of a bundled model's Mamba-2 mixer."""
    import json

    from profile_coverage import config_file  # this folder

    path = config_file(model)
    if path is None:
        raise ValueError(f"--model {model!r}: unknown model (no bundled config.json)")
    cfg = json.loads(Path(path).read_text())
    cfg = cfg.get("text_config", cfg)
    try:
        return (int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"]), int(cfg["n_groups"]),
                int(cfg["ssm_state_size"]), int(cfg["chunk_size"]))
    except KeyError as exc:
        raise ValueError(f"--model {model!r}: its config has no Mamba-2 mixer field {exc}") from None


def variants(x, dt, A, B, C, chunk: int, kw: dict) -> dict:
    """Each variant's call on these inputs (VARIANTS)."""
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    from unikv.kernels import ssd

    return {
        "kernels": lambda: ssd.chunk_scan(x, dt, A, B, C, chunk, triton=True, **kw),
        "einsum": lambda: ssd.chunk_scan(x, dt, A, B, C, chunk, triton=False, **kw),
        "transformers": lambda: mamba2_chunk_scan(x, dt, A, B, C, chunk_size=chunk, z=None, return_final_states=True,
                                                  **kw),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-3-nano-30b-a3b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 4096, 8192])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: bench_ssd.py times CUDA kernels; no CUDA device here", file=sys.stderr)
        return 2
    if any(t < 1 for t in args.tokens) or args.reps < 1:
        print(f"error: --tokens {args.tokens} and --reps {args.reps} must be positive", file=sys.stderr)
        return 2
    try:
        h, p, g, n, cs = mixer_shape(args.model)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []
    for tokens in args.tokens:
        gen = torch.Generator(device=dev).manual_seed(tokens)
        proj = torch.randn(1, tokens, h * p + 2 * g * n + h, generator=gen, device=dev).bfloat16()
        x, B, C, dt = proj.split([h * p, g * n, g * n, h], dim=-1)
        x, B, C = x.view(1, tokens, h, p), B.view(1, tokens, g, n), C.view(1, tokens, g, n)
        A = -torch.rand(h, device=dev, generator=gen) * 8
        D, bias = torch.randn(h, device=dev, generator=gen), torch.randn(h, device=dev, generator=gen) - 4
        for initial in (False, True):
            init = torch.randn(1, h, p, n, device=dev, generator=gen) if initial else None
            kw = dict(D=D, dt_bias=bias, initial_states=init, dt_softplus=True, dt_limit=(0.0, float("inf")))
            calls = variants(x, dt, A, B, C, cs, kw)
            y, final = calls["kernels"]()
            ref, ref_final = calls["einsum"]()
            err = max(float((y - ref).abs().max() / ref.abs().max()),
                      float((final - ref_final).abs().max() / ref_final.abs().max()))
            moved = (x.numel() + 2 * B.numel() + dt.numel()) * 2 + (y.numel() + final.numel()) * 4
            if init is not None:
                moved += init.numel() * 4
            for name in args.variants:
                for _ in range(3):
                    calls[name]()
                times = []
                for _ in range(args.reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    calls[name]()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b))
                ms = statistics.median(times)
                row = {"model": args.model, "tokens": tokens, "initial": initial, "variant": name,
                       "ms": round(ms, 4), "tb_per_s": round(moved / ms / 1e9, 3),
                       "kernels_vs_einsum_rel_err": f"{err:.2e}"}
                rows.append(row)
                print(f"{tokens:>6} tokens {'initial' if initial else 'zero   '} {name:<12} {ms:9.3f} ms  "
                      f"{row['tb_per_s']:6.3f} TB/s effective  (kernels vs einsum: {err:.1e} rel.)", flush=True)
            torch.cuda.empty_cache()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

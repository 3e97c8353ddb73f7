"""The decode step's matmuls alone on a GPU: what a dense model's weight
reads cost at small batch, with the projections as transformers keeps them
against fused ones (issue 16 item 6, the roofline target).

For a dense decoder config (hidden size, heads, KV heads, head dim,
intermediate size, layers, vocabulary), the script holds one weight per
projection per layer on the GPU (bf16, distinct tensors, so no layer reads
another's bytes from L2) and captures, in one CUDA graph, the matmuls of a
whole decode step at batch B:

- `unfused`: per layer q, k, v, o, gate, up, down (seven matmuls, as
  transformers' Llama / Gemma layers call them), then the head;
- `fused`: per layer qkv, o, gate_up, down (four matmuls, the weights
  concatenated as vLLM's `QKVParallelLinear` and
  `MergedColumnParallelLinear` hold them), then the head.

Reported per variant and batch (median of `--reps` replays, CUDA events):
the replay's milliseconds, the bytes of weights it reads, the achieved
bandwidth, and the time against the weight-read roofline at the H200's
4.8 TB/s. No norms, attention or activations run: the numbers bound from
below what a decode step built on these matmuls can reach.

    python benchmarks/bench_gemv.py --config benchmarks/configs/gemma-3-12b-text_config.json \
        --batch 1 64 --out results/real/h200/gemv.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

HBM = 4.8e12
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


def shapes(config: dict) -> dict:
    """Per-layer `(out, in)` shapes of the projections, and the head's.

    Raises ValueError naming the field a dense decoder config lacks, or the
    MoE field that makes it not dense."""
    text = config.get("text_config", config)
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if text.get(key):
            raise ValueError(f"config has {key}={text[key]}: bench_gemv times dense decoders only")
    missing = [k for k in REQUIRED if k not in text]
    if missing:
        raise ValueError(f"config lacks {missing[0]!r}, which a dense decoder's shapes need")
    h, heads = text["hidden_size"], text["num_attention_heads"]
    dim = text.get("head_dim") or h // heads
    kv = text.get("num_key_value_heads") or heads
    inter = text["intermediate_size"]
    return {"layers": text["num_hidden_layers"],
            "unfused": [(heads * dim, h), (kv * dim, h), (kv * dim, h), (h, heads * dim),
                        (inter, h), (inter, h), (h, inter)],
            "fused": [((heads + 2 * kv) * dim, h), (h, heads * dim), (2 * inter, h), (h, inter)],
            "head": (text["vocab_size"], h)}


def run(config: dict, batches: list[int], reps: int) -> list[dict]:
    import torch

    geo = shapes(config)
    rows = []
    for variant in ("unfused", "fused"):
        weights = [[torch.empty(s, dtype=torch.bfloat16, device="cuda").normal_() for s in geo[variant]]
                   for _ in range(geo["layers"])]
        head = torch.empty(geo["head"], dtype=torch.bfloat16, device="cuda").normal_()
        nbytes = sum(w.numel() * 2 for layer in weights for w in layer) + head.numel() * 2
        for b in batches:
            x = {n: torch.randn(b, n, dtype=torch.bfloat16, device="cuda")
                 for n in {s[1] for s in geo[variant]} | {geo["head"][1]}}

            def step(weights=weights, head=head, x=x):
                for layer in weights:
                    for w in layer:
                        torch.nn.functional.linear(x[w.shape[1]], w)
                torch.nn.functional.linear(x[head.shape[1]], head)

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graphs asks
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(reps):
                start.record()
                graph.replay()
                stop.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(stop) / 1e3)
            t = statistics.median(times)
            rows.append({"variant": variant, "batch": b, "matmuls": len(geo[variant]) * geo["layers"] + 1,
                         "ms": 1e3 * t, "weight_gb": nbytes / 1e9, "tb_s": nbytes / t / 1e12,
                         "x_roofline": t / (nbytes / HBM)})
            print(rows[-1], flush=True)
            del graph
        del weights, head
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True, help="a dense decoder's config.json")
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        config = json.loads(args.config.read_text())
        shapes(config)
    except (OSError, ValueError) as exc:
        print(f"error: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    if bad := [b for b in args.batch if b < 1]:
        print(f"error: --batch {bad[0]}: batch sizes are >= 1", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: bench_gemv needs a CUDA device", file=sys.stderr)
        return 2
    rows = run(config, args.batch, args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

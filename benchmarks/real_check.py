"""Real-size check of the real executor on a GPU: greedy decoding through the
pool against transformers' own forward, in bf16 (issue 16 item 5).

For each model, a 16-request trace (prompts of 64-1,500 tokens, outputs of
8-40, arrivals over time, shared prefix blocks) is replayed through the real
scheduler with the real executor (`sim.run.run`, `executor="real"`,
`real_clock="cost"`, so the steps are those of a cost-model replay), under a
KV budget tight enough that pages move and requests are retracted. The logits
of every sampled row are kept. Then, per request, transformers' own forward
(SDPA attention, no pool) runs once over the prompt and the pool's tokens
(teacher forcing), and the script reports:

- the largest absolute logit difference at the sampled positions (pool vs
  transformers), and the logit scale (max |logit|) beside it;
- token agreement: positions where transformers' greedy choice differs from
  the pool's, split into near ties (transformers' top-1 / top-2 margin
  below 2x the largest logit difference seen for that request) and real
  disagreements (a margin above that: a bug);
- transformers' own greedy generation with its `DynamicCache`, free
  running, compared token for token until the first near tie.

It also reports the moves, relocations and retractions the pool made. Needs
CUDA; writes `real_check.json` and `real_check.md` under --out.

    python benchmarks/real_check.py --out results/real/h200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # name -> (config, KV budget GiB, compaction, decode graphs)
    # budgets found by replaying this trace with the cost executor (the same steps: real_clock="cost")
    # so that requests are retracted after their first token too (6 for llama, 18 for gemma)
    "llama-3.1-8b": (ROOT / "tests/data/configs/meta-llama--Meta-Llama-3.1-8B_config.json", 0.63, "eager", False),
    "gemma-3-12b": (ROOT / "benchmarks/configs/gemma-3-12b-text_config.json", 1.0, "lazy", False),
    "gpt-oss-20b": (ROOT / "tests/data/configs/openai--gpt-oss-20b_config.json", 0.35, "lazy", False),
}
N = 16
SCALE = 1  # prompts divided by this (--smoke: a CPU run of a trimmed config)
DEVICE, DTYPE = "cuda", "bf16"


def trace():
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 0.5, N)),
                       "prompt_tokens": rng.integers(64, 1500, N) // SCALE,
                       "output_tokens": rng.integers(8, 40, N),
                       "prefix_hashes": [[7, 8] if i % 3 == 0 else [] for i in range(N)]})
    df.attrs["block_tokens"] = 16
    return df


def replay(name: str, config_path: Path, budget: float, compaction: str, graphs: bool):
    """Run the trace; returns (result, executor, logits per rid, retractions seen)."""
    from unikv.sim.config import RunConfig, SchedulerConfig
    from unikv.sim.memory import Memory
    from unikv.sim.real import executor as real_executor
    from unikv.sim.run import run

    built, logits, retracted = {}, {}, []
    build = real_executor.build_real_executor

    def building(*a, **k):
        ex = build(*a, **k)
        stash = {}
        ex.model.register_forward_hook(lambda m, args, out: stash.__setitem__("logits", out.logits))
        forward = ex._forward

        def recording(batch):
            picks = forward(batch)
            out = stash["logits"]
            rows = out[0] if batch.layout == "packed" else out[:, -1]
            for r, row in zip(batch.samplers, rows):
                logits.setdefault(r.rid, []).append(row.float())
            return picks

        ex._forward = recording
        built["ex"] = ex
        return ex

    real_executor.build_real_executor = building
    retract = Memory.retract

    def counting(self, req, now):
        retracted.append(req.generated)
        retract(self, req, now)

    Memory.retract = counting
    try:
        cfg = RunConfig(trace="real-check", model=str(config_path), kv_cache_dtype=DTYPE, executor="real",
                        real_clock="cost", device=DEVICE, decode_graphs=graphs, kv_budget_gib=budget,
                        page_size=16, layout="end_end", compaction=compaction, check_every=8,
                        scheduler=SchedulerConfig(max_running=16, prefill_tokens_per_step=2048,
                                                  reserve_init=0.0, reserve_min=0.0, reserve_decay=0.0))
        res = run(cfg, trace_df=trace())
    finally:
        real_executor.build_real_executor = build
        Memory.retract = retract
    return res, built["ex"], logits, retracted


def compare(ex, logits, requests) -> dict:
    """Per request: logit differences and token agreement against
    transformers' own forward (teacher forcing) and its DynamicCache greedy run."""
    import torch
    from unikv.sim.request import Request

    model = ex.model
    try:
        model.set_attn_implementation("sdpa")
    except ValueError:  # gpt-oss: transformers offers no SDPA path (its sinks); its eager attention then
        model.set_attn_implementation("eager")
    hashes = trace()["prefix_hashes"]
    rows = []
    with torch.inference_mode():
        for rid, prompt_n, out_n in zip(requests["rid"], requests["prompt_tokens"], requests["output_tokens"]):
            rid = int(rid)
            req = Request(rid, 0.0, int(prompt_n), int(out_n), tuple(hashes[rid]))
            prompt = list(ex.tokens.prompt(req))
            gen = ex.generated[rid]
            ids = torch.tensor([prompt + gen[:-1]], device=model.device)
            ref = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:].float()
            pool = torch.stack(logits[rid])
            diff = float((pool - ref).abs().max())
            top2 = ref.topk(2, dim=-1).values
            margin = top2[:, 0] - top2[:, 1]
            ref_tok = ref.argmax(-1).tolist()
            disagree = [i for i, (a, b) in enumerate(zip(ref_tok, gen)) if a != b]
            tie = 2 * diff
            real_bad = [i for i in disagree if float(margin[i]) > tie]
            free = greedy(model, prompt, len(gen))
            first = next((i for i, (a, b) in enumerate(zip(free, gen)) if a != b), None)
            rows.append({"rid": rid, "prompt": len(prompt), "generated": len(gen), "max_abs_logit_diff": diff,
                         "logit_scale": float(ref.abs().max()), "teacher_forced_disagreements": len(disagree),
                         "near_tie_disagreements": len(disagree) - len(real_bad),
                         "disagreements_above_tie": len(real_bad),
                         "free_running_equal_tokens": first if first is not None else len(gen),
                         "free_running_first_divergence_margin": None if first is None else float(margin[first])})
    return rows


def greedy(model, prompt, n):
    """transformers' greedy decoding with its own DynamicCache."""
    import inspect

    import torch
    from transformers import DynamicCache

    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kw = {key: DynamicCache(config=model.config), "use_cache": True}
    out = model(input_ids=torch.tensor([prompt], device=model.device), **kw)
    toks = []
    for _ in range(n):
        toks.append(int(out.logits[0, -1].argmax()))
        out = model(input_ids=torch.tensor([[toks[-1]]], device=model.device), **kw)
    return toks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--smoke", type=Path, default=None, metavar="CONFIG",
                    help="check the script on the CPU: fp32, this (small) config, prompts / 30")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                    help="model and KV dtype (fp32 doubles each budget: the same tokens fit)")
    args = ap.parse_args(argv)
    import torch

    global DTYPE
    if args.dtype == "fp32" and args.smoke is None:
        DTYPE = "fp32"
        for name, (path, budget, compaction, graphs) in list(MODELS.items()):
            MODELS[name] = (path, 2 * budget, compaction, graphs)

    if args.smoke is not None:
        global SCALE, DEVICE
        SCALE, DEVICE, DTYPE = 30, "cpu", "fp32"
        MODELS.clear()
        MODELS["smoke"] = (args.smoke.resolve(), 0.0003, "lazy", False)
        args.models = ["smoke"]
    elif not torch.cuda.is_available():
        print("error: real_check needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"dtype": DTYPE, "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "models": {}}
    for name in args.models:
        path, budget, compaction, graphs = MODELS[name]
        t0 = time.perf_counter()
        res, ex, logits, retracted = replay(name, path, budget, compaction, graphs)
        rows = compare(ex, logits, res.requests)
        steps = res.steps
        report["models"][name] = {
            "config": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path), "kv_budget_gib": budget, "compaction": compaction,
            "violations": len(res.violations), "moves": int(steps["moves"].iloc[-1]),
            "relocations": int(res.summary.get("relocations", 0) or 0),
            "retractions_mid_generation": sum(1 for g in retracted if g > 0), "retractions": len(retracted),
            "prefix_hit_tokens": int(res.requests["hit_tokens"].sum()), "steps": len(steps),
            "wall_s": round(time.perf_counter() - t0, 1), "requests": rows}
        del ex, logits
        torch.cuda.empty_cache()
        print(name, json.dumps({k: v for k, v in report["models"][name].items() if k != "requests"}), flush=True)
        for r in rows:
            print("  ", r, flush=True)
    (out / "real_check.json").write_text(json.dumps(report, indent=1))
    (out / "real_check.md").write_text(markdown(report))
    return 0


def markdown(report) -> str:
    lines = [f"# Real executor vs transformers, {DTYPE}, {report['device']} (torch {report['torch']})", "",
             "| model | moves | retractions (mid-gen) | requests | max abs logit diff | logit scale | "
             "teacher-forced disagreements (near ties / above tie) | free-running tokens equal |",
             "|---|---|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        rs = m["requests"]
        lines.append(
            f"| {name} | {m['moves']} | {m['retractions']} ({m['retractions_mid_generation']}) | {len(rs)} | "
            f"{max(r['max_abs_logit_diff'] for r in rs):.3g} | {max(r['logit_scale'] for r in rs):.3g} | "
            f"{sum(r['teacher_forced_disagreements'] for r in rs)} "
            f"({sum(r['near_tie_disagreements'] for r in rs)} / {sum(r['disagreements_above_tie'] for r in rs)}) | "
            f"{sum(r['free_running_equal_tokens'] for r in rs)} of {sum(r['generated'] for r in rs)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""`unikv models list` and `unikv models describe CONFIG_OR_NAME`: what a model costs.

`describe` prints a model's token kinds (bytes per token per layer and in
all), its state kinds (bytes per request), the band view the layouts use,
its dtypes, parameter counts and the layouts / baselines that apply to it
(`sim.layouts.applicable_kinds`); `--json` prints the same as one object.
Bad input exits 2 with one line "error: ..." on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from unikv.sim.layouts import applicable_kinds
from unikv.sim.model_spec import FP4_KV_CACHE_DTYPES, KV_CACHE_DTYPES, STATE_DTYPES, ModelSpec
from unikv.sim.models import list_models, load_model


def main(argv: Sequence[str]) -> int:
    """Run `unikv models ARGV`; returns the exit code (2: refused input)."""
    args = _parser().parse_args(list(argv))
    try:
        if args.command == "list":
            return _list(args.json)
        spec = load_model(args.model, state_dtype=args.state_dtype, kv_cache_dtype=args.kv_cache_dtype)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    report = describe(spec)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unikv models", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="the bundled models")
    listing.add_argument("--json", action="store_true", help="print JSON")
    desc = sub.add_parser("describe", help="bytes per token and per request of one model")
    desc.add_argument("model", help="a bundled model name or a config.json path")
    desc.add_argument("--kv-cache-dtype", default="bf16",
                      help=f"KV-cache dtype, one of {sorted(KV_CACHE_DTYPES) + list(FP4_KV_CACHE_DTYPES)} "
                           "(default bf16)")
    desc.add_argument("--state-dtype", default="bf16",
                      help=f"state dtypes where the config declares none, one of {list(STATE_DTYPES)}")
    desc.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _list(as_json: bool) -> int:
    rows = [describe(load_model(name)) for name in list_models()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        bands = ", ".join(f"{b} {v['bytes']:,} B/{v['per']}" for b, v in row["bands"].items())
        print(f"{row['name']:<28} {row['architecture'] or '?':<34} {bands}")
    return 0


def describe(spec: ModelSpec) -> dict[str, Any]:
    """A JSON-able description of `spec` (what `describe` prints)."""
    return {
        "name": spec.name, "architecture": spec.architecture, "model_type": spec.model_type,
        "token_kinds": [{"kind": k.name, "band": k.band, "layers": k.layers, "dtype": k.dtype,
                         "bytes_per_token_per_layer": k.bytes_per_token_per_layer,
                         "bytes_per_token": k.bytes_per_token, "window_tokens": k.window_tokens}
                        for k in spec.token_kinds],
        "state_kinds": [{"kind": s.name, "layers": s.layers, "conv_elems_per_layer": s.conv_elems,
                         "ssm_elems_per_layer": s.ssm_elems, "conv_dtype": s.conv_dtype,
                         "ssm_dtype": s.ssm_dtype, "bytes_per_layer": s.bytes_per_layer,
                         "bytes_per_request": s.bytes_per_request} for s in spec.state_kinds],
        "bands": _bands(spec),
        "meta_tokens": spec.meta_tokens,
        "dtypes": {"kv_cache": spec.kv_cache_dtype, "conv_state": spec.conv_state_dtype,
                   "ssm_state": spec.ssm_state_dtype},
        "params": {"total": spec.params_total, "active": spec.params_active,
                   "weight_bytes": spec.weight_bytes},
        "max_context_tokens": spec.max_context_tokens,
        "applicable_layouts": list(applicable_kinds(spec)),
    }


def _bands(spec: ModelSpec) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if spec.state_layers:
        out["mamba"] = {"layers": spec.state_layers, "bytes": spec.state_bytes, "per": "request"}
    if spec.swa_layers:
        out["swa"] = {"layers": spec.swa_layers, "bytes": spec.swa_token_bytes, "per": "token",
                      "window_tokens": spec.window_tokens, "chunked": spec.chunked}
    if spec.full_layers:
        out["full"] = {"layers": spec.full_layers, "bytes": spec.full_token_bytes, "per": "token"}
    return out


def render(report: dict[str, Any]) -> str:
    """The text form of a `describe` report."""
    arch = report["architecture"] or "architecture unknown"
    lines = [f"{report['name']}: {arch} (model_type {report['model_type'] or '?'})", "token kinds:"]
    for k in report["token_kinds"]:
        window = f", window {k['window_tokens']}" if k["window_tokens"] else ""
        lines.append(f"  {k['kind']:<15} {k['layers']:>3} layers x {k['bytes_per_token_per_layer']:,} B "
                     f"= {k['bytes_per_token']:,} B/token ({k['dtype']}, band {k['band']}{window})")
    lines += ["  (none)"] * (not report["token_kinds"]) + ["state kinds:"]
    for s in report["state_kinds"]:
        lines.append(f"  {s['kind']:<15} {s['layers']:>3} layers x (conv {s['conv_elems_per_layer']:,} "
                     f"{s['conv_dtype']} + ssm {s['ssm_elems_per_layer']:,} {s['ssm_dtype']}) "
                     f"= {s['bytes_per_request']:,} B/request")
    lines += ["  (none)"] * (not report["state_kinds"])
    bands = ", ".join(f"{b} {v['bytes']:,} B/{v['per']} ({v['layers']} layers)"
                      for b, v in report["bands"].items())
    params = report["params"]
    size = ", ".join(f"{params[k]:,} {k}" for k in ("total", "active") if params[k]) or \
        "unknown (no bundled count for this config)"
    dtypes = report["dtypes"]
    lines += [f"bands: {bands}", f"meta tokens: {report['meta_tokens']}" * bool(report["meta_tokens"]),
              f"dtypes: kv cache {dtypes['kv_cache']}, conv state {dtypes['conv_state']}, "
              f"ssm state {dtypes['ssm_state']}",
              f"parameters: {size}",
              "weights: " + (f"{params['weight_bytes']:,} B" if params["weight_bytes"] is not None
                             else "unknown (see the model's sources)"),
              "layouts and baselines that apply: "
              + (", ".join(report["applicable_layouts"]) or "none (no token band)")]
    return "\n".join(line for line in lines if line)

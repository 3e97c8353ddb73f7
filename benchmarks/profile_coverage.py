"""Which bundled models can be profiled on one GPU (issue 17 item 1), and why not.

For every model id of `sim/data/models.json` the script checks, in order,
what `benchmarks/profile_model.py` needs to measure a profile:

1. a config.json the real executor builds the model from (`config_file`:
   a GPU benchmark's config, else the bundled model's copy in
   `tests/data/configs`, `sim.real.model.config_path`);
2. the installed transformers builds its model_type as a causal LM
   (`sim.real.model.build_model`'s path, on the meta device: no memory);
3. the real executor supports its layers: the checks `build_real_executor`
   makes before it runs (`sim.real.layers.model_layers`: MLA and unknown
   layer types refused by name; recurrent layers only where a
   `StateBinder` binds them and the pool's state band has their bytes;
   the layout's token bands hold what the layers write);
4. its weights fit the GPU with room for the profile's pools: bf16 (the
   executor drops a `quantization_config` and builds random weights in
   bf16, so gpt-oss's MXFP4 checkpoint is measured as bf16) plus ROOM_GIB.

It prints one markdown row per model (and, with `--docs`, rewrites the
table between the markers in docs/cost_model.md), the transformers version
it ran under in the heading: the table is generated, never edited by hand.

    python benchmarks/profile_coverage.py --docs docs/cost_model.md
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bench_real_decode import CONFIGS  # the GPU benchmarks' own configs (this folder)

USABLE_GIB = {"h200": 139.0}
"""GPU memory a process can take, GiB: the H200's 141 GiB less what the
driver keeps (about 139 GiB on the lent H200s, /work/.library/device)."""
ROOM_GIB = 12.0 + 6.0
"""What a profile run needs beside the weights: the calibration replay's
12 GiB KV budget (`profile_model.CALIBRATION`) and the 6 GiB `pool_for`
leaves free for activations."""
BEGIN, END = "<!-- profile-coverage:begin -->", "<!-- profile-coverage:end -->"


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """Whether one model can be profiled on one GPU.

    Attributes:
        model: the bundled model id; model_type: its config's (or models.json's).
        config: the config.json the executor builds (None: none bundled).
        weights_gib: bf16 weights as the executor builds them (None: unknown);
            counted: from the built model (False: params.json's params_total).
        fits: weights + ROOM_GIB <= the GPU's usable memory (None: unknown).
        build_error / executor_error: why transformers cannot build it, or
            why the real executor cannot run it ("" when it can).
        profiled: the profile file of (model, gpu) is bundled.
        recurrent: a model with recurrent state: the real executor runs
            each prefill chunk as its own forward, padded to its token
            bucket and captured (`sim.real.padded_chunk`), and its decode
            through the decode graphs with the state gathered and scattered
            inside them; its profile says `"step_forwards": "per_chunk"`.
    """

    model: str
    model_type: str
    config: Path | None
    weights_gib: float | None
    counted: bool
    fits: bool | None
    build_error: str
    executor_error: str
    profiled: bool
    recurrent: bool = False

    def short_refusal(self) -> str:
        """Which check `refusal` failed, in a word or three ("not measured
        yet" when none did): the table's other columns say why."""
        if self.refusal() is None:
            return "profilable, not measured yet"
        return ("no config.json" if self.config is None else "not buildable" if self.build_error
                else "executor" if self.executor_error else "does not fit")

    def refusal(self) -> str | None:
        """Why `profile_model.py` cannot profile it (None: it can)."""
        if self.config is None:
            return "no config.json is bundled for it (the real executor builds a model from one)"
        if self.build_error:
            return self.build_error
        if self.executor_error:
            return self.executor_error
        if not self.fits:
            return f"its bf16 weights ({self.weights_gib:.1f} GiB) and {ROOM_GIB:.0f} GiB of pools do not fit one GPU"
        return None


def config_file(model: str) -> Path | None:
    """The config.json the real executor builds `model` from (None: none bundled)."""
    if model in CONFIGS:
        return CONFIGS[model]
    from unikv.sim.real.model import config_path

    try:
        return config_path(model)
    except ValueError:
        return None


def executor_error(lm, config: Path) -> str:
    """Why the real executor cannot run `lm` (built from `config`), or "".

    The checks `sim.real.executor.build_real_executor` makes before its
    first step, on a model built on the meta device."""
    import torch
    from unikv.sim.layouts import build_layout
    from unikv.sim.models import load_model
    from unikv.sim.real import layers
    from unikv.sim.real.state import layer_states, recurrent_layers, state_bytes

    try:
        placed = layers.model_layers(lm.config, torch.bfloat16)
        spec = load_model(str(config))
        layers.check_layout(placed, build_layout(spec, kv_budget_gib=4.0, page_size=16, kind="end_end").layout)
        if placed.recurrent:
            try:
                bound = tuple(g.layer for g in recurrent_layers(lm))
            except ValueError:
                bound = ()
            layers.check_recurrent(placed, lm.config, bound=bound)
            have = state_bytes(layer_states(lm))
            if have != spec.state_bytes:
                return (f"its recurrent layers keep {have} bytes per request, unikv sizes {spec.state_bytes}: "
                        "the pool's state band cannot hold them")
    except ValueError as exc:  # the executor's own refusals
        return f"the real executor refuses it: {short(str(exc))}"
    except (TypeError, AttributeError, RuntimeError) as exc:  # what the executor would crash on
        return f"the real executor fails on its config: {type(exc).__name__}: {short(str(exc))}"
    return ""


def short(message: str) -> str:
    """The gist of an error message for a table cell: its first line and
    first sentence, long layer lists counted, the hint after "; expected"
    and the source pointers dropped."""
    text = re.sub(r"\[(\d+, ){3,}\d+\]", lambda m: f"[{m.group(0).count(',') + 1} layers]",
                  message.splitlines()[0])
    for cut in ("; expected", " (sim/", ". "):
        text = text.split(cut)[0]
    return text


def check(model: str, gpu: str = "h200") -> Coverage:
    """`Coverage` of one bundled model id on `gpu`.

    Raises:
        ValueError: an unknown model id or GPU (named).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from unikv.sim.models import load_model
    from unikv.sim.profile import profile_path
    from unikv.sim.real.model import hf_config

    if gpu not in USABLE_GIB:
        raise ValueError(f"gpu={gpu!r}: no usable memory known; expected one of {sorted(USABLE_GIB)}")
    spec = load_model(model)  # raises for an unknown id
    config = config_file(model)
    weights_gib, counted, build, runs, recurrent = None, False, "", "", False
    model_type = spec.model_type or "?"
    if config is not None:
        try:
            with torch.device("meta"):
                lm = AutoModelForCausalLM.from_config(hf_config(config), dtype=torch.bfloat16)
        except (ValueError, TypeError, KeyError, AssertionError) as exc:
            build = (f"transformers {transformers.__version__} cannot build it as a causal LM "
                     f"({str(exc).splitlines()[0]})")
        else:
            model_type = lm.config.model_type
            weights_gib, counted = sum(p.numel() for p in lm.parameters()) * 2 / 2**30, True
            runs = executor_error(lm, config)
            if not runs:
                from unikv.sim.real import layers

                recurrent = bool(layers.model_layers(lm.config, torch.bfloat16).recurrent)
    if weights_gib is None and spec.params_total:
        weights_gib = spec.params_total * 2 / 2**30
    fits = None if weights_gib is None else weights_gib + ROOM_GIB <= USABLE_GIB[gpu]
    return Coverage(model=model, model_type=model_type, config=config, weights_gib=weights_gib, counted=counted,
                    fits=fits, build_error=build, executor_error=runs,
                    profiled=profile_path(model, gpu).is_file(), recurrent=recurrent)


def markdown(rows: list[Coverage], gpu: str) -> str:
    """The coverage table (what `--docs` writes between the markers)."""
    import transformers

    usable = USABLE_GIB[gpu]
    lines = [f"Generated by `benchmarks/profile_coverage.py --gpu {gpu}` under transformers "
             f"{transformers.__version__}. Weights: bf16 as the executor builds them, counted from the model "
             f"transformers builds (* from params.json's parameter count where it cannot be built). Fits: weights "
             f"+ {ROOM_GIB:.0f} GiB of pools <= {usable:.0f} GiB.", "",
             f"| model | model_type | weights GiB | fits one {gpu} | buildable | executor supports | profiled |",
             "| --- | --- | ---: | --- | --- | --- | --- |"]
    for c in rows:
        weights = "?" if c.weights_gib is None else f"{c.weights_gib:.1f}" + ("" if c.counted else "*")
        fits = "?" if c.fits is None else ("yes" if c.fits else "no")
        build = "no config.json bundled" if c.config is None else ("no: " + c.build_error if c.build_error else "yes")
        runs = "?" if c.config is None or c.build_error else ("no: " + c.executor_error if c.executor_error else "yes")
        profiled = "yes" if c.profiled else "no: " + c.short_refusal()
        lines.append(f"| {c.model} | {c.model_type} | {weights} | {fits} | {build} | {runs} | {profiled} |")
    return "\n".join(lines) + "\n"


def write_docs(path: Path, table: str) -> None:
    """Replace the text between BEGIN and END in `path` by `table`.

    Raises:
        ValueError: the file lacks the markers (named).
    """
    text = path.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{path}: expected one {BEGIN!r} line before one {END!r} line")
    head, rest = text.split(BEGIN)
    path.write_text(head + BEGIN + "\n" + table + END + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> int:
    from unikv.sim.models import list_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200", help=f"one of {sorted(USABLE_GIB)}")
    ap.add_argument("--docs", type=Path, default=None, help="rewrite the table between the markers in this file")
    args = ap.parse_args(argv)
    try:
        table = markdown([check(m, args.gpu) for m in list_models()], args.gpu)
        if args.docs is not None:
            write_docs(args.docs, table)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

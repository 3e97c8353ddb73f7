"""Which bundled models can be profiled on one H200 (benchmarks/profile_coverage.py), and
profile_model.py's refusal of the others."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bench(monkeypatch):
    """The benchmarks folder importable (its scripts import each other by name)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("profile_coverage"), importlib.import_module("profile_model")


@pytest.mark.parametrize("model, refusal", [
    ("nemotron-3-nano-30b-a3b", None),
    ("gemma-3-12b", None),
    ("llama-3.1-70b", "its bf16 weights (131.4 GiB) and 18 GiB of pools do not fit one GPU"),
    ("falcon-h1-7b", "no config.json is bundled for it"),
    ("qwen3-next-80b-a3b", "keep recurrent state (linear_attention) of qwen3_next, which the real executor cannot bind"),
    ("llama-4-scout-17b-16e", "config layer_types holds ['chunked_attention']"),
])
def test_each_check_names_why_a_model_cannot_be_profiled(bench, model, refusal):
    coverage, _ = bench
    got = coverage.check(model, "h200").refusal()
    assert got == refusal if refusal is None else refusal in got


def test_the_recurrent_hybrid_is_profiled_and_said_to_be_recurrent(bench):
    """Nemotron-3-Nano (Mamba-2 state) is profiled as the executor runs it,
    per chunk (its bundled profile, 5f603e2); attention-only models are
    not recurrent."""
    coverage, _ = bench
    nemotron, gemma = coverage.check("nemotron-3-nano-30b-a3b", "h200"), coverage.check("gemma-3-12b", "h200")
    assert nemotron.recurrent and nemotron.profiled and nemotron.refusal() is None
    assert not gemma.recurrent and gemma.profiled


def test_an_mla_model_is_refused_by_name(bench):
    coverage, _ = bench
    import torch
    from transformers import AutoModelForCausalLM
    from unikv.sim.real.model import hf_config

    config = ROOT / "tests" / "data" / "configs" / "deepseek-ai--DeepSeek-V2-Lite-Chat_config.json"
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(hf_config(config), dtype=torch.bfloat16)
    assert coverage.executor_error(lm, config).startswith(
        "the real executor refuses it: config kv_lora_rank=512: MLA is not described")


def test_weights_are_counted_as_the_executor_builds_them_in_bf16(bench):
    coverage, _ = bench
    oss = coverage.check("gpt-oss-20b", "h200")  # its MXFP4 checkpoint is built (and was profiled) in bf16
    assert oss.counted and oss.weights_gib == pytest.approx(20_914_757_184 * 2 / 2**30) and oss.profiled
    falcon = coverage.check("falcon-h1-7b", "h200")  # no config: params.json's count, marked
    assert not falcon.counted and falcon.weights_gib == pytest.approx(7_590_000_000 * 2 / 2**30) and falcon.fits


def test_the_docs_table_is_the_generated_one(bench):
    coverage, _ = bench
    from unikv.sim.models import list_models

    table = coverage.markdown([coverage.check(m, "h200") for m in list_models()], "h200")
    docs = (ROOT / "docs" / "cost_model.md").read_text()
    committed = docs.split(coverage.BEGIN)[1].split(coverage.END)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]  # the heading names the transformers
    assert [line for line in committed.splitlines() if line.startswith("| ")] == rows
    assert len(rows) == 2 + len(list_models())


def test_the_docs_markers_are_required_and_the_table_replaced_between_them(bench, tmp_path):
    coverage, _ = bench
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{coverage.BEGIN}\nold\n{coverage.END}\nrest\n")
    coverage.write_docs(doc, "| new |\n")
    assert doc.read_text() == f"intro\n{coverage.BEGIN}\n| new |\n{coverage.END}\nrest\n"
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="expected one"):
        coverage.write_docs(doc, "| new |\n")
    assert doc.read_text() == "no markers\n"


@pytest.mark.parametrize("model, needle", [
    ("llama-3.1-70b", "do not fit one GPU"),
    ("gemma-4-26b-a4b", "the real executor fails on its config: AmbiguousGlobalPerLayerAttributeError"),
    ("no-such-model", "unknown model 'no-such-model'"),
])
def test_profile_model_refuses_an_unprofilable_model_in_one_line(bench, tmp_path, capsys, model, needle):
    _, profile_model = bench
    out, held = tmp_path / "fit.json", tmp_path / "held.json"
    assert profile_model.main(["--model", model, "--gpu", "h200", "--out", str(out), "--heldout", str(held)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --model {model!r} cannot be profiled on one h200: ")
    assert needle in errors[0]
    assert not out.exists() and not held.exists()

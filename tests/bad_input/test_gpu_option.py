"""`--gpu NAME` on `unikv replay` / `unikv compare`: a bundled spec is selected and
recorded; an unknown name, or a name beside a hardware file, is refused in one line."""

from __future__ import annotations

import json

import pytest
from cli_probe import assert_complete_or_absent, assert_refused, run_cli
from unikv.sim.hardware import gpu_names

SHORT = ["--trace-end-s", "5", "--no-figures", "--no-oracle", "--quiet"]


@pytest.mark.parametrize("command", ["replay", "compare"])
def test_an_unknown_gpu_is_refused_listing_the_known_ones(tmp_path, command):
    res = run_cli([command, "--gpu", "h300", "--out", tmp_path / "run", "--quiet"])
    line = assert_refused(res, "gpu='h300'", "not a bundled GPU", *gpu_names())
    assert "known: " + ", ".join(gpu_names()) in line
    assert_complete_or_absent(tmp_path / "run")


def test_a_gpu_beside_a_hardware_file_is_refused_naming_both(tmp_path):
    hw = tmp_path / "gpu.json"
    hw.write_text("{}")
    res = run_cli(["replay", "--gpu", "b200", "--hardware", hw, "--out", tmp_path / "run", "--quiet"])
    assert_refused(res, "gpu='b200'", str(hw), "give one")
    assert not (tmp_path / "run").exists()


def test_a_known_gpu_is_charged_and_recorded_in_the_summary(tmp_path):
    res = run_cli(["replay", "--gpu", "a100-40gb", *SHORT, "--out", tmp_path / "run"])
    assert res.rc == 0, res.stderr
    doc = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert doc["identity"]["hardware"]["name"] == "A100-40GB-SXM4"
    summary = doc["summary"]
    assert (summary["gpu"], summary["gpu_spec_source"], summary["step_time_model"]) == (
        "a100-40gb", "bundled sim/data/hardware/a100-40gb.json", "roofline")
    slow = summary["busy_time_s"]
    assert run_cli(["replay", *SHORT, "--out", tmp_path / "h200"]).rc == 0
    fast = json.loads((tmp_path / "h200" / "summary.json").read_text())["summary"]
    assert fast["gpu"] == "h200" and fast["busy_time_s"] < slow  # the A100 is charged slower steps


def test_compare_charges_every_cell_on_the_selected_gpu(tmp_path):
    res = run_cli(["compare", "--gpu", "b200", "--trace-end-s", "5", "--layouts", "end_end",
                   "--compactions", "lazy", "--quiet", "--out", tmp_path / "cmp"])
    assert res.rc == 0, res.stderr
    summaries = sorted((tmp_path / "cmp").rglob("summary.json"))
    assert len(summaries) == 2  # end_end and the oracle
    for path in summaries:
        doc = json.loads(path.read_text())
        assert doc["identity"]["hardware"]["name"] == "B200-HGX"
        assert (doc["summary"]["gpu"], doc["summary"]["gpu_spec_source"]) == (
            "b200", "bundled sim/data/hardware/b200.json")

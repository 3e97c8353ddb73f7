"""Hardware coefficients as package data: loading, validation, derivation, no repository reads."""

import importlib.util
import json
import re
from importlib import resources
from pathlib import Path

import pytest
from unikv.sim.cost import COEFFICIENTS, HardwareSpec, hardware_names

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("derive_hardware", ROOT / "benchmarks" / "derive_hardware.py")
derive_hardware = importlib.util.module_from_spec(spec)
spec.loader.exec_module(derive_hardware)


def _package_file(name: str) -> dict:
    return json.loads(resources.files("unikv.sim").joinpath(f"data/hardware/{name}.json").read_text())


def test_loaded_coefficients_equal_the_package_data_file():
    assert hardware_names() == ["h200"]
    data = _package_file("h200")
    hw = HardwareSpec.h200()
    assert hw.as_dict() == data
    assert {c: getattr(hw, c) for c in COEFFICIENTS} == {c: data["coefficients"][c]["value"] for c in COEFFICIENTS}
    assert HardwareSpec.load("h200") == hw == HardwareSpec.from_dict(hw.as_dict())


def test_the_run_charges_the_measured_page_move_bandwidth_of_before():
    # The value HardwareSpec.from_results("results/kernels") gave before the
    # coefficients became package data: replays stay identical.
    assert HardwareSpec.h200().move_bytes_per_s == 3960900000000.0


def test_the_h200_capacity_is_the_datasheets_binary_141_gb_and_what_the_device_reports_fits_it():
    hw = HardwareSpec.h200()
    assert hw.hbm_capacity_bytes == 141 * 2**30
    # nvidia-smi's memory.total on the project's H200 (143771 MiB) is above
    # 141e9 bytes: the datasheet's GB cannot be decimal
    reported = hw.provenance["hbm_capacity_bytes"]["device_reported_bytes"]
    assert 141e9 < reported <= hw.hbm_capacity_bytes


def test_a_users_file_loads_and_its_provenance_travels(tmp_path):
    data = HardwareSpec.h200().as_dict()
    data["name"] = "my-gpu"
    data["coefficients"]["mbu"] = {"value": 0.8, "source": "our own decode measurement"}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    hw = HardwareSpec.load(path)
    assert (hw.name, hw.mbu, hw.provenance["mbu"]) == ("my-gpu", 0.8, {"source": "our own decode measurement"})
    assert HardwareSpec.load(str(path)) == hw


def _bad(tmp_path, mutate) -> str:
    data = HardwareSpec.h200().as_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        HardwareSpec.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["coefficients"].pop("mfu"), "missing ['mfu']"),
    (lambda d: d["coefficients"].update(tflops={"value": 1, "source": "x"}), "unknown coefficients ['tflops']"),
    (lambda d: d["coefficients"]["mbu"].update(value=1.5), "mbu=1.5"),
    (lambda d: d["coefficients"]["peak_flops"].update(value="fast"), "peak_flops='fast'"),
    (lambda d: d["coefficients"].pop("hbm_capacity_bytes"), "missing ['hbm_capacity_bytes']"),
    (lambda d: d["coefficients"]["hbm_capacity_bytes"].update(value=141.5e9), "hbm_capacity_bytes=141500000000.0"),
    (lambda d: d["coefficients"]["hbm_capacity_bytes"].update(value=0), "hbm_capacity_bytes=0"),
    (lambda d: d["coefficients"]["step_overhead_s"].pop("value"), "coefficients.step_overhead_s"),
    (lambda d: d["coefficients"]["hbm_bytes_per_s"].pop("source"), "provenance of hbm_bytes_per_s"),
    (lambda d: d.pop("coefficients"), "missing field 'coefficients'"),
    (lambda d: d.pop("name"), "name=None"),
    (lambda d: d.update(gpu="h200"), "unknown fields ['gpu']"),
])
def test_a_bad_file_gets_a_one_line_error_naming_the_field(tmp_path, mutate, needle):
    assert needle in _bad(tmp_path, mutate)


def test_not_json_and_unknown_names_are_refused(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        HardwareSpec.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match=r"neither a bundled name \['h200'\] nor a file"):
        HardwareSpec.load("b200")


def test_with_replaces_coefficients_and_says_so_in_the_provenance():
    hw = HardwareSpec.h200().with_(move_bytes_per_s=1.15e12)
    assert hw.move_bytes_per_s == 1.15e12 and hw.provenance["move_bytes_per_s"]["source"].startswith("override")
    assert hw.provenance["mfu"] == HardwareSpec.h200().provenance["mfu"]
    with pytest.raises(ValueError, match="unknown coefficients"):
        hw.with_(tflops=1.0)


# -- derivation from the benchmark CSV ------------------------------------------------

def test_the_package_file_is_what_the_committed_measurement_derives():
    assert derive_hardware.main(["--check"]) == 0


HEADER = ["ts", "gpu", "torch", "triton", "git_rev", "bench", "shape", "method", "page_bytes", "pages", "gbps"]


def _csv(path, rows):
    stamp = ["2026-01-02T03:04:05+00:00", "GPU X", "2.0", "3.0", "abc1234"]
    path.write_text("\n".join([",".join(HEADER)] + [",".join(map(str, stamp + r)) for r in rows]) + "\n")
    return path


def test_derivation_takes_the_median_triton_rate_at_the_largest_transfer(tmp_path):
    path = _csv(tmp_path / "moves.csv", [
        ["move_pages", "disjoint", "triton", 65536, 16, 1000.0],
        ["move_pages", "disjoint", "triton", 65536, 4096, 3000.0],
        ["move_pages", "shift", "triton", 65536, 4096, 3200.0],
        ["move_pages", "disjoint", "triton", 65536, 4096, 3100.0],
        ["move_pages", "disjoint", "copy", 65536, 4096, 4200.0],
        ["launch_overhead", "disjoint", "triton", 65536, 8192, ""],
    ])
    value, prov = derive_hardware.move_bandwidth(path)
    assert value == 3100.0e9
    assert (prov["rows"], prov["row_gbps"], prov["machine"]) == ([3, 4, 5], [3000.0, 3200.0, 3100.0],
                                                                   "GPU X, torch 2.0, triton 3.0")
    assert derive_hardware.move_bandwidth(path, "copy")[0] == 4200.0e9
    out = derive_hardware.derive(HardwareSpec.h200().as_dict(), path)
    assert HardwareSpec.from_dict(out).move_bytes_per_s == 3100.0e9


def test_derivation_without_triton_takes_the_fastest_and_refuses_what_it_cannot_use(tmp_path):
    path = _csv(tmp_path / "moves.csv", [["move_pages", "disjoint", "copy", 4096, 64, 10.0],
                                         ["move_pages", "disjoint", "torch_index", 4096, 64, 5.0]])
    assert derive_hardware.move_bandwidth(path)[0] == 10.0e9
    with pytest.raises(ValueError, match="no move_pages row of method 'triton'"):
        derive_hardware.move_bandwidth(path, "triton")
    (tmp_path / "short.csv").write_text("method,gbps\ntriton,1\n")
    with pytest.raises(ValueError, match="missing columns"):
        derive_hardware.move_bandwidth(tmp_path / "short.csv")


# -- nothing in the packages reads the repository at run time --------------------------

# A path into results/ or ../shared built from string literals, in any package module.
# (a bare "shared" or "results" string is a value, e.g. GLM-5's "shared" indexer layers)
REPO_READ = re.compile(r"""["']\.\./(results|shared)["'/]|["'](results|shared)/|parents\[\d+\]\s*/\s*["'](results|shared)"""
                       r"""|/\s*["'](results|shared)["']""")
HELP_TEXT = re.compile(r"""help=|default=Path\(["']results/""")  # where outputs go, or a user's example


def test_no_package_module_reads_results_or_shared_at_run_time():
    offenders = []
    for top in ("unikv", "sim", "traces"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if REPO_READ.search(line) and not HELP_TEXT.search(line) and "(e.g. ../shared" not in line:
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_the_repository_read_pattern_catches_the_old_reads():
    old = 'HardwareSpec.from_results(Path(__file__).resolve().parents[1] / "results" / "kernels")'
    assert REPO_READ.search(old) and REPO_READ.search('open("results/kernels/move_pages.csv")')
    assert REPO_READ.search('REPO.parent / "shared" / "traces"')

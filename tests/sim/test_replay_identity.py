"""benchmarks/replay_identity.py: save, then check, and a difference is reported."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "replay_identity", Path(__file__).resolve().parents[2] / "benchmarks" / "replay_identity.py")
identity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(identity)


def test_save_then_check_is_identical_and_a_change_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(identity, "CASES", {"tiny": dict(trace="azure_conv", trace_end_s=15,
                                                         model="gpt-oss-20b", kv_budget_gib=1.0)})
    assert identity.main(["save", "--dir", str(tmp_path)]) == 0
    assert identity.main(["check", "--dir", str(tmp_path)]) == 0
    assert "tiny: identical" in capsys.readouterr().out
    # another budget: the same requests, other pool numbers
    monkeypatch.setattr(identity, "CASES", {"tiny": dict(trace="azure_conv", trace_end_s=15,
                                                         model="gpt-oss-20b", kv_budget_gib=2.0)})
    assert identity.main(["check", "--dir", str(tmp_path)]) == 1
    assert "tiny: DIFFERS: steps table" in capsys.readouterr().out


def test_check_without_a_save_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(identity, "CASES", {"tiny": dict(trace="azure_conv", trace_end_s=5)})
    assert identity.main(["check", "--dir", str(tmp_path)]) == 1
    assert "nothing stored" in capsys.readouterr().out

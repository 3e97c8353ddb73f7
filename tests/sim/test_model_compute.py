"""The roofline's attention FLOPs and expert counts read from a user's
config.json (`sim.model_compute`) equal the bundled table
(`sim/data/compute.json`) for every bundled model with a config copy the
plain rule describes, and are left out, with the reason, where it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from unikv.sim.models import _bundled, _compute, load_model

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _copies():
    for mid, entry in sorted(_bundled()[0].items()):
        name = Path(entry["sources"].get("config", "").split(":")[-1].split(" ")[0]).name
        if name and (CONFIGS / name).is_file() and mid in _compute():
            yield mid, CONFIGS / name


COPIES = list(_copies())
REFUSED = {"gemma-4-26b-a4b", "mimo-v2-flash"}  # per-kind KV heads / asymmetric K and V


def test_there_are_copies_to_compare():
    assert len(COPIES) >= 8 and {m for m, _ in COPIES} >= REFUSED


@pytest.mark.parametrize("mid,path", COPIES, ids=[m for m, _ in COPIES])
def test_a_config_read_as_a_users_gets_the_bundled_tables_figures(tmp_path, mid, path):
    folder = tmp_path / mid
    folder.mkdir()
    (folder / "config.json").write_text(path.read_text())  # "config.json": not recognised as bundled
    spec = load_model(str(folder))
    table = _compute()[mid]
    moe = table.get("moe") or {}
    want_pairs = (table["attention_pair_flops"]["full"], table["attention_pair_flops"]["window"])
    if mid in REFUSED:
        assert spec.attention_pair_flops is None and "no attention term" in spec.sources["compute"]
    else:
        assert spec.attention_pair_flops == want_pairs, spec.sources["compute"]
    assert (spec.routed_experts, spec.experts_per_token) == (moe.get("routed_experts"), moe.get("experts_per_token"))

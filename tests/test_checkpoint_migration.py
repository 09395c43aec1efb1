"""Checkpoints written before the mechanism-registry restructure (format version 1) still load.

tests/data/checkpoint_v1_*.pt were written by the code of commit b37b62d (model state_dict
layout 1: HEPT models kept their region counts under ``region_hash``) with an example input
and the model's output on it.
"""
from pathlib import Path

import pytest
import torch

from pointformers.engine.checkpoint import load_checkpoint, model_from_checkpoint
from pointformers.models.migration import STATE_VERSION, migrate_state_dict

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("tag", ["hept-tracking", "pileup"])
def test_version_1_checkpoint_loads_and_computes_the_same(tag):
    path = DATA / f"checkpoint_v1_{tag}.pt"
    ck = load_checkpoint(path)
    assert ck["version"] == 1 and any("region_hash" in k for k in ck["model"])
    model = model_from_checkpoint(path)
    ex = ck["example"]
    with torch.no_grad():
        y = model(ex["x"], ex["pos"])
    torch.testing.assert_close(y, ex["y"], rtol=0, atol=0)


def test_migration_renames_only_model_owned_regions():
    state = {"region_hash.regions": 1, "encoder.region_hash.regions": 2,
             "blocks.0.mixer.region_hash.regions": 3, "W.weight": 4}
    out = migrate_state_dict(state, 1)
    assert out == {"shared.regions": 1, "encoder.shared.regions": 2, "blocks.0.mixer.region_hash.regions": 3,
                   "W.weight": 4}
    assert migrate_state_dict(out, STATE_VERSION) == out
    with pytest.raises(ValueError, match="version"):
        migrate_state_dict(state, STATE_VERSION + 1)

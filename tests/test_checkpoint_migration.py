"""Checkpoints written by older layouts still load and compute the same.

tests/data/checkpoint_v1_*.pt were written by the code of commit b37b62d (model state_dict
layout 1: HEPT models kept their region counts under ``region_hash``) with an example input
and the model's output on it. tests/data/checkpoint_v2_*.pt were written by the code of commit
5ade253 (layout 2: SFT, SAMSA, FLT and the Sampled Transformer had block classes of their own,
with ``ffn``, SFT's and SAMSA's ``attn`` and SAMSA's ``norm``), each with an example input
(``inputs``, the model's positional arguments) and its eval output.
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
    # float rounding only: the block kernel's exp is exp2 of a scaled product since the example was
    # saved (a wrongly migrated weight would move outputs by far more)
    torch.testing.assert_close(y, ex["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tag", ["sft-cls", "samsa-cls", "sampled-cls", "flt-seq"])
def test_version_2_checkpoint_loads_and_computes_the_same(tag):
    path = DATA / f"checkpoint_v2_{tag}.pt"
    ck = load_checkpoint(path)
    assert ck["version"] == 2 and any(".ffn." in k for k in ck["model"])
    model = model_from_checkpoint(path)
    assert not any(".ffn." in k or ".attn." in k for k in model.state_dict())
    ex = ck["example"]
    with torch.no_grad():
        y = model(*ex["inputs"])
    # float rounding only: the example was saved on another CPU, whose GEMM kernels may round
    # differently (a wrongly migrated weight would move outputs by far more)
    torch.testing.assert_close(y, ex["y"], rtol=1e-5, atol=1e-6)


def test_migration_renames_only_model_owned_regions():
    state = {"region_hash.regions": 1, "encoder.region_hash.regions": 2,
             "blocks.0.mixer.region_hash.regions": 3, "W.weight": 4}
    out = migrate_state_dict(state, 1)
    assert out == {"shared.regions": 1, "encoder.shared.regions": 2, "blocks.0.mixer.region_hash.regions": 3,
                   "W.weight": 4}
    assert migrate_state_dict(out, STATE_VERSION) == out
    with pytest.raises(ValueError, match="version"):
        migrate_state_dict(state, STATE_VERSION + 1)


def test_migration_2_to_3_renames_the_children_of_blocks_only():
    state = {
        # SFT block (its mixer's own sub-modules keep their names)
        "encoder.blocks.0.attn.w_q.weight": 1, "encoder.blocks.0.attn.sampler.score.weight": 2,
        "encoder.blocks.0.norm1.weight": 3, "encoder.blocks.0.ffn.0.weight": 4, "encoder.blocks.0.ffn.3.bias": 5,
        # SAMSA block: norm -> norm1; the stack's shared alpha stays
        "backbone.encoder.alpha": 6, "backbone.encoder.blocks.1.norm.weight": 7,
        "backbone.encoder.blocks.1.norm2.weight": 8, "backbone.encoder.blocks.1.attn.importance.0.weight": 9,
        "backbone.encoder.blocks.1.ffn.0.weight": 10, "backbone.encoder.blocks.1.ffn.2.weight": 11,
        # a block that already had a mixer (FLT / Sampled / twins); HEPT's blocks (ff) are unchanged
        "block.mixer.w_q.weight": 16, "block.ffn.0.weight": 17, "blocks.2.ff.0.weight": 18,
        # not children of a layout-2 block
        "blocks.2.mixer.attn.x": 19, "head.attn.weight": 20, "norm.weight": 21,
    }
    out = migrate_state_dict(state, 2)
    assert out == {
        "encoder.blocks.0.mixer.w_q.weight": 1, "encoder.blocks.0.mixer.sampler.score.weight": 2,
        "encoder.blocks.0.norm1.weight": 3, "encoder.blocks.0.ff.0.weight": 4, "encoder.blocks.0.ff.3.bias": 5,
        "backbone.encoder.alpha": 6, "backbone.encoder.blocks.1.norm1.weight": 7,
        "backbone.encoder.blocks.1.norm2.weight": 8, "backbone.encoder.blocks.1.mixer.importance.0.weight": 9,
        "backbone.encoder.blocks.1.ff.0.weight": 10, "backbone.encoder.blocks.1.ff.2.weight": 11,
        "block.mixer.w_q.weight": 16, "block.ff.0.weight": 17, "blocks.2.ff.0.weight": 18,
        "blocks.2.mixer.attn.x": 19, "head.attn.weight": 20, "norm.weight": 21,
    }
    assert list(out.values()) == list(state.values())   # order kept
    assert migrate_state_dict(out, STATE_VERSION) == out
    # a lone SAMSA block's state_dict (its own ReZero alpha)
    lone = {"norm.weight": 1, "attn.w_k.weight": 2, "ffn.0.weight": 3, "ffn.2.bias": 4, "alpha": 5}
    assert migrate_state_dict(lone, 2) == {"norm1.weight": 1, "mixer.w_k.weight": 2, "ff.0.weight": 3,
                                           "ff.2.bias": 4, "alpha": 5}

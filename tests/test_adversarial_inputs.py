"""Hostile tensors for every mechanism: NaN / inf in padded rows never reach real points, and an
input dtype the module does not hold is refused with a message naming the argument."""
from __future__ import annotations

import pytest
import torch

import pointformers
from pointformers.attention import build

OPTIONS = {"full": {}, "kernel": {"coord_dim": 3}, "hept": {"coord_dim": 3, "block_size": 16, "num_regions": 4},
           "lsh_or": {"coord_dim": 3, "block_size": 16}, "coord_lsh": {"coord_dim": 3, "block_size": 16, "num_regions": 4}, "performer": {"nb_features": 16},
           "flt": {"nb_features": 16, "coord_dim": 3}, "sft": {"k": 8}, "samsa": {"k": 4},
           "sampled": {}, "knn": {"k": 8, "coord_dim": 3}, "serialized": {"patch_size": 16, "coord_dim": 3}}


def test_every_mechanism_is_covered():
    assert set(pointformers.attention.available()) - {"linear"} <= set(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_non_finite_padding_stays_out(name, mode):
    torch.manual_seed(0)
    attn = build(name, dim=32, heads=4, **OPTIONS[name])
    getattr(attn, mode)()
    g = torch.Generator().manual_seed(0)
    x, pos = torch.randn(2, 60, 32, generator=g), torch.rand(2, 60, 3, generator=g)
    mask = torch.ones(2, 60, dtype=torch.bool)
    mask[1, 40:] = False
    clean_x, clean_pos = x.clone(), pos.clone()
    x[1, 45], x[1, 41], pos[1, 50] = float("nan"), float("inf"), float("inf")
    torch.manual_seed(1)
    y = attn(x, pos, mask)
    torch.manual_seed(1)
    ref = attn(clean_x, clean_pos, mask)
    assert bool(torch.isfinite(y[mask]).all())
    torch.testing.assert_close(y[mask], ref[mask])  # padding content does not matter at all


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_wrong_input_dtype_is_named(name):
    attn = build(name, dim=32, heads=4, **OPTIONS[name]).eval()
    with pytest.raises(ValueError, match=r"x: dtype torch.float64 does not match the module's parameters"):
        attn(torch.randn(1, 20, 32, dtype=torch.float64), torch.rand(1, 20, 3, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_magnitudes_beyond_the_documented_range_are_refused(name):
    """Up to 1e15 (float32) every mechanism's output is finite; beyond, the input check says so
    (SFT stays finite further and checks less)."""
    from pointformers.nn.model_inputs import MAX_MAGNITUDE

    attn = build(name, dim=32, heads=4, **OPTIONS[name]).eval()
    g = torch.Generator().manual_seed(0)
    x, pos = torch.randn(1, 40, 32, generator=g), torch.rand(1, 40, 3, generator=g)
    limit = MAX_MAGNITUDE[torch.float32]
    y = attn(x.clamp(-1, 1) * limit, pos * limit)
    assert bool(torch.isfinite(y).all())
    big = pos.clone()
    big[0, 7, 1] = 1e30
    if name == "sft":
        assert bool(torch.isfinite(attn(x, big)).all())
    else:
        with pytest.raises(ValueError, match=r"pos has values up to 1e\+30 at real points"):
            attn(x, big)

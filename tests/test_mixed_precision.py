"""Mixed precision for every mechanism: bf16 autocast with float32 inputs (forward and backward),
and a float16 module (no NaN at real points). The RBF-kernel family (kernel, hept, lsh_or) keeps
its scores in float32 (see pointformers.attention.kernel.core_dtype); the others follow autocast.
"""
from __future__ import annotations

import pytest
import torch

import pointformers
from pointformers.attention import build

DIM, HEADS, N = 32, 4, 60
OPTIONS = {
    "full": {}, "kernel": {"coord_dim": 3}, "hept": {"coord_dim": 3, "block_size": 16, "num_regions": 4},
    "lsh_or": {"coord_dim": 3, "block_size": 16}, "coord_lsh": {"coord_dim": 3, "block_size": 16, "num_regions": 4},
    "performer": {"nb_features": 32},
    "flt": {"nb_features": 32, "coord_dim": 3}, "sft": {"k": 12}, "samsa": {"k": 8},
    "sampled": {}, "knn": {"k": 8, "coord_dim": 3}, "serialized": {"patch_size": 16, "coord_dim": 3},
}
#: Largest |bf16 − fp32| / max|fp32| seen per mechanism is a few 1e-2 at most (bf16 keeps 8 bits).
BF16_TOL = 0.1


def _inputs():
    g = torch.Generator().manual_seed(0)
    x, pos = torch.randn(2, N, DIM, generator=g), torch.rand(2, N, 3, generator=g)
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 45:] = False
    return x, pos, mask


def test_every_mechanism_is_covered():
    assert set(pointformers.attention.available()) - {"linear"} <= set(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_bf16_autocast_with_float32_inputs(name, mode):
    torch.manual_seed(0)
    attn = build(name, dim=DIM, heads=HEADS, **OPTIONS[name])
    getattr(attn, mode)()
    x, pos, mask = _inputs()
    torch.manual_seed(1)
    ref = attn(x, pos, mask)
    x.requires_grad_(mode == "train")
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attn(x, pos, mask)
    assert y.shape == ref.shape and bool(torch.isfinite(y[mask]).all())
    assert bool((y[~mask] == 0).all())
    if mode == "eval":
        err = float((y.float() - ref).detach().abs().max() / ref.detach().abs().max())
        assert err < BF16_TOL, f"{name}: bf16 error {err:.3g} relative to fp32"
    else:
        y.float().pow(2).mean().backward()
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_float16_module_has_no_nan_at_real_points(name):
    torch.manual_seed(0)
    attn = build(name, dim=DIM, heads=HEADS, **OPTIONS[name]).eval()
    x, pos, mask = _inputs()
    # the reference sees the same float16-representable inputs: rounding the coordinates alone moves points
    # across block boundaries where the blocks follow the coordinates (coord_lsh: 0.12 of the output's max)
    x, pos = x.half().float(), pos.half().float()
    ref = attn(x, pos, mask)
    try:
        y = attn.half()(x.half(), pos.half(), mask)
    except (ValueError, NotImplementedError, RuntimeError) as exc:  # a clear refusal is allowed, a NaN is not
        pytest.fail(f"{name}: float16 raised {type(exc).__name__}: {exc}")
    assert y.dtype == torch.float16 and bool(torch.isfinite(y[mask]).all()), name
    err = float((y.float() - ref).detach().abs().max() / ref.detach().abs().max())
    assert err < BF16_TOL, f"{name}: fp16 error {err:.3g}"

"""Property-based fuzzing of the attention contract for every registered mechanism.

Random batch sizes, cloud sizes (1 point up to several blocks), masks (including all but one
point padded), dtypes and odd head counts: every case gives finite output of the right
shape with zero padded rows, or a clear ValueError — never NaN from valid input and never a
crash deep inside torch. In float64, eval mode, each cloud's output equals its output alone and
the flat (PyG-style ``batch=``/``ptr=``) call's.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pointformers
from pointformers.attention import build

DIM, COORDS = 12, 3
#: Small-size options per mechanism (blocks/patches/samples smaller than the clouds drawn).
OPTIONS = {
    "full": {},
    "kernel": {"coord_dim": COORDS},
    "hept": {"coord_dim": COORDS, "block_size": 8, "n_hashes": 2, "num_regions": 4},
    "lsh_or": {"coord_dim": COORDS, "block_size": 8, "n_hashes": 2},
    "coord_lsh": {"coord_dim": COORDS, "block_size": 8, "n_hashes": 2, "num_regions": 4},
    "performer": {"nb_features": 16},
    "flt": {"nb_features": 16, "num_rpe_features": 8, "rpe_type": "gaussian_basis"},
    "sft": {"k": 6},
    "samsa": {"k": 6},
    "sampled": {},
    "knn": {"k": 5, "coord_dim": COORDS},
    "serialized": {"patch_size": 8, "coord_dim": COORDS},
}
_cache: dict = {}


def mechanism(name: str, heads: int, dtype: torch.dtype):
    key = (name, heads, dtype)
    if key not in _cache:
        torch.manual_seed(0)
        _cache[key] = build(name, dim=DIM, heads=heads, **OPTIONS.get(name, {})).to(dtype).eval()
    return _cache[key]


def test_every_registered_mechanism_is_fuzzed():
    assert set(pointformers.attention.available()) <= set(OPTIONS), \
        f"add fuzz options for {set(pointformers.attention.available()) - set(OPTIONS)}"


cases = st.fixed_dictionaries({
    "sizes": st.lists(st.integers(1, 40), min_size=1, max_size=3),
    "heads": st.sampled_from([1, 3]),
    "dtype": st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    "seed": st.integers(0, 2**16),
    "one_left": st.booleans(),
})


@pytest.mark.parametrize("name", sorted(OPTIONS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases)
def test_contract_fuzz(name, case):
    if name not in pointformers.attention.available():
        pytest.skip(f"{name} not registered")
    attn = mechanism(name, case["heads"], case["dtype"])
    g = torch.Generator().manual_seed(case["seed"])
    sizes = case["sizes"]
    if case["one_left"]:
        sizes = [1] + sizes[1:]  # a cloud with all but one point padded
    B, N = len(sizes), max(sizes)
    x = torch.randn(B, N, DIM, generator=g, dtype=torch.float64)
    pos = torch.randn(B, N, COORDS, generator=g, dtype=torch.float64)
    mask = torch.arange(N)[None, :] < torch.tensor(sizes)[:, None]
    x = (x * mask[..., None]).to(case["dtype"])
    pos = (pos * mask[..., None]).to(case["dtype"])
    with torch.no_grad():
        try:
            y = attn(x, pos, mask)
        except ValueError as e:  # a clear refusal is allowed, but must say why
            assert len(str(e)) > 10
            return
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y.float()).all(), "non-finite output from valid input"
    assert torch.all(y[~mask] == 0), "padded rows must be zero"
    if case["dtype"] == torch.float64:
        with torch.no_grad():
            for i, n in enumerate(sizes):
                alone = attn(x[i:i + 1, :n], pos[i:i + 1, :n])
                torch.testing.assert_close(y[i:i + 1, :n], alone, rtol=1e-7, atol=1e-7)
            # PyG-style flat input (batch= / ptr=) gives the padded call's real rows
            batch = torch.repeat_interleave(torch.arange(B), torch.tensor(sizes))
            ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
            for index in (dict(batch=batch), dict(ptr=ptr)):
                torch.testing.assert_close(attn(x[mask], pos[mask], **index), y[mask], rtol=1e-7, atol=1e-7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_cuda_matches_cpu(name):
    if name not in pointformers.attention.available():
        pytest.skip(f"{name} not registered")
    attn = mechanism(name, 3, torch.float64)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 30, DIM, generator=g, dtype=torch.float64)
    pos = torch.randn(2, 30, COORDS, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 20:] = False
    with torch.no_grad():
        y_cpu = attn(x, pos, mask)
        y_gpu = attn.cuda()(x.cuda(), pos.cuda(), mask.cuda()).cpu()
    attn.cpu()
    torch.testing.assert_close(y_gpu, y_cpu, rtol=1e-6, atol=1e-6)

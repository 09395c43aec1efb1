"""OR-only / OR & AND E2LSH attention without coordinate codes (HEPT Table 3 ablations)."""
import pytest
import torch

import pointformers.attention.lsh  # noqa: F401  (registers lsh_or)
from pointformers.attention import build
from pointformers.attention.lsh import _equal_count_buckets, sample_bucket_counts


def cloud(n, seed, dim=16, c=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, dim, generator=g, dtype=torch.float64), torch.randn(1, n, c, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("kw", [{}, {"tied": True}, {"n_and": 3, "num_regions": 6}])
def test_padding_invariance_and_zero_padding(kw):
    torch.manual_seed(0)
    attn = build("lsh_or", dim=16, heads=3, coord_dim=3, block_size=8, n_hashes=2, **kw).double().eval()
    x, p = cloud(37, 1)
    xo, po = cloud(50, 2)
    xb = torch.cat([torch.cat([x, torch.zeros(1, 13, 16, dtype=x.dtype)], 1), xo])
    pb = torch.cat([torch.cat([p, torch.zeros(1, 13, 3, dtype=p.dtype)], 1), po])
    mb = torch.ones(2, 50, dtype=torch.bool)
    mb[0, 37:] = False
    with torch.no_grad():
        yb = attn(xb, pb, mb)
        torch.testing.assert_close(yb[:1, :37], attn(x, p), rtol=1e-10, atol=1e-10)
    assert torch.all(yb[0, 37:] == 0)


def test_one_table_one_block_equals_kernel():
    torch.manual_seed(0)
    h = build("lsh_or", dim=16, heads=3, coord_dim=3, block_size=64, n_hashes=1).double()
    k = build("kernel", dim=16, heads=3, coord_dim=3).double()
    k.load_state_dict(h.state_dict(), strict=False)
    x, p = cloud(40, 3)
    torch.testing.assert_close(h(x, p), k(x, p))


def test_tied_aligns_query_and_key_buckets():
    torch.manual_seed(0)
    for tied in (False, True):
        attn = build("lsh_or", dim=16, heads=2, coord_dim=3, block_size=8, n_hashes=3, n_and=3,
                     num_regions=6, tied=tied).double()
        x, p = cloud(64, 4)
        mask = torch.ones(1, 64, dtype=torch.bool)
        q, k, _ = attn.augmented_qkv(x, p, mask)
        tq, tk = attn.sort_keys(q, k, mask)
        same = torch.equal(torch.argsort(tq, -1), torch.argsort(tk, -1))
        assert same == tied  # untied q/k sort differently: the misalignment HEPT fixes


def test_equal_count_buckets_and_counts():
    vals = torch.tensor([[5.0, 1.0, 3.0, 2.0, 4.0, 0.0, 9.0, 7.0]])
    valid = torch.tensor([[True] * 6 + [False] * 2])
    r = _equal_count_buckets(vals, valid, torch.tensor([3.0]))
    # 6 real values, 3 buckets of 2 by rank: 0,1 -> 1; 2,3 -> 2; 4,5 -> 3
    assert r[0, :6].tolist() == [3, 1, 2, 2, 3, 1]
    b = sample_bucket_counts(150, 4, 2, torch.Generator().manual_seed(0))
    assert b.shape == (4, 2) and torch.all(b >= 1)
    assert torch.allclose(b.prod(-1), torch.full((4,), 150.0), rtol=0.1)


def test_gradients_and_state_dict():
    torch.manual_seed(0)
    a = build("lsh_or", dim=8, heads=3, coord_dim=2, block_size=4, n_hashes=2, n_and=2, num_regions=3).double()
    x = torch.randn(1, 13, 8, dtype=torch.float64, requires_grad=True)
    p = torch.randn(1, 13, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: a(x, p), (x,))
    torch.manual_seed(5)
    b = build("lsh_or", dim=8, heads=3, coord_dim=2, block_size=4, n_hashes=2, n_and=2, num_regions=3).double()
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x, p), b(x, p), rtol=0, atol=0)
    with pytest.raises(ValueError, match="n_and must be a positive int"):
        build("lsh_or", dim=8, n_and=0)

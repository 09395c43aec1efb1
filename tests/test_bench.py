"""The benchmark's authors-style baseline computes the same function as the fused HEPT."""
import torch

from pointformers.attention import build
from pointformers.bench.materialized_hept import MaterializedHEPTAttention
from pointformers.bench.speed import report


def test_materialized_hept_equals_fused_hept_with_gradients():
    torch.manual_seed(0)
    opts = dict(dim=16, heads=4, coord_dim=3, block_size=8, n_hashes=3, num_regions=6)
    fused = build("hept", **opts).double()
    mat = MaterializedHEPTAttention(**opts).double()
    mat.load_state_dict(fused.state_dict())
    x = torch.randn(2, 37, 16, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 37, 3, dtype=torch.float64)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False
    y1, y2 = fused(x, pos, mask), mat(x, pos, mask)
    torch.testing.assert_close(y1, y2)
    g1, = torch.autograd.grad(y1.pow(2).sum(), x)
    g2, = torch.autograd.grad(y2.pow(2).sum(), x)
    torch.testing.assert_close(g1, g2)


def test_report_ratios():
    rs = [{"mechanism": m, "n": 100, "mode": "forward", "seconds": s, "peak_mb": 10.0}
          for m, s in (("hept", 1.0), ("hept-materialized", 5.0), ("full", 2.0), ("kernel", 3.0))]
    rs += [{"mechanism": m, "n": 50, "mode": "train", "seconds": 1.0, "peak_mb": mb}
           for m, mb in (("hept", 50.0), ("hept-materialized", 400.0), ("full", 100.0))]
    text = report(rs, [100], 50)
    assert "| 100 | 1.00 | 5.00 | 2.00 | 3.00 |" in text and "| 5.0× | 2.0× |" in text
    assert "| hept | 1.00 | 50 | 0.50 |" in text

"""stable_argsort equals torch.argsort(stable=True) exactly, ties, signed zeros and infinities included."""
import torch

from pointformers.attention.stable_sort import stable_argsort


def test_equals_torch_stable_argsort_with_ties_zeros_and_inf():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 500, generator=g)
    x[..., 10:60] = 0.25  # a run of ties
    x[0, 0, 70:80] = -0.0
    x[0, 0, 80:90] = 0.0  # −0.0 and +0.0 compare equal: index order
    x[..., -40:] = float("inf")  # padding keys
    x[1, 2, :5] = float("-inf")
    x[1, 1, ::7] = torch.round(x[1, 1, ::7] * 4) / 4  # more ties
    out = stable_argsort(x)
    assert out.dtype == torch.int64
    assert torch.equal(out, torch.argsort(x, dim=-1, stable=True))


def test_other_dtypes_and_views_fall_back_correctly():
    x = torch.randn(4, 33, dtype=torch.float64)
    assert torch.equal(stable_argsort(x), torch.argsort(x, dim=-1, stable=True))
    y = torch.randn(50, 3).T  # non-contiguous float32
    assert torch.equal(stable_argsort(y), torch.argsort(y, dim=-1, stable=True))
    z = torch.randn(5, requires_grad=True)
    assert torch.equal(stable_argsort(z), torch.argsort(z.detach(), dim=-1, stable=True))


def test_long_rows_take_the_radix_path_and_stay_exact():
    # rows of at least RADIX_MIN_LENGTH keys are sorted one at a time by torch.sort on int32 keys
    # (a radix sort): negative keys, ties, signed zeros and infinities must still sort as the stable argsort
    from pointformers.attention import stable_sort

    n = stable_sort.RADIX_MIN_LENGTH + 17
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, n, generator=g) * 50
    x[..., ::5] = 2.5
    x[..., 1::7] = -2.5
    x[0, 0, :40:2] = -0.0
    x[0, 0, 1:40:2] = 0.0
    x[1, 2, 7] = float("inf")
    x[1, 2, 8] = float("-inf")
    assert torch.equal(stable_argsort(x), torch.argsort(x, dim=-1, stable=True))
    assert torch.equal(stable_argsort(x[..., :n - 40]), torch.argsort(x[..., :n - 40], dim=-1, stable=True))

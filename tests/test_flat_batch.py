"""PyG-style flat input for every mechanism: ``attn(x (N, D), pos (N, P), batch=b)`` (or ``ptr=``)
gives, point for point, what the padded call ``attn(x (B, n, D), pos, mask)`` gives."""
from __future__ import annotations

import pytest
import torch

from pointformers.attention import build
from pointformers.data.batch import flat_layout, pad_clouds

OPTIONS = {
    "full": {}, "kernel": {"coord_dim": 3}, "hept": {"coord_dim": 3, "block_size": 16, "num_regions": 4},
    "lsh_or": {"coord_dim": 3, "block_size": 16}, "performer": {"nb_features": 32},
    "flt": {"nb_features": 32, "coord_dim": 3}, "sft": {"k": 12}, "samsa": {"k": 8},
    "sampled": {}, "knn": {"k": 8, "coord_dim": 3}, "serialized": {"patch_size": 16, "coord_dim": 3},
}
SIZES = (37, 70, 20)


def _clouds(seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, 32, generator=g, dtype=torch.float64) for n in SIZES]
    ps = [torch.rand(n, 3, generator=g, dtype=torch.float64) for n in SIZES]
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(SIZES)])
    return xs, ps, batch


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_flat_equals_padded(name):
    torch.manual_seed(0)
    attn = build(name, dim=32, heads=4, **OPTIONS[name]).double().eval()
    xs, ps, batch = _clouds()
    (x, mask), (pos, _) = pad_clouds(xs), pad_clouds(ps)
    ref = attn(x, pos, mask)[mask]
    ptr = torch.tensor([0, *torch.tensor(SIZES).cumsum(0).tolist()])
    torch.testing.assert_close(attn(torch.cat(xs), torch.cat(ps), batch=batch), ref, rtol=0, atol=0)
    torch.testing.assert_close(attn(torch.cat(xs), torch.cat(ps), ptr=ptr), ref, rtol=0, atol=0)
    # one flat cloud without an index is one cloud
    torch.testing.assert_close(attn(xs[0], ps[0]), attn(xs[0][None], ps[0][None])[0], rtol=0, atol=0)


def test_flat_gradients_reach_the_inputs():
    torch.manual_seed(0)
    attn = build("hept", dim=32, heads=4, **OPTIONS["hept"]).double()
    xs, ps, batch = _clouds()
    x = torch.cat(xs).requires_grad_(True)
    attn(x, torch.cat(ps), batch=batch).pow(2).sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all()) and float(x.grad.abs().sum()) > 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch=torch.tensor([0, 0, 1, 0])), "sorted"),
    (dict(batch=torch.tensor([0, 0, 2, 2])), r"cloud\(s\) \[1\] have no points"),
    (dict(batch=torch.tensor([0, 0, 1])), "4 cloud indices"),
    (dict(batch=torch.tensor([0.0, 0, 1, 1])), "integer"),
    (dict(ptr=torch.tensor([0, 2, 3])), "end at the point count 4"),
    (dict(ptr=torch.tensor([0, 3, 2, 4])), "must not decrease"),
    (dict(batch=torch.tensor([0, 0, 1, 1]), ptr=torch.tensor([0, 2, 4])), "not both"),
])
def test_bad_flat_index_is_named(kwargs, match):
    attn = build("full", dim=8, heads=2)
    with pytest.raises(ValueError, match=match):
        attn(torch.randn(4, 8), **kwargs)


def test_flat_input_rejects_a_mask_and_mismatched_pos():
    attn = build("knn", dim=8, heads=2, k=2, coord_dim=3)
    b = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="mask: flat input"):
        attn(torch.randn(4, 8), torch.randn(4, 3), torch.ones(4, dtype=torch.bool), batch=b)
    with pytest.raises(ValueError, match=r"pos: with flat x \(4, D\)"):
        attn(torch.randn(4, 8), torch.randn(5, 3), batch=b)


def test_layout_round_trip():
    lay = flat_layout(5, batch=torch.tensor([0, 0, 0, 1, 1]))
    t = torch.arange(5.0)[:, None]
    assert lay.n_clouds == 2 and lay.n_max == 3
    torch.testing.assert_close(lay.unpad(lay.pad(t)), t)
    assert lay.mask().tolist() == [[True, True, True], [True, True, False]]


@pytest.mark.parametrize("name,options", [
    ("hept-tracking", dict(heads=2, n_layers=2, block_size=16, num_regions=4, mlp_hidden=16, mlp_layers=2)),
    ("tracking-encoder", dict(attention="performer", heads=2, n_layers=1, pe="learned", mlp_hidden=16, mlp_layers=2)),
    ("hept-pileup", dict(heads=2, n_layers=1, block_size=16, num_regions=4, mlp_hidden=16, mlp_layers=2)),
])
def test_models_take_flat_batches(name, options):
    from pointformers import models

    torch.manual_seed(0)
    model = models.build(name, dropout=0.0, **options).double().eval()
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, model.in_dim, generator=g, dtype=torch.float64) for n in SIZES]
    cs = [torch.randn(n, model.coord_dim, generator=g, dtype=torch.float64) for n in SIZES]
    if name == "hept-pileup":  # the last column is the PID category
        for x in xs:
            x[:, -1] = torch.randint(0, 7, (x.shape[0],), generator=g).double()
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(SIZES)])
    (x, mask), (c, _) = pad_clouds(xs), pad_clouds(cs)
    with torch.no_grad():
        ref = model(x, c, mask)[mask]
        # HEPT models pack the clouds (other GEMM row counts): equal to float64 rounding
        torch.testing.assert_close(model(torch.cat(xs), torch.cat(cs), batch=batch), ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="no padding"):
        model(torch.cat(xs), torch.cat(cs), torch.ones(len(batch), dtype=torch.bool), batch=batch)


POINT_MODELS = {  # model -> options for a small instance; (per-point output, needs category)
    "sft-cls": (dict(k=8, dim=16, depth=1, heads=2), False), "sft-partseg": (dict(k=8, dim=16, depth=1, heads=2), True),
    "samsa-cls": (dict(k=4, dim=16, depth=1, heads=2), False), "samsa-partseg": (dict(k=4, dim=16, depth=1, heads=2), True),
    "sampled-cls": ({}, False), "mlp-cls": ({}, False), "mlp-partseg": ({}, True), "full-cls": ({}, False),
    "flt-3d-reg": ({}, False), "mlp-3d-reg": ({}, False),
}


@pytest.mark.parametrize("name", sorted(POINT_MODELS))
def test_point_models_take_flat_batches(name):
    from pointformers import models

    options, per_point = POINT_MODELS[name]
    torch.manual_seed(0)
    try:
        model = models.build(name, **options).double().eval()
    except TypeError:
        model = models.build(name).double().eval()
    in_dim = getattr(model, "in_dim", None)
    if in_dim is None:
        in_dim = getattr(getattr(model, "encoder", None), "in_dim", 0)
    g = torch.Generator().manual_seed(0)
    sizes = (40, 64, 25)
    ps = [torch.rand(n, 3, generator=g, dtype=torch.float64) for n in sizes]
    xs = [torch.randn(n, in_dim, generator=g, dtype=torch.float64) for n in sizes] if in_dim else None
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    (pos, mask) = pad_clouds(ps)
    x = pad_clouds(xs)[0] if xs else None
    kw = {"category": torch.zeros(len(sizes), dtype=torch.long)} if per_point and getattr(model, "num_categories", 0) \
        else {}
    with torch.no_grad():
        ref = model(x, pos, mask, **kw)
        out = model(torch.cat(xs) if xs else None, torch.cat(ps), batch=batch, **kw)
    torch.testing.assert_close(out, ref[mask] if per_point else ref, rtol=1e-10, atol=1e-10)


def test_a_failing_call_leaves_no_layout_behind():
    attn = build("full", dim=8, heads=2)
    for _ in range(3):
        with pytest.raises(ValueError, match="empty"):
            attn(torch.randn(1, 4, 8), mask=torch.zeros(1, 4, dtype=torch.bool))
    assert attn._flat_layouts == []
    x, b = torch.randn(5, 8), torch.tensor([0, 0, 1, 1, 1])
    assert attn(x, batch=b).shape == (5, 8)


def test_a_refused_flat_index_leaves_no_layout_behind():
    attn = build("full", dim=8, heads=2)
    with pytest.raises(ValueError, match="sorted"):
        attn(torch.randn(4, 8), batch=torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="dtype"):
        attn(torch.randn(1, 4, 8, dtype=torch.float64))
    assert attn._flat_layouts == []


# ---------------------------------------------------------------- HEPT packs flat clouds
PACK_SIZES = (37, 100, 5, 61)  # with block_size 16: packed width 48 + 112 + 16 + 64 = 240, padded 4 × 112 = 448


def _pack_inputs(dim, coord_dim, sizes=PACK_SIZES, seed=1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, dim, generator=g, dtype=torch.float64) for n in sizes]
    ps = [torch.randn(n, coord_dim, generator=g, dtype=torch.float64) for n in sizes]
    return xs, ps, torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])


def test_packed_layout_pads_each_cloud_to_a_block_multiple_only():
    from pointformers.data.batch import packed_layout

    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(PACK_SIZES)])
    lay = packed_layout(len(batch), batch=batch, multiple=16)
    assert lay.n_packed == 240 and lay.segments == ((0, 48), (48, 160), (160, 176), (176, 240))
    t = torch.arange(float(len(batch)))[:, None]
    torch.testing.assert_close(lay.unpad(lay.pad(t)), t)
    m = lay.mask()[0]
    for (s, e), n in zip(lay.segments, PACK_SIZES):  # real points first in each segment, then padding
        assert m[s:s + n].all() and not m[s + n:e].any()
    with pytest.raises(ValueError, match="multiple"):
        packed_layout(3, multiple=0)


@pytest.mark.parametrize("implementation", ["fused", "materialized"])
def test_hept_flat_input_is_packed_and_each_cloud_as_alone(implementation, monkeypatch):
    """Each cloud's output and input gradient equal its own single-cloud call's, and the block attention
    runs on the packed width (Σ ceil(n/b)·b rows), not B × the largest cloud."""
    from pointformers.attention.hept_regions import HEPTRegions

    torch.manual_seed(0)
    attn = build("hept", dim=32, heads=4, coord_dim=3, block_size=16, num_regions=4,
                 implementation=implementation).double()
    xs, ps, batch = _pack_inputs(32, 3)
    widths = []
    real_forward = HEPTRegions.forward
    monkeypatch.setattr(HEPTRegions, "forward", lambda self, pos, mask, *a, **k: widths.append(tuple(mask.shape))
                        or real_forward(self, pos, mask, *a, **k))
    x = torch.cat(xs).requires_grad_(True)
    y = attn(x, torch.cat(ps), batch=batch)
    assert widths == [(1, 240)]
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (y * w).sum().backward()
    start = 0
    for xc, pc in zip(xs, ps):
        n = xc.shape[0]
        xc = xc.clone().requires_grad_(True)
        yc = attn(xc, pc)
        (yc * w[start:start + n]).sum().backward()
        torch.testing.assert_close(y[start:start + n], yc, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x.grad[start:start + n], xc.grad, rtol=1e-10, atol=1e-12)
        start += n


def test_hept_models_pack_flat_input(monkeypatch):
    from pointformers import models
    from pointformers.attention.hept_regions import HEPTRegions

    torch.manual_seed(0)
    model = models.build("hept-tracking", heads=2, n_layers=2, block_size=16, num_regions=4, mlp_hidden=16,
                         mlp_layers=2, dropout=0.0).double().eval()
    xs, cs, batch = _pack_inputs(model.in_dim, model.coord_dim)
    widths = []
    real_forward = HEPTRegions.forward
    monkeypatch.setattr(HEPTRegions, "forward", lambda self, pos, mask, *a, **k: widths.append(tuple(mask.shape))
                        or real_forward(self, pos, mask, *a, **k))
    with torch.no_grad():
        y = model(torch.cat(xs), torch.cat(cs), batch=batch)
        assert widths == [(1, 240)]  # once per forward (shared by the layers), on the packed row
        (x, mask), (c, _) = pad_clouds(xs), pad_clouds(cs)
        torch.testing.assert_close(y, model(x, c, mask)[mask], rtol=1e-12, atol=1e-12)


def test_packed_clouds_are_refused_by_a_mechanism_that_would_mix_them():
    from pointformers.attention import ForwardContext

    x, pos, mask = torch.randn(1, 32, 8), torch.randn(1, 32, 3), torch.ones(1, 32, dtype=torch.bool)
    ctx = ForwardContext(pos, mask, segments=((0, 16), (16, 32)))
    knn = build("knn", dim=8, heads=2, k=2, coord_dim=3)
    with pytest.raises(ValueError, match="packed in one row"):
        knn(x, pos, mask, context=ctx)
    hept = build("hept", dim=8, heads=2, coord_dim=3, block_size=16, num_regions=4)
    with pytest.raises(ValueError, match="segments: expected consecutive"):
        hept(x, pos, mask, context=ForwardContext(pos, mask, segments=((0, 10), (10, 32))))
    with pytest.raises(ValueError, match="context: flat input"):
        hept(x[0], pos[0], batch=torch.zeros(32, dtype=torch.long), context=ctx)

"""Export mode of the mechanisms (full, performer, flt, sft, samsa, serialized): the flag changes how,
never what; the graph exports with a dynamic point count; refusals name the mechanism; and the
registry's FLOP formulas and benchmark defaults equal those of pointformers.bench."""
import pytest
import torch
from torch import nn

from pointformers.attention import UnsupportedExportError, build, info, set_exportable
from pointformers.attention.flop_count import (FlopCount, dense_core, favor_features, favor_products, padded,
                                               projections)
from pointformers.bench.flops import attention_flops

DIM, HEADS = 16, 2

#: (mechanism, options); the export graph is traced for N >= the module's min_points()
CASES = [
    ("full", {}),
    ("performer", dict(nb_features=16)),
    ("flt", dict(nb_features=16, num_rpe_features=4, coord_dim=3)),
    ("flt", dict(nb_features=16, num_rpe_features=4, rpe_type="local", coord_dim=3)),
    ("flt", dict(nb_features=16, num_rpe_features=4, rpe_type="gaussian_basis", num_components=3)),
    ("flt", dict(nb_features=16, num_rpe_features=4, complex_g=True, coord_dim=3)),
    ("sft", dict(k=8)),
    ("sft", dict(k=8, rpe="points", normal_dims=1)),
    ("sft", dict(k=8, rpe="sequence", hard_eval=True, leak_mode="per_query")),
    ("samsa", dict(k=4)),
    ("samsa", dict(k=4, mode="soft")),
    ("samsa", dict(k=4, support=False, proxy="softmax_group", mode="soft")),
    ("samsa", dict(k=4, support=False)),
    ("serialized", dict(patch_size=8, coord_dim=3)),
    ("serialized", dict(patch_size=8, coord_dim=3, shift=True, curve="hilbert")),
    ("serialized", dict(patch_size=5, coord_dim=3, shift=True, layer_index=1)),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in CASES]


def make(name, options, dtype=torch.float32):
    torch.manual_seed(0)
    return build(name, dim=DIM, heads=HEADS, **options).to(dtype).eval()


def inputs(n, dtype=torch.float32, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed + n)
    return (torch.randn(batch, n, DIM, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(batch, n, 3, generator=g, dtype=torch.float64).to(dtype))


def both_modes(m, *args):
    with torch.no_grad():
        ref = m(*args)
        set_exportable(m, True)
        try:
            return m(*args), ref
        finally:
            set_exportable(m, False)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_export_mode_computes_the_same_function(name, options, dtype, tol):
    m = make(name, options, dtype)
    for n in (37, 64):
        y, ref = both_modes(m, *inputs(n, dtype))
        torch.testing.assert_close(y, ref, atol=tol, rtol=0)
    # padded batches too: the export path handles the mask as the eval forward does
    x, pos = inputs(50, dtype, batch=2)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[0, 10:23] = False
    mask[1, -5:] = False
    x[~mask] = float("nan")  # padding may hold anything
    y, ref = both_modes(m, x, pos, mask)
    torch.testing.assert_close(y, ref, atol=tol, rtol=0)
    assert torch.all(y[~mask] == 0)


class _Wrapper(nn.Module):
    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer

    def forward(self, x, pos):
        return self.mixer(x, pos)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_torch_export_with_a_dynamic_point_count(name, options):
    m = make(name, options)
    set_exportable(m, True)
    min_n = max(2, m.min_points())
    n = torch.export.Dim("n", min=min_n, max=1 << 16)
    with torch.no_grad():
        program = torch.export.export(_Wrapper(m), inputs(40), dynamic_shapes={"x": {1: n}, "pos": {1: n}},
                                      strict=False)
        for count in (57, min_n + 1):  # not the traced count
            x, pos = inputs(count, seed=1)
            set_exportable(m, False)
            ref = m(x, pos)
            set_exportable(m, True)
            torch.testing.assert_close(program.module()(x, pos), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,options,match", [
    ("knn", dict(k=4), "k-NN search"),
    ("sampled", {}, "randperm"),
    ("performer", dict(causal=True), "causal=True"),
    ("flt", dict(causal=True), "causal=True"),
    ("sft", dict(rpe="graph", edge_dim=2), "rpe='graph'"),
])
def test_set_exportable_refuses(name, options, match):
    m = build(name, dim=DIM, heads=HEADS, **options)
    assert m.export_refusal() is not None
    with pytest.raises(UnsupportedExportError, match=rf"mechanism '{name}'.*{match}"):
        set_exportable(nn.Sequential(nn.Identity(), m))
    assert not m.exportable
    assert info(name).export is None or name in ("knn", "sampled")


def test_exportable_mechanisms_have_no_refusal():
    for name, options in CASES:
        assert build(name, dim=DIM, heads=HEADS, **options).export_refusal() is None, name


MINE = ("full", "performer", "flt", "sft", "samsa", "serialized", "knn", "sampled")

#: The benchmark defaults of these mechanisms as pointformers.bench.mechanisms.OPTIONS held them before
#: they moved into the registry.
BENCH_OPTIONS = {
    "full": {},
    "performer": {"nb_features": 256},
    "flt": {"nb_features": 256, "num_rpe_features": 32, "rpe_type": "gaussian_basis"},
    "sft": {"k": 256},
    "samsa": {"k": 256},
    "sampled": {},
    "knn": {"k": 16, "coord_dim": 3},
    "serialized": {"patch_size": 1024, "coord_dim": 3},
}


def frozen_attention_flops(name, n, dim, heads, pos_dim=None, **options):
    """pointformers.bench.flops.attention_flops as it was before the formulas moved into the
    registry (its branches for these mechanisms, verbatim), the reference the registry must equal."""
    m = build(name, dim=dim, heads=heads, **options)
    H, d = heads, m.head_dim
    f = FlopCount()
    if name == "sft":
        k = min(m.k, n)
        inner = H * d
        f.add("q projection", 2 * n * dim * inner)
        f.add("k, v projections (sampled tokens)", 2 * 2 * k * dim * inner)
        f.add("out projection", 2 * n * inner * dim)
        f.add("sampler score and leak", 2 * n * dim + 2 * k * dim * H)
        f.add("maxout scores (L1, non-matmul)", H * 3 * n * k * d)
        f.add("value product", H * 2 * n * k * (d + 1))
        return f
    f.add("projections", projections(n, dim, H, d))
    if name == "full":
        f.add("attention", H * dense_core(n, d, d))
    elif name in ("performer", "flt"):
        width = d
        if name == "flt":
            r, ell = m.num_rpe_features, m.coord_dim
            f.add("rpe phases", H * 2 * n * r * ell, backward=1)
            width = d + 2 * r
        f.add("feature maps", H * favor_features(n, width, m.nb_features), backward=1)
        f.add("attention", H * favor_products(n, d, m.nb_features))
    elif name == "samsa":
        hid = m.importance[0].out_features
        k = m.k if m.support else min(m.k, n)
        f.add("importance MLP", 2 * n * dim * hid + 2 * n * hid * H)
        f.add("attention", H * dense_core(n, d, d, keys=k))
    elif name == "sampled":
        f.add("attention", H * dense_core(n, d, d, keys=2) - H * 2 * n * 2)
    elif name == "knn":
        k = min(m.k, n)
        P = pos_dim or m.coord_dim or 3
        f.add("neighbour search (cdist, non-matmul)", 3 * n * n * P, grad=False)
        f.add("attention", H * dense_core(n, d, d, keys=k))
    elif name == "serialized":
        f.add("attention", H * dense_core(padded(n, m.patch_size), d, d, keys=m.patch_size))
    return f


@pytest.mark.parametrize("name", MINE)
def test_registry_flops_and_bench_equal_the_benchmarks(name):
    """``info(name).flops`` gives, part by part, what the benchmarks counted before the formulas moved
    into the registry (and what :func:`attention_flops`, which now delegates to it, returns), and
    ``info(name).bench`` are the benchmark's former default options."""
    assert dict(info(name).bench) == BENCH_OPTIONS[name]
    variants = [dict(BENCH_OPTIONS[name]), {}]
    variants += {"samsa": [dict(k=8, support=False, imp_hidden=12)], "flt": [dict(num_rpe_features=4, coord_dim=2)],
                 "knn": [dict(k=4)], "serialized": [dict(patch_size=64)]}.get(name, [])
    for opts in variants:
        for dim, heads in ((64, 4), (24, 3)):
            m = build(name, dim=dim, heads=heads, **opts)
            for n in (5, 100, 1000, 4097):
                for pos_dim in ((None, 2) if name == "knn" else (None,)):
                    ref = frozen_attention_flops(name, n, dim, heads, pos_dim=pos_dim, **opts)
                    got = info(name).flops(m, n, dim, pos_dim)
                    now = attention_flops(name, n, dim, heads, pos_dim=pos_dim, **opts)
                    for f in (got, now):
                        assert (f.parts, f.backward) == (ref.parts, ref.backward), (name, opts, n)
                        for mode in ("forward", "train"):
                            assert f.total(mode) == ref.total(mode)

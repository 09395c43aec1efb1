"""The error–complexity study measures the real implementations, and its claims hold on small clouds."""
import math

import pytest
import torch

from pointformers.bench import approximation as A
from pointformers.bench.suite import write_intro


@pytest.fixture(scope="module")
def ball():
    torch.manual_seed(0)
    cloud = A.ball_cloud(512, seed=3)
    return cloud, A.exact_reference(cloud, rows=128)


@pytest.fixture(scope="module")
def tracking():
    cloud = A.tracking_cloud(512, seed=1)
    return cloud, A.exact_reference(cloud, rows=128)


@pytest.mark.parametrize("method,config", [("or_and", {"b": 32, "tables": 3, "G": 8.0}),
                                           ("or", {"b": 32, "tables": 3}),
                                           ("or_and_plain", {"b": 64, "tables": 2, "G": 8.0}),
                                           ("rff", {"m": 64})])
def test_implied_weights_reproduce_the_mechanisms_outputs(tracking, method, config):
    # the implied weight matrix (from the module's own sort orders / features) times V is exactly
    # what the block kernel (or Performer's linear attention) outputs for those rows
    cloud, exact = tracking
    est = A.estimate(method, cloud, exact.rows, config, seed=5)
    torch.testing.assert_close(est.weights @ cloud.v, est.output[exact.rows], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(est.weights.sum(1), torch.ones(len(exact.rows), dtype=torch.float64))


def test_one_block_covering_the_cloud_is_exact(ball):
    # HEPT with a single block (b = n) and one table computes every pair: the dense kernel
    cloud, exact = ball
    est = A.hept_estimate(cloud, exact.rows, n_hashes=1, block_size=cloud.n, seed=0, num_regions=1)
    errs = A.errors(est, exact)
    assert errs["kernel"] == 0.0 and errs["weights"] < 1e-30 and errs["output"] < 1e-24


def test_collision_counts_by_hand():
    iq = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])   # two tables, queries sorted
    ik = torch.tensor([[1, 0, 3, 2], [0, 3, 1, 2]])   # keys sorted separately
    c = A.collision_counts(iq, ik, torch.tensor([0, 2]), 4, block_size=2)
    # query 0: table 1 block 0 = keys {1, 0}; table 2 block 1 = keys {1, 2}
    # query 2: table 1 block 1 = keys {3, 2}; table 2 block 0 = keys {0, 3}
    assert c.tolist() == [[1, 2, 1, 0], [1, 0, 1, 2]]


def test_or_and_beats_or_only_at_equal_flops():
    # a local cloud: OR & AND with coordinate codes misses less kernel mass than OR-only with the
    # same blocks and tables (same FLOPs), over two seeds
    cloud = A.ball_cloud(1024, seed=0)
    exact = A.exact_reference(cloud, rows=256)
    G = exact.regions()
    errs = {m: [] for m in ("or", "or_and")}
    for seed in (0, 1):
        a = A.estimate("or", cloud, exact.rows, {"b": 32, "tables": 4}, seed)
        b = A.estimate("or_and", cloud, exact.rows, {"b": 32, "tables": 4, "G": G}, seed)
        assert a.flops == b.flops
        errs["or"].append(A.errors(a, exact))
        errs["or_and"].append(A.errors(b, exact))
    for metric in ("kernel", "weights", "output"):
        mean = {m: sum(e[metric] for e in v) / 2 for m, v in errs.items()}
        assert mean["or_and"] < 0.7 * mean["or"], (metric, mean)
    assert errs["or_and"][0]["kernel"] < exact.zero_errors()["kernel"] / 5


def test_trig_rff_matches_theorem_3_3_variance(ball):
    cloud, exact = ball
    ratios = [A.errors(A.trig_rff_estimate(cloud, exact.rows, 256, seed), exact)["kernel"]
              / A.trig_variance(exact, 256) for seed in (0, 1)]
    assert 0.8 < sum(ratios) / 2 < 1.25


def test_favor_kernel_estimate_is_unbiased_on_a_wide_kernel():
    # FAVOR+ adapted to the RBF kernel: on small-norm rows (a wide kernel) the feature product
    # converges to exp(−½‖q − k‖²)
    g = torch.Generator().manual_seed(0)
    q = 0.3 * torch.randn(64, 3, generator=g, dtype=torch.float64)
    cloud = A.Cloud("t", q, q.clone(), torch.randn(64, 2, generator=g, dtype=torch.float64), q, 1, 2, "")
    exact = A.exact_reference(cloud, rows=64)
    err = A.errors(A.favor_estimate(cloud, exact.rows, 4096, seed=0), exact)
    assert err["kernel"] < 1e-3 * exact.zero_errors()["kernel"]


def test_fronts_budgets_and_fits():
    rs = [{"method": "x", "flops": f, "kernel": e} for f, e in ((10, 1.0), (20, 2.0), (30, 0.5), (40, 0.6), (50, 0.1))]
    assert [r["flops"] for r in A.front(rs, "x", "kernel")] == [10, 30, 50]
    assert A.best_within(rs, "x", "kernel", 45)["flops"] == 30 and A.best_within(rs, "x", "kernel", 5) is None
    fr = A.front(rs, "x", "kernel")
    assert abs(A.flops_to_reach(fr, "kernel", 0.5, n=1, width=1) - 30) < 1e-9
    x = A.flops_to_reach(fr, "kernel", math.sqrt(0.5 * 0.1), n=1, width=1)   # halfway in log error
    assert abs(x - math.sqrt(30 * 50)) < 1e-9
    assert math.isnan(A.flops_to_reach(fr, "kernel", 0.01, n=1, width=1))
    pts = [{"flops": f, "kernel": 3.0 * math.exp(-0.02 * f / (10 * 4))} for f in (100, 400, 900, 2000)]
    a, c = A.exp_fit(pts, "kernel", n=10, width=4)
    assert abs(a - 3.0) < 1e-9 and abs(c - 0.02) < 1e-12


def test_write_intro_goes_under_the_title_and_keeps_sections(tmp_path):
    path = str(tmp_path / "b.md")
    with open(path, "w") as f:
        f.write("# Benchmarks\n\n<!-- speed:begin -->\nspeed table\n<!-- speed:end -->\n")
    write_intro(path, "one command")
    write_intro(path, "one command, again")
    text = open(path).read()
    assert text.startswith("# Benchmarks\n")
    assert text.count("<!-- intro:begin -->") == 1 and "one command, again" in text
    assert text.index("intro:end") < text.index("speed:begin") and "speed table" in text


def test_exact_reference_is_the_kernel_mechanism():
    # the study's target is the `kernel` mechanism's exp(−½‖q̂ − k̂‖²) attention: one head whose
    # output projection is the identity gives exactly the reference output on the same rows
    from pointformers.attention import build

    torch.manual_seed(0)
    m = build("kernel", dim=4, heads=1, coord_dim=3).double()
    with torch.no_grad():
        m.out_linear.weight.copy_(torch.eye(4))
        m.out_linear.bias.zero_()
    x = torch.randn(1, 200, 4, dtype=torch.float64)
    pos = 0.3 * torch.rand(1, 200, 3, dtype=torch.float64)
    mask = torch.ones(1, 200, dtype=torch.bool)
    q, k, v = m.augmented_qkv(x, pos, mask)
    cloud = A.Cloud("t", q[0, 0], k[0, 0], v[0, 0], pos[0], 4, 3, "")
    exact = A.exact_reference(cloud, rows=50)
    torch.testing.assert_close(exact.output, m(x, pos)[0], rtol=1e-10, atol=1e-12)
    assert exact.flops == 2 * 200 * 200 * (7 + 2) + 2 * 200 * 200 * 5  # dense_core on augmented rows

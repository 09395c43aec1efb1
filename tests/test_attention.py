"""The attention contract for full, kernel and hept: reference paths, invariances, errors."""
import math

import pytest
import torch

import pointformers
from pointformers.attention import build
from pointformers.attention.block_attention import sorted_block_attention

MECHS = {
    "full": dict(dim=16, heads=4),
    "kernel": dict(dim=16, heads=4, coord_dim=3),
    "hept": dict(dim=16, heads=4, coord_dim=3, block_size=8, n_hashes=3, num_regions=6),
}


def local_cloud(n, generator, dim=16, coord_dim=3, dtype=torch.float64):
    """Features and coordinates with local structure: clustered points, features that follow position."""
    centers = torch.randn(max(1, n // 10), coord_dim, generator=generator, dtype=dtype)
    pos = centers[torch.randint(len(centers), (n,), generator=generator)] \
        + 0.1 * torch.randn(n, coord_dim, generator=generator, dtype=dtype)
    x = torch.randn(n, dim, generator=generator, dtype=dtype) * 0.3
    x[:, :coord_dim] += pos
    return x, pos


def test_registry():
    assert {"full", "kernel", "hept"} <= set(pointformers.attention.available())
    with pytest.raises(ValueError, match="unknown attention mechanism 'nope'"):
        build("nope", dim=4)


def _copy_kernel_weights(hept, kernel):
    missing = kernel.load_state_dict(hept.state_dict(), strict=False)
    assert not missing.missing_keys


@pytest.mark.parametrize("masked", [False, True])
def test_hept_one_table_one_block_equals_kernel(masked):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    hept = build("hept", dim=16, heads=4, coord_dim=3, block_size=64, n_hashes=1, num_regions=1).double()
    kern = build("kernel", dim=16, heads=4, coord_dim=3).double()
    _copy_kernel_weights(hept, kern)
    x, pos = local_cloud(60, g)
    x, pos = x[None], pos[None]
    mask = None
    if masked:
        mask = torch.ones(1, 60, dtype=torch.bool)
        mask[0, 50:] = False
    y_h, y_k = hept(x, pos, mask), kern(x, pos, mask)
    torch.testing.assert_close(y_h, y_k, atol=1e-5, rtol=0)
    # and in float32 too, to the contract's 1e-5
    y32 = hept.float()(x.float(), pos.float(), mask)
    torch.testing.assert_close(y32, kern.float()(x.float(), pos.float(), mask), atol=1e-5, rtol=1e-4)


def _rel_err(a, b):
    return float((a - b).norm() / b.norm())


def test_hept_error_falls_with_tables_and_block_size():
    g = torch.Generator().manual_seed(1)
    x, pos = local_cloud(512, g)
    x, pos = x[None], pos[None]

    def err(n_hashes, block_size, seed=0):
        torch.manual_seed(seed)
        h = build("hept", dim=16, heads=4, coord_dim=3, block_size=block_size, n_hashes=n_hashes,
                  num_regions=1).double()
        k = build("kernel", dim=16, heads=4, coord_dim=3).double()
        _copy_kernel_weights(h, k)
        with torch.no_grad():
            h.log_omega.fill_(0.0)  # a wide kernel, so that many keys matter
            k.log_omega.fill_(0.0)
            return _rel_err(h(x, pos), k(x, pos))

    by_tables = [sum(err(t, 32, s) for s in range(3)) / 3 for t in (1, 2, 8)]
    by_block = [sum(err(1, b, s) for s in range(3)) / 3 for b in (16, 64, 256)]
    assert by_tables[0] > by_tables[1] > by_tables[2]
    assert by_block[0] > by_block[1] > by_block[2]
    assert err(1, 512) < 1e-12  # one block covering the cloud is exact


@pytest.mark.parametrize("name", list(MECHS))
def test_padding_and_batch_invariance(name):
    torch.manual_seed(0)
    attn = build(name, **MECHS[name]).double().eval()
    g = torch.Generator().manual_seed(2)
    sizes = [37, 80, 5]
    clouds = [local_cloud(n, g) for n in sizes]
    xs, m = pointformers.data.batch.pad_clouds([c[0] for c in clouds])
    ps, _ = pointformers.data.batch.pad_clouds([c[1] for c in clouds])
    with torch.no_grad():
        y_batch = attn(xs, ps, m)
        for i, (x, p) in enumerate(clouds):
            y_alone = attn(x[None], p[None])[0]
            torch.testing.assert_close(y_batch[i, : sizes[i]], y_alone, atol=1e-10, rtol=1e-10)
        assert torch.all(y_batch[~m] == 0)


def test_hept_hash_parameters_survive_state_dict_round_trip():
    torch.manual_seed(0)
    a = build("hept", **MECHS["hept"]).double()
    torch.manual_seed(123)
    b = build("hept", **MECHS["hept"]).double()
    assert not torch.equal(a.alpha, b.alpha) and not torch.equal(a.region_hash.regions, b.region_hash.regions)
    sd = a.state_dict()
    assert "alpha" in sd and "region_hash.regions" in sd
    b.load_state_dict(sd)
    assert torch.equal(a.alpha, b.alpha) and torch.equal(a.region_hash.regions, b.region_hash.regions)
    g = torch.Generator().manual_seed(3)
    x, pos = local_cloud(50, g)
    torch.testing.assert_close(a(x[None], pos[None]), b(x[None], pos[None]), atol=0, rtol=0)
    # frozen: no gradient flows to the hash parameters, they are buffers
    assert all(n not in dict(a.named_parameters()) for n in ("alpha", "region_hash.regions"))


def test_hept_region_codes_shared_context_equals_own():
    torch.manual_seed(0)
    attn = build("hept", **MECHS["hept"]).double()
    g = torch.Generator().manual_seed(4)
    x, pos = local_cloud(40, g)
    ctx = attn.prepare(pos[None])
    torch.testing.assert_close(attn(x[None], pos[None], context=ctx), attn(x[None], pos[None]), atol=0, rtol=0)
    with pytest.raises(ValueError, match="context was prepared"):
        attn(x[None, :30], pos[None, :30], context=ctx)


def test_block_attention_gradients_match_autograd():
    torch.manual_seed(0)
    G, n, D, dv, T, b = 3, 20, 5, 4, 2, 5
    q = (torch.randn(G * n, D, dtype=torch.float64) * 0.5).requires_grad_()
    k = (torch.randn(G * n, D, dtype=torch.float64) * 0.5).requires_grad_()
    v = torch.randn(G * n, dv, dtype=torch.float64, requires_grad=True)
    valid = torch.rand(G * n, generator=torch.Generator().manual_seed(0)) > 0.2
    perms = lambda: torch.stack([torch.stack([torch.randperm(n) + g * n for _ in range(T)]) for g in range(G)])
    iq, ik = perms(), perms()
    f = lambda q, k, v: sorted_block_attention(q, k, v, valid, iq, ik, b, chunk_elems=50)
    assert torch.autograd.gradcheck(f, (q, k, v))
    # and the forward equals a direct dense-per-block computation
    out = f(q, k, v)
    num = torch.zeros(G * n, dv + 1, dtype=torch.float64)
    v1 = torch.cat([v, torch.ones(G * n, 1, dtype=torch.float64)], 1) * valid[:, None]
    for g in range(G):
        for t in range(T):
            for j in range(n // b):
                rq, rk = iq[g, t, j * b:(j + 1) * b], ik[g, t, j * b:(j + 1) * b]
                s = (-0.5 * torch.cdist(q[rq], k[rk]).pow(2)).exp()
                num[rq] += s @ v1[rk]
    torch.testing.assert_close(out, num[:, :dv] / (num[:, dv:] + T * 1e-20))


def test_hept_gradients_finite_and_correct():
    # HEPT is smooth only between sort-order changes: the seed gives no hash near-tie within
    # gradcheck's eps (seed 0 has one since region sizes follow the cloud's own count)
    torch.manual_seed(1)
    h = build("hept", dim=8, heads=3, coord_dim=3, block_size=5, n_hashes=2, num_regions=4).double()
    x = torch.randn(2, 23, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 23, 3, dtype=torch.float64)
    mask = torch.rand(2, 23, generator=torch.Generator().manual_seed(0)) > 0.3
    assert torch.autograd.gradcheck(lambda x: h(x, pos, mask), (x,))
    h(x, pos, mask).pow(2).sum().backward()
    assert h.log_omega.grad is not None and torch.isfinite(h.log_omega.grad).all()
    assert h.w_q.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", list(MECHS))
def test_bad_input_errors(name):
    attn = build(name, **MECHS[name])
    x = torch.randn(1, 10, 16)
    pos = torch.randn(1, 10, 3)
    bad = pos.clone()
    bad[0, 3, 0] = float("nan")
    if name != "full":
        with pytest.raises(ValueError, match="pos contains NaN or inf"):
            attn(x, bad)
        with pytest.raises(ValueError, match="pos"):
            attn(x, None)
        with pytest.raises(ValueError, match="coordinate columns"):
            attn(x, pos[..., :2])
    xb = x.clone()
    xb[0, 1, 1] = float("inf")
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        attn(xb, pos)
    with pytest.raises(ValueError, match="empty"):
        attn(x, pos, torch.zeros(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="empty"):
        attn(x[:, :0], pos[:, :0])
    with pytest.raises(ValueError, match="feature size"):
        attn(torch.randn(1, 10, 5), pos)
    with pytest.raises(ValueError, match="mask must be a bool"):
        attn(x, pos, torch.ones(1, 10))
    with pytest.raises(ValueError, match="must be a floating"):
        attn(x.long(), pos)


def test_hept_needs_eta_phi():
    with pytest.raises(ValueError, match="coord_dim must be >= 2"):
        build("hept", dim=8, heads=2, coord_dim=1)


def test_finite_check_survives_overflowing_sums_and_nan_padding():
    """The finiteness check first sums the tensor; a sum that overflows (finite values) or a NaN in
    padding must fall back to the exact check at real points, not raise."""
    from pointformers.attention.base import check_attention_inputs

    x = torch.full((1, 4, 3), 3e38)                     # finite, but beyond the range mechanisms keep finite
    mask = torch.ones(1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"x has values up to 3e\+38 at real points"):
        check_attention_inputs(x, None, mask, dim=3)
    assert check_attention_inputs(x.double(), None, mask, dim=3).all()  # float64's range is wider
    x2 = torch.randn(2, 5, 3)
    x2[1, 4] = float("nan")                              # padding may hold anything
    mask2 = torch.ones(2, 5, dtype=torch.bool)
    mask2[1, 4] = False
    check_attention_inputs(x2, x2.clone(), mask2, dim=3)
    mask2[1, 4] = True
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        check_attention_inputs(x2, None, mask2, dim=3)


def test_gpu_chunks_are_larger_than_cpu_chunks():
    """Off the CPU the default chunk holds far more blocks (launch-bound otherwise); an explicit
    chunk size is kept on every device."""
    from pointformers.attention.block_attention import DEFAULT_CHUNK_ELEMS, DEFAULT_GPU_CHUNK_ELEMS, chunk_blocks_for
    cpu, meta = torch.empty(0), torch.empty(0, device="meta")
    assert chunk_blocks_for(DEFAULT_CHUNK_ELEMS, 100, cpu) == DEFAULT_CHUNK_ELEMS // 10_000
    assert chunk_blocks_for(DEFAULT_CHUNK_ELEMS, 100, meta) == DEFAULT_GPU_CHUNK_ELEMS // 10_000
    assert chunk_blocks_for(50_000, 100, meta) == 5


def test_hept_all_heads_at_once_equals_one_head_at_a_time():
    """The GPU layout (every head projected, sorted and attended at once) computes what the CPU
    layout (one head at a time) computes: outputs and gradients, masked padding and the authors'
    duplicate padding alike."""
    torch.manual_seed(1)
    h = build("hept", dim=8, heads=3, coord_dim=3, block_size=5, n_hashes=2, num_regions=4).double()
    x = torch.randn(2, 23, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 23, 3, dtype=torch.float64)
    mask = torch.rand(2, 23, generator=torch.Generator().manual_seed(0)) > 0.3
    outs, grads = [], []
    for all_heads in (False, True):
        h.all_heads = all_heads
        y = h(x, pos, mask)
        (g,) = torch.autograd.grad(y.pow(2).sum(), x)
        outs.append(y.detach())
        grads.append(g)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-12)
    from pointformers.models import from_reference_checkpoint

    model = from_reference_checkpoint(dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    xs, cs = torch.randn(1234, 15, generator=g, dtype=torch.float64), torch.randn(1234, 6, generator=g, dtype=torch.float64)
    with torch.no_grad():
        per_head = model(xs, cs)
        for blk in model.blocks:
            blk.mixer.all_heads = True
        at_once = model(xs, cs)
    torch.testing.assert_close(at_once, per_head, rtol=1e-9, atol=1e-9)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_hept_parallel_heads_equal_one_after_another(two_threads, monkeypatch):
    """With several intra-op threads the per-head CPU inference path runs heads in parallel
    threads, each kernel on one thread: the output equals a one-thread run bit for bit (float32,
    the published model, where a rounding difference would move points between blocks), and
    torch's thread count is restored."""
    from pointformers.attention import block_attention
    from pointformers.models import from_reference_checkpoint

    monkeypatch.setattr(block_attention, "PARALLEL_MIN_ROWS", 1000)
    model = from_reference_checkpoint()
    g = torch.Generator().manual_seed(3)
    xs, cs = torch.randn(2345, 15, generator=g), torch.randn(2345, 6, generator=g)
    calls = []
    real = block_attention.run_heads
    monkeypatch.setattr(block_attention, "run_heads", lambda fn, h, w: calls.append(w) or real(fn, h, w))
    with torch.no_grad():
        parallel = model(xs, cs)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        one_thread = model(xs, cs)
        torch.set_num_threads(2)
    assert calls[:4] == [2, 2, 2, 2] and set(calls[4:]) == {1}  # parallel at 2 threads, then one thread
    assert torch.equal(parallel, one_thread)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("parallel", [True, False])
def test_hept_head_workspaces_and_fused_projection_equal_the_plain_forward(two_threads, monkeypatch, parallel):
    """Large inputs (WORKSPACE_MIN_ROWS) reuse one workspace per worker for every head's rows, sums
    and output, square the norm columns in pieces (NORM_PIECE_ROWS) and project each head's output
    as it is made (HEPT's out_linear inside the core): one layer's output equals the plain path's
    up to the rounding of the projection's sum order (a workspace a head did not fully overwrite,
    or shared by two parallel heads, would change whole rows)."""
    from pointformers.attention import block_attention

    monkeypatch.setattr(block_attention, "PARALLEL_MIN_ROWS", 1000 if parallel else 10**9)
    torch.manual_seed(0)
    layer = build("hept", dim=24, heads=8, coord_dim=2, block_size=100, n_hashes=3, num_regions=20).eval()
    g = torch.Generator().manual_seed(5)
    x, pos = torch.randn(1, 2345, 24, generator=g), torch.randn(1, 2345, 2, generator=g)
    made, projected = [], []
    real = block_attention.HeadWorkspace.__init__
    monkeypatch.setattr(block_attention.HeadWorkspace, "__init__",
                        lambda self, *a: made.append(1) or real(self, *a))
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: projected.append(1) or real_linear(*a))
    with torch.no_grad():
        plain = layer(x, pos)
        assert not made and projected  # the plain path: no workspace, out_linear after the core
        projected.clear()
        monkeypatch.setattr(block_attention, "WORKSPACE_MIN_ROWS", 1000)
        monkeypatch.setattr(block_attention, "NORM_PIECE_ROWS", 100)
        fused = layer(x, pos)
    assert len(made) == (2 if parallel else 1) and not projected  # one per worker; no separate projection
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_run_heads_reraises_a_worker_error_and_restores_threads(two_threads):
    from pointformers.attention.block_attention import run_heads

    seen = []

    def fn(h, w):
        seen.append((h, w))
        if h == 2:
            raise ValueError("head 2 failed")

    with pytest.raises(ValueError, match="head 2 failed"):
        run_heads(fn, 4, 2)
    assert torch.get_num_threads() == 2
    assert sorted(seen)[:2] == [(0, 0), (1, 1)]  # worker w takes heads w, w + 2, …


def test_hept_training_with_kept_scores_equals_recomputed(monkeypatch):
    """Small clouds keep the forward's scores for the backward pass (STORE_SCORES_MAX); the
    gradients are the recomputing backward's bit for bit, and the kept scores are freed."""
    from pointformers.attention import block_attention

    torch.manual_seed(4)
    h = build("hept", dim=8, heads=3, coord_dim=3, block_size=5, n_hashes=2, num_regions=4)
    x = torch.randn(2, 37, 8)
    pos = torch.randn(2, 37, 3)
    mask = torch.rand(2, 37, generator=torch.Generator().manual_seed(1)) > 0.2
    kept = []
    real = block_attention._attend

    def spy(*args, keep=None, **kw):
        kept.append(keep is not None)
        return real(*args, keep=keep, **kw)

    monkeypatch.setattr(block_attention, "_attend", spy)
    grads = []
    for limit in (1 << 24, 0):  # (the rows are kept in both: only the scores differ)
        monkeypatch.setattr(block_attention, "STORE_SCORES_MAX", limit)
        xr = x.clone().requires_grad_()
        y = h(xr, pos, mask)
        grads.append(torch.autograd.grad(y.pow(2).sum(), [xr, h.w_q.weight, h.w_v.weight]))
    assert kept == [True] * 3 + [False] * 3
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n_hashes", [1, 2])
def test_hept_training_with_kept_rows_equals_per_head_rows(monkeypatch, n_hashes):
    """Small training layers project every head's rows by one GEMM and keep them (KEEP_ROWS_MAX);
    output and gradients (input, every weight, ω) equal the per-head path's to float rounding, and
    value rows padded to whole vectors (dv + 1 = 7 -> 8) give their weights no stray gradient."""
    from pointformers.attention import block_attention

    torch.manual_seed(5)
    h = build("hept", dim=12, heads=2, head_dim=6, coord_dim=3, block_size=5, n_hashes=n_hashes, num_regions=4)
    x = torch.randn(2, 33, 12)
    pos = torch.randn(2, 33, 3)
    mask = torch.rand(2, 33, generator=torch.Generator().manual_seed(2)) > 0.2
    results = []
    for limit in (1 << 23, 0):
        monkeypatch.setattr(block_attention, "KEEP_ROWS_MAX", limit)
        h.zero_grad()
        xr = x.clone().requires_grad_()
        y = h(xr, pos, mask)
        y.pow(2).sum().backward()
        results.append([y.detach(), xr.grad] + [p.grad.clone() for p in h.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(g.abs().sum() > 0 for g in results[0][2:])


def test_head_workers_range(two_threads, monkeypatch):
    """Heads run in parallel only for PARALLEL_MIN_ROWS ≤ rows ≤ PARALLEL_MAX_ROWS in CPU inference."""
    from pointformers.attention import block_attention as ba

    monkeypatch.setattr(ba, "PARALLEL_MIN_ROWS", 10)
    monkeypatch.setattr(ba, "PARALLEL_MAX_ROWS", 100)
    assert [ba.head_workers(8, torch.empty(n, 3), False) for n in (9, 10, 100, 101)] == [1, 2, 2, 1]
    assert ba.head_workers(8, torch.empty(50, 3), True) == 1  # training: one head after another
    assert ba.head_workers(1, torch.empty(50, 3), False) == 1  # never more workers than heads


def test_fused_scores_stay_clear_of_subnormal_products():
    # below float64 the fused kernel's scores are at least 2^-100: a score near e^-87 times a value row
    # underflows to subnormals, which cost a microcode assist per product on many x86 CPUs (3x slower
    # training on one); float64 keeps the floor e^-87 (exact comparisons with the authors' code)
    from pointformers.attention.block_attention import (LOGIT_FLOOR, SCORE_FLOOR_LOG2, _chunk_logits, _chunk_scores,
                                                        logit_floor)

    q = torch.tensor([[[1.0, 0.0]]])                                       # one block: 1 query, 3 keys
    k = torch.tensor([[[-1e3, 0.0], [-10.0, 0.0], [0.0, 0.0]]])            # logits -1000, -10, 0
    s32 = _chunk_scores(_chunk_logits(q, k))[0, 0]
    torch.testing.assert_close(s32, torch.tensor([2.0 ** SCORE_FLOOR_LOG2, math.exp(-10.0), 1.0]), rtol=1e-6, atol=0)
    s64 = _chunk_scores(_chunk_logits(q.double(), k.double()))[0, 0]
    torch.testing.assert_close(s64, torch.tensor([math.exp(LOGIT_FLOOR), math.exp(-10.0), 1.0], dtype=torch.float64))
    assert 2.0 ** SCORE_FLOOR_LOG2 * 1e-7 > torch.finfo(torch.float32).tiny   # a score times 1e-7 is still normal
    assert logit_floor(torch.float64) == LOGIT_FLOOR
    assert abs(logit_floor(torch.float32) - SCORE_FLOOR_LOG2 * math.log(2)) < 1e-12

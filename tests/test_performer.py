"""Performer (FAVOR+): convergence to exact softmax, prefix-sum causal path, random-feature
policy (seeds, redraw, state_dict) and the attention contract."""
import math

import pytest
import torch

import pointformers.attention.performer  # noqa: F401  (registers "performer")
from pointformers.attention import build
from pointformers.attention.random_features import orthogonal_gaussian
from pointformers.data.batch import pad_clouds


def performer(**kw):
    opts = dict(dim=16, heads=4, nb_features=32, redraw="never", seed=0)
    opts.update(kw)
    return build("performer", **opts)


def dense_softmax_reference(attn, x, mask, causal=False):
    """softmax(QKᵀ/√d)V computed from the module's weights, with key mask (and causal rule)."""
    B, N, _ = x.shape
    H, d = attn.heads, attn.head_dim
    q = attn.w_q(x).view(B, N, H, d).transpose(1, 2)
    k = attn.w_k(x).view(B, N, H, d).transpose(1, 2)
    v = attn.w_v(x).view(B, N, H, d).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)
    allowed = mask[:, None, None, :].expand(B, H, N, N)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    w = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    y = attn.out_linear((w @ v).transpose(1, 2).reshape(B, N, H * d))
    return y.masked_fill(~mask[..., None], 0.0)


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("causal", [False, True])
def test_performer_converges_to_exact_softmax(causal):
    g = torch.Generator().manual_seed(0)
    x = 0.5 * torch.randn(2, 40, 16, generator=g, dtype=torch.float64)  # small-norm q/k
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 27:] = False
    errs = {}
    for m in (64, 4096):
        e = []
        for seed in range(2):
            torch.manual_seed(0)  # same weights, different random features
            a = performer(nb_features=m, causal=causal, seed=seed, chunk_size=16).double().eval()
            with torch.no_grad():
                ref = dense_softmax_reference(a, x, mask, causal)
                torch.testing.assert_close(a.exact_attention(x, mask=mask), ref, atol=1e-12, rtol=0)
                e.append(rel_err(a(x, mask=mask), ref))
        errs[m] = sum(e) / len(e)
    assert errs[4096] < errs[64] / 2.5, errs  # Monte-Carlo error ~ 1/√m: ratio 8 in expectation
    assert errs[4096] < 0.01, errs


def _quadratic_same_features(a, x, mask, causal):
    """The FAVOR+ estimate with the module's own Ω, computed densely (N×N) without any
    stabilisation: (ϕ(Q)ϕ(K)ᵀ ⊙ allowed) V / row sums."""
    B, N, _ = x.shape
    H, d = a.heads, a.head_dim
    q = a.w_q(x).view(B, N, H, d).transpose(1, 2) * d ** -0.25
    k = a.w_k(x).view(B, N, H, d).transpose(1, 2) * d ** -0.25
    v = a.w_v(x).view(B, N, H, d).transpose(1, 2)
    om = a.features.value
    phi = lambda t: torch.exp(t @ om.T - 0.5 * t.pow(2).sum(-1, keepdim=True)) / math.sqrt(om.shape[0])
    A = phi(q) @ phi(k).transpose(-1, -2)
    allowed = mask[:, None, None, :].expand(B, H, N, N)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    A = A * allowed
    o = (A @ v) / A.sum(-1, keepdim=True).clamp_min(1e-300)
    return a.out_linear(o.transpose(1, 2).reshape(B, N, H * d)).masked_fill(~mask[..., None], 0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_paths_equal_quadratic_with_same_features(causal):
    torch.manual_seed(1)
    a = performer(causal=causal, chunk_size=5).double().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 23, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 23, dtype=torch.bool)
    mask[1, 17:] = False
    mask[2, :7] = False  # left padding: the first causal chunk has no real key at all
    with torch.no_grad():
        torch.testing.assert_close(a(x, mask=mask), _quadratic_same_features(a, x, mask, causal), atol=1e-12, rtol=1e-10)


def test_causal_chunk_size_does_not_change_result():
    torch.manual_seed(2)
    a = performer(causal=True).double().eval()
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    outs = []
    for c in (1, 4, 30, 64):
        a.chunk_size = c
        outs.append(a(x))
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-12, rtol=0)
    # causality: output at i does not depend on later inputs
    x2 = x.clone()
    x2[:, 20:] += 1.0
    torch.testing.assert_close(a(x2)[:, :20], outs[0][:, :20], atol=1e-12, rtol=0)


def test_orthogonal_features_are_orthogonal_and_gaussian_lengths():
    g = torch.Generator().manual_seed(0)
    w = orthogonal_gaussian(20, 8, g)
    assert w.shape == (20, 8)
    u = w / w.norm(dim=1, keepdim=True)
    for lo, hi in ((0, 8), (8, 16), (16, 20)):  # rows inside a block are exactly orthogonal
        torch.testing.assert_close(u[lo:hi] @ u[lo:hi].T, torch.eye(hi - lo, dtype=torch.float64), atol=1e-12, rtol=0)
    big = orthogonal_gaussian(40000, 4, g)  # marginally N(0, I): second moment ≈ I
    torch.testing.assert_close(big.T @ big / len(big), torch.eye(4, dtype=torch.float64), atol=0.03, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_and_batch_invariance(causal):
    torch.manual_seed(0)
    a = performer(dim=15, heads=3, causal=causal, chunk_size=8).double().eval()  # odd head count
    g = torch.Generator().manual_seed(3)
    sizes = [37, 50, 1, 5]
    clouds = [torch.randn(n, 15, generator=g, dtype=torch.float64) for n in sizes]
    xs, m = pad_clouds(clouds)
    xs[~m] = float("nan")  # padding content must never leak
    with torch.no_grad():
        yb = a(xs, mask=m)
        for i, c in enumerate(clouds):
            torch.testing.assert_close(yb[i, :sizes[i]], a(c[None])[0], atol=1e-10, rtol=1e-10)
    assert torch.all(yb[~m] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_key_stabiliser_is_per_cloud(causal):
    """A cloud with huge keys (very negative key exponents) batched with a small-norm cloud:
    a key max taken over the whole batch would underflow its float32 features; the max over
    the cloud's own real keys keeps batch and alone equal."""
    torch.manual_seed(0)
    a = performer(dim=15, heads=3, causal=causal).eval()
    g = torch.Generator().manual_seed(3)
    clouds = [40 * torch.randn(20, 15, generator=g), 0.1 * torch.randn(14, 15, generator=g)]
    xs, m = pad_clouds(clouds)
    with torch.no_grad():
        yb = a(xs, mask=m)
        for i, c in enumerate(clouds):
            ya = a(c[None])[0]
            assert torch.isfinite(ya).all()
            torch.testing.assert_close(yb[i, :len(c)], ya, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_single_real_point_returns_its_value(causal):
    """With one real key, softmax weights are exactly 1: y = out_linear(w_v x)."""
    torch.manual_seed(0)
    a = performer(causal=causal).double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, 3] = True  # all but one padded
    expect = a.out_linear(a.w_v(x[:, 3]))
    y = a(x, mask=mask)
    torch.testing.assert_close(y[0, 3], expect[0], atol=1e-12, rtol=0)
    assert torch.all(y[0, [0, 1, 2, 4, 5]] == 0)
    torch.testing.assert_close(a(x[:, 3:4])[0, 0], expect[0], atol=1e-12, rtol=0)  # N = 1


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    torch.manual_seed(0)
    a = performer(dim=6, heads=3, nb_features=8, causal=causal, chunk_size=3).double().eval()
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    assert torch.autograd.gradcheck(lambda x: a(x, mask=mask), (x,))
    a(x, mask=mask).pow(2).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in a.parameters())


def test_seeds_and_redraw_policy():
    x = torch.randn(2, 9, 16)
    a, b = performer(seed=5), performer(seed=5)
    torch.testing.assert_close(a.features.value, b.features.value, atol=0, rtol=0)
    assert not torch.equal(a.features.value, performer(seed=6).features.value)
    torch.manual_seed(11)
    c = performer(seed=None)
    torch.manual_seed(11)
    d = performer(seed=None)
    assert torch.equal(c.features.value, d.features.value)
    torch.testing.assert_close(c(x), d(x), atol=0, rtol=0)

    # "never": frozen even in training
    n = performer(redraw="never").train()
    w0 = n.features.value.clone()
    n(x), n(x)
    assert torch.equal(n.features.value, w0)
    # every forward in training; frozen in eval (no counter movement either)
    e = performer(redraw="every_forward_in_training").train()
    seen = [e.features.value.clone()]
    for _ in range(3):
        e(x)
        seen.append(e.features.value.clone())
    assert all(not torch.equal(seen[i], seen[i + 1]) for i in range(3))
    e.eval()
    y1, y2 = e(x), e(x)
    assert torch.equal(e.features.value, seen[-1]) and torch.equal(y1, y2) and int(e.features.train_steps) == 3
    # every N = 2 training forwards: draws change at steps 2, 4, ...
    k = performer(redraw=2).train()
    vals = []
    for _ in range(5):
        k(x)
        vals.append(k.features.value.clone())
    changed = [not torch.equal(vals[i], vals[i + 1]) for i in range(4)]
    assert changed == [False, True, False, True]
    # the state_dict carries seed, draw index and step counter: a loaded copy continues identically
    f = performer(seed=999, redraw=2).train()
    f.load_state_dict(k.state_dict())
    assert torch.equal(f.features.value, k.features.value)
    for _ in range(3):
        torch.testing.assert_close(f(x), k(x), atol=0, rtol=0)
        assert torch.equal(f.features.value, k.features.value)


def test_redrawn_features_keep_old_graph_valid():
    """Two training forwards (with a redraw between) before one backward, as in gradient accumulation."""
    a = performer(redraw="every_forward_in_training").train()
    x = torch.randn(1, 5, 16)
    loss = a(x).sum() + a(x).sum()
    loss.backward()
    assert torch.isfinite(a.w_q.weight.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtypes(dtype):
    torch.manual_seed(0)
    a = performer(nb_features=64).eval()
    x = torch.randn(2, 12, 16)
    ref = a.double()(x.double())
    a = a.to(dtype)
    y = a(x.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 0.1}[dtype]
    torch.testing.assert_close(y.double(), ref, atol=tol, rtol=0)


def test_bad_input_errors():
    a = performer()
    x = torch.randn(1, 10, 16)
    bad = x.clone()
    bad[0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        a(bad)
    bad[0, 2, 3] = float("inf")
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        a(bad)
    with pytest.raises(ValueError, match="empty"):
        a(x, mask=torch.zeros(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="empty"):
        a(x[:, :0])
    with pytest.raises(ValueError, match="feature size"):
        a(torch.randn(1, 10, 5))
    with pytest.raises(ValueError, match=r"x must be a \(B, N, D\)"):
        a(torch.randn(16))  # (a 2-D x is a flat PyG-style cloud, see test_flat_batch.py)
    with pytest.raises(ValueError, match="mask has shape"):
        a(x, mask=torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="pos must have shape"):
        a(x, pos=torch.randn(1, 9, 3))
    with pytest.raises(ValueError, match="redraw"):
        performer(redraw="sometimes")
    with pytest.raises(ValueError, match="redraw"):
        performer(redraw=0)
    with pytest.raises(ValueError, match="nb_features"):
        performer(nb_features=0)
    with pytest.raises(ValueError, match="seed"):
        performer(seed=-1)


@pytest.mark.parametrize("keys", [False, True])
def test_fused_positive_features_equal_the_reference_with_gradients(keys):
    from pointformers.attention.random_features import key_exponents, positive_features, query_features

    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 9, 5, generator=g, dtype=torch.float64)
    omega = torch.randn(7, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2] = False                      # a cloud without real keys: its key features are all 0
    w = torch.randn(3, 2, 9, 7, generator=g, dtype=torch.float64)

    def reference(x):
        if not keys:
            return query_features(x, omega)
        e = key_exponents(x, omega).masked_fill(~mask[:, None, :, None], float("-inf"))
        c = e.amax(dim=(-2, -1), keepdim=True).detach()
        return torch.exp(e - torch.where(torch.isfinite(c), c, torch.zeros_like(c)))

    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = reference(xr), positive_features(xf, omega, mask if keys else None, keys=keys)
    torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-12)
    (want * w).sum().backward()
    (got * w).sum().backward()
    torch.testing.assert_close(xf.grad, xr.grad, atol=1e-12, rtol=1e-10)
    with torch.no_grad():                # the in-place inference path
        torch.testing.assert_close(positive_features(x, omega, mask if keys else None, keys=keys), want.detach())
    if keys:
        assert bool((got[2] == 0).all()) and bool((got[1, :, 6:] == 0).all())

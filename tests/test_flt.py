"""FLT: the RPE estimator against closed-form f, FLT against exact softmax(N + QKᵀ/√d), the
chunked causal path against the quadratic computation with the same features, invariances,
random-feature policy and the attention contract."""
import math

import pytest
import torch

import pointformers.attention.flt  # noqa: F401  (registers "flt")
import pointformers.attention.performer  # noqa: F401
from pointformers.attention import build
from pointformers.data.batch import pad_clouds

F64 = torch.float64


def flt(**kw):
    opts = dict(dim=16, heads=4, nb_features=32, num_rpe_features=8, seed=0)
    opts.update(kw)
    return build("flt", **opts)


def closed_form_f(a, delta):
    """Re f(Δ) for the module's current parameters, written out from the paper's formulas
    (independently of FLTAttention.rpe_function). delta (..., ℓ) -> (..., H)."""
    d = delta.to(F64)[..., None, None, :]  # (..., 1, 1, ℓ) against (H, T)
    ell = d.shape[-1]
    w = a.rpe_w.detach().double()
    if a.rpe_type == "gaussian_mixture":
        sigma = a.sigma_max.double() * torch.sigmoid(a.rpe_sigma_raw.detach().double())
        mu = a.rpe_mu.detach().double()
        # ∫ e^{2πiΔξ} w e^{−‖ξ−μ‖²/2σ²} dξ = w (√(2π)σ)^ℓ e^{2πiΔ·μ} e^{−2π²σ²‖Δ‖²}
        amp = (math.sqrt(2 * math.pi) * sigma) ** ell * torch.exp(-2 * math.pi ** 2 * sigma ** 2 * (d ** 2).sum(-1))
        ph = 2 * math.pi * (d * mu).sum(-1)
        val = w * torch.cos(ph)
        if a.complex_g:
            val = val - a.rpe_w_imag.detach().double() * torch.sin(ph)
        return (amp * val).sum(-1)
    if a.rpe_type == "gaussian_basis":
        sigma = torch.nn.functional.softplus(a.rpe_sigma_raw.detach().double())
        return (w / (math.sqrt(2 * math.pi) * sigma) ** ell * torch.exp(-(d ** 2).sum(-1) / (2 * sigma ** 2))).sum(-1)
    v = torch.nn.functional.softplus(a.rpe_radius_raw.detach().double())
    return (w * (d.abs() <= v).all(-1).double()).sum(-1)


def sequence_pos(B, N):
    return torch.arange(N, dtype=F64).view(1, N, 1).repeat(B, 1, 1)


CASES = {  # rpe_type, ℓ, extra options
    "mixture-1d": ("gaussian_mixture", 1, {}),
    "mixture-1d-complex": ("gaussian_mixture", 1, {"complex_g": True}),
    "basis-3d": ("gaussian_basis", 3, {}),
    "local-1d": ("local", 1, {}),
}


def positions(ell, B, N, g):
    return sequence_pos(B, N) if ell == 1 else 0.8 * torch.randn(B, N, 3, generator=g, dtype=F64)


@pytest.mark.parametrize("case", list(CASES))
def test_rpe_estimate_converges_to_closed_form(case):
    rpe_type, ell, extra = CASES[case]
    g = torch.Generator().manual_seed(0)
    pos = positions(ell, 1, 30, g)
    mask = torch.ones(1, 30, dtype=torch.bool)
    errs = []
    for r in (64, 1024, 16384):
        e = []
        for seed in range(2):
            torch.manual_seed(0)  # same g, different frequencies
            a = flt(num_rpe_features=r, rpe_type=rpe_type, coord_dim=ell, seed=seed, nb_features=4, **extra).double()
            with torch.no_grad():
                a.rpe_w.mul_(4.0)
                if a.complex_g:  # a purely imaginary g: f is odd, all of it from the β features
                    a.rpe_w.zero_()
                    a.rpe_w_imag.mul_(8.0)
                n1, n2 = a.rpe_features(pos)
                p = a.centred_positions(pos, mask)
                exact = closed_form_f(a, p[:, :, None] - p[:, None]).permute(0, 3, 1, 2)  # (1, H, N, N)
                torch.testing.assert_close(a.rpe_function(p[:, :, None] - p[:, None]).permute(0, 3, 1, 2), exact)
                e.append(float((n1 @ n2.transpose(-1, -2) - exact).abs().mean()))
        errs.append(sum(e) / len(e))
    assert exact.abs().max() > 0.1  # a non-trivial RPE
    # unbiased Monte-Carlo error ~ 1/√r: 16× more frequencies -> ~4× smaller at every step (a
    # biased estimator would plateau at its bias)
    assert errs[0] > 2.8 * errs[1] and errs[1] > 2.8 * errs[2], errs
    if extra.get("complex_g"):  # an imaginary g gives an asymmetric f: f(Δ) ≠ f(−Δ)
        assert (exact + exact.transpose(-1, -2)).abs().max() < 1e-12  # odd: f(Δ) = −f(−Δ)


def dense_rpe_reference(a, x, pos, mask, causal=False):
    """softmax(f(r_i − r_j) + q·k/√d) V with the closed-form f, from the module's weights."""
    B, N, _ = x.shape
    H, d = a.heads, a.head_dim
    q, k, v = (lin(x).view(B, N, H, d).transpose(1, 2) for lin in (a.w_q, a.w_k, a.w_v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)
    logits = logits + closed_form_f(a, pos[:, :, None] - pos[:, None]).permute(0, 3, 1, 2)
    allowed = mask[:, None, None, :].expand(B, H, N, N)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    w = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    y = a.out_linear((w @ v).transpose(1, 2).reshape(B, N, H * d))
    return y.masked_fill(~mask[..., None], 0.0)


@pytest.mark.parametrize("case,causal", [("mixture-1d", True), ("basis-3d", False)])
def test_flt_converges_to_exact_rpe_softmax(case, causal):
    rpe_type, ell, extra = CASES[case]
    g = torch.Generator().manual_seed(1)
    B, N = 2, 24
    x = 0.5 * torch.randn(B, N, 16, generator=g, dtype=F64)
    pos = positions(ell, B, N, g)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 17:] = False
    errs = []
    for m, r in ((64, 16), (512, 64), (4096, 256)):
        e = []
        for seed in range(2):
            torch.manual_seed(0)  # same weights and g, different random features
            a = flt(rpe_type=rpe_type, coord_dim=ell, nb_features=m, num_rpe_features=r, causal=causal,
                    chunk_size=8, seed=seed, **extra).double().eval()
            with torch.no_grad():
                a.rpe_w.mul_(2.0)
                a.out_linear.bias.zero_()  # errors relative to the mixing itself, not to a constant bias
                ref = dense_rpe_reference(a, x, pos, mask, causal)
                e.append(float((a(x, pos, mask) - ref).norm() / ref.norm()))
        errs.append(sum(e) / len(e))
    with torch.no_grad():
        torch.testing.assert_close(a.exact_attention(x, pos, mask), ref, atol=1e-12, rtol=0)
        a.rpe_w.zero_()
        no_rpe = dense_rpe_reference(a, x, pos, mask, causal)
    rpe_effect = float((ref - no_rpe).norm() / ref.norm())
    assert errs[0] > errs[1] > errs[2], errs
    assert errs[2] < errs[0] / 3, errs
    assert errs[2] < 0.05, errs
    # the estimate really carries the RPE: much closer to softmax(N + QKᵀ/√d) than to softmax(QKᵀ/√d)
    assert errs[2] < 0.75 * rpe_effect, (errs, rpe_effect)


def quadratic_same_features(a, x, pos, mask, causal):
    """FLT's FAVOR+ estimate with the module's own Ω and ξ, built densely (N×N) with plain,
    unstabilised positive features ϕ(u) = exp(Ωu − ‖u‖²/2)/√m."""
    qh, kh, v = a.augmented_qkv(x, pos, mask)
    om = a.omega.value
    phi = lambda t: torch.exp(t @ om.T - 0.5 * t.pow(2).sum(-1, keepdim=True)) / math.sqrt(om.shape[0])
    A = phi(qh) @ phi(kh).transpose(-1, -2)
    N = x.shape[1]
    allowed = mask[:, None, None, :].expand_as(A)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    A = A * allowed
    o = (A @ v) / A.sum(-1, keepdim=True).clamp_min(1e-300)
    return a.merge_heads(o, mask, x.dtype)


@pytest.mark.parametrize("case", ["mixture-1d", "basis-3d", "local-1d"])
@pytest.mark.parametrize("causal", [True, False])
def test_linear_paths_equal_quadratic_with_same_features(case, causal):
    rpe_type, ell, extra = CASES[case]
    torch.manual_seed(2)
    a = flt(rpe_type=rpe_type, coord_dim=ell, causal=causal, chunk_size=5, **extra).double().eval()
    g = torch.Generator().manual_seed(2)
    B, N = 3, 23
    x = torch.randn(B, N, 16, generator=g, dtype=F64)
    pos = positions(ell, B, N, g)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 16:] = False
    mask[2, :7] = False  # left padding: the first chunk holds no real key
    with torch.no_grad():
        a.rpe_w.mul_(3.0)
        # the augmented logits are N̂ + q·k/√d
        qh, kh, _ = a.augmented_qkv(x, pos, mask)
        n1, n2 = a.rpe_features(pos, mask)
        q, k = (lin(x).view(B, N, 4, 4).transpose(1, 2) for lin in (a.w_q, a.w_k))
        keep = mask[:, None, :, None] & mask[:, None, None, :]
        torch.testing.assert_close((qh @ kh.transpose(-1, -2))[keep.expand(-1, 4, -1, -1)],
                                   (n1 @ n2.transpose(-1, -2) + q @ k.transpose(-1, -2) / 2.0)[keep.expand(-1, 4, -1, -1)])
        torch.testing.assert_close(a(x, pos, mask), quadratic_same_features(a, x, pos, mask, causal),
                                   atol=1e-12, rtol=1e-10)


def test_translation_invariance_3d():
    torch.manual_seed(0)
    a = flt(rpe_type="gaussian_basis").double().eval()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 30, 16, generator=g, dtype=F64)
    pos = torch.randn(2, 30, 3, generator=g, dtype=F64)
    shift = torch.tensor([100.0, -50.0, 7.25], dtype=F64)
    with torch.no_grad():
        a.rpe_w.mul_(5.0)
        torch.testing.assert_close(a(x, pos + shift), a(x, pos), atol=1e-10, rtol=0)
        # the estimator itself (without the per-cloud centring) depends only on differences
        a.centred_positions = lambda p, m: p.to(F64)
        n1, n2 = a.rpe_features(pos)
        s1, s2 = a.rpe_features(pos + shift)
        torch.testing.assert_close(s1 @ s2.transpose(-1, -2), n1 @ n2.transpose(-1, -2), atol=1e-9, rtol=0)
        assert not torch.allclose(s1, n1)  # the features themselves do move


def test_zero_rpe_is_exactly_the_performer():
    """With g = 0 the RPE columns carry nothing: FLT equals a Performer whose Ω is FLT's Ω
    restricted to the q/k columns (checks the concatenation order and the d^{-1/4} scaling)."""
    torch.manual_seed(0)
    a = flt(causal=True, chunk_size=4).double().eval()
    p = build("performer", dim=16, heads=4, nb_features=32, causal=True, chunk_size=4, redraw="never").double().eval()
    p.load_state_dict({k: v for k, v in a.state_dict().items() if k.split(".")[0] in ("w_q", "w_k", "w_v", "out_linear")},
                      strict=False)
    p.features.value = a.omega.value[:, 2 * a.num_rpe_features:].clone()
    x = torch.randn(2, 11, 16, dtype=F64)
    with torch.no_grad():
        a.rpe_w.zero_()
        torch.testing.assert_close(a(x, sequence_pos(2, 11)), p(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("case,causal", [("mixture-1d", False), ("mixture-1d", True), ("basis-3d", False),
                                         ("local-1d", True)])
def test_padding_and_batch_invariance(case, causal):
    rpe_type, ell, extra = CASES[case]
    torch.manual_seed(0)
    a = flt(dim=15, heads=3, rpe_type=rpe_type, coord_dim=ell, causal=causal, chunk_size=8, **extra).double().eval()
    g = torch.Generator().manual_seed(3)
    sizes = [37, 50, 1, 5]
    xs_, ps_ = [], []
    for n in sizes:
        xs_.append(torch.randn(n, 15, generator=g, dtype=F64))
        ps_.append(positions(ell, 1, n, g)[0] + (3.0 if ell == 3 else 0.0))
    xs, m = pad_clouds(xs_)
    ps, _ = pad_clouds(ps_)
    xs[~m] = float("nan")  # padding content never leaks
    ps[~m] = float("inf")
    with torch.no_grad():
        a.rpe_w.mul_(3.0)
        yb = a(xs, ps, m)
        for i in range(len(sizes)):
            torch.testing.assert_close(yb[i, :sizes[i]], a(xs_[i][None], ps_[i][None])[0], atol=1e-10, rtol=1e-10)
    assert torch.all(yb[~m] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_single_real_point_returns_its_value(causal):
    torch.manual_seed(0)
    a = flt(causal=causal).double().eval()
    x = torch.randn(1, 6, 16, dtype=F64)
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, 4] = True  # all but one padded
    expect = a.out_linear(a.w_v(x[:, 4]))[0]
    y = a(x, sequence_pos(1, 6), mask)
    torch.testing.assert_close(y[0, 4], expect, atol=1e-12, rtol=0)
    assert torch.all(y[0, :4] == 0) and torch.all(y[0, 5] == 0)
    torch.testing.assert_close(a(x[:, 4:5], sequence_pos(1, 1))[0, 0], expect, atol=1e-12, rtol=0)  # N = 1


@pytest.mark.parametrize("case,causal", [("mixture-1d-complex", True), ("basis-3d", False), ("local-1d", False)])
def test_gradcheck_and_parameter_gradients(case, causal):
    rpe_type, ell, extra = CASES[case]
    torch.manual_seed(0)
    a = flt(dim=6, heads=3, nb_features=8, num_rpe_features=3, num_components=2, rpe_type=rpe_type, coord_dim=ell,
            causal=causal, chunk_size=3, **extra).double().eval()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 6, generator=g, dtype=F64, requires_grad=True)
    pos = (0.3 * positions(ell, 2, 7, g)).requires_grad_()
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    assert torch.autograd.gradcheck(lambda x, p: a(x, p, mask), (x, pos))
    a(x, pos, mask).pow(2).sum().backward()
    for name, p in a.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name.startswith(("rpe_", "log_proposal")):
            assert p.grad.abs().sum() > 0, name  # g's parameters (and the learnable proposal σ) learn
    assert isinstance(a.log_proposal_std, torch.nn.Parameter) == (rpe_type == "gaussian_basis")


def test_seeds_and_redraw_policy():
    x, pos = torch.randn(2, 9, 16), sequence_pos(2, 9).float()
    a, b = flt(seed=5), flt(seed=5)
    assert torch.equal(a.omega.value, b.omega.value) and torch.equal(a.rpe_noise.value, b.rpe_noise.value)
    c = flt(seed=6)
    assert not torch.equal(a.omega.value, c.omega.value) and not torch.equal(a.rpe_noise.value, c.rpe_noise.value)
    torch.manual_seed(3)
    d = flt(seed=None)
    torch.manual_seed(3)
    e = flt(seed=None)
    torch.testing.assert_close(d(x, pos), e(x, pos), atol=0, rtol=0)
    # defaults: both frozen, even in training
    f = flt().train()
    om, eps = f.omega.value.clone(), f.rpe_noise.value.clone()
    f(x, pos), f(x, pos)
    assert torch.equal(f.omega.value, om) and torch.equal(f.rpe_noise.value, eps)
    # RPE frequencies redrawn per training forward, Ω kept; nothing moves in eval
    h = flt(redraw_rpe="every_forward_in_training").train()
    om, eps = h.omega.value.clone(), h.rpe_noise.value.clone()
    h(x, pos)
    assert torch.equal(h.omega.value, om) and not torch.equal(h.rpe_noise.value, eps)
    h.eval()
    eps = h.rpe_noise.value.clone()
    torch.testing.assert_close(h(x, pos), h(x, pos), atol=0, rtol=0)
    assert torch.equal(h.rpe_noise.value, eps)
    # state_dict round trip carries the draws and the seeds
    k = flt(seed=77, redraw_rpe="every_forward_in_training")
    k.load_state_dict(h.state_dict())
    torch.testing.assert_close(k.eval()(x, pos), h(x, pos), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtypes(dtype):
    torch.manual_seed(0)
    a = flt(nb_features=64).eval()
    x, pos = torch.randn(2, 12, 16), sequence_pos(2, 12)
    with torch.no_grad():
        ref = a.double()(x.double(), pos)
        a = a.to(dtype)
        y = a(x.to(dtype), pos.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 0.1}[dtype]
    torch.testing.assert_close(y.double(), ref, atol=tol, rtol=0)


def test_bad_input_errors():
    a = flt(rpe_type="gaussian_basis")
    x, pos = torch.randn(1, 10, 16), torch.randn(1, 10, 3)
    for val in (float("nan"), float("inf")):
        bad = pos.clone()
        bad[0, 3, 1] = val
        with pytest.raises(ValueError, match="pos contains NaN or inf"):
            a(x, bad)
        badx = x.clone()
        badx[0, 1, 1] = val
        with pytest.raises(ValueError, match="x contains NaN or inf"):
            a(badx, pos)
    with pytest.raises(ValueError, match="pos .* required"):
        a(x)
    with pytest.raises(ValueError, match="3 coordinate columns|expected 3"):
        a(x, pos[..., :1])
    with pytest.raises(ValueError, match="empty"):
        a(x, pos, torch.zeros(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="empty"):
        a(x[:, :0], pos[:, :0])
    with pytest.raises(ValueError, match="feature size"):
        a(torch.randn(1, 10, 5), pos)
    with pytest.raises(ValueError, match="pos must have shape"):
        a(x, pos[:, :9])
    with pytest.raises(ValueError, match="mask must be a bool"):
        a(x, pos, torch.ones(1, 10))
    with pytest.raises(ValueError, match="coordinate columns"):
        flt()(x, pos)  # a 1-D (sequence) FLT given 3-D positions
    with pytest.raises(ValueError, match="rpe_type"):
        flt(rpe_type="sinusoidal")
    with pytest.raises(ValueError, match="complex_g"):
        flt(rpe_type="local", complex_g=True)
    with pytest.raises(ValueError, match="num_rpe_features"):
        flt(num_rpe_features=0)
    with pytest.raises(ValueError, match="proposal_std"):
        flt(proposal_std=-1.0)
    with pytest.raises(ValueError, match="redraw"):
        flt(redraw_rpe="often")

"""Set models for amortised clustering: mixture outputs, invariances, MAB reference, loose sampling, training."""
import math

import pytest
import torch

import pointformers.models  # noqa: F401  (registers the models)
from pointformers.models import build
from pointformers.models.set_models import mixture_nll
from pointformers.nn.set_attention import ISAB, MAB, loose_key_choice
from pointformers.tasks.metrics import clustering_log_likelihoods

SETS = ["set-isab-pma", "set-isab-pma-sampled", "set-sab-pma", "mlp-set"]


def _model(name, seed=0, **kw):
    torch.manual_seed(seed)
    return build(name, **kw).double().eval()


def _mog_set(n, g):
    centres = torch.randn(4, 2, generator=g, dtype=torch.float64) * 4
    z = torch.randint(0, 4, (n,), generator=g)
    return centres[z] + 0.3 * torch.randn(n, 2, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("name", SETS)
def test_outputs_are_valid_mixtures_and_padding_never_changes_a_set(name):
    m = _model(name)
    g = torch.Generator().manual_seed(1)
    a, b = _mog_set(50, g), _mog_set(31, g)
    x = torch.full((2, 57, 2), float("nan"), dtype=torch.float64)
    mask = torch.zeros(2, 57, dtype=torch.bool)
    ia, ib = torch.randperm(57, generator=g)[:50].sort().values, torch.randperm(57, generator=g)[:31].sort().values
    x[0, ia], x[1, ib], mask[0, ia], mask[1, ib] = a, b, True, True
    with torch.no_grad():
        out = m(x, mask)
        log_pi, mu, sigma = out
        assert log_pi.shape == (2, 4) and mu.shape == sigma.shape == (2, 4, 2)
        assert torch.allclose(log_pi.logsumexp(-1), torch.zeros(2, dtype=torch.float64)) and bool((sigma > 0).all())
        for i, s in enumerate((a, b)):
            alone = m(s[None])
            for t_b, t_a in zip(out, alone):
                assert torch.allclose(t_b[i], t_a[0], atol=1e-9)


@pytest.mark.parametrize("name", ["set-isab-pma", "set-sab-pma", "mlp-set"])
def test_dense_set_models_are_permutation_invariant(name):
    m = _model(name)
    g = torch.Generator().manual_seed(2)
    s = _mog_set(40, g)
    perm = torch.randperm(40, generator=g)
    with torch.no_grad():
        for t_a, t_b in zip(m(s[None]), m(s[perm][None])):
            assert torch.allclose(t_a, t_b, atol=1e-9)


def _reference_mab(mab, X, Y):
    """Set Transformer's MAB written out: H = Q + softmax(Q_h K_hᵀ/√D) V_h (per head), out = H + ReLU(W_o H)."""
    D, h = mab.dim, mab.heads
    q, k, v = mab.fc_q(X), mab.fc_k(Y), mab.fc_v(Y)
    outs = []
    for j in range(h):
        sl = slice(j * D // h, (j + 1) * D // h)
        a = torch.softmax(q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(D), -1)
        outs.append(a @ v[..., sl])
    H = q + torch.cat(outs, -1)
    return H + torch.relu(mab.fc_o(H))


def test_mab_matches_the_written_out_reference_and_sampled_equals_full_with_two_keys():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    full = MAB(3, 5, 8, heads=2).double()
    X = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    Y = torch.randn(2, 7, 5, generator=g, dtype=torch.float64)
    assert torch.allclose(full(X, Y), _reference_mab(full, X, Y))
    # a key mask equals dropping the masked keys
    km = torch.ones(2, 7, dtype=torch.bool)
    km[0, 4:] = False
    assert torch.allclose(full(X, Y, None, km)[0], _reference_mab(full, X[:1], Y[:1, :4])[0])
    # with exactly two real keys the loose sampler picks both, so sampled == full (train and eval)
    loose = MAB(3, 5, 8, heads=2, attention="sampled").double()
    loose.load_state_dict(full.state_dict())
    km2 = torch.zeros(2, 7, dtype=torch.bool)
    km2[0, [1, 5]], km2[1, [0, 3]] = True, True
    for training in (True, False):
        loose.train(training)
        assert torch.allclose(loose(X, Y, None, km2), full(X, Y, None, km2))


def test_loose_choice_draws_two_distinct_real_keys():
    n = torch.tensor([1, 2, 5, 40])
    q_rank = torch.arange(30).expand(4, 30)
    for training in (True, False):
        r = loose_key_choice(n, q_rank, seed=7, training=training)
        assert r.shape == (4, 30, 2)
        assert bool((r >= 0).all()) and bool((r < n.view(4, 1, 1)).all())
        assert bool((r[1:, :, 0] != r[1:, :, 1]).all())              # distinct whenever n > 1
    e1, e2 = (loose_key_choice(n, q_rank, seed=7, training=False) for _ in range(2))
    assert torch.equal(e1, e2)                                        # eval: deterministic
    t1, t2 = (loose_key_choice(n, q_rank, seed=7, training=True) for _ in range(2))
    assert not torch.equal(t1, t2)                                    # training: fresh draws
    # roughly uniform over the 40 keys
    counts = torch.bincount(loose_key_choice(torch.tensor([40]), torch.arange(4000)[None], 3, False).flatten(), minlength=40)
    assert int(counts.min()) > 120 and int(counts.max()) < 290


def test_sampled_isab_attends_only_two_keys_per_row():
    torch.manual_seed(0)
    isab = ISAB(2, 8, heads=2, num_inducing=4, attention="sampled").double().eval()
    g = torch.Generator().manual_seed(4)
    X = torch.randn(1, 20, 2, generator=g, dtype=torch.float64)
    base = isab.mab0(isab.inducing.double(), X)
    # moving a point the inducing queries never drew leaves their output unchanged
    ranks = loose_key_choice(torch.tensor([20]), torch.arange(4)[None], int(isab.mab0.seed), False)
    unused = sorted(set(range(20)) - set(ranks.flatten().tolist()))
    X2 = X.clone()
    X2[0, unused[0]] += 10.0
    assert torch.allclose(isab.mab0(isab.inducing.double(), X2), base)
    X3 = X.clone()
    X3[0, int(ranks[0, 0, 0])] += 10.0
    assert not torch.allclose(isab.mab0(isab.inducing.double(), X3), base)


@pytest.mark.parametrize("name", SETS)
def test_gradients_reach_every_parameter(name):
    m = _model(name).train()
    g = torch.Generator().manual_seed(5)
    x = torch.stack([_mog_set(30, g) for _ in range(2)])
    mixture_nll(x, m(x)).backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and float(p.grad.abs().sum()) > 0, pname


def test_loss_is_the_negative_metric_and_training_improves_it():
    m = _model("set-isab-pma").float().train()
    g = torch.Generator().manual_seed(6)
    x = torch.stack([_mog_set(40, g) for _ in range(6)]).float()
    mask = torch.ones(6, 40, dtype=torch.bool)
    mask[:3, 30:] = False
    with torch.no_grad():
        before = clustering_log_likelihoods(x, m(x, mask), mask)
        assert float(mixture_nll(x, m(x, mask), mask)) == pytest.approx(-before["ll0"], rel=1e-5)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(20):
        opt.zero_grad()
        mixture_nll(x, m(x, mask), mask).backward()
        opt.step()
    with torch.no_grad():
        after = clustering_log_likelihoods(x, m(x, mask), mask)
    assert after["ll0"] > before["ll0"] + 0.5
    assert after["ll1"] >= after["ll0"] - 1e-9                      # one EM step from the prediction never hurts


def test_bad_set_inputs_raise_value_errors():
    m = _model("set-isab-pma")
    with pytest.raises(ValueError, match="feature size"):
        m(torch.zeros(1, 5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        m(torch.full((1, 5, 2), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="encoder"):
        build("set-sab-pma", attention="sampled")

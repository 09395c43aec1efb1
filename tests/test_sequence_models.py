"""Sequence models (SAMSA, FLT, full twin, MLP): padding, order, gradients, twins, RPE sharing, inputs."""
import pytest
import torch

import pointformers.models  # noqa: F401  (registers the models)
from pointformers.attention.flt import FLTAttention
from pointformers.attention.full import FullAttention
from pointformers.attention.samsa import SAMSAAttention
from pointformers.models import build

SEQ = ["samsa-seq", "flt-seq", "full-seq", "mlp-seq"]
VOCAB = 12


def _model(name, seed=0, **kw):
    torch.manual_seed(seed)
    return build(name, vocab_size=VOCAB, num_classes=4, **kw).double().eval()


@pytest.mark.parametrize("name", SEQ + ["flt-seq-exact"])
def test_padding_at_the_end_never_changes_a_sequence(name):
    m = _model("flt-seq", attention="flt_exact") if name == "flt-seq-exact" else _model(name)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, VOCAB, (30,), generator=g), torch.randint(0, VOCAB, (17,), generator=g)
    tokens = torch.full((2, 34), -5)          # padding holds invalid ids: they must be ignored
    mask = torch.zeros(2, 34, dtype=torch.bool)
    tokens[0, :30], tokens[1, :17] = a, b
    mask[0, :30], mask[1, :17] = True, True
    with torch.no_grad():
        batched = m(tokens, mask)
        assert torch.allclose(batched[0], m(a[None])[0], atol=1e-9)
        assert torch.allclose(batched[1], m(b[None])[0], atol=1e-9)
        assert torch.equal(batched, m(tokens, mask))               # eval is deterministic


@pytest.mark.parametrize("name", SEQ)
def test_order_matters_except_for_the_bag_of_tokens_baseline(name):
    m = _model(name)
    g = torch.Generator().manual_seed(2)
    t = torch.randint(0, VOCAB, (1, 25), generator=g)
    perm = torch.randperm(25, generator=g)
    with torch.no_grad():
        a, b = m(t), m(t[:, perm])
    if name == "mlp-seq":
        assert torch.allclose(a, b, atol=1e-9)
    else:   # learned absolute positions (SAMSA, full) or the learned relative RPE (FLT)
        assert not torch.allclose(a, b, atol=1e-6)


def test_sinusoidal_positions_are_fixed_and_make_order_matter():
    none, sin = _model("full-seq", positional="none"), _model("full-seq", positional="sinusoidal", dim=32)
    none32 = _model("full-seq", positional="none", dim=32)
    assert set(sin.state_dict()) == set(none32.state_dict())      # no parameter, nothing new in checkpoints
    i, j = 7, 5    # Vaswani et al.: PE[i, 2j] = sin(i / 10000^(2j/d)), PE[i, 2j + 1] = cos(...)
    assert sin.pos_table[i, 2 * j].item() == pytest.approx(torch.sin(torch.tensor(i / 10000 ** (2 * j / 32))).item())
    assert sin.pos_table[i, 2 * j + 1].item() == pytest.approx(torch.cos(torch.tensor(i / 10000 ** (2 * j / 32))).item())
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, VOCAB, (1, 25), generator=g)
    perm = torch.randperm(25, generator=g)
    with torch.no_grad():
        assert not torch.allclose(sin(t), sin(t[:, perm]), atol=1e-6)
        assert torch.allclose(none(t), none(t[:, perm]), atol=1e-9)   # full attention alone sees a set
        tokens = torch.cat([t, torch.full((1, 5), -1)], 1)
        mask = torch.cat([torch.ones(1, 25, dtype=torch.bool), torch.zeros(1, 5, dtype=torch.bool)], 1)
        assert torch.allclose(sin(tokens, mask), sin(t), atol=1e-9)
    with pytest.raises(ValueError, match="sinusoidal"):
        build("full-seq", positional="rotary")


@pytest.mark.parametrize("name", SEQ)
def test_gradients_reach_every_parameter(name):
    N = 40   # a position table of exactly N rows, so that every row is reached
    m = _model(name, **({"max_len": N} if name in ("samsa-seq", "full-seq") else {})).train()
    for mod in m.modules():   # SAMSA's shared ReZero α starts at 0
        if isinstance(getattr(mod, "alpha", None), torch.nn.Parameter):
            torch.nn.init.constant_(mod.alpha, 0.5)
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, VOCAB, (2, N), generator=g)
    out = m(t)
    (out * torch.randn(out.shape, generator=g, dtype=torch.float64)).sum().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), pname
        if "support_" not in pname and "embed.weight" not in pname:
            assert float(p.grad.abs().sum()) > 0, pname


def test_full_twin_is_the_samsa_layout_with_full_attention():
    samsa, twin = _model("samsa-seq"), _model("full-seq")
    assert all(isinstance(b.mixer, SAMSAAttention) for b in samsa.backbone.encoder.blocks)
    assert all(isinstance(b.mixer, FullAttention) for b in twin.backbone.encoder.blocks)
    assert len(samsa.backbone.encoder.blocks) == len(twin.backbone.encoder.blocks)
    # identical parameters outside the token mixers
    outside = lambda m: {k: v.shape for k, v in m.state_dict().items() if ".mixer." not in k}  # noqa: E731
    assert outside(samsa) == outside(twin)


def test_flt_seq_shares_one_rpe_across_layers_and_has_an_exact_twin():
    m = _model("flt-seq", depth=3)
    mixers = [b.mixer for b in m.blocks]
    assert all(type(x) is FLTAttention for x in mixers)
    assert all(x.rpe_w is mixers[0].rpe_w and x.rpe_noise is mixers[0].rpe_noise for x in mixers)
    assert mixers[0].omega is not mixers[1].omega          # FAVOR+ features stay per layer
    unshared = _model("flt-seq", depth=3, share_rpe=False)
    assert unshared.blocks[0].mixer.rpe_w is not unshared.blocks[1].mixer.rpe_w
    n_shared = sum(p.numel() for p in m.parameters())
    n_unshared = sum(p.numel() for p in unshared.parameters())
    per_layer_rpe = sum(p.numel() for n, p in unshared.blocks[0].mixer.named_parameters() if n.startswith("rpe_"))
    assert n_unshared - n_shared == 2 * per_layer_rpe
    exact = _model("flt-seq", depth=3, attention="flt_exact")
    exact.load_state_dict(m.state_dict())
    assert all(type(b.mixer) is FLTAttention and b.mixer.exact for b in exact.blocks)
    assert not any(b.mixer.exact for b in m.blocks)


def test_bad_token_inputs_raise_value_errors():
    m = _model("samsa-seq")
    with pytest.raises(ValueError, match="token ids"):
        m(torch.tensor([[1, 2, VOCAB]]))
    with pytest.raises(ValueError, match="integer"):
        m(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="empty"):
        m(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="max_len"):
        _model("samsa-seq", max_len=8)(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        m(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 4, dtype=torch.bool))

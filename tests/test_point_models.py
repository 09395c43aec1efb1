"""Point-cloud models: padding, permutation and rotation invariances, gradients, twins, FPS/kNN, 3-D regression."""
import math

import pytest
import torch

import pointformers.models  # noqa: F401  (registers the models)
from pointformers.attention.flt import FLTAttention
from pointformers.attention.full import FullAttention
from pointformers.attention.sampled import coordinate_cycle
from pointformers.models import build
from pointformers.models.sampled_models import farthest_point_sample, knn_group
from pointformers.models.sft_models import SFTEncoder
from pointformers.models.sft_models import PAPER_CLS

CLASSIFIERS = ["sft-cls", "sft-ri-cls", "full-cls", "samsa-cls", "sampled-cls", "sampled-hier-cls", "mlp-cls"]
SEGMENTERS = ["sft-partseg", "sft-ri-partseg", "full-partseg", "samsa-partseg", "mlp-partseg"]
REGRESSORS = ["flt-3d-reg", "full-3d-reg", "mlp-3d-reg"]


def _cloud(n, g):
    pos = torch.randn(n, 3, generator=g, dtype=torch.float64)
    normals = torch.nn.functional.normalize(torch.randn(n, 3, generator=g, dtype=torch.float64), dim=-1)
    return normals, pos


def _model(name, seed=0):
    torch.manual_seed(seed)
    if name in CLASSIFIERS:
        m = build(name, num_classes=5)
    elif name in SEGMENTERS:
        m = build(name, num_parts=6, num_categories=3)
    else:
        m = build(name)
    return m.double().eval()


def _call(name, m, x, pos, mask=None, category=None):
    if name in SEGMENTERS:
        return m(x, pos, mask, category=category)
    if name in REGRESSORS:
        return m(x[..., :1], pos, mask)
    return m(x, pos, mask)


def _random_rotation(g):
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


# ------------------------------------------------------------------------------------------------ padding
@pytest.mark.parametrize("name", CLASSIFIERS + SEGMENTERS + REGRESSORS)
def test_padding_never_changes_a_cloud_in_eval(name):
    g = torch.Generator().manual_seed(1)
    m = _model(name)
    (xa, pa), (xb, pb) = _cloud(37, g), _cloud(23, g)
    N = 45
    x = torch.full((2, N, 3), float("nan"), dtype=torch.float64)
    pos = torch.full((2, N, 3), 1e6, dtype=torch.float64)
    mask = torch.zeros(2, N, dtype=torch.bool)
    where = [torch.randperm(N, generator=g)[:37].sort().values, torch.randperm(N, generator=g)[:23].sort().values]
    for b, (xc, pc) in enumerate(((xa, pa), (xb, pb))):
        x[b, where[b]], pos[b, where[b]], mask[b, where[b]] = xc, pc, True
    cat = torch.tensor([1, 2])
    with torch.no_grad():
        batched = _call(name, m, x, pos, mask, cat)
        for b, (xc, pc) in enumerate(((xa, pa), (xb, pb))):
            alone = _call(name, m, xc[None], pc[None], None, cat[b:b + 1])
            if name in SEGMENTERS:
                assert torch.allclose(batched[b, where[b]], alone[0], atol=1e-9)
                assert bool((batched[b, ~mask[b]] == 0).all())
            else:
                assert torch.allclose(batched[b], alone[0], atol=1e-9)


# ------------------------------------------------------------------------------------------------ permutations
@pytest.mark.parametrize("name", [c for c in CLASSIFIERS if c != "sft-ri-cls"] + REGRESSORS)
def test_classifiers_are_permutation_invariant_in_eval(name):
    g = torch.Generator().manual_seed(2)
    m = _model(name)
    x, pos = _cloud(30, g)
    perm = torch.randperm(30, generator=g)
    with torch.no_grad():
        a = _call(name, m, x[None], pos[None])
        b = _call(name, m, x[perm][None], pos[perm][None])
        assert torch.allclose(a, b, atol=1e-9)
        assert torch.equal(a, _call(name, m, x[None], pos[None]))      # deterministic


@pytest.mark.parametrize("name", [s for s in SEGMENTERS if s != "sft-ri-partseg"])
def test_segmenters_are_permutation_equivariant_in_eval(name):
    g = torch.Generator().manual_seed(3)
    m = _model(name)
    x, pos = _cloud(30, g)
    perm = torch.randperm(30, generator=g)
    cat = torch.tensor([2])
    with torch.no_grad():
        a = m(x[None], pos[None], category=cat)
        b = m(x[perm][None], pos[perm][None], category=cat)
    assert torch.allclose(a[0, perm], b[0], atol=1e-9)


def test_rotation_invariant_sft_is_invariant_and_the_plain_one_is_not():
    g = torch.Generator().manual_seed(4)
    x, pos = _cloud(40, g)
    ri, plain = _model("sft-ri-cls"), _model("sft-cls")
    seg = _model("sft-ri-partseg")
    cat = torch.tensor([1])
    with torch.no_grad():
        y_ri, y_plain, y_seg = ri(x[None], pos[None]), plain(x[None], pos[None]), seg(x[None], pos[None], category=cat)
        for _ in range(3):
            R = _random_rotation(g)
            t = torch.randn(3, generator=g, dtype=torch.float64)
            assert torch.allclose(ri((x @ R.T)[None], (pos @ R.T + t)[None]), y_ri, atol=1e-8)
            assert torch.allclose(seg((x @ R.T)[None], (pos @ R.T + t)[None], category=cat), y_seg, atol=1e-8)
            assert not torch.allclose(plain((x @ R.T)[None], (pos @ R.T)[None]), y_plain, atol=1e-4)
    # the all-ones tokens do become distinct through the layers (rank injection), else the head could not tell
    enc = ri.encoder.encoder
    assert isinstance(enc, SFTEncoder) and enc.rotation_invariant
    with torch.no_grad():
        h, _ = ri.encoder(x[None], pos[None])
    assert torch.linalg.matrix_rank(h[0]) > 3


# ------------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("name", CLASSIFIERS + SEGMENTERS + REGRESSORS)
def test_gradients_reach_every_parameter(name):
    g = torch.Generator().manual_seed(5)
    m = _model(name).train()
    for mod in m.modules():   # SAMSA's ReZero α starts at 0, which would block its branches' gradients
        if hasattr(mod, "alpha") and isinstance(mod.alpha, torch.nn.Parameter):
            torch.nn.init.constant_(mod.alpha, 0.5)
    x, pos = _cloud(40, g)        # more points than the sampler bins, so every bin has a partner
    out = _call(name, m, x[None].repeat(2, 1, 1), pos[None].repeat(2, 1, 1), None, torch.tensor([0, 1]))
    (out * torch.randn(out.shape, generator=g, dtype=torch.float64)).sum().backward()
    for pname, p in m.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), pname
        if "support_" not in pname:   # SAMSA support vectors only get a gradient when they are sampled
            assert float(p.grad.abs().sum()) > 0, pname


# ------------------------------------------------------------------------------------------------ twins
def test_full_twins_use_full_attention_in_the_same_layout():
    sft, twin = _model("sft-cls"), _model("full-cls")
    assert isinstance(sft.encoder.encoder, SFTEncoder) and twin.encoder.encoder is None
    mixers = [b.mixer for b in twin.encoder.blocks]
    assert len(mixers) == len(sft.encoder.encoder.blocks) and all(isinstance(a, FullAttention) for a in mixers)
    assert twin.encoder.norm_position == sft.encoder.norm_position
    assert all(b.norm_position == twin.encoder.norm_position for b in twin.encoder.blocks)
    assert sft.encoder.embed.weight.shape == twin.encoder.embed.weight.shape
    assert sft.head.fc.weight.shape == twin.head.fc.weight.shape and twin.head.sampler is not None
    seg = _model("full-partseg")
    assert all(isinstance(b.mixer, FullAttention) for b in seg.encoder.blocks)
    samsa = build("samsa-cls", attention="full")
    assert all(isinstance(b.mixer, FullAttention) for b in samsa.backbone.encoder.blocks)
    basic = build("sampled-cls", attention="full")
    assert isinstance(basic.block.mixer, FullAttention)
    hier = build("sampled-hier-cls", attention="full")
    assert all(isinstance(b.mixer, FullAttention) for s in hier.stages for b in s)


def test_full_3d_twin_is_exact_rpe_attention_with_flt_parameters():
    flt, twin = _model("flt-3d-reg"), _model("full-3d-reg")
    assert flt.state_dict().keys() == twin.state_dict().keys()
    twin.load_state_dict(flt.state_dict())
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 15, 32, generator=g, dtype=torch.float64)
    pos = torch.randn(1, 15, 3, generator=g, dtype=torch.float64)
    for a, b in zip(flt.blocks, twin.blocks):
        assert type(a.mixer) is type(b.mixer) is FLTAttention and b.mixer.exact and not a.mixer.exact
        with torch.no_grad():
            assert torch.allclose(b.mixer(x, pos), a.mixer.exact_attention(x, pos))
    # the RPE is shared by the layers (the paper's LM sharing, ``share_rpe``)
    assert flt.blocks[0].mixer.rpe_w is flt.blocks[1].mixer.rpe_w


def test_flt_regressor_is_translation_invariant():
    g = torch.Generator().manual_seed(7)
    m = _model("flt-3d-reg")
    x, pos = _cloud(20, g)
    with torch.no_grad():
        a = m(x[None, :, :1], pos[None])
        b = m(x[None, :, :1], pos[None] + torch.tensor([3.0, -2.0, 5.0], dtype=torch.float64))
    assert torch.allclose(a, b, atol=1e-9)


# ------------------------------------------------------------------------------------------------ FPS / kNN
def test_fps_takes_the_farthest_point_each_step_and_knn_matches_brute_force():
    g = torch.Generator().manual_seed(8)
    pos = torch.randn(2, 30, 3, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 20:] = False
    counts = torch.tensor([8, 5])
    idx, valid = farthest_point_sample(pos, mask, counts)
    for b in range(2):
        n = int(mask[b].sum())
        p = pos[b, :n]
        chosen = idx[b, : int(counts[b])].tolist()
        assert chosen[0] == int((p - p.mean(0)).norm(dim=-1).argmax())
        for j in range(1, len(chosen)):
            mind = torch.cdist(p, p[chosen[:j]]).min(1).values
            assert chosen[j] == int(mind.argmax())
        assert valid[b].sum() == counts[b]
    nb, nb_valid = knn_group(pos[:, :4], pos, mask, 6)
    for b in range(2):
        n = int(mask[b].sum())
        ref = torch.cdist(pos[b, :4], pos[b, :n]).topk(6, largest=False).indices
        assert torch.equal(nb[b].sort(-1).values, ref.sort(-1).values)
    assert bool(nb_valid.all())


def test_coordinate_cycle_lists_real_points_first_and_follows_permutations():
    g = torch.Generator().manual_seed(9)
    pos = torch.randn(1, 12, 3, generator=g, dtype=torch.float64)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, [3, 7]] = False
    order = coordinate_cycle(pos, mask, seed=5)
    assert set(order[0, :10].tolist()) == set(mask[0].nonzero().flatten().tolist())
    perm = torch.randperm(12, generator=g)
    order_p = coordinate_cycle(pos[:, perm], mask[:, perm], seed=5)
    assert torch.equal(perm[order_p[0, :10]], order[0, :10])     # the same points in the same cycle order


# ------------------------------------------------------------------------------------------------ inputs
def test_bad_inputs_raise_value_errors():
    m = _model("sft-cls")
    x, pos = torch.randn(1, 10, 3, dtype=torch.float64), torch.randn(1, 10, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="NaN"):
        m(x, pos.clone().index_fill_(1, torch.tensor([2]), float("nan")))
    with pytest.raises(ValueError, match="feature size"):
        m(torch.randn(1, 10, 4, dtype=torch.float64), pos)
    with pytest.raises(ValueError, match="pos"):
        m(x, pos[..., :2])
    seg = _model("samsa-partseg")
    with pytest.raises(ValueError, match="category"):
        seg(x, pos)
    with pytest.raises(ValueError, match="category"):
        seg(x, pos, category=torch.tensor([7]))
    with pytest.raises(ValueError, match="rotation_invariant"):
        build("sft-ri-cls", attention="full")


def test_paper_options_build_the_published_sizes():
    m = build("sft-cls", **PAPER_CLS)
    assert len(m.encoder.encoder.blocks) == 8 and m.encoder.dim == 256
    attn = m.encoder.encoder.blocks[0].mixer
    assert attn.heads == 16 and attn.k == 256 and attn.sampler.drop_token == 0.5 and m.head.sampler.k == 512
    assert math.isclose(attn.qk_dropout.p, 0.1)

"""Models decide by what a mechanism declares, never by its registry name.

A model passes a mechanism the options its constructor takes (``entry(name).accepts``), asks the
built mixer what it can do (``share_rpe_with``, ``encodes_positions``), and a mechanism's own
behaviour (FLT's exact reference path, sampled attention's coordinate eval cycle) is an option of
the mechanism, in its own file. Probe mechanisms registered here for the test show that a new
mechanism gets the same treatment without any model knowing its name.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import pointformers.models  # noqa: F401  (registers the models)
from pointformers.attention import ForwardContext, MECHANISMS, register
from pointformers.attention.flt import FLTAttention
from pointformers.attention.full import FullAttention
from pointformers.attention.sampled import SampledAttention, coordinate_cycle
from pointformers.models import build
from pointformers.models.sft_models import SFTEncoder
from pointformers.nn.set_attention import ISAB, MAB

SRC = Path(__file__).resolve().parents[1] / "src" / "pointformers"
#: What a branch on a mechanism's registry name looks like.
NAME_BRANCHES = [re.compile(p) for p in (r"""attention\s*(==|!=)\s*["']""", r"""["']\s*(==|!=)\s*attention\b""",
                                         r"attention\s+(not\s+)?in\s*[(\[{]", r"isinstance\([^)]*Attention\b")]


def test_no_model_branches_on_a_mechanism_name():
    hits = [f"{path.relative_to(SRC)}:{i}: {line.strip()}"
            for folder in ("models", "nn") for path in sorted((SRC / folder).glob("*.py"))
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if any(p.search(line) for p in NAME_BRANCHES)]
    assert not hits, "\n".join(hits)


class Probe(FullAttention):
    """Full attention that records the options a model gives it."""

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, k: int | None = None,
                 eval_cycle: str | None = None, mode: str | None = None, nb_features: int | None = None,
                 causal: bool | None = None, drop_token: float | None = None, qk_dropout: float | None = None):
        super().__init__(dim, heads, head_dim)
        self.options = dict(k=k, eval_cycle=eval_cycle, mode=mode, nb_features=nb_features, causal=causal,
                            drop_token=drop_token, qk_dropout=qk_dropout)


class RelativeProbe(Probe):
    """A probe that takes relative features (``rpe``), encodes positions and shares its RPE."""

    encodes_positions = True

    def __init__(self, dim: int, heads: int = 8, k: int | None = None, rpe: str | None = None,
                 normal_dims: int | None = None, **options):
        super().__init__(dim, heads, k=k, **options)
        self.options.update(rpe=rpe, normal_dims=normal_dims)
        self.shared_with = None

    def share_rpe_with(self, other):
        self.shared_with = other


@pytest.fixture(scope="module")
def probes():
    register("probe")(Probe)
    register("probe_rel")(RelativeProbe)
    yield
    MECHANISMS.unregister("probe")
    MECHANISMS.unregister("probe_rel")


def _opts(blocks):
    return [b.mixer.options for b in blocks]


def test_models_pass_the_options_a_mechanism_takes(probes):
    basic = build("sampled-cls", attention="probe")
    assert basic.block.mixer.options["k"] == 16 and basic.block.mixer.options["eval_cycle"] == "coordinates"
    assert build("sampled-cls", attention="probe", eval_cycle="attention").block.mixer.options["eval_cycle"] is None
    assert build("sampled-cls", attention="probe", attention_options={"k": 3}).block.mixer.options["k"] == 3
    hier = build("sampled-hier-cls", attention="probe", neighbours=(4, 8))
    assert [o["k"] for s in hier.stages for o in _opts(s)] == [4, 8]
    samsa = build("samsa-cls", attention="probe", k=5, mode="soft")
    assert all(o["k"] == 5 and o["mode"] is None for o in _opts(samsa.backbone.encoder.blocks))  # mode is SAMSA's
    sft = build("sft-cls", attention="probe", k=6, drop_token=0.3, qk_dropout=0.1)
    assert sft.encoder.encoder is None
    assert all(o["k"] == 6 and o["drop_token"] == 0.3 and o["qk_dropout"] == 0.1 for o in _opts(sft.encoder.blocks))
    flt = build("flt-seq", attention="probe", nb_features=7, causal=True, share_rpe=True)
    assert all(o["nb_features"] == 7 and o["causal"] is True for o in _opts(flt.blocks))
    assert flt.pos_embed is not None          # the probe does not encode positions: learned ones are added


def test_relative_feature_mechanisms_run_in_the_sft_encoder(probes):
    m = build("sft-cls", attention="probe_rel", k=6)
    assert isinstance(m.encoder.encoder, SFTEncoder) and m.encoder.blocks is None
    assert all(o["rpe"] == "points" and o["normal_dims"] == 3 and o["k"] == 6 for o in _opts(m.encoder.encoder.blocks))
    assert build("sft-ri-cls", attention="probe_rel").encoder.rotation_invariant
    with pytest.raises(ValueError, match="rotation_invariant=True needs a mechanism that takes relative features"):
        build("sft-ri-cls", attention="probe")


def test_flt_layout_asks_the_mixer_for_positions_and_rpe_sharing(probes):
    m = build("flt-seq", attention="probe_rel", depth=3)
    assert m.pos_embed is None                # it encodes positions itself
    assert [b.mixer.shared_with for b in m.blocks] == [None, m.blocks[0].mixer, m.blocks[0].mixer]
    unshared = build("flt-seq", attention="probe_rel", depth=3, share_rpe=False)
    assert all(b.mixer.shared_with is None for b in unshared.blocks)
    assert build("flt-seq").pos_embed is None and build("flt-seq", attention="full").pos_embed is not None


# ------------------------------------------------------------------------------------------------ FLT
def test_flt_exact_is_a_constructor_flag_of_flt():
    opts = dict(heads=2, nb_features=8, num_rpe_features=4, rpe_type="gaussian_basis", coord_dim=3)
    torch.manual_seed(0)
    fast = FLTAttention(16, **opts).double()
    torch.manual_seed(0)
    exact = FLTAttention(16, exact=True, **opts).double()
    assert exact.exact and not fast.exact and "exact=True" in repr(exact)
    for (na, a), (nb, b) in zip(fast.state_dict().items(), exact.state_dict().items()):
        assert na == nb and torch.equal(a, b)
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(2, 9, 16, generator=g, dtype=torch.float64), torch.randn(2, 9, 3, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    torch.testing.assert_close(exact(x, pos, mask), fast.exact_attention(x, pos, mask), rtol=0, atol=0)
    # the models' "flt_exact" is attention="flt" with exact=True
    torch.manual_seed(0)
    a = build("flt-3d-reg", attention="flt_exact")
    torch.manual_seed(0)
    b = build("flt-3d-reg", attention="flt", attention_options={"exact": True})
    assert all(blk.mixer.exact for blk in a.blocks)
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(ta, tb)


# ------------------------------------------------------------------------------------------------ sampled
def test_coordinate_eval_cycle_is_the_mechanisms_option():
    torch.manual_seed(0)
    attn = SampledAttention(16, heads=2, eval_cycle="coordinates", seed=5).double().eval()
    ref = SampledAttention(16, heads=2, seed=5).double().eval()
    ref.load_state_dict(attn.state_dict())
    g = torch.Generator().manual_seed(2)
    x, pos = torch.randn(2, 11, 16, generator=g, dtype=torch.float64), torch.randn(2, 11, 3, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 8:] = False
    with torch.no_grad():
        y = attn(x, pos, mask)
        ctx = ref.use_order(ForwardContext(pos, mask), coordinate_cycle(pos, mask, 5), mask)
        torch.testing.assert_close(y, ref(x, pos, mask, context=ctx), rtol=0, atol=0)
        perm = torch.randperm(11, generator=g)
        torch.testing.assert_close(attn(x[:, perm], pos[:, perm], mask[:, perm]), y[:, perm], rtol=0, atol=1e-12)
        with pytest.raises(ValueError, match="pos"):
            attn(x, None, mask)
    attn.train(), ref.train()                 # training draws random cycles as before
    torch.manual_seed(3)
    y_train = attn(x, pos, mask)
    torch.manual_seed(3)
    torch.testing.assert_close(y_train, ref(x, pos, mask), rtol=0, atol=0)
    assert build("sampled-cls").block.mixer.eval_cycle == "coordinates"
    assert build("sampled-cls", eval_cycle="attention").block.mixer.eval_cycle == "seeded"


# ------------------------------------------------------------------------------------------------ sets
def test_set_attention_mode_is_the_modules_own_option_and_attention_still_works():
    torch.manual_seed(0)
    a = MAB(3, 5, 8, heads=2, mode="sampled")
    torch.manual_seed(0)
    b = MAB(3, 5, 8, heads=2, attention="sampled")
    assert a.mode == b.mode == "sampled" and MAB(3, 5, 8, heads=2, attention="full").mode == "dense"
    assert all(torch.equal(t, b.state_dict()[n]) for n, t in a.state_dict().items())
    assert ISAB(2, 8, heads=2, attention="sampled").mab0.mode == "sampled"
    with pytest.raises(ValueError, match="disagree"):
        MAB(3, 5, 8, mode="dense", attention="sampled")
    with pytest.raises(ValueError, match="mode must be"):
        MAB(3, 5, 8, mode="full")
    with pytest.raises(ValueError, match="attention must be"):
        MAB(3, 5, 8, attention="performer")
    modes = lambda m: {blk.mab0.mode for blk in m.encoder}  # noqa: E731
    assert modes(build("set-isab-pma-sampled")) == {"sampled"} and modes(build("set-isab-pma")) == {"dense"}
    assert modes(build("set-isab-pma-sampled", attention="full")) == {"dense"}
    assert modes(build("set-isab-pma", mode="sampled")) == modes(build("set-isab-pma", attention="sampled")) == {"sampled"}
    with pytest.raises(ValueError, match="encoder='sab'"):
        build("set-sab-pma", mode="sampled")

"""The one transformer block: every layout against its formula, ReZero sharing, state_dict keys, checks."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pointformers.attention import ForwardContext, TokenMixer
from pointformers.nn import RMSNorm, TransformerBlock

D = 6


class ToyMixer(TokenMixer):
    """A linear token mixer that mixes in the cloud mean (so padding matters if mishandled)."""

    def __init__(self, dim):
        super().__init__(dim, 1)
        self.lin = nn.Linear(dim, dim)
        self.calls = []

    def forward(self, x, pos=None, mask=None, context=None):
        self.calls.append(context)
        keep = mask.unsqueeze(-1)
        x = x.masked_fill(~keep, 0.0)
        mean = x.sum(1, keepdim=True) / mask.sum(1).view(-1, 1, 1)
        return self.zero_padding(self.lin(x + mean), mask)


def _norm(kind):
    return {"layer": lambda t: F.layer_norm(t, (D,)), "rms": lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6),
            "none": lambda t: t}[kind]


@pytest.mark.parametrize("norm", ["layer", "rms", "none"])
@pytest.mark.parametrize("position", ["pre", "post", "parallel"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
@pytest.mark.parametrize("rezero", [False, True])
def test_layouts_match_their_formulas(norm, position, activation, rezero):
    torch.manual_seed(0)
    blk = TransformerBlock(D, ToyMixer(D), norm=norm, norm_position=position, rezero=rezero, activation=activation,
                           ffn_mult=2).double().eval()
    if rezero:
        with torch.no_grad():
            blk.alpha.fill_(0.3)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0]], dtype=torch.bool)
    x[~mask] = float("nan")                        # padding may hold anything
    n, s = _norm(norm), (0.3 if rezero else 1.0)
    mix = lambda t: blk.mixer(t, None, mask)       # noqa: E731
    act = F.relu if activation == "relu" else F.gelu
    if activation == "swiglu":   # W₂(SiLU(W_g t) ⊙ W_u t): the gate is the first half of w_in's rows
        w_g, w_u = blk.ff.w_in.weight[:2 * D], blk.ff.w_in.weight[2 * D:]
        ffn = lambda t: (F.silu(t @ w_g.T) * (t @ w_u.T)) @ blk.ff.w_out.weight.T  # noqa: E731
    else:
        ffn = lambda t: blk.ff[-1](act(blk.ff[0](t)))  # noqa: E731
    x0 = x.masked_fill(~mask[..., None], 0.0)
    if position == "pre":
        h = x0 + s * mix(n(x0))
        ref = h + s * ffn(n(h))
    elif position == "post":
        h = n(x0 + s * mix(x0))
        ref = n(h + s * ffn(h))
    else:
        h = x0 + s * mix(n(x0))
        ref = h + s * ffn(n(x0))
    ref = ref.masked_fill(~mask[..., None], 0.0)
    torch.testing.assert_close(blk(x, None, mask), ref, atol=1e-12, rtol=0)
    assert (blk.norm2 is None) == (position == "parallel")
    assert isinstance(blk.norm1, {"layer": nn.LayerNorm, "rms": RMSNorm, "none": nn.Identity}[norm])


def test_keys_of_the_hept_layout_and_of_an_ffn_dropout():
    hept = TransformerBlock(D, ToyMixer(D), activation="relu", ffn_hidden=D, dropout=0.1)
    assert [k for k in hept.state_dict() if not k.startswith("mixer.")] == [
        "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "ff.0.weight", "ff.0.bias", "ff.2.weight",
        "ff.2.bias"]
    sft = TransformerBlock(D, ToyMixer(D), ffn_dropout=0.2)
    assert isinstance(sft.ff[2], nn.Dropout) and sft.ff[2].p == 0.2 and "ff.3.weight" in sft.state_dict()


def test_shared_rezero_is_registered_once_by_its_owner():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = nn.Parameter(torch.zeros(()))
            self.blocks = nn.ModuleList(TransformerBlock(D, ToyMixer(D), rezero=self.alpha) for _ in range(2))

    st = Stack().double()
    assert [k for k in st.state_dict() if "alpha" in k] == ["alpha"]
    assert sum(1 for n, _ in st.named_parameters() if "alpha" in n) == 1
    assert all(b.residual_scale() is st.alpha for b in st.blocks)   # .double() kept the sharing
    x = torch.randn(1, 4, D, dtype=torch.float64)
    torch.testing.assert_close(st.blocks[0](x), x)                    # α = 0: the identity
    st.blocks[1](st.blocks[0](x)).sum().backward()
    assert st.alpha.grad is not None and float(st.alpha.grad.abs()) > 0
    assert TransformerBlock(D, ToyMixer(D)).residual_scale() is None


def test_context_reaches_the_mixer_and_inputs_are_checked():
    blk = TransformerBlock(D, ToyMixer(D))
    ctx = ForwardContext(edge_attr=torch.zeros(1))
    blk(torch.randn(1, 3, D), None, None, context=ctx)
    assert blk.mixer.calls == [ctx] and ctx.inputs["edge_attr"].shape == (1,)
    with pytest.raises(ValueError, match="feature size"):
        blk(torch.randn(1, 3, D + 1))
    with pytest.raises(ValueError, match="bool"):
        blk(torch.randn(1, 3, D), None, torch.ones(1, 3))
    for bad in (dict(norm="batch"), dict(norm_position="sandwich"), dict(activation="tanh"), dict(rezero=0.5)):
        with pytest.raises(ValueError):
            TransformerBlock(D, ToyMixer(D), **bad)

"""nn.MLP: the chunked inference path computes exactly what the one-shot path computes."""
import torch

from pointformers.nn import MLP


def test_mlp_chunked_inference_equals_one_shot(monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setattr(MLP, "INFERENCE_CHUNK_ROWS", 7)  # force several chunks, the last one partial
    m = MLP([5, 16, 16, 3]).double().eval()
    x = torch.randn(2, 45, 5, dtype=torch.float64)
    with torch.no_grad():
        chunked = m(x)
    one_shot = m._rows(x)  # grad enabled here: the unchunked path
    assert chunked.shape == (2, 45, 3)
    torch.testing.assert_close(chunked, one_shot, rtol=0, atol=1e-14)
    y = m(x.requires_grad_())  # training path keeps autograd
    assert y.requires_grad


def test_fast_tanh_matches_torch_tanh_and_its_gradient():
    # float32 CPU: tanh as 2·sigmoid(2x) − 1 with tanh's own backward; extremes, NaN and float64 included
    from pointformers.nn.mlp import tanh

    x = torch.cat([torch.randn(1000) * 4, torch.tensor([0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0, 1e30, -1e30,
                                                        float("inf"), float("-inf")])]).requires_grad_()
    y = tanh(x)
    ref = torch.tanh(x.detach())
    torch.testing.assert_close(y.detach(), ref, rtol=0, atol=3e-7)
    assert torch.isnan(tanh(torch.tensor([float("nan")]))).all()
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    xr = x.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad(torch.tanh(xr), xr, g)
    torch.testing.assert_close(gx, gr, rtol=1e-5, atol=1e-6)
    xd = torch.randn(50, dtype=torch.float64)
    assert torch.equal(tanh(xd), torch.tanh(xd))  # other dtypes: torch.tanh itself
    h = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    mlp = MLP([7, 16, 5])
    with torch.no_grad():
        ref_out = mlp.lins[1](torch.tanh(mlp.norms[0](mlp.lins[0](h))))
    torch.testing.assert_close(mlp(h), ref_out, rtol=1e-5, atol=1e-6)

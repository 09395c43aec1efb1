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

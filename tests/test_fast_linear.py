"""oneDNN prepacked linear (pointformers.nn.fast_linear): same results as F.linear, cache invalidation,
fallbacks, and the SFT fast path in float32 equal to its general path with the kernels on and off."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from pointformers.attention.sft import SFTBlock
from pointformers.nn import fast_linear

needs_onednn = pytest.mark.skipif(not fast_linear.available(), reason="oneDNN linear not in this torch build")


@pytest.mark.parametrize("activation", ["none", "gelu"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_equals_f_linear(activation, use_bias):
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    x = torch.randn(37, 24, generator=g)
    ref = F.linear(x, lin.weight, lin.bias if use_bias else None)
    ref = F.gelu(ref) if activation == "gelu" else ref
    with torch.no_grad():
        got = fast_linear.linear(lin, x, activation, use_bias=use_bias)
        with fast_linear.disabled():
            plain = fast_linear.linear(lin, x, activation, use_bias=use_bias)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain, ref, rtol=1e-6, atol=1e-6)


@needs_onednn
def test_packed_weight_follows_in_place_updates():
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(11, 8)
    with torch.no_grad():
        before = fast_linear.linear(lin, x)
        lin.weight.mul_(-2.0)                       # in place: same storage, new version
        after = fast_linear.linear(lin, x)
    torch.testing.assert_close(after, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, after)


def test_fallbacks_and_bad_activation():
    lin = torch.nn.Linear(6, 3)
    x = torch.randn(4, 6, requires_grad=True)
    y = fast_linear.linear(lin, x)                  # autograd on: plain path, differentiable
    y.sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    with torch.no_grad():
        xd = torch.randn(4, 6, dtype=torch.float64)
        lind = torch.nn.Linear(6, 3).double()
        torch.testing.assert_close(fast_linear.linear(lind, xd), F.linear(xd, lind.weight, lind.bias))
        a, b = torch.randn(9, 5), torch.randn(5, 7)
        torch.testing.assert_close(fast_linear.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast_linear.matmul(a.t().contiguous().t(), b), a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="activation"):
        fast_linear.linear(lin, x, "relu")


@needs_onednn
def test_flop_counter_sees_the_onednn_kernel():
    lin = torch.nn.Linear(16, 32)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        fast_linear.linear(lin, torch.randn(10, 16))
    assert fc.get_total_flops() == 2 * 10 * 16 * 32


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("k", [4, 12])   # k' ≤ d_h (P (V Wₒᵀ) association) and k' > d_h
def test_sft_float32_fast_path_equals_general_path(onednn, norm_position, k):
    torch.manual_seed(3)
    blk = SFTBlock(32, heads=4, k=k, norm_position=norm_position).eval()
    x = torch.randn(3, 50, 32)
    with torch.no_grad():
        if onednn:
            fast = blk(x)
        else:
            with fast_linear.disabled():
                fast = blk(x)
        blk.mixer.fast_inference = False
        general = blk(x)
    torch.testing.assert_close(fast, general, rtol=1e-4, atol=1e-4)


def test_traced_graphs_keep_portable_linear_ops():
    """A jit trace taken without autograd must not record the private oneDNN op."""
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return fast_linear.linear(self.lin, x)

    head = Head()
    with torch.no_grad():
        traced = torch.jit.trace(head, torch.randn(3, 8))
    assert "mkldnn" not in str(traced.graph)
    x = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), F.linear(x, head.lin.weight, head.lin.bias))

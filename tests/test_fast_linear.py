"""oneDNN prepacked linear (pointformers.nn.fast_linear): same results as F.linear, cache invalidation,
fallbacks, and the SFT fast path in float32 equal to its general path with the kernels on and off."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
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


class _CountOps(TorchDispatchMode):
    """Counts the oneDNN ops (packing and the prepacked linear) that run inside the block."""

    def __init__(self):
        super().__init__()
        self.counts = {"pack": 0, "linear": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "_reorder_linear_weight" in name:
            self.counts["pack"] += 1
        elif "_linear_pointwise" in name:
            self.counts["linear"] += 1
        return func(*args, **(kwargs or {}))


@needs_onednn
def test_training_never_packs_weights_and_inference_still_uses_onednn():
    """A training step (grad on; HEPT's projections run inside a custom autograd Function, where
    autograd is off but the weights change every step) takes the plain path: no packing; an eval
    forward without grad still uses oneDNN, and the two give the same embedding."""
    from pointformers import models
    from pointformers.tasks.tracking.core import generated_inputs

    torch.manual_seed(0)
    model = models.build("hept-tracking", n_layers=2, num_regions=4, dropout=0.0)
    x, coords = generated_inputs(300)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    with _CountOps() as ops:
        opt.zero_grad()
        model(x, coords).pow(2).mean().backward()
        opt.step()
    assert ops.counts == {"pack": 0, "linear": 0}
    model.eval()
    with torch.no_grad():
        with _CountOps() as ops:
            fast = model(x, coords)
        with fast_linear.disabled():
            plain = model(x, coords)
    assert ops.counts["pack"] > 0 and ops.counts["linear"] > 0
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_matmul_inside_an_autograd_function_of_a_training_pass_is_plain(monkeypatch):
    class Proj(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return fast_linear.matmul(x, w.view(2, -1, 8)[1].T)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            fast_linear.matmul(x, w.view(2, -1, 8)[1].T)  # as a recomputing backward does
            dw = torch.zeros_like(w)
            dw.view(2, -1, 8)[1] = g.T @ x
            return g @ w.view(2, -1, 8)[1], dw

    x, w = torch.randn(40, 8, requires_grad=True), torch.randn(10, 8, requires_grad=True)
    with _CountOps() as ops:
        y = Proj.apply(x, w)
        y.sum().backward()
    assert ops.counts == {"pack": 0, "linear": 0}
    assert torch.equal(y, torch.mm(x, w.view(2, -1, 8)[1].T))   # plain mm: bit for bit
    with torch.no_grad(), _CountOps() as ops:  # inference, fewer rows than MATMUL_MIN_ROWS: plain mm
        y2 = Proj.apply(x.detach(), w.detach())
    assert ops.counts == {"pack": 0, "linear": 0}
    monkeypatch.setattr(fast_linear, "MATMUL_MIN_ROWS", 40)
    with torch.no_grad(), _CountOps() as ops:  # enough rows: packed for oneDNN
        y2 = Proj.apply(x.detach(), w.detach())
    assert ops.counts == {"pack": 1, "linear": 1}
    torch.testing.assert_close(y2, y.detach(), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_packed_weight_is_cached_per_weight_version():
    """One pack per weight version: reused while the weight is unchanged, refreshed after an
    optimiser step (in place) or when the module gets another weight tensor."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(16, 12)
    x = torch.randn(30, 16)
    opt = torch.optim.Adam(lin.parameters(), lr=0.1)

    def packs_and_check():
        with torch.no_grad(), _CountOps() as ops:
            y = fast_linear.linear(lin, x)
        torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        return ops.counts["pack"]

    lin.eval()
    assert packs_and_check() == 1
    assert packs_and_check() == 0                  # cached
    lin.train()
    opt.zero_grad()
    F.mse_loss(lin(x), torch.zeros(30, 12)).backward()
    opt.step()                                     # in-place update: a new version
    lin.eval()
    assert packs_and_check() == 1
    assert packs_and_check() == 0
    lin.weight = torch.nn.Parameter(torch.randn(12, 16))   # another tensor
    assert packs_and_check() == 1
    with torch.no_grad():
        lin.weight.data.mul_(3.0)                  # through .data: no new version, forget() is needed
    fast_linear.forget(lin)
    assert packs_and_check() == 1

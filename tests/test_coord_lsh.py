"""coord_lsh: softmax attention in blocks of points hashed on (η, φ), hash rounds merged by their
log-sum-exp (the track-reconstruction encoder's attention, issue 24)."""
import pytest
import torch

import pointformers.attention.coord_lsh as coord_lsh
from pointformers.attention import ForwardContext, build, set_exportable


def _attn(**options):
    torch.manual_seed(0)
    opts = dict(dim=16, heads=2, coord_dim=3, block_size=8, n_hashes=3, num_regions=4)
    return build("coord_lsh", **{**opts, **options}).double()


def _inputs(B=2, N=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, 16, generator=g, dtype=torch.float64)
    pos = torch.rand(B, N, 3, generator=g, dtype=torch.float64) * torch.tensor([4.0, 6.0, 1.0], dtype=torch.float64)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 25:] = False
    return x, pos, mask


@pytest.mark.parametrize("qk_norm", [True, False])
def test_equals_the_dense_formula_over_the_rounds_blocks(qk_norm):
    # each key weighted by the number of rounds that put it in the query's block: the LSE merge is the
    # softmax over the union of the rounds' blocks
    attn = _attn(qk_norm=qk_norm)
    x, pos, mask = _inputs()
    y = attn(x, pos, mask)
    torch.testing.assert_close(y, attn.reference(x, pos, mask))
    assert bool((y[1, 25:] == 0).all())
    torch.testing.assert_close(attn(x[1:, :25], pos[1:, :25])[0], y[1, :25])  # alone = in a padded batch
    with torch.no_grad():   # inference: the in-place block softmax, with empty blocks (padding) and chunks
        torch.testing.assert_close(attn(x, pos, mask), y)
        attn.chunk_elems = 64
        torch.testing.assert_close(attn(x, pos, mask), y)


@pytest.mark.parametrize("n_hashes", [1, 3])
def test_blocks_as_large_as_the_cloud_give_full_softmax_attention(n_hashes):
    attn = _attn(block_size=64, n_hashes=n_hashes, qk_norm=False)
    full = build("full", dim=16, heads=2).double()
    full.load_state_dict({k: v for k, v in attn.state_dict().items() if k.split(".")[0] in ("w_q", "w_k", "w_v",
                                                                                           "out_linear")})
    x, pos, mask = _inputs()
    torch.testing.assert_close(attn(x, pos, mask), full(x, mask=mask))


def test_one_order_per_round_and_head_from_eta_phi_alone():
    attn = _attn()
    x, pos, mask = _inputs()
    order = attn.prepare(pos, mask)
    assert order.shape == (2, 3, 2, 37)
    assert bool((order.sort(-1).values == torch.arange(37)).all())  # a permutation per (cloud, round, head)
    assert bool((order[1, ..., :25].sort(-1).values == torch.arange(25)).all())  # real points first
    other = pos.clone()
    other[..., 2] = torch.randn(2, 37, dtype=torch.float64)  # a column that is not η or φ
    assert torch.equal(attn.prepare(other, mask), order)
    moved = pos.clone()
    moved[..., 1] = moved[..., 1].flip(-1)  # φ changes: the orders change
    assert not torch.equal(attn.prepare(moved, mask), order)
    assert not torch.equal(order[:, 0], order[:, 1])  # rounds hash differently


def test_blocks_are_local_in_eta_phi():
    # a block's points are neighbours in (η, φ): their spread is far below that of random blocks
    attn = _attn(block_size=16, n_hashes=2, num_regions=9)
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(1, 1024, 3, generator=g, dtype=torch.float64)
    order = attn.prepare(pos, torch.ones(1, 1024, dtype=torch.bool))
    blocks = pos[0, order[0].reshape(-1), :2].view(-1, 16, 2)
    spread = blocks.std(1).mean()
    assert float(spread) < 0.4 * float(pos[0, :, :2].std(0).mean())


@pytest.mark.parametrize("fused", [True, False], ids=["fused-cpu-kernel", "score-buffer"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inference_block_softmax_equals_the_autograd_one(monkeypatch, fused, dtype):
    if fused:
        assert coord_lsh._FLASH_CPU is not None   # torch 2.13 has the kernel: the fast path is tested
    else:
        monkeypatch.setattr(coord_lsh, "_FLASH_CPU", None)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, 8, 4, generator=g, dtype=dtype) for _ in range(3))
    ok = torch.rand(5, 8, generator=g) > 0.3
    ok[2] = False                       # a block without keys: o = 0, lse very negative
    v[~ok] = 0.0                        # as the empty slots' table row
    for keys in (ok, torch.ones_like(ok)):   # a chunk with empty slots, and one without
        o, lse = coord_lsh.block_softmax(q, k, v, keys, 0.5)
        oi, lsei = coord_lsh.block_softmax_inference(q, k, v, keys, 0.5)
        torch.testing.assert_close(oi, o)
        torch.testing.assert_close(lsei[keys.any(-1)], lse[keys.any(-1)])
    oi, lsei = coord_lsh.block_softmax_inference(q, k, v, ok, 0.5)
    assert bool((oi[2] == 0).all()) and bool((lsei[2] < -1e30).all())


def _grads(attn, x, pos, mask, fused: bool):
    """Output and gradients (x, then every parameter) of a weighted sum of the output; ``fused``: the fused
    CPU kernel's training path, else the score-tensor path (the math backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    attn.zero_grad()
    xg = x.clone().requires_grad_()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION if fused else SDPBackend.MATH):
        y = attn(xg, pos, mask)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    return [y.detach(), xg.grad] + [p.grad.clone() for p in attn.parameters()]


@pytest.mark.parametrize("qk_norm", [True, False])
def test_the_fused_training_path_has_the_exact_gradients(qk_norm):
    """Training on the CPU runs every round through the fused kernel and its backward, given the merged output and
    log-sum-exp: the same outputs and gradients (input and every parameter) as autograd through the score tensors
    and as the dense reference, with padding and a block without keys (the padded cloud's last block)."""
    assert coord_lsh._FLASH_CPU_BACKWARD is not None   # torch 2.13 has the kernel: the fast path is tested
    attn = _attn(qk_norm=qk_norm)
    x, pos, mask = _inputs()
    fused, scores = _grads(attn, x, pos, mask, True), _grads(attn, x, pos, mask, False)
    for a, b in zip(fused, scores):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    attn.zero_grad()
    xr = x.clone().requires_grad_()
    y = attn.reference(xr, pos, mask)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    torch.testing.assert_close(fused[1], xr.grad)
    assert float(fused[1][0].abs().sum()) > 0 and bool((fused[1][1, 25:] == 0).all())


def test_export_mode_chunks_and_recomputation_give_the_same_function(monkeypatch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    attn = _attn()
    x, pos, mask = _inputs()
    y = attn(x, pos, mask)
    set_exportable(attn)
    torch.testing.assert_close(attn(x, pos, mask), y)
    set_exportable(attn, False)
    attn.chunk_elems = 64  # one block per chunk
    torch.testing.assert_close(attn(x, pos, mask), y)
    with sdpa_kernel(SDPBackend.MATH):   # the score-tensor path, where chunks are stored or recomputed
        xg = x.clone().requires_grad_()
        attn(xg, pos, mask).pow(2).sum().backward()
        monkeypatch.setattr(coord_lsh, "STORE_SCORES_MAX", 0)  # every chunk recomputed in the backward pass
        xr = x.clone().requires_grad_()
        attn(xr, pos, mask).pow(2).sum().backward()
    torch.testing.assert_close(xr.grad, xg.grad)
    assert float(xg.grad.abs().sum()) > 0


def test_context_shares_the_orders_and_the_draws_survive_a_state_dict():
    attn = _attn()
    x, pos, mask = _inputs()
    ctx = ForwardContext(pos, mask)
    y = attn(x, pos, mask, context=ctx)
    assert len(ctx) == 1 and torch.equal(attn(x, pos, mask, context=ctx), y)
    torch.manual_seed(1)
    other = build("coord_lsh", dim=16, heads=2, coord_dim=3, block_size=8, n_hashes=3, num_regions=4).double()
    assert not torch.equal(other.directions, attn.directions)
    other.load_state_dict(attn.state_dict())
    torch.testing.assert_close(other(x, pos, mask), y)
    attn.reset_parameters()
    assert torch.equal(attn.directions, other.directions) and torch.equal(attn.regions, other.regions)


def test_bad_options_name_the_argument():
    for bad, match in ((dict(coord_dim=1), "coord_dim"), (dict(block_size=0), "block_size"),
                       (dict(n_hashes=0), "n_hashes"), (dict(chunk_elems=0), "chunk_elems"),
                       (dict(num_regions=0), "num_regions")):
        with pytest.raises(ValueError, match=match):
            build("coord_lsh", dim=16, heads=2, **bad)
    attn = _attn()
    x, pos, mask = _inputs()
    with pytest.raises(ValueError, match="pos"):
        attn(x, pos[..., :2], mask)
    with pytest.raises(ValueError, match="orders are for"):
        attn(x[:, :30], pos[:, :30], mask[:, :30], context=_context_for(attn, pos, mask))


def _context_for(attn, pos, mask):
    ctx = ForwardContext(pos, mask)
    ctx.put(attn.prepare_key(), attn.prepare(pos, mask))
    return ctx

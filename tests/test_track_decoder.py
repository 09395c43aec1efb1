"""The track-slot decoder (pointformers.nn.track_decoder) and its set criterion
(pointformers.tasks.tracking.set_criterion): matcher against brute force, slot-order invariance of the
loss, padding never assigned, sectors batched equal sectors run alone, the φ-sector cut."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from pointformers.nn.track_decoder import (DecoderOutput, TrackDecoder, assign_hits, gather_sectors, labels_to_hits,
                                           Sectors, phi_sectors, sector_frame)
from pointformers.tasks.tracking.set_criterion import (SetCriterionWeights, dice_loss, match_slots, pair_costs,
                                                       sector_targets, set_loss, sigmoid_focal)


def _brute_force(cost: np.ndarray) -> float:
    m, t = cost.shape
    if m >= t:
        return min(sum(cost[p[j], j] for j in range(t)) for p in itertools.permutations(range(m), t))
    return min(sum(cost[i, p[i]] for i in range(m)) for p in itertools.permutations(range(t), m))


@pytest.mark.parametrize("m,t", [(5, 3), (4, 4), (3, 5), (6, 1), (1, 1)])
def test_matcher_equals_brute_force(m, t):
    g = torch.Generator().manual_seed(m * 10 + t)
    for _ in range(5):
        n = 12
        obj, assign = torch.randn(m, generator=g), torch.randn(m, n, generator=g) * 3
        mask = torch.rand(n, generator=g) > 0.2
        targets = (torch.rand(t, n, generator=g) > 0.6) & mask
        cost = pair_costs(obj, assign, mask, targets)
        rows, cols = match_slots(cost)
        assert len(rows) == min(m, t) and len(set(rows)) == len(rows) and len(set(cols)) == len(cols)
        c = cost.double().numpy()                                       # the matcher solves it in float64
        assert float(c[rows, cols].sum()) == pytest.approx(_brute_force(c), abs=1e-9)


@pytest.mark.parametrize("alpha,gamma,scale", [(0.3, 1.5, 1.0), (0.25, 2.0, 8.0)])
def test_pair_costs_equal_the_losses_of_each_pair(alpha, gamma, scale):
    """The matrix-product cost of a pair is the loss of that pair computed elementwise (γ = 2 takes a path of
    its own; large logits reach the saturated ends of the sigmoid)."""
    g = torch.Generator().manual_seed(0)
    m, t, n = 4, 3, 20
    obj, assign = torch.randn(m, generator=g, dtype=torch.float64), torch.randn(m, n, generator=g, dtype=torch.float64) * scale
    mask = torch.rand(n, generator=g) > 0.3
    targets = (torch.rand(t, n, generator=g) > 0.5) & mask
    w = SetCriterionWeights(cls=0.7, focal=3.0, dice=2.0, alpha=alpha, gamma=gamma)
    cost = pair_costs(obj, assign, mask, targets, w)
    wm = mask.double()
    for i in range(m):
        for j in range(t):
            tj = targets[j].double()
            focal = float((sigmoid_focal(assign[i], tj, alpha, gamma) * wm).sum() / wm.sum())
            dice = float(dice_loss(torch.sigmoid(assign[i])[None], tj[None], wm)[0])
            want = -0.7 * float(torch.sigmoid(obj[i])) + 3.0 * focal + 2.0 * dice
            assert float(cost[i, j]) == pytest.approx(want, rel=1e-10)


def test_focal_loss_equals_its_definition():
    x = torch.tensor([-2.0, 0.0, 1.5, 3.0], dtype=torch.float64)
    t = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    p = torch.sigmoid(x)
    want = -0.25 * t * (1 - p) ** 2 * torch.log(p) - 0.75 * (1 - t) * p ** 2 * torch.log(1 - p)
    torch.testing.assert_close(sigmoid_focal(x, t), want)


def _sector_problem(seed: int, s: int = 2, m: int = 6, n: int = 15):
    g = torch.Generator().manual_seed(seed)
    obj = torch.randn(s, m, generator=g, dtype=torch.float64, requires_grad=True)
    assign = torch.randn(s, m, n, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(s, n, generator=g) > 0.25
    pid = torch.randint(0, 5, (s, n), generator=g)
    targets = [sector_targets(pid[i], mask[i], torch.ones(n, dtype=torch.bool), min_hits=1)[0] for i in range(s)]
    return obj, assign, mask, targets


def test_loss_is_invariant_to_the_order_of_the_slots():
    obj, assign, mask, targets = _sector_problem(1)
    perm = torch.randperm(obj.shape[1], generator=torch.Generator().manual_seed(3))
    a = set_loss(obj, assign, mask, targets)
    b = set_loss(obj[:, perm], assign[:, perm], mask, targets)
    for key in ("loss", "cls", "focal", "dice"):
        assert a[key].item() == pytest.approx(b[key].item(), rel=1e-12)
    # and the loss does depend on which slot predicts what: two slots' assignments swapped change it
    swapped = assign.detach().clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]
    assert set_loss(obj, swapped, mask, targets)["loss"].item() != pytest.approx(a["loss"].item(), rel=1e-6)


def test_loss_ignores_padding_and_is_differentiable():
    obj, assign, mask, targets = _sector_problem(2)
    base = set_loss(obj, assign, mask, targets)
    noisy = assign.detach().clone()
    noisy[~mask[:, None, :].expand_as(noisy)] = 1e3   # anything at padding hits
    again = set_loss(obj, noisy, mask, targets)
    assert again["loss"].item() == pytest.approx(base["loss"].item(), rel=1e-12)
    base["loss"].backward()
    assert torch.isfinite(assign.grad).all() and float(assign.grad.abs().sum()) > 0
    assert bool((assign.grad[~mask[:, None, :].expand_as(assign)] == 0).all())


def test_perfect_prediction_has_a_lower_loss_than_a_random_one():
    obj, assign, mask, targets = _sector_problem(4)
    good_obj = torch.full_like(obj, -8.0)
    good = torch.full_like(assign, -8.0)
    for s, t in enumerate(targets):
        good_obj[s, : t.shape[0]] = 8.0
        good[s, : t.shape[0]] = torch.where(t, 8.0, -8.0).double()
    assert set_loss(good_obj, good, mask, targets)["loss"].item() < 0.05 * set_loss(obj, assign, mask, targets)["loss"].item()


@pytest.mark.parametrize("no_object", [1.0, 0.1])
def test_no_object_weight_is_the_weighted_mean_of_the_class_term(no_object):
    # DETR's eos_coef: matched slots weigh 1, unmatched ones no_object, the term is the weighted mean;
    # 1 is the plain mean; the assignment terms do not change
    obj, assign, mask, targets = _sector_problem(5)
    weights = SetCriterionWeights(no_object=no_object)
    matches = [match_slots(pair_costs(obj[s], assign[s], mask[s], targets[s], weights)) for s in range(obj.shape[0])]
    got = set_loss(obj, assign, mask, targets, weights, matches)
    y = torch.zeros_like(obj)
    for s, (rows, _) in enumerate(matches):
        y[s, torch.as_tensor(rows, dtype=torch.long)] = 1.0
    w = torch.where(y > 0, 1.0, no_object).double()
    p = torch.sigmoid(obj.detach())
    want = (-(y * p.log() + (1 - y) * (1 - p).log()) * w).sum() / w.sum()
    assert got["cls"].item() == pytest.approx(want.item(), rel=1e-9)
    plain = set_loss(obj, assign, mask, targets, SetCriterionWeights(), matches)
    assert got["focal"].item() == pytest.approx(plain["focal"].item(), rel=1e-12)
    if no_object != 1.0:
        assert got["cls"].item() != pytest.approx(plain["cls"].item(), rel=1e-3)
    with pytest.raises(ValueError, match="no_object"):
        SetCriterionWeights(no_object=0.0)


def test_sector_targets_select_target_particles_with_enough_hits():
    pid = torch.tensor([0, 1, 1, 1, 2, 2, 3, 3, 3, 3, 1])
    mask = torch.tensor([True] * 10 + [False])
    is_target = torch.tensor([True, True, True, True, True, True, False, False, False, False, True])
    masks, ids = sector_targets(pid, mask, is_target, min_hits=3)
    assert ids.tolist() == [1]                        # 2 has two hits, 3 is no target, the padding hit is not counted
    assert masks.tolist() == [[False, True, True, True] + [False] * 7]
    with pytest.raises(ValueError, match="min_hits"):
        sector_targets(pid, mask, is_target, min_hits=0)


def test_criterion_arguments_are_checked():
    with pytest.raises(ValueError, match="focal"):
        SetCriterionWeights(focal=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        SetCriterionWeights(alpha=2.0)
    with pytest.raises(ValueError, match="NaN"):
        match_slots(torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match="sectors"):
        set_loss(torch.zeros(2, 3), torch.zeros(2, 3, 4), torch.ones(2, 4, dtype=torch.bool), [torch.zeros(0, 4)])


def test_phi_sectors_cut_equal_counts_in_phi_order():
    phi = torch.tensor([[0.3, -2.0, 1.0, 2.5, -0.5, 0.0, 3.0, -3.0, 9.9, 9.9]])
    mask = torch.tensor([[True] * 8 + [False] * 2])
    sec = phi_sectors(phi, mask, k=3)
    got = [sec.index[i][sec.mask[i]].tolist() for i in range(3)]
    order = torch.argsort(phi[0, :8]).tolist()       # [7, 1, 4, 5, 0, 2, 3, 6]
    assert got == [order[0:3], order[3:6], order[6:8]]
    assert sec.index.shape == (3, 4)                  # L = ⌈10 / 3⌉ from the padded size
    wide = phi_sectors(phi, mask, k=2, overlap=0.25)
    rows = [wide.index[i][wide.mask[i]].tolist() for i in range(2)]
    assert rows == [[order[7]] + order[0:5], order[3:8] + [order[0]]]   # one hit more on each side, cyclic
    for bad in ({"k": 0}, {"k": 2, "overlap": 0.7}):
        with pytest.raises(ValueError, match="k must|overlap"):
            phi_sectors(phi, mask, **bad)


def test_every_real_hit_is_in_exactly_one_sector_without_overlap():
    g = torch.Generator().manual_seed(0)
    phi = torch.rand(3, 50, generator=g) * 6.28 - 3.14
    mask = torch.rand(3, 50, generator=g) > 0.3
    mask[2] = False
    mask[2, :2] = True                                 # fewer real hits than sectors
    sec = phi_sectors(phi, mask, k=4)
    for b in range(3):
        hits = torch.cat([sec.index[b * 4 + s][sec.mask[b * 4 + s]] for s in range(4)])
        assert sorted(hits.tolist()) == torch.nonzero(mask[b]).flatten().tolist()
    x = torch.randn(3, 50, 5, generator=g)
    xs = gather_sectors(x, sec)
    assert xs.shape == (12, 13, 5) and bool((xs[~sec.mask] == 0).all())
    torch.testing.assert_close(xs[4][sec.mask[4]], x[1, sec.index[4][sec.mask[4]]])


def test_the_sector_frame_is_the_same_whatever_the_sectors_azimuth():
    """Each sector's positions are (eta, cos, sin) of the azimuth from the sector's centre: a sector turned by any
    angle gets the same positions; its real hits' sin(delta phi) sum to 0; padding is zero."""
    g = torch.Generator().manual_seed(4)
    eta = torch.randn(2, 40, generator=g, dtype=torch.float64)
    phi = torch.rand(2, 40, generator=g, dtype=torch.float64) * 1.5 - 0.75      # one sector's worth of azimuth
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 25:] = False
    sec = phi_sectors(phi, mask, k=1)
    ref = sector_frame(eta, phi, sec)
    assert ref.shape == (2, 40, 3) and bool((ref[~sec.mask] == 0).all())
    torch.testing.assert_close(ref[..., 2].sum(1), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(ref[..., 1] ** 2 + ref[..., 2] ** 2, sec.mask.double())
    for turn in (2.0, -3.0, 3.1):               # across phi = +-pi too: the frame does not see the wrap
        turned = torch.remainder(phi + turn + math.pi, 2 * math.pi) - math.pi
        idx = phi_sectors(turned, mask, k=1)
        got = sector_frame(eta, turned, idx)
        # the same hits in the same frame (a sector's hit order may start elsewhere after the wrap: compare per hit)
        for b in range(2):
            a = torch.zeros(40, 3, dtype=torch.float64).index_copy(0, sec.index[b][sec.mask[b]], ref[b][sec.mask[b]])
            c = torch.zeros(40, 3, dtype=torch.float64).index_copy(0, idx.index[b][idx.mask[b]], got[b][idx.mask[b]])
            torch.testing.assert_close(a, c, rtol=0, atol=1e-12)


def test_positional_keys_are_read_and_checked():
    dec = _decoder(pos_dim=3)
    g = torch.Generator().manual_seed(6)
    hits = torch.randn(2, 9, 16, generator=g, dtype=torch.float64)
    pos = torch.randn(2, 9, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        a, b = dec(hits, None, pos)[-1], dec(hits, None, pos + 1)[-1]
    assert not torch.allclose(a.object_logits, b.object_logits)        # the keys' positions steer the slots
    with pytest.raises(ValueError, match=r"expected pos \(S, n, 3\)"):
        dec(hits)
    with pytest.raises(ValueError, match=r"expected no pos"):
        _decoder()(hits, None, pos)


def _decoder(**kw) -> TrackDecoder:
    torch.manual_seed(0)
    return TrackDecoder(dim=16, num_slots=5, heads=4, n_layers=2, **kw).double().eval()


@pytest.mark.parametrize("attention_mask,seed_slots", [(False, False), (True, False), (True, True)])
def test_batched_sectors_equal_sectors_run_one_at_a_time(attention_mask, seed_slots):
    dec = _decoder(attention_mask=attention_mask, seed_slots=seed_slots)
    g = torch.Generator().manual_seed(1)
    hits = torch.randn(3, 12, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 7:] = False
    mask[2, 3:] = False
    with torch.no_grad():
        batched = dec(hits, mask)
        for s in range(3):
            n = int(mask[s].sum())
            alone = dec(hits[s:s + 1, :n])
            assert len(alone) == len(batched) == 2
            for a, b in zip(alone, batched):
                torch.testing.assert_close(a.object_logits[0], b.object_logits[s], rtol=1e-10, atol=1e-10)
                torch.testing.assert_close(a.assign_logits[0], b.assign_logits[s, :, :n], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention_mask", [False, True])
@pytest.mark.parametrize("mask_threshold", [0.5, 0.2])
def test_inference_path_equals_the_training_path(attention_mask, mask_threshold):
    """Without autograd the decoder takes its in-place softmax (and no mask when nothing is padded) and attends by
    the slots' claims (those claiming none by the fused kernel, the others pair by pair); ``last_only`` skips the
    intermediate heads: the same predictions as with autograd (the masked fused attention), with padding and a
    sector without a real hit."""
    dec = _decoder(attention_mask=attention_mask, mask_threshold=mask_threshold)
    g = torch.Generator().manual_seed(5)
    hits = torch.randn(4, 12, 16, generator=g, dtype=torch.float64) * 2
    for mask in (None, torch.arange(12)[None].expand(4, 12) < torch.tensor([[12], [7], [3], [0]])):
        with torch.enable_grad():
            ref = dec(hits, mask)
        with torch.no_grad():
            fast, last = dec(hits, mask), dec(hits, mask, last_only=True)
        assert len(fast) == 2 and len(last) == 1
        for a, b in zip(fast, ref):
            torch.testing.assert_close(a.assign_logits, b.assign_logits.detach(), rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(a.object_logits, b.object_logits.detach(), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(last[0].assign_logits, ref[-1].assign_logits.detach(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention_mask", [False, True])
def test_the_fused_attention_equals_the_written_out_one_with_gradients(monkeypatch, attention_mask):
    """Eager, the decoder's attentions run PyTorch's fused kernel (forward and backward); traced, the written-out
    scores: the same predictions and gradients (hits, positions and every parameter), with padding."""
    import pointformers.nn.track_decoder as td

    g = torch.Generator().manual_seed(8)
    hits = torch.randn(3, 12, 16, generator=g, dtype=torch.float64)
    pos = torch.randn(3, 12, 3, generator=g, dtype=torch.float64)
    mask = torch.arange(12)[None].expand(3, 12) < torch.tensor([[12], [7], [3]])
    runs = []
    for traced in (False, True):
        monkeypatch.setattr(td, "is_tracing", lambda: traced)
        dec = _decoder(attention_mask=attention_mask, pos_dim=3).train()
        h, p = hits.clone().requires_grad_(), pos.clone().requires_grad_()
        outs = dec(h, mask, p)
        loss = sum((o.assign_logits * mask[:, None]).square().sum() + o.object_logits.sum() for o in outs)
        loss.backward()
        runs.append([outs[-1].assign_logits.detach(), h.grad, p.grad] + [q.grad for q in dec.parameters()])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_attention_mask_acts_only_when_asked_for():
    """The mask threshold changes nothing without the Mask2Former mask (every slot sees every real hit at every
    layer), and changes the later layers with it."""
    g = torch.Generator().manual_seed(3)
    hits = torch.randn(2, 12, 16, generator=g, dtype=torch.float64) * 3
    with torch.no_grad():
        for attention_mask, differ in ((False, False), (True, True)):
            low, high = (_decoder(attention_mask=attention_mask, mask_threshold=t)(hits) for t in (0.3, 0.7))
            assert (not torch.allclose(low[-1].assign_logits, high[-1].assign_logits)) == differ


def test_padding_hits_are_never_assigned():
    dec = _decoder()
    g = torch.Generator().manual_seed(2)
    hits = torch.randn(2, 9, 16, generator=g, dtype=torch.float64) * 5
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 4:] = False
    mask[1] = False                                    # a sector without a single real hit
    with torch.no_grad():
        out = dec(hits, mask)[-1]
    assert torch.isfinite(out.assign_logits).all() and torch.isfinite(out.object_logits).all()
    labels, scores = assign_hits(out, mask, threshold=0.0)
    assert bool((labels[~mask] == -1).all()) and bool((scores[~mask] == 0).all())
    with torch.no_grad():   # consume: the scores take the logits' buffer, the same labels and scores
        copy = DecoderOutput(out.object_logits, out.assign_logits.clone(), out.slots)
        kept, kept_scores = assign_hits(copy, mask, threshold=0.0, consume=True)
    assert torch.equal(kept, labels) and torch.equal(kept_scores, scores)
    assert not torch.equal(copy.assign_logits, out.assign_logits)
    assert bool((labels[mask] >= 0).all())             # threshold 0: every real hit takes its best slot
    hi = DecoderOutput(torch.full((2, 5), 20.0), torch.full((2, 5, 9), 20.0), torch.zeros(2, 5, 16))
    labels, _ = assign_hits(hi, mask, threshold=0.5)
    assert bool((labels[~mask] == -1).all())
    lo = DecoderOutput(torch.full((2, 5), -20.0), torch.zeros(2, 5, 9), torch.zeros(2, 5, 16))
    assert bool((assign_hits(lo, mask, threshold=0.5)[0] == -1).all())   # below threshold: no track


def test_labels_go_back_to_the_events_hits():
    phi = torch.tensor([[0.1, -1.0, 2.0, -2.5, 1.2, 0.5], [3.0, -3.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    sec = phi_sectors(phi, mask, k=2, overlap=0.5)
    labels = torch.where(sec.mask, torch.arange(sec.index.shape[1]).expand_as(sec.index) % 3, torch.full_like(sec.index, -1))
    scores = torch.rand(sec.index.shape, generator=torch.Generator().manual_seed(0)) * sec.mask
    out = labels_to_hits(labels, scores, sec, num_hits=6, num_slots=3)
    assert out.shape == (2, 6) and bool((out[~mask] == -1).all())
    for b in range(2):
        for h in torch.nonzero(mask[b]).flatten().tolist():
            cands = [(float(scores[b * 2 + s, j]), s * 3 + int(labels[b * 2 + s, j]))
                     for s in range(2) for j in range(sec.index.shape[1])
                     if sec.mask[b * 2 + s, j] and int(sec.index[b * 2 + s, j]) == h]
            assert cands and int(out[b, h]) == max(cands)[1]


def test_seeded_slots_start_from_hits_spread_over_the_sector():
    dec = _decoder(seed_slots=True)
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[0], mask[1, :10], mask[2, :2] = True, True, True
    # 5 slots: positions floor((2m + 1) n / 10) of the n real hits
    assert dec.seed_index(mask).tolist() == [[1, 3, 6, 8, 10], [1, 3, 5, 7, 9], [0, 0, 1, 1, 1]]
    g = torch.Generator().manual_seed(2)
    hits = torch.randn(3, 12, 16, generator=g, dtype=torch.float64)
    seen = []
    hook = dec.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        dec(hits, mask)
        normed = dec.hit_norm(hits)
        want = dec.slots + dec.seed_proj(torch.stack([normed[s, dec.seed_index(mask)[s]] for s in range(3)]))
    hook.remove()
    torch.testing.assert_close(seen[0], want)            # each slot: its bank vector + its seed hit, padding unused
    with pytest.raises(ValueError, match="seed_slots"):
        TrackDecoder(dim=16, num_slots=4, heads=4, seed_slots=1)
    holes = torch.ones(3, 12, dtype=torch.bool)
    holes[1, 4] = False
    with pytest.raises(ValueError, match="real hits first"):
        dec(hits, holes)


def test_decoder_arguments_are_checked():
    with pytest.raises(ValueError, match="divisible"):
        TrackDecoder(dim=10, num_slots=4, heads=4)
    with pytest.raises(ValueError, match="num_slots"):
        TrackDecoder(dim=16, num_slots=0, heads=4)
    dec = _decoder()
    with pytest.raises(ValueError, match=r"hits must be \(S, n, 16\)"):
        dec(torch.zeros(2, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="mask"):
        dec(torch.zeros(2, 3, 16, dtype=torch.float64), torch.ones(2, 4, dtype=torch.bool))


def _same_partition(a, b) -> bool:
    """Two labelings of the same hits group them alike (equal up to renaming)."""
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("min_hits", [1, 2, 3])
def test_stitching_joins_the_tracks_that_overlapping_sectors_found_twice(min_hits):
    # two events (24 and 18 hits) of tracks of 4 hits consecutive in phi; 3 sectors overlapping by 2 hits on each
    # side, each labelling its hits perfectly but with slots of its own: a track crossing a border is found by
    # both sectors, and without stitching the overlap hits split it. Stitched with min_hits <= 2 (each border
    # shares 2 hits of one track) the labels group the hits as the tracks do; min_hits = 3 links nothing.
    g = torch.Generator().manual_seed(0)
    n, num_slots, k = torch.tensor([24, 18]), 8, 3
    phi = torch.rand(2, 24, generator=g) * 6.28 - 3.14
    mask = torch.arange(24)[None] < n[:, None]
    rank = torch.empty(2, 24, dtype=torch.long)
    for b in range(2):
        order = torch.sort(torch.where(mask[b], phi[b], torch.tensor(9.0)), stable=True).indices
        rank[b, order] = torch.arange(24)
    truth = torch.where(mask, rank // 4, torch.full_like(rank, -1))                 # (2, 24) the true tracks
    sec = phi_sectors(phi, mask, k=k, overlap=0.25)
    perm = torch.stack([torch.randperm(num_slots, generator=g) for _ in range(2 * k)])  # each sector's own slots
    hit_truth = truth.gather(1, sec.index.view(2, -1)).view(2 * k, -1)
    labels = torch.where(sec.mask, perm.gather(1, hit_truth.clamp_min(0)), torch.full_like(sec.index, -1))
    scores = torch.rand(sec.index.shape, generator=g) * sec.mask
    plain = labels_to_hits(labels, scores, sec, num_hits=24, num_slots=num_slots)
    stitched = labels_to_hits(labels, scores, sec, num_hits=24, num_slots=num_slots, stitch_min_hits=min_hits)
    for b in range(2):
        real = mask[b]
        assert not _same_partition(plain[b, real], truth[b, real])            # the border tracks are split
        assert _same_partition(stitched[b, real], truth[b, real]) == (min_hits <= 2)
        assert bool((stitched[b, ~real] == -1).all())
        # stitching only joins: hits that shared a track before still do
        assert len(set(zip(plain[b, real].tolist(), stitched[b, real].tolist()))) == len(set(plain[b, real].tolist()))
    alone = labels_to_hits(labels[k:], scores[k:], Sectors(sec.index[k:], sec.mask[k:], k), num_hits=24,
                           num_slots=num_slots, stitch_min_hits=min_hits)
    assert torch.equal(alone[0], stitched[1])                                 # an event's labels are its own
    assert int(stitched.max()) < k * num_slots


def test_the_model_stitches_only_overlapping_sectors():
    from pointformers.models.track_reconstruction import TrackReconstructor

    with pytest.raises(ValueError, match="stitch_min_hits"):
        TrackReconstructor(dim=16, heads=2, overlap=0.0, stitch_min_hits=2)
    with pytest.raises(ValueError, match="stitch_min_hits"):
        TrackReconstructor(dim=16, heads=2, overlap=0.1, stitch_min_hits=-1)
    assert TrackReconstructor(dim=16, heads=2, overlap=0.1, stitch_min_hits=2).stitch_min_hits == 2


def test_assignment_in_an_embedding_space_is_a_kernel_around_each_slots_centre():
    """assign_dim: logit = α − β·‖e − c‖² with the slot's centre c (the decoder's centre head) and each hit's
    key e, for every slot and hit; keys are required exactly when assign_dim > 0, with their shape."""
    torch.manual_seed(0)
    dec = TrackDecoder(dim=16, num_slots=5, heads=4, assign_dim=6).double()
    hits, keys = torch.randn(2, 9, 16, dtype=torch.float64), torch.randn(2, 9, 6, dtype=torch.float64)
    out = dec(hits, keys=keys)[-1]
    c = dec.centre(out.slots)
    beta = torch.nn.functional.softplus(dec.kernel[1])
    torch.testing.assert_close(out.assign_logits, dec.kernel[0] - beta * torch.cdist(c, keys) ** 2)
    assert torch.isclose(beta, torch.tensor(10.0, dtype=torch.float64)) and dec.kernel[0] == 1.0
    out.assign_logits.sum().backward()
    assert keys.grad is None and dec.kernel.grad is not None
    with pytest.raises(ValueError, match=r"expected keys \(S, n, 6\)"):
        dec(hits)
    with pytest.raises(ValueError, match="expected keys"):
        dec(hits, keys=keys[..., :5])
    with pytest.raises(ValueError, match=r"no keys \(assign_dim=0\)"):
        TrackDecoder(dim=16, num_slots=5, heads=4)(hits.float(), keys=keys.float())
    with pytest.raises(ValueError, match="assign_dim"):
        TrackDecoder(dim=16, num_slots=5, heads=4, assign_dim=-1)


def _padded_sectors(g: torch.Generator):
    """Three sectors of 12 rows (float64): hit features (3, 12, 16), keys (3, 12, 6) and a mask with padding
    after 7 rows in the second and after 2 in the third."""
    hits = torch.randn(3, 12, 16, generator=g, dtype=torch.float64)
    keys = torch.randn(3, 12, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 7:], mask[2, 2:] = False, False
    return hits, keys, mask


def _assert_batched_equals_alone(dec, hits, keys, mask):
    """Every stage's logits of the padded batch equal those of each sector run alone on its real hits."""
    batched = dec(hits, mask, keys=keys)
    for s in range(hits.shape[0]):
        n = int(mask[s].sum())
        alone = dec(hits[s:s + 1, :n], keys=keys[s:s + 1, :n])
        for a, b in zip(alone, batched):
            torch.testing.assert_close(a.assign_logits[0], b.assign_logits[s, :, :n], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(a.object_logits[0], b.object_logits[s], rtol=1e-10, atol=1e-10)


def test_seeded_centres_start_on_the_seed_hits_keys_and_batch_like_single_sectors():
    """seed_centres: a slot's centre is its seed hit's key plus the centre head's offset, which starts at zero, so
    the first prediction's logits are α − β·‖e − e_seed‖² exactly; batched
    sectors (padding, a sector of two hits) equal sectors run alone; it needs seed_slots and assign_dim."""
    torch.manual_seed(0)
    dec = TrackDecoder(dim=16, num_slots=5, heads=4, n_layers=2, assign_dim=6, seed_slots=True, seed_centres=True,
                       attention_mask=True).double().eval()
    g = torch.Generator().manual_seed(3)
    hits, keys, mask = _padded_sectors(g)
    with torch.no_grad():
        slots = dec.slots + dec.seed_proj(torch.gather(dec.hit_norm(hits) * mask[..., None], 1,
                                                       dec.seed_index(mask)[..., None].expand(-1, -1, 16)))
        first = dec.predict(slots, dec.hit_norm(hits), keys, base=torch.gather(
            keys, 1, dec.seed_index(mask)[..., None].expand(-1, -1, 6)))
        seeds = torch.stack([keys[s, dec.seed_index(mask)[s]] for s in range(3)])          # (S, M, 6)
        beta = torch.nn.functional.softplus(dec.kernel[1])
        torch.testing.assert_close(first.assign_logits, dec.kernel[0] - beta * torch.cdist(seeds, keys) ** 2)
        _assert_batched_equals_alone(dec, hits, keys, mask)
    for kw in (dict(assign_dim=6), dict(seed_slots=True), dict(assign_dim=6, seed_slots=True, seed_centres=1)):
        with pytest.raises(ValueError, match="seed_centres"):
            TrackDecoder(dim=16, num_slots=5, heads=4, **({"seed_centres": True} | kw))


def test_refined_assignment_starts_as_the_kernel_and_computes_its_formula():
    """assign_refine: at initialisation the logits equal the kernel model's with the same weights (the per-slot
    width and the dot product start at zero); with those heads moved, the logits are α − β_m·‖e − c‖² + w_m·h
    exactly; batched sectors equal sectors run alone; it needs assign_dim."""
    torch.manual_seed(0)
    kw = dict(dim=16, num_slots=5, heads=4, n_layers=2, assign_dim=6, seed_slots=True, seed_centres=True,
              attention_mask=True)
    dec = TrackDecoder(**kw, assign_refine=True).double().eval()
    plain = TrackDecoder(**kw).double().eval()
    plain.load_state_dict({k: v for k, v in dec.state_dict().items() if not k.startswith("width.")})
    g = torch.Generator().manual_seed(3)
    hits, keys, mask = _padded_sectors(g)
    with torch.no_grad():
        for a, b in zip(dec(hits, mask, keys=keys), plain(hits, mask, keys=keys)):
            torch.testing.assert_close(a.assign_logits, b.assign_logits, rtol=1e-12, atol=1e-12)
        for p in list(dec.width.parameters()) + list(dec.mask_embed[-1].parameters()):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
        z = torch.randn(3, 5, 16, generator=g, dtype=torch.float64)
        base = torch.randn(3, 5, 6, generator=g, dtype=torch.float64)
        h = dec.hit_norm(hits)
        got = dec.predict(z, h, keys, base=base).assign_logits
        zn = dec.out_norm(z)
        c = base + dec.centre(zn)
        beta = torch.nn.functional.softplus(dec.kernel[1] + dec.width(zn))              # (S, M, 1)
        want = dec.kernel[0] - beta * torch.cdist(c, keys) ** 2 + dec.mask_embed(zn) @ h.transpose(1, 2)
        torch.testing.assert_close(got, want)
        plain.load_state_dict({k: v for k, v in dec.state_dict().items() if not k.startswith("width.")})
        assert not torch.allclose(got, plain.predict(z, h, keys, base=base).assign_logits)
        _assert_batched_equals_alone(dec, hits, keys, mask)
    with pytest.raises(ValueError, match="assign_refine"):
        TrackDecoder(dim=16, num_slots=5, heads=4, assign_refine=True)
    with pytest.raises(ValueError, match="assign_refine"):
        TrackDecoder(dim=16, num_slots=5, heads=4, assign_dim=6, assign_refine=1)

"""The end-to-end track reconstruction model (pointformers.models.track_reconstruction): events batched
equal events run alone, labels only on real hits and unique per event, the loss trains it."""
from __future__ import annotations

import pytest
import torch

from pointformers.models.track_reconstruction import TRACK_PARAMS, TrackReconstructor, merge_fragments, track_parameters
from pointformers.tasks.tracking.set_criterion import sector_targets, set_loss

SMALL = dict(dim=16, heads=2, n_layers=2, num_slots=8, block_size=32, num_regions=4, decoder_heads=2)


def _clouds(sizes=(150, 97), seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x = torch.randn(n, 15, generator=g, dtype=torch.float64)
        coords = torch.randn(n, 6, generator=g, dtype=torch.float64)
        coords[:, 1] = torch.rand(n, generator=g, dtype=torch.float64) * 6.28 - 3.14
        out.append((x, coords))
    return out


def _pad(clouds):
    n = max(c[0].shape[0] for c in clouds)
    x = torch.full((len(clouds), n, 15), 0.5, dtype=torch.float64)
    coords = torch.full((len(clouds), n, 6), 0.5, dtype=torch.float64)
    mask = torch.zeros(len(clouds), n, dtype=torch.bool)
    for i, (xi, ci) in enumerate(clouds):
        x[i, : xi.shape[0]], coords[i, : xi.shape[0]], mask[i, : xi.shape[0]] = xi, ci, True
    return x, coords, mask


def _model(**kw) -> TrackReconstructor:
    torch.manual_seed(0)
    return TrackReconstructor(**{**SMALL, **kw}).double().eval()


@pytest.mark.parametrize("overlap", [0.0, 0.2])
def test_batched_events_equal_events_run_alone(overlap):
    model = _model(overlap=overlap, threshold=0.0)
    clouds = _clouds()
    x, coords, mask = _pad(clouds)
    with torch.no_grad():
        out = model(x, coords, mask, outputs=True)
        labels = model(x, coords, mask)
        torch.testing.assert_close(model.labels_from(out, x.shape[1]), labels)
        for b, (xi, ci) in enumerate(clouds):
            n = xi.shape[0]
            alone = model(xi[None], ci[None], outputs=True)
            torch.testing.assert_close(alone.hit_logits[0], out.hit_logits[b, :n], rtol=1e-9, atol=1e-9)
            k = model.num_sectors
            for a, s in zip(alone.stages, out.stages):
                torch.testing.assert_close(a.object_logits, s.object_logits[b * k:(b + 1) * k], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(model.labels_from(alone, n)[0], labels[b, :n])
    assert bool((labels[~mask] == -1).all()) and bool((labels[mask] >= 0).all())   # threshold 0: all assigned
    assert labels.max() < model.num_sectors * model.num_slots


def test_the_set_loss_trains_the_model():
    """A few steps on one event: the set loss falls (the decoder learns to claim the event's tracks)."""
    torch.manual_seed(0)
    model = TrackReconstructor(**SMALL).double()
    (x, coords), = _clouds((120,), seed=3)
    pid = torch.randint(1, 9, (120,), generator=torch.Generator().manual_seed(4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        out = model(x[None], coords[None], outputs=True)
        sec = out.sectors
        targets = [sector_targets(pid[sec.index[s]], sec.mask[s], torch.ones_like(sec.mask[s]), min_hits=2)[0]
                   for s in range(sec.index.shape[0])]
        loss = sum(set_loss(st.object_logits, st.assign_logits, sec.mask, targets)["loss"] for st in out.stages)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_track_parameters_and_arguments():
    p = torch.tensor([[0.0, 1.0, 0.3, 0.0, 1.0], [1.0, -2.0, -1.0, -1.0, 0.0]], dtype=torch.float64)
    t = track_parameters(p)
    assert len(TRACK_PARAMS) == 5
    torch.testing.assert_close(t["pt"], torch.tensor([1.0, 2.718281828459045], dtype=torch.float64))
    assert t["charge"].tolist() == [1.0, -1.0] and t["phi"][0].item() == pytest.approx(1.5707963, rel=1e-6)
    with pytest.raises(ValueError, match="phi_column"):
        TrackReconstructor(phi_column=6)
    with pytest.raises(ValueError, match="overlap"):
        TrackReconstructor(overlap=0.9)
    with pytest.raises(ValueError, match="threshold"):
        TrackReconstructor(threshold=1.0)
    with pytest.raises(ValueError, match="batch dimension"):
        _model()(*_clouds((10,))[0])
    with pytest.raises(ValueError, match="^outputs: the training outputs need padded input"):
        _model()(*_clouds((10,))[0], outputs=True, batch=torch.zeros(10, dtype=torch.long))


def test_merge_fragments_joins_the_nearest_track_per_event():
    labels = torch.tensor([[0, 0, 0, 5, 7, 7, 7, 7, -1, 9],
                           [3, 3, 4, -1, -1, -1, -1, -1, -1, -1]])
    emb = torch.zeros(2, 10, 2, dtype=torch.float64)
    emb[0, :3] = torch.tensor([0.0, 0.0])        # track 0 around (0, 0)
    emb[0, 4:8] = torch.tensor([10.0, 0.0])      # track 7 around (10, 0)
    emb[0, 3] = torch.tensor([9.0, 1.0])         # fragment 5: nearest to track 7
    emb[0, 9] = torch.tensor([1.0, -1.0])        # fragment 9: nearest to track 0
    emb[0, 8] = torch.tensor([10.0, 0.0])        # no track: stays -1
    out = merge_fragments(labels, emb)
    assert out[0].tolist() == [0, 0, 0, 7, 7, 7, 7, 7, -1, 0]
    assert out[1].tolist() == labels[1].tolist()   # no track of more than 2 hits there: unchanged
    assert merge_fragments(labels[0], emb[0]).tolist() == out[0].tolist()
    assert merge_fragments(labels, emb, max_hits=3)[0].tolist() == [7, 7, 7, 7, 7, 7, 7, 7, -1, 7]
    with pytest.raises(ValueError, match="max_hits"):
        merge_fragments(labels, emb, max_hits=0)

"""The end-to-end track reconstruction model (pointformers.models.track_reconstruction): events batched
equal events run alone, labels only on real hits and unique per event, the loss trains it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers.models.track_reconstruction import TRACK_PARAMS, TrackReconstructor, merge_tracks, track_parameters
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


#: The published encoder's design: coordinate-hashed softmax blocks, pre-RMSNorm SwiGLU blocks, the coordinate
#: encoding at every layer.
V2_ENCODER = dict(attention="coord_lsh", encoder_options={"norm": "rms", "ffn": "swiglu", "pe": "learned-each-layer"})


@pytest.mark.parametrize("overlap,encoder", [(0.0, {}), (0.2, {}), (0.2, V2_ENCODER), (0.2, dict(sector_frame=True)),
                                             (0.0, dict(sector_frame=True, frame_columns=[2, 4])),
                                             (0.2, dict(sector_frame=True, seed_slots=True)), (0.0, dict(seed_slots=True)),
                                             (0.2, dict(assign_space="embedding", attention_mask=True))])
def test_batched_events_equal_events_run_alone(overlap, encoder):
    model = _model(overlap=overlap, threshold=0.0, **encoder)
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
            torch.testing.assert_close(model(xi, ci), labels[b, :n])   # one event (N, F) as the encoder takes it
    assert bool((labels[~mask] == -1).all()) and bool((labels[mask] >= 0).all())   # threshold 0: all assigned
    assert labels.max() < model.num_sectors * model.num_slots


@pytest.mark.parametrize("options", [dict(attention="full"),
                                     dict(attention="full", overlap=0.2, stitch_min_hits=2, merge_radius=2.0),
                                     dict(attention="full", assign_space="embedding", attention_mask=True,
                                          seed_slots=True, seed_centres=True, assign_refine=True, hit_threshold=0.5)],
                         ids=["plain", "overlap-stitched-merged", "refined-gated"])
def test_inference_in_chunks_of_sectors_equals_all_sectors_at_once(options, monkeypatch):
    """Eager inference decodes and assigns a few sectors at a time (INFERENCE_SECTOR_CHUNK): the labels of a
    batch of events cut into many sectors are those of all sectors at once (and of the training outputs)."""
    import pointformers.models.track_reconstruction as tr

    model = _model(sectors=5, threshold=0.0, **options)
    x, coords, mask = _pad(_clouds(sizes=(150, 97)))
    with torch.no_grad():
        out = model(x, coords, mask, outputs=True)
        want = model.labels_from(out, x.shape[1])
        for chunk in (1, 3, 10, 64):
            monkeypatch.setattr(tr, "INFERENCE_SECTOR_CHUNK", chunk)
            assert torch.equal(model(x, coords, mask), want), chunk
            labels, emb = model.labels_and_embedding(x, coords, mask)
            assert torch.equal(labels, want) and torch.equal(emb, out.embedding), chunk


def test_assign_space_is_named_when_wrong():
    with pytest.raises(ValueError, match="^assign_space: expected 'features'"):
        TrackReconstructor(assign_space="kernel")
    with pytest.raises(ValueError, match="^assign_refine refines the kernel"):
        TrackReconstructor(assign_refine=True)


def test_sector_hits_scale_the_sectors_with_the_event(monkeypatch):
    """sector_hits: an event gets max(sectors, ⌈n / sector_hits⌉) sectors (n its real hits, the most of a batch), the
    same labels as a model of that fixed sector count with the same weights (merging included: the track labels of
    every sector are distinct); never fewer than ``sectors``; eager only; bad values named."""
    x, coords, mask = _pad(_clouds(sizes=(150, 97)))
    scaled = _model(sectors=2, sector_hits=40, threshold=0.0, merge_max_hits=2)
    with torch.no_grad():
        out = scaled(x, coords, mask, outputs=True)
        assert out.sectors.k == 4 and scaled(x[1:, :97], coords[1:, :97], outputs=True).sectors.k == 3
        fixed = _model(sectors=4, threshold=0.0, merge_max_hits=2)
        fixed.load_state_dict(scaled.state_dict())
        labels = scaled(x, coords, mask)
        torch.testing.assert_close(labels, fixed(x, coords, mask))
        assert labels.max() >= 2 * scaled.num_slots   # tracks of the sectors beyond the configured two
        assert _model(sectors=2, sector_hits=400)(x, coords, mask, outputs=True).sectors.k == 2
    import pointformers.models.track_reconstruction as tr

    monkeypatch.setattr(tr, "is_tracing", lambda: True)
    with pytest.raises(ValueError, match="^sector_hits=40: .*eager mode only"):
        scaled.sector_count(mask)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="^sector_hits: expected an integer >= 0"):
            TrackReconstructor(sector_hits=bad)


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
    x1, c1 = _clouds((10,))[0]
    with pytest.raises(ValueError, match="coords: with one event"):
        _model()(x1, c1[None])
    with pytest.raises(ValueError, match="^outputs: the training outputs need padded input"):
        _model()(*_clouds((10,))[0], outputs=True, batch=torch.zeros(10, dtype=torch.long))
    for bad in (dict(sector_frame=True, frame_columns=[6]), dict(sector_frame=True, frame_columns="24"),
                dict(sector_frame=True, frame_columns=[True]), dict(frame_columns=[2])):
        with pytest.raises(ValueError, match="frame_columns"):
            TrackReconstructor(**bad)
    for bad in (dict(merge_max_hits=-1), dict(merge_radius=-1.0), dict(merge_radius="0.1")):
        with pytest.raises(ValueError, match="merge_max_hits|merge_radius"):
            TrackReconstructor(**bad)


def test_merge_tracks_joins_fragments_to_the_nearest_track_per_event():
    labels = torch.tensor([[0, 0, 0, 5, 7, 7, 7, 7, -1, 9],
                           [3, 3, 4, -1, -1, -1, -1, -1, -1, -1]])
    emb = torch.zeros(2, 10, 2, dtype=torch.float64)
    emb[0, :3] = torch.tensor([0.0, 0.0])        # track 0 around (0, 0)
    emb[0, 4:8] = torch.tensor([10.0, 0.0])      # track 7 around (10, 0)
    emb[0, 3] = torch.tensor([9.0, 1.0])         # fragment 5: nearest to track 7
    emb[0, 9] = torch.tensor([1.0, -1.0])        # fragment 9: nearest to track 0
    emb[0, 8] = torch.tensor([10.0, 0.0])        # no track: stays -1
    out = merge_tracks(labels, emb)
    assert out[0].tolist() == [0, 0, 0, 7, 7, 7, 7, 7, -1, 0]
    assert out[1].tolist() == labels[1].tolist()   # no track of more than 2 hits there: unchanged
    assert merge_tracks(labels[0], emb[0]).tolist() == out[0].tolist()
    assert merge_tracks(labels, emb, 10).tolist() == out.tolist()          # more possible labels: the same
    assert merge_tracks(labels, emb, max_hits=3)[0].tolist() == [7, 7, 7, 7, 7, 7, 7, 7, -1, 7]
    assert merge_tracks(labels, emb, max_hits=0).tolist() == labels.tolist()
    for bad in (dict(max_hits=-1), dict(max_hits=True), dict(radius=-0.1), dict(radius=float("nan")),
                dict(radius=float("inf"))):
        with pytest.raises(ValueError, match="merge_max_hits|merge_radius"):
            merge_tracks(labels, emb, **bad)
    with pytest.raises(ValueError, match="merge_tracks: expected labels"):
        merge_tracks(labels, emb[:, :5])
    with pytest.raises(ValueError, match=r"merge_tracks: labels must lie in \[-1, num_tracks=8\), got 9"):
        merge_tracks(labels, emb, 8)


def _merge_reference(labels: np.ndarray, emb: np.ndarray, max_hits: int, radius: float, ring: int = 0,
                     per: int = 1) -> np.ndarray:
    """merge_tracks written out with loops, one event; ``ring`` sectors of ``per`` labels each: joins within
    neighbouring sectors only."""
    def close(a, b):
        return not ring or (a // per - b // per) % ring in (0, 1, ring - 1)
    ids = sorted(set(labels[labels >= 0].tolist()))
    size = {t: int((labels == t).sum()) for t in ids}
    centre = {t: emb[labels == t].mean(0) for t in ids}
    dist = {(a, b): float(np.linalg.norm(centre[a] - centre[b])) for a in ids for b in ids}
    parent = {}
    for a in ids:
        whole = [b for b in ids if size[b] > max_hits and close(a, b)]
        if size[a] <= max_hits:
            parent[a] = min(whole, key=lambda b: dist[a, b]) if whole else a
        else:
            near = [b for b in whole if (size[b], b) > (size[a], a) and dist[a, b] < radius]
            parent[a] = min(near, key=lambda b: dist[a, b]) if near else a
    out = labels.copy()
    for i, t in enumerate(labels):
        while t >= 0 and parent[t] != t:
            t = parent[t]
        out[i] = t
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("path", ["eager", "eager-chunked", "eager-fine-grid", "traced"])
def test_merge_tracks_with_a_radius_equals_the_loops(seed, path, monkeypatch):
    # every other track joins the nearest larger one within the radius (equal sizes: the higher label),
    # joins chain; fragments as above. Eager: the tracks with hits alone, their distances in chunks of rows
    # (here also one row per chunk); traced: the fixed-shape (num_tracks, num_tracks) table
    import pointformers.models.track_reconstruction as tr

    monkeypatch.setattr(tr, "is_tracing", lambda: path == "traced")
    if path == "eager-chunked":
        monkeypatch.setattr(tr, "MERGE_CHUNK_ELEMS", 1)
    if path == "eager-fine-grid":   # cells far smaller than the tracks' spacing: most fragments compared with all
        monkeypatch.setattr(tr, "MERGE_CELL_TRACKS", 1e-4)
    g = np.random.default_rng(seed)
    n, t = 80, 14
    labels = g.integers(-1, t, n)
    emb = np.round(g.normal(size=(t, 2))[np.clip(labels, 0, None)] + 0.05 * g.normal(size=(n, 2)), 3)
    for max_hits, radius in ((2, 0.0), (2, 0.8), (0, 1.5), (4, 1.0)):
        got = merge_tracks(torch.as_tensor(labels)[None], torch.as_tensor(emb)[None], t + 3, max_hits, radius)[0]
        assert got.tolist() == _merge_reference(labels, emb, max_hits, radius).tolist(), (max_hits, radius)
    # a chain: 3 hits -> 4 hits -> 5 hits, each 0.3 apart
    lab = torch.tensor([1] * 5 + [2] * 4 + [3] * 3)
    e = torch.tensor([[0.0, 0]] * 5 + [[0.3, 0]] * 4 + [[0.6, 0]] * 3)
    assert merge_tracks(lab, e, radius=0.35).tolist() == [1] * 12
    assert merge_tracks(lab, e, radius=0.25).tolist() == lab.tolist()
    assert merge_tracks(torch.tensor([4, 4, 4, 6, 6, 6]), torch.zeros(6, 2), radius=0.1).tolist() == [6] * 6
    # sectors > 3: joins only within neighbouring sectors (cyclic); labels = sector * per + slot
    for ring, per in ((5, 3), (7, 2), (3, 5)):
        for max_hits, radius in ((2, 0.0), (2, 0.8), (4, 1.0)):
            got = merge_tracks(torch.as_tensor(labels)[None], torch.as_tensor(emb)[None], ring * per, max_hits, radius,
                               sectors=ring)[0]
            want = _merge_reference(labels, emb, max_hits, radius, ring if ring > 3 else 0, per)
            assert got.tolist() == want.tolist(), (ring, max_hits, radius)


@pytest.mark.parametrize("seed", range(3))
def test_eager_merging_equals_the_exported_table_on_many_tracks(seed, monkeypatch):
    """Eager merging compares each joining track with the whole tracks of the neighbouring cells of a grid (the rest
    only for a fragment with none within a cell): the labels of the fixed-shape table the export traces, for
    hundreds of tracks in a 12-d embedding, clustered and spread, with and without a radius, over several events."""
    import pointformers.models.track_reconstruction as tr

    g = torch.Generator().manual_seed(seed)
    t, n = 600, 3000
    labels = torch.randint(-1, t, (2, n), generator=g)
    labels[1, :1500] = torch.randint(-1, 40, (1500,), generator=g)       # a second event: fewer, larger tracks
    centres = torch.randn(t, 12, generator=g) * torch.tensor([3.0] * 3 + [0.3] * 9)
    emb = centres[labels.clamp(min=0)] + 0.05 * torch.randn(2, n, 12, generator=g)
    for max_hits, radius in ((2, 0.0), (5, 0.0), (2, 0.3), (4, 1.5), (0, 0.8)):
        eager = merge_tracks(labels, emb, t, max_hits, radius)
        monkeypatch.setattr(tr, "is_tracing", lambda: True)
        traced = merge_tracks(labels, emb, t, max_hits, radius)
        monkeypatch.setattr(tr, "is_tracing", lambda: False)
        assert torch.equal(eager, traced), (max_hits, radius, int((eager != traced).sum()))
        assert (eager != labels).any() or max_hits == 0
        # an event of many sectors (joins within neighbouring sectors; the loops above check which): eager = traced
        ringed = merge_tracks(labels, emb, t, max_hits, radius, sectors=12)
        monkeypatch.setattr(tr, "is_tracing", lambda: True)
        traced = merge_tracks(labels, emb, t, max_hits, radius, sectors=12)
        monkeypatch.setattr(tr, "is_tracing", lambda: False)
        assert torch.equal(ringed, traced), (max_hits, radius, int((ringed != traced).sum()))
        assert max_hits == 0 or bool(((ringed != labels) & (labels >= 0)).any())
    with pytest.raises(ValueError, match="sectors=7 num_tracks must be a multiple"):
        merge_tracks(labels, emb, t, sectors=7)
    with pytest.raises(ValueError, match="sectors must be an integer"):
        merge_tracks(labels, emb, t, sectors=-1)


# ---------------------------------------------------------------------------- the engine's task, export
TRACK_SETS = ["--set", "data.preset=tiny", "--set", "train.epochs=1", "--set", "train.warmup_steps=2",
              "--set", "model.options.dim=16", "--set", "model.options.heads=2", "--set", "model.options.head_dim=8",
              "--set", "model.options.n_layers=1",
              "--set", "model.options.num_slots=24", "--set", "model.options.block_size=32",
              "--set", "model.options.num_regions=4", "--set", "model.options.decoder_heads=2"]


def test_the_config_trains_through_the_cli_and_evaluate_reports_tracks(tmp_path, monkeypatch, capsys):
    """configs/track-reconstruction-small.yaml (shrunk) trains for an epoch through the CLI; `evaluate --split
    test` reports the TrackML score, the matching rates and the parameter resolutions."""
    import json
    from pathlib import Path

    from pointformers.cli import main

    monkeypatch.setenv("POINTFORMERS_CACHE", str(tmp_path / "cache"))
    config = Path(__file__).resolve().parents[1] / "configs" / "track-reconstruction-small.yaml"
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out), *TRACK_SETS]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"][0]["train_loss"] > 0 and "trackml_score" in metrics["epochs"][0]["val"]
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "test", "--json",
                 str(tmp_path / "test.json")]) == 0
    printed = capsys.readouterr().out
    assert "trackml_score" in printed and "eff_dm" in printed and "pt_rel_res" in printed
    res = json.loads((tmp_path / "test.json").read_text())
    row = res["rows"][next(iter(res["rows"]))]
    assert 0 <= row["trackml_score"] <= 1 and row["num_tracks"] >= 0
    # the resolution plot: written when tracks were matched, else a one-line error naming --plot (exit 2)
    rc = main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "test", "--plot", str(tmp_path / "r.png")])
    assert rc == (0 if row["param_tracks"] > 0 else 2)
    assert (tmp_path / "r.png").exists() == (row["param_tracks"] > 0)
    assert main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "val", "--plot",
                 str(tmp_path / "v.png")]) == 2 and "--plot" in capsys.readouterr().err
    # --set model.options.* reaches the model rebuilt from the checkpoint (its weights must still fit)
    import argparse

    from pointformers.cli import _config_for_checkpoint
    from pointformers.engine import load_checkpoint
    from pointformers.engine.config import ConfigError

    ckpt = load_checkpoint(out / "best.pt")
    args = argparse.Namespace(config=None, checkpoint=str(out / "best.pt"),
                              set=["model.options.param_fit=false", "model.options.threshold=0.3"])
    cfg = _config_for_checkpoint(args, ckpt)
    assert ckpt["model_config"]["param_fit"] is False and ckpt["model_config"]["threshold"] == 0.3
    assert cfg["model"]["options"]["threshold"] == 0.3
    with pytest.raises(ConfigError, match="--set model.name"):
        _config_for_checkpoint(argparse.Namespace(config=None, checkpoint=str(out / "best.pt"),
                                                  set=["model.name=hept-tracking"]), load_checkpoint(out / "best.pt"))
    assert main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "val", "--set", "model.options.dim=8"]) != 0
    assert "weights do not fit" in capsys.readouterr().err
    _check_trackml_folder_commands(out / "best.pt", tmp_path, capsys)


def _check_trackml_folder_commands(ckpt_path, tmp_path, capsys):
    """`evaluate --data` and `predict` on TrackML files with an end-to-end checkpoint: its own labels (as the model
    gives them, sectors of --sector-hits hits), track ids and scores from them, its embedding in the npz; DBSCAN's
    options refused with one-line errors."""
    import json

    import numpy as np

    from pointformers.cli import main
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.data.trackml import read_trackml_event, write_trackml_event
    from pointformers.engine.checkpoint import model_from_checkpoint
    from pointformers.tasks.tracking import tracking_inputs
    from pointformers.tasks.tracking.trackml_score import trackml_score
    from pointformers.trackml_eval import submission_track_ids

    folder = tmp_path / "events"
    write_trackml_event(generate_event(preset_params("tiny"), seed=5), folder, "event000000007")
    ev = read_trackml_event(folder / "event000000007")
    model = model_from_checkpoint(ckpt_path).eval()
    model.sector_hits = 150                          # several sectors in this event
    inp = tracking_inputs(ev)
    with torch.no_grad():
        labels = model(inp.x[None], inp.coords[None])[0].numpy()
    assert model.sector_count(torch.ones(1, inp.num_hits, dtype=torch.bool)) > model.num_sectors
    js = tmp_path / "e2e.json"
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(ckpt_path), "--data", str(folder), "--sector-hits", "150",
                 "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert "end-to-end tracks" in printed and "the model's tracks" in printed and "DBSCAN" not in printed
    res = json.loads(js.read_text())
    assert res["sector_hits"] == 150 and "dbscan_eps" not in res and res["threshold"] == model.threshold
    want = trackml_score(labels, ev.particle_id, ev.weight.astype(np.float64))
    assert res["events"][0]["trackml_score"] == pytest.approx(want, abs=1e-9)
    assert res["events"][0]["num_tracks"] == len(np.unique(labels[labels >= 0]))
    pred = tmp_path / "pred"
    assert main(["predict", "--checkpoint", str(ckpt_path), "--data", str(folder), "--out", str(pred),
                 "--sector-hits", "150"]) == 0
    rows = np.array([[int(v) for v in line.split(",")] for line in
                     (pred / "event000000007-tracks.csv").read_text().splitlines()[1:]])
    np.testing.assert_array_equal(rows[:, 1], submission_track_ids(labels))
    z = np.load(pred / "event000000007-embeddings.npz")
    assert int(z["sector_hits"]) == 150 and "dbscan_eps" not in z.files
    assert z["embedding"].shape == (inp.num_hits, model.embed_head.out_features)
    for argv, name in ((["--eps", "0.2"], "--eps"), (["--sector-hits", "0"], "--sector-hits")):
        assert main(["predict", "--checkpoint", str(ckpt_path), "--data", str(folder), "--out", str(tmp_path / "p2"),
                     *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert name in err and err.count("\n") == 0, err


def test_task_losses_on_a_generated_cloud():
    """Every term of the loss is finite and positive on a generated event, and its gradient reaches every
    head (set decoder, hit classifier, embedding, track parameters)."""
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.tasks.tracking.reconstruction import TrackReconstructionTask
    from pointformers.tasks.tracking.training import prepare_tracking_clouds

    cloud, = prepare_tracking_clouds([generate_event(preset_params("tiny"), seed=5)], cache_dir=False)
    assert cloud.particle_q is not None and set(cloud.particle_q[cloud.inputs.particle_id > 0].abs().tolist()) == {1}
    torch.manual_seed(0)
    model = TrackReconstructor(dim=16, heads=2, n_layers=1, num_slots=24, block_size=32, num_regions=4,
                               decoder_heads=2)
    task = TrackReconstructionTask()
    out = model(cloud.inputs.x[None], cloud.inputs.coords[None], outputs=True)
    parts = task.losses(out, cloud, torch.Generator().manual_seed(0))
    assert all(bool(torch.isfinite(v)) and float(v) > 0 for v in (p.detach() for p in parts.values())), parts
    parts["loss"].backward()
    for head in (model.decoder.class_head, model.hit_head, model.embed_head, model.param_head[-1]):
        assert head.weight.grad is not None and float(head.weight.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match="^min_hits"):
        TrackReconstructionTask(min_hits=0)
    with pytest.raises(ValueError, match="^hit_weight"):
        TrackReconstructionTask(hit_weight=float("nan"))


def test_the_hit_classifier_learns_hits_above_hit_pt_min():
    """task.hit_pt_min sets the hit classifier's targets apart from the slots' (pt_min): its term is the binary
    cross-entropy against the hits of reconstructable particles above it; a config's key reaches the task."""
    import torch.nn.functional as F

    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.engine.config import load_config
    from pointformers.tasks.registry import get_task
    from pointformers.tasks.tracking.reconstruction import TrackReconstructionTask
    from pointformers.tasks.tracking.training import prepare_tracking_clouds

    cloud, = prepare_tracking_clouds([generate_event(preset_params("tiny"), seed=5)], cache_dir=False)
    torch.manual_seed(0)
    model = TrackReconstructor(dim=16, heads=2, n_layers=1, num_slots=24, block_size=32, num_regions=4, decoder_heads=2)
    out = model(cloud.inputs.x[None], cloud.inputs.coords[None], outputs=True)
    high, every = cloud.target_hits(0.9), cloud.target_hits(0.0)
    assert 0 < int(high.sum()) < int(every.sum())
    for task, target in ((TrackReconstructionTask(pt_min=0.0), every),
                         (TrackReconstructionTask(pt_min=0.0, hit_pt_min=0.9), high)):
        hit = task.losses(out, cloud, torch.Generator().manual_seed(0))["hit"]
        assert torch.allclose(hit, F.binary_cross_entropy_with_logits(out.hit_logits[0], target.float()))
    assert TrackReconstructionTask(pt_min=0.5).hit_pt_min == 0.5
    for bad in (-0.1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="^hit_pt_min"):
            TrackReconstructionTask(hit_pt_min=bad)
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(str(root / "configs" / "track-reconstruction-6k.yaml"), ["task.hit_pt_min=0.9"])
    assert get_task("track-reconstruction").build(cfg).hit_pt_min == 0.9


def test_the_hit_gate_leaves_hits_the_classifier_rejects_without_a_track():
    """hit_threshold: a hit whose hit-classifier probability is below it takes no track; the others keep
    their labels; 0 changes nothing; the model's own gate is its labels' (forward)."""
    model = _model(n_layers=1, threshold=0.0, attention="full", merge_max_hits=0).eval()
    (x, coords), = _clouds((400,), seed=3)
    with torch.no_grad():
        out = model(x[None], coords[None], outputs=True)
        free = model.assign(out, 400)
        p = torch.sigmoid(out.hit_logits)
        assert torch.equal(model.assign(out, 400, hit_threshold=0.0), free)
        for h in (0.3, 0.5, 0.7):
            gated = model.assign(out, 400, hit_threshold=h)
            assert torch.equal(gated[p >= h], free[p >= h]) and bool((gated[p < h] == -1).all())
        h = float(p.median())
        assert bool((free[p < h] >= 0).any())           # the gate has something to remove
        model.hit_threshold = h
        assert torch.equal(model(x[None], coords[None]), model.assign(out, 400, hit_threshold=h))
    with pytest.raises(ValueError, match="^hit_threshold"):
        _model(hit_threshold=1.0)
    with pytest.raises(ValueError, match="^hit_threshold"):
        model.assign(out, 400, hit_threshold=-0.1)


def test_the_parameters_of_a_slot_with_hits_are_their_helix_fit():
    """param_fit (the default): a slot that claims at least three hits reports the helix fit of those hits, the
    head the others (and only they train it); param_fit=False: the head everywhere; a checkpoint loads either way."""
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.models.track_reconstruction import FIT_COLUMNS, FIT_TRIM, slot_helix_fit
    from pointformers.nn.track_decoder import gather_sectors
    from pointformers.tasks.tracking.training import prepare_tracking_clouds

    cloud, = prepare_tracking_clouds([generate_event(preset_params("tiny"), seed=5)], cache_dir=False)
    x, coords = cloud.inputs.x[None].double(), cloud.inputs.coords[None].double()
    torch.manual_seed(0)
    model = TrackReconstructor(dim=16, heads=2, n_layers=1, num_slots=24, block_size=32, num_regions=4,
                               decoder_heads=2, threshold=0.0).double()
    out = model(x, coords, outputs=True)
    last = out.stages[-1]
    best, slot = (torch.sigmoid(last.object_logits)[..., None] * torch.sigmoid(last.assign_logits)).max(1)
    fit = slot_helix_fit(gather_sectors(x[..., list(FIT_COLUMNS)], out.sectors), slot, out.sectors.mask.double(), 24,
                         FIT_TRIM)
    ok = fit["fitted"]
    assert 0 < int(ok.sum()) < ok.numel()
    got = track_parameters(out.params)
    torch.testing.assert_close(got["pt"][ok], fit["pt"][ok])
    torch.testing.assert_close(got["eta"][ok], torch.asinh(fit["cot"][ok]))
    torch.testing.assert_close(torch.cos(got["phi"][ok] - fit["phi"][ok]), torch.ones(int(ok.sum()), dtype=torch.float64))
    assert torch.equal(got["charge"][ok], fit["charge"][ok])
    head = model.param_head(last.slots)
    torch.testing.assert_close(out.params[~ok], head[~ok])
    out.params[ok].sum().backward()
    assert model.param_head[-1].weight.grad is None or float(model.param_head[-1].weight.grad.abs().sum()) == 0
    plain = TrackReconstructor(dim=16, heads=2, n_layers=1, num_slots=24, block_size=32, num_regions=4,
                               decoder_heads=2, threshold=0.0, param_fit=False).double()
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(plain(x, coords, outputs=True).params, head)
    with pytest.raises(ValueError, match="^param_fit: expected true or false"):
        TrackReconstructor(param_fit="yes")
    with pytest.raises(ValueError, match="^param_fit fits helices"):
        TrackReconstructor(in_dim=5)
    TrackReconstructor(in_dim=5, param_fit=False)


@pytest.mark.parametrize("encoder", [dict(attention="full"), V2_ENCODER,
                                     dict(attention="full", overlap=0.2, stitch_min_hits=1),
                                     dict(attention="full", sector_frame=True, frame_columns=[2, 4]),
                                     dict(attention="full", merge_radius=2.0, merge_max_hits=3),
                                     dict(attention="full", sector_frame=True, seed_slots=True),
                                     dict(attention="full", assign_space="embedding", attention_mask=True),
                                     dict(attention="full", assign_space="embedding", attention_mask=True,
                                          seed_slots=True, seed_centres=True),
                                     dict(attention="full", assign_space="embedding", attention_mask=True,
                                          seed_slots=True, seed_centres=True, assign_refine=True),
                                     dict(attention="full", hit_threshold=0.5)],
                         ids=["full", "v2", "stitched", "sector-frame", "merged", "seeded", "embedding-assign",
                              "seeded-centres", "refined", "gated"])
def test_the_exported_model_equals_the_eager_one(tmp_path, encoder):
    """torch.export of the whole model, assignment step included: the file's track labels equal the eager
    model's at point counts other than the traced one (full attention, and the published encoder's design;
    the HEPT export path has its own tests; the heavy suite exports the model with its HEPT encoder to ONNX)."""
    from pointformers.export import export_model, load_exported
    from pointformers.export.onnx_export import example_inputs

    model = _model(n_layers=1, threshold=0.0, **encoder)
    model.registry_name = "track-reconstruction"
    run = load_exported(export_model(model, tmp_path / "m.pt2", format="torch.export", dtype=torch.float64))
    assert run.min_points == 2 * model.num_sectors
    for n, seed in ((run.min_points, 1), (run.min_points + 301, 2), (1234, 3)):
        x, coords = example_inputs(model, n=n, dtype=torch.float64, seed=seed)
        with torch.no_grad():
            ref = model(x[None], coords[None])[0]
        assert torch.equal(torch.as_tensor(run(x, coords)).long(), ref), n


@pytest.mark.heavy
def test_the_exported_hept_model_equals_the_eager_one(tmp_path):
    """The default encoder (HEPT) with the Mask2Former mask, exported to ONNX (through torch.export) and run by
    ONNX Runtime; labels equal eager."""
    for mod in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(mod)
    fmt, name = "onnx", "m.onnx"
    from pointformers.export import export_model, load_exported
    from pointformers.export.onnx_export import example_inputs

    model = _model(n_layers=1, threshold=0.0, attention_mask=True)
    run = load_exported(export_model(model, tmp_path / name, format=fmt, dtype=torch.float64))
    for n, seed in ((run.min_points + 301, 1), (1234, 2)):
        x, coords = example_inputs(model, n=n, dtype=torch.float64, seed=seed)
        with torch.no_grad():
            ref = model(x[None], coords[None])[0]
        assert torch.equal(torch.as_tensor(run(x, coords)).long(), ref), (fmt, n)


def test_the_published_encoder_design_adds_the_coordinate_encoding_at_every_block():
    model = _model(n_layers=3, **V2_ENCODER)
    enc = model.encoder
    assert all(b.norm_type == "rms" and b.activation == "swiglu" and b.mixer.registry_name == "coord_lsh"
               for b in enc.blocks)
    (x, coords), = _clouds(sizes=(120,))
    seen, outs = {}, {}
    hooks = [b.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].clone())) for i, b in
             enumerate(enc.blocks)]
    hooks += [b.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o.clone())) for i, b in
              enumerate(enc.blocks)]
    with torch.no_grad():
        enc(x[None], coords[None])
        p = enc.pos_encoder(coords[None])
        torch.testing.assert_close(seen[0], enc.feat_encoder(x[None]) + p)
        for i in (1, 2):   # each block's input: the previous block's output plus the encoding
            torch.testing.assert_close(seen[i], outs[i - 1] + p)
    for h in hooks:
        h.remove()
    with pytest.raises(ValueError, match="encoder_options"):
        TrackReconstructor(**SMALL, encoder_options={"heads": 2})
    with pytest.raises(ValueError, match="pe: expected"):
        TrackReconstructor(**SMALL, encoder_options={"pe": "sinusoidal"})


def test_resolution_plot_of_matched_tracks(tmp_path):
    pytest.importorskip("matplotlib")
    from pointformers.tasks.tracking.resolution_plot import draw_resolutions

    g = np.random.default_rng(0)
    n = 200
    truth = {"pt": g.uniform(0.9, 20.0, n), "eta": g.uniform(-3, 3, n), "phi": g.uniform(-np.pi, np.pi, n),
             "charge": g.choice([-1.0, 1.0], n)}
    pred = {"pt": truth["pt"] * (1 + 0.05 * g.standard_normal(n)), "eta": truth["eta"] + 0.01 * g.standard_normal(n),
            "phi": np.angle(np.exp(1j * (truth["phi"] + 0.02 * g.standard_normal(n)))), "charge": truth["charge"]}
    out = draw_resolutions(pred, truth, tmp_path / "res.png", title="test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fitted = {**pred, "pt": np.where(np.arange(n) % 7 == 0, np.nan, pred["pt"] * 1.01)}   # a fit beside, some NaN
    both = draw_resolutions(pred, truth, tmp_path / "both.png", fitted=fitted)
    assert both.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="fitted: missing"):
        draw_resolutions(pred, truth, tmp_path / "x.png", fitted={"pt": pred["pt"]})
    with pytest.raises(ValueError, match="no matched track"):
        draw_resolutions({k: v[:0] for k, v in pred.items()}, {k: v[:0] for k, v in truth.items()}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="one entry per track"):
        draw_resolutions({**pred, "eta": pred["eta"][:5]}, truth, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_the_assignment_threshold_and_merging_radius_are_chosen_on_validation_clouds():
    # as HEPT's DBSCAN radius: the grid's threshold of highest mean TrackML score on the validation clouds
    # (ties: the larger), then at it the merging radius (ties: the smaller), then used on the test clouds
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.tasks.tracking.reconstruction import (HIT_GATE_GRID, MERGE_RADIUS_GRID, THRESHOLD_GRID,
                                                            TrackReconstructionTask)
    from pointformers.tasks.tracking.trackml_score import trackml_score, trackml_score_split
    from pointformers.tasks.tracking.training import cloud_truth_weights, prepare_tracking_clouds

    clouds = prepare_tracking_clouds([generate_event(preset_params("tiny"), seed=s) for s in (5, 6)], cache_dir=False)
    torch.manual_seed(0)
    model = TrackReconstructor(dim=16, heads=2, n_layers=1, num_slots=24, block_size=32, num_regions=4,
                               decoder_heads=2).eval()
    task = TrackReconstructionTask()
    val, test = clouds[:1], clouds[1:]

    def scores(settings):
        pred = task.predict(model, val, settings)
        return [trackml_score_split([trackml_score(lab[i], c.inputs.particle_id, cloud_truth_weights(c))
                                     for (lab, _), c in zip(pred, val)]) for i in range(len(settings))]
    s1 = scores([(t, None) for t in THRESHOLD_GRID])
    i = max(range(len(s1)), key=lambda k: (s1[k], k))
    s2 = scores([(THRESHOLD_GRID[i], r) for r in MERGE_RADIUS_GRID])
    j = max(range(len(s2)), key=lambda k: (s2[k], -k))
    t, r, g, score = task.choose_assignment(model, val)
    assert (t, r, g, score) == (THRESHOLD_GRID[i], MERGE_RADIUS_GRID[j], 0.0, s2[j])   # hit_pt_min = pt_min: no gate
    # labels that are perfect at one threshold (any radius) or at one radius only: that one is chosen
    pid = val[0].inputs.particle_id
    real_assign, real_merge = model.assign, model.merge
    for k in (0, 4, len(THRESHOLD_GRID) - 2):
        model.assign = lambda out, n, threshold=None, k=k, **kw: (pid if threshold == THRESHOLD_GRID[k]
                                                                 else torch.full_like(pid, -1))[None]
        model.merge = lambda labels, emb, radius=None, sectors=None: labels
        assert task.choose_assignment(model, val) == (THRESHOLD_GRID[k], 0.0, 0.0, 1.0)
    for k in (1, len(MERGE_RADIUS_GRID) - 1):
        model.assign = lambda out, n, threshold=None, **kw: torch.full_like(pid, -1)[None]
        model.merge = lambda labels, emb, radius=None, sectors=None, k=k: pid[None] if radius == MERGE_RADIUS_GRID[k] else labels
        assert task.choose_assignment(model, val) == (THRESHOLD_GRID[-1], MERGE_RADIUS_GRID[k], 0.0, 1.0)
    # the gate: searched with every radius when the hit classifier learns fewer particles than the slots; a
    # setting perfect at one gate only is the one chosen (ties: the smaller gate, then the smaller radius)
    gated = TrackReconstructionTask(pt_min=0.0, hit_pt_min=0.9)
    for k in (1, len(HIT_GATE_GRID) - 1):
        model.assign = lambda out, n, threshold=None, **kw: pid[None]
        model.gate = lambda labels, out, h=None, k=k: labels if h == HIT_GATE_GRID[k] else torch.full_like(labels, -1)
        model.merge = lambda labels, emb, radius=None, sectors=None: labels
        assert gated.choose_assignment(model, val) == (THRESHOLD_GRID[-1], 0.0, HIT_GATE_GRID[k], 1.0)
        assert task.choose_assignment(model, val, hit_thresholds=HIT_GATE_GRID)[2] == HIT_GATE_GRID[k]
    del model.gate
    model.assign, model.merge = real_assign, real_merge
    val_metrics = task.evaluate(model, val)                  # the validation metric: at the chosen setting
    assert (val_metrics["threshold"], val_metrics["merge_radius"], val_metrics["hit_threshold"],
            val_metrics["trackml_score"]) == (t, r, g, score)
    res = task.evaluate_report(model, val, test)
    assert (res["threshold"], res["merge_radius"], res["hit_threshold"], res["val_trackml_score"]) == (t, r, g, score)
    (lab, _), = task.predict(model, test, [(t, r)])
    assert res["num_tracks"] == len(np.unique(lab[0][lab[0] >= 0]))
    # after training (the engine's hooks): best.pt's config carries the validated options, the model and
    # the test pass use them instead of choosing again on the test clouds
    assert task.validated_options(val_metrics) == {"threshold": t, "merge_radius": r, "hit_threshold": g}
    other = THRESHOLD_GRID[0] if t != THRESHOLD_GRID[0] else THRESHOLD_GRID[1]
    task.use_validated(model, {"threshold": other, "merge_radius": 0.3, "hit_threshold": 0.4})
    assert (model.threshold, model.merge_radius, model.hit_threshold) == (other, 0.3, 0.4)
    got = task.evaluate(model, test)
    assert (got["threshold"], got["merge_radius"], got["hit_threshold"]) == (other, 0.3, 0.4)
    (lab, _), = task.predict(model, test)                     # the model's own setting now
    (want, _), = task.predict(model, test, [(other, 0.3, 0.4)])
    assert np.array_equal(lab, want[0])

"""Pile-up task: inputs, focal loss, per-event AP / ROC-AUC on hand-made cases, the model, training."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score
from torch import nn

from pointformers import attention, models
from pointformers.data.pileup import PileupEvent, generate_events
from pointformers.tasks.pileup import (
    PILEUP_FEATURES,
    PileupInputs,
    PileupTask,
    focal_loss,
    pileup_event_metrics,
    pileup_inputs,
    pileup_baselines,
    pileup_metrics,
    prepare_pileup_samples,
    scored_mask,
)
from pointformers.tasks.registry import get_task


def logit(p):
    p = torch.as_tensor(p, dtype=torch.float64)
    return torch.log(p / (1 - p))


def small_model(attention_name: str = "hept", **kw) -> nn.Module:
    torch.manual_seed(0)
    opts = dict(n_layers=2, heads=2, head_dim=8, dim=16, mlp_hidden=32, mlp_layers=3, dropout=0.0, num_regions=2,
                block_size=50)
    opts.update(kw)
    return models.build("pileup-encoder", attention=attention_name, **opts)


def event_from(rows: dict) -> PileupEvent:
    n = len(rows["pt"])
    base = dict(eta=np.zeros(n), phi=np.zeros(n), px=np.zeros(n), py=np.zeros(n), energy=np.ones(n),
                rapidity=np.zeros(n), charge=np.zeros(n, np.int64), pdg=np.full(n, 22), is_pu=np.ones(n, bool),
                vertex=np.ones(n, np.int64), jet=np.full(n, -1))
    base.update(rows)
    return PileupEvent(**{k: np.asarray(v) for k, v in base.items()})


# ------------------------------------------------------------------ focal loss
def test_focal_loss_hand_computed() -> None:
    # p = 0.8 (y=1), 0.8 (y=0), 0.5 (y=1), 0.1 (y=0):
    #   BCE = -ln 0.8, -ln 0.2, ln 2, -ln 0.9;  p_t = 0.8, 0.2, 0.5, 0.9
    #   FL  = 0.25 (1 - p_t)^2 BCE = 0.25·0.04·0.223144, 0.25·0.64·1.609438, 0.25·0.25·0.693147, 0.25·0.01·0.105361
    z = logit([0.8, 0.8, 0.5, 0.1])
    y = torch.tensor([1, 0, 1, 0])
    terms = [0.002231436, 0.257510006, 0.043321698, 0.000263401]
    assert float(focal_loss(z, y)) == pytest.approx(sum(terms) / 4, rel=1e-6)
    # Lin et al.'s α-balanced form: α for positives, 1 − α for negatives.
    bal = [terms[0], terms[1] * 3, terms[2], terms[3] * 3]
    assert float(focal_loss(z, y, alpha_mode="balanced")) == pytest.approx(sum(bal) / 4, rel=1e-6)
    # γ = 0, α = 1 is plain binary cross-entropy.
    assert float(focal_loss(z, y, alpha=1.0, gamma=0.0)) == pytest.approx(
        float(F.binary_cross_entropy(torch.sigmoid(z), y.double())), rel=1e-9)


def test_focal_loss_edges_and_errors() -> None:
    empty = torch.zeros(0, requires_grad=True)
    out = focal_loss(empty, torch.zeros(0))
    assert float(out.detach()) == 0.0 and out.requires_grad
    out.backward()  # a training step on an event without scored particles runs
    z = torch.tensor([30.0, -30.0], dtype=torch.float64)  # confident and right: no log(0) blow-up
    assert 0 <= float(focal_loss(z, torch.tensor([1, 0]))) < 1e-20
    with pytest.raises(ValueError, match="logits: contains NaN"):
        focal_loss(torch.tensor([float("nan")]), torch.tensor([1]))
    with pytest.raises(ValueError, match="target: expected a tensor of shape"):
        focal_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="target: expected 0/1"):
        focal_loss(torch.zeros(2), torch.tensor([0.0, 2.0]))
    with pytest.raises(ValueError, match="^alpha:"):
        focal_loss(torch.zeros(2), torch.zeros(2), alpha=1.5)
    with pytest.raises(ValueError, match="^alpha_mode:"):
        focal_loss(torch.zeros(2), torch.zeros(2), alpha_mode="x")


# ------------------------------------------------------------------ metrics
def test_ap_and_roc_auc_hand_computed() -> None:
    # Event 1, ranked 0.9(+) 0.8(−) 0.3(+) 0.1(−): AP = ½(1/1 + 2/3) = 5/6; ROC-AUC = 3 of 4 pairs = 0.75.
    # Event 2, ranked 0.7(−) 0.6(−) 0.2(+): AP = 1/3; ROC-AUC = 0.
    s1, y1 = np.array([0.9, 0.8, 0.3, 0.1]), np.array([1, 0, 1, 0])
    s2, y2 = np.array([0.2, 0.7, 0.6]), np.array([1, 0, 0])
    e1 = pileup_event_metrics(s1, y1)
    assert e1["ap"] == pytest.approx(5 / 6) and e1["roc_auc"] == pytest.approx(0.75)
    assert e1["f1"] == pytest.approx(0.5)  # threshold 0.5: predicted {0.9, 0.8}: P = 1/2, R = 1/2
    m = pileup_metrics([s1, s2], [y1, y2])
    assert m["ap"] == pytest.approx((5 / 6 + 1 / 3) / 2)  # the mean over events, not pooled
    assert m["roc_auc"] == pytest.approx(0.375)
    pooled = average_precision_score(np.r_[y1, y2], np.r_[s1, s2])
    assert abs(pooled - m["ap"]) > 0.01
    assert (m["events"], m["events_ap"], m["events_roc_auc"], m["events_skipped"]) == (2, 2, 2, 0)


def test_metric_skips_events_without_scorable_particles() -> None:
    s1, y1 = np.array([0.9, 0.8, 0.3, 0.1]), np.array([1, 0, 1, 0])
    none = (np.zeros(0), np.zeros(0, bool))  # no neutral above the pT cut
    negatives = (np.array([0.4, 0.2]), np.array([0, 0]))  # AP undefined (no positive)
    positives = (np.array([0.4]), np.array([1]))  # AP = 1, ROC-AUC undefined (one class)
    m = pileup_metrics([s1, none[0], negatives[0], positives[0]], [y1, none[1], negatives[1], positives[1]])
    assert m["ap"] == pytest.approx((5 / 6 + 1.0) / 2)
    assert m["roc_auc"] == pytest.approx(0.75)
    assert (m["events"], m["events_ap"], m["events_roc_auc"], m["events_skipped"]) == (4, 2, 1, 2)
    with pytest.raises(ValueError, match="none of the 2 events has a scored particle from the leading collision"):
        pileup_metrics([none[0], negatives[0]], [none[1], negatives[1]])
    with pytest.raises(ValueError, match="no events"):
        pileup_metrics([], [])
    with pytest.raises(ValueError, match="scores: contains NaN"):
        pileup_event_metrics(np.array([np.nan]), np.array([1]))
    with pytest.raises(ValueError, match="equal shapes"):
        pileup_event_metrics(np.zeros(2), np.zeros(3))


# ------------------------------------------------------------------ inputs
def test_inputs_columns_and_scored_mask() -> None:
    ev = event_from(dict(pt=[0.5, 1.2, 3.0, 0.9], eta=[0.1, -1.0, 2.0, 3.5], phi=[0.2, 1.0, -2.0, 3.0],
                         px=[1, 2, 3, 4], py=[5, 6, 7, 8], energy=[9, 10, 11, 12], rapidity=[0.1, -0.9, 1.9, 3.4],
                         charge=[0, 0, 1, 0], pdg=[22, 130, 211, 2112], is_pu=[True, False, False, True]))
    inp = pileup_inputs(ev)
    assert PILEUP_FEATURES == ("eta", "phi", "px", "py", "pt", "energy", "rapidity", "pid")
    want = np.array([[0.1, 0.2, 1, 5, 0.5, 9, 0.1, 1], [-1.0, 1.0, 2, 6, 1.2, 10, -0.9, 2],
                     [2.0, -2.0, 3, 7, 3.0, 11, 1.9, 0], [3.5, 3.0, 4, 8, 0.9, 12, 3.4, 4]])
    np.testing.assert_allclose(inp.x.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(inp.coords.numpy(), want[:, [0, 1, 0, 1]], rtol=1e-6)
    assert inp.label.tolist() == [False, True, True, False]
    # Neutral with pT strictly above 0.9: the charged π and the 0.9 GeV neutron are out.
    assert scored_mask(inp.charge, inp.pt).tolist() == [False, True, False, False]
    bad = event_from(dict(pt=[1.0, float("inf")]))
    with pytest.raises(ValueError, match="feature 'pt' has NaN or inf"):
        pileup_inputs(bad)
    with pytest.raises(ValueError, match="has no particles"):
        pileup_inputs(event_from(dict(pt=np.zeros(0))))
    with pytest.raises(ValueError, match="PDG code 111"):
        pileup_inputs(event_from(dict(pt=[1.0], pdg=[111])))


# ------------------------------------------------------------------ model
def test_model_shapes_padding_and_bad_input() -> None:
    model = small_model("full").eval()
    ev = prepare_pileup_samples(generate_events("pileup-tiny", 2, seed=0))
    a, b = ev
    with torch.no_grad():
        za, zb = model(a.x, a.coords), model(b.x, b.coords)
        assert za.shape == (a.num_particles,)
        n = max(a.num_particles, b.num_particles)
        x = torch.zeros(2, n, 8)
        c = torch.zeros(2, n, 4)
        mask = torch.zeros(2, n, dtype=torch.bool)
        for i, s in enumerate((a, b)):
            x[i, : s.num_particles], c[i, : s.num_particles], mask[i, : s.num_particles] = s.x, s.coords, True
        zz = model(x, c, mask)
        torch.testing.assert_close(zz[0, : a.num_particles], za, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(zz[1, : b.num_particles], zb, atol=1e-5, rtol=1e-4)
        assert (zz[~mask] == 0).all()
        # Permutation equivariance: shuffling the particles shuffles the logits.
        p = torch.randperm(a.num_particles, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(model(a.x[p], a.coords[p]), za[p], atol=1e-5, rtol=1e-4)
    x = a.x.clone()
    x[0, -1] = 7.0
    with pytest.raises(ValueError, match="integer PID categories 0..6"):
        model(x, a.coords)
    with pytest.raises(ValueError, match=r"x: expected \(B, N, 8\)"):
        model(a.x[:, :7], a.coords)


def test_hept_pileup_matches_the_paper_configuration() -> None:
    m = models.build("hept-pileup")
    assert m.encoder.in_dim == 17 and m.encoder.coord_dim == 4  # 8 − 1 + 10 (PID embedding)
    assert m.pid_embedding.num_embeddings == 7 and m.pid_embedding.embedding_dim == 10
    assert m.out_proj.in_features == 12 and m.encoder.attention == "hept"
    n = sum(p.numel() for p in m.parameters() if p.requires_grad)
    # The authors' 0.31M includes 4 × w_rpe Linear(30, 192) (5,952 each) of which only ω is used.
    assert abs(n + 4 * 5952 - 311_000) < 2_000


@pytest.mark.parametrize("mech", sorted(attention.available()))
def test_every_mechanism_trains_on_the_task(mech: str) -> None:
    sample = prepare_pileup_samples(generate_events("pileup-tiny", 1, seed=3))[0]
    model = small_model(mech, n_layers=1)
    loss = PileupTask().loss(model, sample)
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() > 0
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)


# ------------------------------------------------------------------ task
class FeatureScore(nn.Module):
    """Logit = w · pT: a stand-in model whose ranking is known exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.0))

    def forward(self, x, coords):
        return self.w * (x[:, 4] - 2.0)


def test_task_loss_and_evaluate_equal_the_direct_computation() -> None:
    samples = prepare_pileup_samples(generate_events("pileup-tiny", 3, seed=9))
    task, model = PileupTask(), FeatureScore()
    s = samples[0]
    sel = scored_mask(s.charge, s.pt)
    want = focal_loss(s.x[sel, 4] - 2.0, s.label[sel])
    assert task.loss(model, s).item() == pytest.approx(want.item(), rel=1e-6)
    m = task.evaluate(model, samples)
    aps = [average_precision_score(t.label[scored_mask(t.charge, t.pt)].numpy(),
                                   t.pt[scored_mask(t.charge, t.pt)].numpy()) for t in samples]
    assert m["ap"] == pytest.approx(float(np.mean(aps)), rel=1e-9)
    assert 0 < m["roc_auc"] <= 1 and m["events_ap"] == 3 and math.isfinite(m["loss"])


def test_events_without_neutral_particles() -> None:
    samples = prepare_pileup_samples(generate_events("pileup-tiny", 2, seed=9))
    charged_only = pileup_inputs(event_from(dict(pt=[2.0, 3.0], charge=[1, -1], pdg=[211, -211],
                                                 is_pu=[False, True])))
    task, model = PileupTask(), small_model("hept")
    loss = task.loss(model, charged_only)
    assert loss.item() == 0.0
    loss.backward()  # no crash; zero gradients
    m = task.evaluate(model, samples + [charged_only])
    assert m["events"] == 3 and m["events_skipped"] == 1 and m["events_ap"] == 2
    with pytest.raises(ValueError, match="none of the 1 events"):
        task.evaluate(model, [charged_only])
    with pytest.raises(ValueError, match="sample: expected PileupInputs"):
        task.loss(model, samples[0].x)
    # An event without any particle cannot be a model input: dropped with a warning, or an error.
    empty = event_from(dict(pt=np.zeros(0)))
    with pytest.warns(UserWarning, match="1 of 2 events have no particles"):
        kept = prepare_pileup_samples([empty, generate_events("pileup-tiny", 1, seed=9)[0]])
    assert len(kept) == 1
    with pytest.raises(ValueError, match="has no particles"):
        prepare_pileup_samples([empty], skip_empty=False)


def test_training_on_the_tiny_preset_reduces_the_loss() -> None:
    samples = prepare_pileup_samples(generate_events("pileup-tiny", 4, seed=0))
    model = small_model("hept")
    task = PileupTask()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def total() -> float:
        model.eval()
        with torch.no_grad():
            out = sum(float(task.loss(model, s)) for s in samples)
        model.train()
        return out

    before = total()
    for _ in range(8):
        for s in samples:
            opt.zero_grad()
            task.loss(model, s).backward()
            opt.step()
    after = total()
    assert after < 0.6 * before


def test_baselines() -> None:
    samples = prepare_pileup_samples(generate_events("pileup-small", 4, seed=1))
    rows = pileup_baselines(samples)
    labels = [s.label[scored_mask(s.charge, s.pt)].numpy() for s in samples]
    pos_rate = float(np.mean([y.mean() for y in labels]))
    # Random scores: AP ≈ the positive rate, ROC-AUC ≈ 0.5; ranking by pT is better (jets are hard).
    assert abs(rows["random probabilities"]["ap"] - pos_rate) < 0.12
    assert abs(rows["random probabilities"]["roc_auc"] - 0.5) < 0.1
    assert rows["pT ranking"]["ap"] > rows["random probabilities"]["ap"] + 0.1
    assert rows == pileup_baselines(samples)  # seeded


def test_registered_task_spec(tmp_path) -> None:
    spec = get_task("pileup")
    assert spec.metric == "ap" and spec.mode == "max" and spec.default_model == "hept-pileup"
    assert spec.baselines is not None
    cfg = {"data": {**spec.data_defaults, "preset": "pileup-tiny", "cache_dir": str(tmp_path)},
           "task": {**spec.task_defaults}}
    spec.validate(cfg)
    out = spec.load(cfg, ("val", "test"), False)
    assert [len(out["val"]), len(out["test"])] == [2, 2] and isinstance(out["val"][0], PileupInputs)
    assert out["val"][0].event_id == 16
    paths = spec.generate(cfg, ("val",))
    assert len(paths) == 1 and (tmp_path / "pileup").is_dir() and paths[0].endswith(".npz")
    task = spec.build(cfg)
    assert isinstance(task, PileupTask) and task.alpha == 0.25 and task.gamma == 2.0 and task.pt_min == 0.9
    over = {"data": {**cfg["data"], "n_events": 10, "mu": 2.0}, "task": cfg["task"]}
    assert len(spec.load(over, ("val",), False)["val"]) == 1
    for section, key, value, msg in (("data", "preset", "nope", "data.preset"), ("data", "seed", -1, "data.seed"),
                                     ("task", "alpha", 2.0, "task.alpha"), ("task", "gamma", -1.0, "task.gamma"),
                                     ("task", "alpha_mode", "x", "task.alpha_mode"),
                                     ("data", "n_events", 0, "data.n_events")):
        bad = {"data": dict(cfg["data"]), "task": dict(cfg["task"])}
        bad[section][key] = value
        with pytest.raises(ValueError, match=f"^{msg}"):
            spec.validate(bad)


def test_config_file_resolves() -> None:
    from pathlib import Path

    from pointformers.engine.config import load_config

    cfg = load_config(Path(__file__).parents[1] / "configs" / "pileup-hept.yaml")
    assert cfg["task"]["name"] == "pileup" and cfg["model"]["name"] == "hept-pileup"
    assert cfg["train"]["metric"] == "ap" and cfg["data"]["preset"] == "pileup-small"
    models.build(cfg["model"]["name"], **cfg["model"]["options"])

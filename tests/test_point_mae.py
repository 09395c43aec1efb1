"""Masked point pre-training (models/point_mae.py): Chamfer distance, FPS + kNN tokenizer, masking,
encoder isolation from masked tokens, overfitting one batch, the fine-tuning classifier.

The module is imported inside the tests (fixture ``pm``), not at collection: importing it registers
"point-mae" / "point-mae-cls", and tests/test_flat_models.py lists the registered models when it is
collected."""
from __future__ import annotations

import importlib
import itertools

import pytest
import torch

SMALL = dict(num_groups=8, group_size=16, dim=32, depth=2, decoder_depth=1, heads=4, head_dim=8, tokenizer_hidden=16,
             pos_hidden=16)


@pytest.fixture(scope="module")
def pm():
    return importlib.import_module("pointformers.models.point_mae")


def _clouds(B=2, N=128, seed=0, dtype=torch.float64):
    return torch.rand(B, N, 3, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------- chamfer
def _chamfer_reference(p, t, tm):
    out = []
    for g in range(p.shape[0]):
        tt = t[g][tm[g]]
        d = [[float(((a - b) ** 2).sum()) for b in tt] for a in p[g]]
        fwd = sum(min(row) for row in d) / len(d)
        bwd = sum(min(d[i][j] for i in range(len(d))) for j in range(len(tt))) / len(tt)
        out.append(fwd + bwd)
    return torch.tensor(out, dtype=p.dtype)


def test_chamfer_l2_equals_brute_force_and_is_zero_on_identical_sets(pm):
    g = torch.Generator().manual_seed(1)
    p = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    t = torch.randn(4, 7, 3, generator=g, dtype=torch.float64)
    tm = torch.ones(4, 7, dtype=torch.bool)
    tm[1, 4:] = False
    tm[3, 1:] = False
    ref = _chamfer_reference(p, t, tm)
    torch.testing.assert_close(pm.chamfer_l2(p, t, target_mask=tm, reduction="none"), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pm.chamfer_l2(p, t, target_mask=tm), ref.mean(), rtol=1e-12, atol=1e-12)
    # identical sets (in another order): zero; symmetric in its arguments
    assert float(pm.chamfer_l2(t, t.flip(1))) == 0.0
    torch.testing.assert_close(pm.chamfer_l2(p, t), pm.chamfer_l2(t, p), rtol=1e-12, atol=1e-12)
    assert float(pm.chamfer_l2(p, t)) > 0


def test_chamfer_l2_names_bad_arguments(pm):
    p = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match="^target:"):
        pm.chamfer_l2(p, torch.zeros(3, 4, 3))
    with pytest.raises(ValueError, match="^target_mask:"):
        pm.chamfer_l2(p, p, target_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="^reduction:"):
        pm.chamfer_l2(p, p, reduction="sum")


# ----------------------------------------------------------------------------------------- tokenizer
def _fps_reference(p, count):
    """Farthest point sampling from the point farthest from the centroid (the helpers' convention)."""
    c = p.mean(0)
    chosen = [int(((p - c) ** 2).sum(-1).argmax())]
    while len(chosen) < count:
        d = torch.stack([((p - p[i]) ** 2).sum(-1) for i in chosen]).amin(0)
        chosen.append(int(d.argmax()))
    return chosen


def test_tokenizer_groups_are_the_knn_of_fps_centres(pm):
    pos = _clouds(B=2, N=60, seed=3)
    mask = torch.ones(2, 60, dtype=torch.bool)
    mask[1, 41:] = False
    pos[1, 41:] = 9.0   # padding far away must be ignored
    tok = pm.PointGroupTokenizer(num_groups=6, group_size=5, dim=8, hidden=4).double()
    out = tok(pos, mask)
    assert out.tokens.shape == (2, 6, 8) and out.index.shape == (2, 6, 5) and bool(out.valid.all())
    for b, n in ((0, 60), (1, 41)):
        p = pos[b, :n]
        centres = _fps_reference(p, 6)
        assert out.centre_index[b].tolist() == centres
        for j, c in enumerate(centres):
            nearest = ((p - p[c]) ** 2).sum(-1).argsort()[:5]
            assert sorted(out.index[b, j].tolist()) == sorted(nearest.tolist())
            torch.testing.assert_close(out.relative[b, j], p[out.index[b, j]] - p[c])
            torch.testing.assert_close(out.centres[b, j], p[c])


def test_tokenizer_small_clouds_get_padding_groups(pm):
    pos = _clouds(B=2, N=20, seed=4)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 3:] = False
    out = pm.PointGroupTokenizer(num_groups=8, group_size=4, dim=8, hidden=4).double()(pos, mask)
    assert out.valid.sum(1).tolist() == [8, 3]
    assert out.point_valid[1, :3].sum(1).tolist() == [3, 3, 3]   # a group holds the cloud's 3 points
    assert bool((out.tokens[1, 3:] == 0).all()) and bool(torch.isfinite(out.tokens).all())
    with pytest.raises(ValueError, match="^num_groups:"):
        pm.PointGroupTokenizer(num_groups=0)


# ------------------------------------------------------------------------------------------- masking
@pytest.mark.parametrize("ratio,expected", [(0.7, [5, 3]), (0.5, [4, 2]), (0.0, [0, 0])])
def test_masking_ratio_is_exact(pm, ratio, expected):
    torch.manual_seed(0)
    model = pm.PointMAE(**{**SMALL, "mask_ratio": ratio}).double()
    pos = _clouds()
    mask = torch.ones(2, 128, dtype=torch.bool)
    mask[1, 5:] = False   # 5 real points: 5 groups, floor(5 * ratio) masked
    loss, d = model(pos, mask, generator=torch.Generator().manual_seed(0))
    assert d["masked"].sum(1).tolist() == expected
    assert not bool((d["masked"] & d["visible"]).any())
    assert ((d["masked"] | d["visible"]) == d["groups"].valid).all()
    assert d["pred"].shape == (sum(expected), 16, 3) and bool(torch.isfinite(loss))


def test_masking_follows_the_generator_and_is_deterministic_in_eval(pm):
    torch.manual_seed(0)
    model = pm.PointMAE(**SMALL).double()
    pos = _clouds()
    masks = [model(pos, generator=torch.Generator().manual_seed(s))[1]["masked"] for s in (5, 5, 6)]
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    model.eval()
    with torch.no_grad():
        (l1, d1), (l2, d2) = model(pos), model(pos)
    assert torch.equal(d1["masked"], d2["masked"]) and float(l1) == float(l2)
    with pytest.raises(ValueError, match="^mask_ratio:"):
        pm.PointMAE(**{**SMALL, "mask_ratio": 1.0})


def test_encoder_never_sees_masked_tokens(pm):
    torch.manual_seed(0)
    model = pm.PointMAE(**SMALL).double()
    pos = _clouds()
    _, ref = model(pos, generator=torch.Generator().manual_seed(2))
    state = {}

    def replace(module, args, out):   # overwrite the chosen tokens with garbage
        tokens = out.tokens.clone()
        tokens[state["which"]] = 100.0 * torch.randn_like(tokens[state["which"]])
        return out._replace(tokens=tokens)

    handle = model.tokenizer.register_forward_hook(replace)
    try:
        state["which"] = ref["masked"]
        _, d = model(pos, generator=torch.Generator().manual_seed(2))
        assert torch.equal(d["masked"], ref["masked"])
        torch.testing.assert_close(d["latent"], ref["latent"], rtol=0, atol=0)
        state["which"] = ref["visible"]      # the check can fail: visible tokens do reach the encoder
        _, d = model(pos, generator=torch.Generator().manual_seed(2))
        assert not torch.allclose(d["latent"], ref["latent"])
    finally:
        handle.remove()


# ------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("attention", ["full", "sampled"])
def test_loss_decreases_when_overfitting_one_batch(pm, attention):
    torch.manual_seed(0)
    model = pm.PointMAE(**SMALL, attention=attention)
    pos = _clouds(dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss, _ = model(pos, generator=torch.Generator().manual_seed(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(map(lambda v: v == v, losses))
    assert min(losses[-5:]) < 0.5 * losses[0], losses


@pytest.mark.parametrize("attention", ["full", "sampled"])
def test_both_mechanisms_train_and_classify(pm, attention):
    torch.manual_seed(0)
    model = pm.PointMAE(**SMALL, attention=attention)
    pos = _clouds(dtype=torch.float32)
    loss, _ = model(pos)
    loss.backward()
    assert all(p.grad is not None for n, p in model.encoder.named_parameters()), "every encoder weight is trained"
    expected = {"full": "FullAttention", "sampled": "SampledAttention"}[attention]
    assert type(model.encoder.blocks[0].mixer).__name__ == expected
    assert type(model.decoder.blocks[0].mixer) is type(model.encoder.blocks[0].mixer)
    cls = pm.PointMAEClassifier.from_pretrained(model, num_classes=5).eval()
    with torch.no_grad():
        logits = cls(None, pos)
    assert logits.shape == (2, 5) and bool(torch.isfinite(logits).all())


# ---------------------------------------------------------------------------------------- fine-tuning
def test_classifier_holds_the_pretrained_encoder(pm, tmp_path):
    from pointformers import models

    torch.manual_seed(0)
    mae = pm.PointMAE(**SMALL, attention="sampled")
    with torch.no_grad():   # move the weights away from any fresh init
        for p in mae.parameters():
            p.add_(0.1 * torch.randn_like(p))
    cls = pm.PointMAEClassifier.from_pretrained(mae, num_classes=7)
    mine, theirs = cls.state_dict(), mae.state_dict()
    shared = [k for k in mine if k.startswith(("tokenizer.", "encoder."))]
    assert shared and set(shared) == {k for k in theirs if k.startswith(("tokenizer.", "encoder."))}
    for k in shared:
        assert torch.equal(mine[k], theirs[k]), k
    assert cls.head[-1].out_features == 7
    # a copy: training the classifier leaves the pre-trained model alone
    with torch.no_grad():
        cls.encoder.norm.weight.add_(1.0)
    assert not torch.equal(cls.encoder.norm.weight, mae.encoder.norm.weight)
    # from a saved state_dict through the registry, with the same options
    path = tmp_path / "mae.pt"
    torch.save(mae.state_dict(), path)
    opts = {k: v for k, v in mae.config.items()}
    built = models.build("point-mae-cls", pretrained=str(path), num_classes=7, **opts)
    for k in shared:
        assert torch.equal(built.state_dict()[k], theirs[k]), k
    pos = _clouds(dtype=torch.float32)
    ref = pm.PointMAEClassifier.from_pretrained(mae, num_classes=7).eval()
    built.head.load_state_dict(ref.head.state_dict())
    built.eval()
    with torch.no_grad():
        torch.testing.assert_close(built(None, pos), ref(None, pos))
    with pytest.raises(ValueError, match="^source:"):
        pm.PointMAEClassifier.from_pretrained({"head.weight": torch.zeros(1)}, num_classes=7, **SMALL)


def test_classifier_flat_input_equals_padded(pm):
    torch.manual_seed(0)
    cls = pm.PointMAEClassifier(num_classes=3, **{k: v for k, v in SMALL.items() if k != "decoder_depth"},
                                attention="sampled").double().eval()
    sizes = (37, 70, 20)
    g = torch.Generator().manual_seed(0)
    clouds = [torch.rand(n, 3, generator=g, dtype=torch.float64) for n in sizes]
    padded = torch.full((3, 70, 3), 0.5, dtype=torch.float64)
    mask = torch.zeros(3, 70, dtype=torch.bool)
    for i, c in enumerate(clouds):
        padded[i, :len(c)], mask[i, :len(c)] = c, True
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    with torch.no_grad():
        torch.testing.assert_close(cls(None, torch.cat(clouds), batch=batch), cls(None, padded, mask),
                                   rtol=1e-12, atol=1e-12)
        # the max-pooled tokens are a function of the point set: storage order does not matter
        perm = torch.randperm(70, generator=g)
        torch.testing.assert_close(cls(None, padded[:, perm], mask[:, perm]), cls(None, padded, mask),
                                   rtol=1e-10, atol=1e-10)


def test_registry_builds_both_models(pm):
    from pointformers import models

    assert models.build("point-mae", **SMALL).registry_name == "point-mae"
    assert isinstance(models.build("point-mae-cls", num_classes=4), pm.PointMAEClassifier)
    assert models.info("point-mae").export == models.info("sampled-cls").export   # the default reason
    for name, value in itertools.product(["depth", "heads"], [0]):
        with pytest.raises(ValueError, match=f"^{name}:"):
            models.build("point-mae", **{**SMALL, name: value})


# ------------------------------------------------------------------------------------ pre-training task
PRETRAIN_YAML = """
data: {preset: tiny, seed: 0, format: procedural, classes: [cone, cuboid, torus], per_class: [2, 1, 1],
  num_points: 64, normals: false, mini_batch: 3}
model:
  name: point-mae
  options: {num_groups: 8, group_size: 16, dim: 32, depth: 2, decoder_depth: 1, heads: 4, head_dim: 8,
    ffn_hidden: 32, tokenizer_hidden: 16, pos_hidden: 16, attention: sampled}
task: {name: point-mae-pretrain, augment: sampled}
train: {epochs: 2, lr: 0.001, optimizer: adamw, weight_decay: 0.05, decay_exempt: true, schedule: cosine,
  schedule_unit: step, warmup_steps: 1, seed: 0, metric: chamfer, mode: min, progress: false, tensorboard: false}
"""


def test_pretrain_task_trains_through_the_cli_and_fine_tunes_from_its_checkpoint(tmp_path, monkeypatch):
    import json

    from pointformers import models
    from pointformers.cli import main
    from pointformers.registry import PLUGIN_ENV

    monkeypatch.setenv(PLUGIN_ENV, "")   # the CLI records --plugin here; restored after the test
    cfg, out = tmp_path / "pretrain.yaml", tmp_path / "run"
    cfg.write_text(PRETRAIN_YAML)
    assert main(["train", "--plugin", "pointformers.tasks.point_mae", "--config", str(cfg),
                 "--set", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["epochs"]) == 2 and all(row["val"]["chamfer"] > 0 for row in metrics["epochs"])
    assert metrics["best"]["chamfer"] == min(row["val"]["chamfer"] for row in metrics["epochs"])   # mode min
    ckpt = torch.load(out / "best.pt", weights_only=True)
    assert ckpt["model_name"] == "point-mae"
    cls = models.build("point-mae-cls", pretrained=str(out / "best.pt"), num_classes=3)
    for k, v in cls.state_dict().items():
        if k.startswith(("tokenizer.", "encoder.")):
            assert torch.equal(v, ckpt["model"][k]), k
    assert type(cls.encoder.blocks[0].mixer).__name__ == "SampledAttention"   # the run's options were used
    with pytest.raises(ValueError, match="^pretrained:"):
        models.build("point-mae-cls", pretrained=str(tmp_path / "missing.pt"))


def test_pretrain_task_loss_and_evaluation(tmp_path):
    import importlib

    import yaml

    importlib.import_module("pointformers.tasks.point_mae")
    from pointformers import models
    from pointformers.engine.config import ConfigError, load_config
    from pointformers.tasks.registry import get_task

    path = tmp_path / "c.yaml"
    path.write_text(PRETRAIN_YAML)
    cfg = load_config(path, [f"data.cache_dir={tmp_path / 'cache'}"])
    spec = get_task("point-mae-pretrain")
    assert (spec.metric, spec.mode) == ("chamfer", "min")
    samples = spec.load(cfg, ("train", "val"), False)
    torch.manual_seed(0)
    model, task = models.build("point-mae", **cfg["model"]["options"]), spec.build(cfg)
    losses = []
    for _ in range(2):   # the masks and augmentation follow the generator (the sampled cycles the global RNG)
        torch.manual_seed(1)
        losses.append(task.loss(model, samples["train"][0], torch.Generator().manual_seed(0)))
    assert float(losses[0].detach()) == float(losses[1].detach()) > 0 and losses[0].requires_grad
    first, second = task.evaluate(model, samples["val"]), task.evaluate(model, samples["val"])
    assert first == second and first["chamfer"] > 0 and model.training   # eval masks are fixed; mode restored
    bad = yaml.safe_load(PRETRAIN_YAML)
    bad["task"]["augment"] = "auto"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="task.augment"):
        load_config(path)


def test_normals_reach_the_tokens(pm):
    torch.manual_seed(0)
    model = pm.PointMAE(**SMALL, in_dim=3).double().eval()
    pos = _clouds()
    nrm = torch.nn.functional.normalize(torch.randn_like(pos), dim=-1)
    with torch.no_grad():
        (_, a), (_, b) = model(pos, x=nrm), model(pos, x=-nrm)
    assert torch.equal(a["masked"], b["masked"]) and not torch.allclose(a["latent"], b["latent"])
    with pytest.raises(ValueError, match="x"):
        model(pos)   # built with in_dim=3: the features are required

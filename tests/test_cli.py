"""CLI tests: config handling (one-line errors naming the key), the demo end to end on the
tiny preset, train -> evaluate, and the event display's cluster score."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pointformers import cli
from pointformers.cli import DEMO_CONFIG, ConfigError, load_config, main
from pointformers.engine import load_checkpoint
from pointformers.tasks.tracking.display import choose_eps, track_match_score

REPO = Path(__file__).resolve().parents[1]
TINY = ["--set", "model.options.n_layers=1", "--set", "model.options.mlp_hidden=32",
        "--set", "model.options.block_size=32", "--set", "model.options.num_regions=4"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    # One generated-data cache for the module's tests, never the user's ~/.cache.
    monkeypatch.setenv("POINTFORMERS_CACHE", str(tmp_path_factory.getbasetemp() / "pf-cache"))
    monkeypatch.setenv("CI", "1")  # no progress bars in test logs


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


# ------------------------------------------------------------------------------ config
def test_shipped_config_is_the_demo_config() -> None:
    assert yaml.safe_load((REPO / "configs" / "tracking-hept-small.yaml").read_text()) == DEMO_CONFIG
    assert load_config(REPO / "configs" / "tracking-hept-small.yaml") == load_config()


def test_set_overrides_and_parses_values() -> None:
    cfg = load_config(None, ["train.epochs=3", "train.lr=1e-3", "model.options.num_regions=4", "data.cache_dir=null"])
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["lr"] == 1e-3  # "1e-3" is a YAML string: coerced
    assert cfg["model"]["options"] == {**DEMO_CONFIG["model"]["options"], "num_regions": 4}
    assert cfg["data"]["cache_dir"] is None


@pytest.mark.parametrize("argv,key", [
    (["train", "--set", "train.epoch=3"], "train.epoch"),
    (["train", "--set", "trian.epochs=3"], "trian"),
    (["train", "--set", "model.options.layers=2"], "model.options.layers"),
    (["train", "--set", "train.epochs=0"], "train.epochs"),
    (["train", "--set", "train.lr=fast"], "train.lr"),
    (["train", "--set", "task.tau=-1"], "task.tau"),
    (["train", "--set", "data.preset=huge"], "data.preset"),
    (["train", "--set", "model.name=nope"], "model.name"),
    (["demo", "--set", "train.gamma=2"], "train.gamma"),
    (["train", "--set", "noequals"], "noequals"),
])
def test_config_errors_are_one_line_naming_the_key(capsys, argv, key) -> None:
    err = _one_line_error(capsys, argv)
    assert key in err and "error" in err


def test_unknown_key_in_yaml_file(tmp_path: Path, capsys) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epochs: 2\n  learning_rate: 0.1\n")
    err = _one_line_error(capsys, ["train", "--config", str(p)])
    assert "train.learning_rate" in err and "valid keys" in err
    p.write_text("train: [1, 2]\n")
    assert "train" in _one_line_error(capsys, ["train", "--config", str(p)])
    assert "no such file" in _one_line_error(capsys, ["train", "--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(ConfigError):
        load_config(None, ["out=3"]) and None  # wrong type for a top-level key


# ------------------------------------------------------------------------------ demo / train / evaluate
@pytest.mark.heavy
def test_demo_tiny_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--epochs", "1", "--preset", "tiny", "--out", str(out), *TINY]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    names = [r["model"] for r in res["rows"]]
    assert len(names) == 3 and names[0].startswith("HEPT trained") and "untrained" in names[1] and "kNN" in names[2]
    for r in res["rows"]:
        assert 0.0 <= r["ap@k"] <= 1.0 and r["model"] in printed
    # The knn row is a fixed function of the data: recompute it independently.
    from pointformers.data.tracking import load_tracking_dataset
    from pointformers.tasks.tracking import ap_at_k, ap_at_k_split, knn_eta_phi_embedding, tracking_inputs

    test = [tracking_inputs(e) for e in load_tracking_dataset("tiny", "test")]
    knn = ap_at_k_split([ap_at_k(knn_eta_phi_embedding(i), i.particle_id, i.pt, i.reconstructable) for i in test])
    assert res["rows"][2]["ap@k"] == pytest.approx(knn)
    png = out / "event_display.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert res["display"] == str(png)
    best = load_checkpoint(out / "best.pt")
    assert best["model_config"]["n_layers"] == 1 and best["epoch"] == 1
    assert res["rows"][0]["ap@k"] == pytest.approx(json.loads((out / "metrics.json").read_text())["test"]["ap@k"])
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["preset"] == "tiny"
    assert "total" in printed


def test_train_then_evaluate(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["train", "--set", "data.preset=tiny", "--set", "train.epochs=1", "--out", str(out), *TINY]
    assert main(argv) == 0
    assert "best epoch 1" in capsys.readouterr().out
    assert main(["evaluate", "--checkpoint", str(out / "best.pt"), "--split", "test"]) == 0
    printed = capsys.readouterr().out
    test_ap = json.loads((out / "metrics.json").read_text())["test"]["ap@k"]
    assert f"{test_ap:.4f}" in printed and "kNN" in printed
    err = _one_line_error(capsys, ["evaluate", "--checkpoint", str(out / "missing.pt")])
    assert "missing.pt" in err
    # --json of a split; then the same run checkpoint on a folder of TrackML events: DBSCAN's
    # radius is the one chosen on the run's validation split, as for --split test.
    assert main(["evaluate", "--checkpoint", str(out / "best.pt"), "--json", str(tmp_path / "split.json")]) == 0
    split = json.loads((tmp_path / "split.json").read_text())
    run_row = split["rows"][next(iter(split["rows"]))]
    assert split["split"] == "test" and run_row["ap@k"] == pytest.approx(test_ap)
    from pointformers.data.tracking import generate_event, preset_params
    from pointformers.data.trackml import write_trackml_event

    write_trackml_event(generate_event(preset_params("tiny"), seed=5), tmp_path / "events", "event000000005")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / "best.pt"), "--data", str(tmp_path / "events"),
                 "--json", str(tmp_path / "data.json")]) == 0
    assert "validation split" in capsys.readouterr().out
    res = json.loads((tmp_path / "data.json").read_text())
    assert res["dbscan_eps"] == pytest.approx(run_row["dbscan_eps"])
    assert [r["event"] for r in res["events"]] == ["event000000005"] and 0 <= res["overall"]["ap@k"] <= 1
    # plot: learning curves plus the tracking task's event display of a validation cloud from best.pt.
    assert main(["plot", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("learning_curves.png", "event_display.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(out / name) in printed
    # generate: the tracking caches of the config's preset, one file per split.
    assert main(["generate", "--set", "data.preset=tiny", "--splits", "val,test"]) == 0
    paths = [line for line in capsys.readouterr().out.splitlines() if line.endswith(".npz")]
    assert len(paths) == 2 and all(Path(p).is_file() and "tiny-" in Path(p).name for p in paths)


# ------------------------------------------------------------------------------ display pieces
def test_track_match_score_hand_made() -> None:
    pid = np.array([1, 1, 1, 2, 2, 0])
    pt = np.array([1.0, 1.0, 1.0, 2.0, 2.0, 0.0])
    rec = np.ones(6, bool)
    assert track_match_score(np.array([0, 0, 0, 1, 1, -1]), pid, pt, rec) == pytest.approx(1.0)
    # Everything merged into one cluster of 6: particle 1 hits score 3²/(6·3), particle 2 hits 2²/(6·2).
    assert track_match_score(np.zeros(6, int), pid, pt, rec) == pytest.approx((3 * 0.5 + 2 * (1 / 3)) / 5)
    # Particle 1 split 2 + 1, particle 2 unclustered (0 each).
    assert track_match_score(np.array([0, 0, 1, -1, -1, -1]), pid, pt, rec) == pytest.approx(
        (2 * (4 / 6) + 1 / 3) / 5)
    # Low-pt particle 2 is not scored.
    assert track_match_score(np.array([0, 0, 0, -1, -1, -1]), pid, np.array([1, 1, 1, .5, .5, 0]), rec) == 1.0


def test_choose_eps_finds_separating_radius() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(10, 4, generator=g) * 10
    pid = torch.arange(10).repeat_interleave(5) + 1
    emb = centres[pid - 1] + 0.05 * torch.randn(50, 4, generator=g)
    eps, scores = choose_eps([emb], [pid], [torch.full((50,), 2.0)], [torch.ones(50, dtype=torch.bool)])
    assert scores[eps] == pytest.approx(1.0)
    assert max(scores.values()) == scores[eps] and min(scores.values()) <= scores[eps]


def test_cli_entry_point_declared() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'pointformers = "pointformers.cli:main"' in text
    assert callable(cli.main)


def test_sample_counts_name_mini_batches_and_items():
    """train/evaluate print mini-batch tasks' samples as mini-batches with their item count."""
    import torch

    from pointformers.cli import _count_phrase
    from pointformers.tasks.minibatch import MiniBatch

    assert _count_phrase([MiniBatch(None, torch.arange(3)), MiniBatch(None, torch.arange(2))]) == \
        "2 mini-batches (5 items)"
    assert _count_phrase([object(), object()]) == "2 samples"
    assert _count_phrase([]) == "0 samples"


def test_evaluate_last_checkpoint_of_a_non_tracking_run(tmp_path: Path, capsys) -> None:
    """``evaluate --checkpoint RUN/last.pt`` evaluates the run's own task and data (the experiment's
    config travels in last.pt as in best.pt), not the demo's tracking data; a checkpoint without
    one falls back to the run folder's config.yaml, and with neither, the error says to pass --config."""
    import torch

    out = tmp_path / "run"
    argv = ["train", "--config", "configs/shape-classification-mlp-cls.yaml", "--set", "train.epochs=1",
            "--set", "data.per_class=[1,1,1]", "--set", "data.num_points=32",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / "last.pt"), "--split", "test"]) == 0
    assert "oa" in capsys.readouterr().out
    ckpt = torch.load(out / "last.pt", weights_only=False)
    ckpt.pop("extra")
    from pointformers.engine.checkpoint import save_checkpoint

    ckpt.pop("sha256", None)
    save_checkpoint(out / "old.pt", ckpt)
    assert main(["evaluate", "--checkpoint", str(out / "old.pt"), "--split", "test"]) == 0  # via config.yaml
    assert "oa" in capsys.readouterr().out
    (out / "config.yaml").unlink()
    err = _one_line_error(capsys, ["evaluate", "--checkpoint", str(out / "old.pt"), "--split", "test"])
    assert "carries no experiment config" in err and "--config" in err

"""Config handling: every error is one line naming the dotted key and what was expected; task
switching through task.name; defaults from the TaskSpec; model options checked against the
constructor's signature."""
from __future__ import annotations

from pathlib import Path

import pytest

import engine_toy_task  # noqa: F401  (registers task "toy" and model "toy-mlp")
from pointformers.cli import DEMO_CONFIG, load_config, main
from pointformers.engine import TrainConfig
from pointformers.engine.config import (
    TRAIN_SCHEMA,
    ConfigError,
    coerce_value,
    model_option_names,
    task_default_config,
)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")


def _one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"pointformers {argv[0]}: error: "), err
    return err


@pytest.mark.parametrize("sets,expected", [
    (["train.batch_size=0"], "train.batch_size: must be an integer >= 1"),
    (["train.batch_size=two"], "train.batch_size: expected an integer, got 'two'"),
    (["train.precision=fp16"], "train.precision: expected one of fp32, bf16, got 'fp16'"),
    (["train.compile=3"], "train.compile: expected true or false or a string, got 3"),
    (["train.tensorboard=maybe"], "train.tensorboard: expected true or false or null, got 'maybe'"),
    (["train.device=tpu"], "train.device: must be 'auto', 'cpu', 'cuda' or 'cuda:K', got 'tpu'"),
    (["train.epochs=true"], "train.epochs: expected an integer, got True"),
    (["train.lr=[1, 2]"], "train.lr: expected a number, got [1, 2]"),
    (["train.grad_clip=-1"], "train.grad_clip: must be a finite number > 0 or null"),
    (["train.mode=best"], "train.mode: must be 'max' or 'min'"),
    (["train.seed=null"], "train.seed: must not be null (expected an integer)"),
    (["train.batchsize=2"], "unknown config key 'train.batchsize' (valid keys in 'train': batch_size,"),
    (["task.name=nope"], "task.name: unknown task 'nope' (valid: "),
    (["task.name=toy", "task.noise=-1"], "task.noise: must be >= 0"),
    (["task.name=toy", "task.radius=1"], "unknown config key 'task.radius' (valid keys in 'task': host_rng, name, noise)"),
    (["task.name=toy", "data.n_train=x"], "data.n_train: expected an integer, got 'x'"),
    (["task.name=toy", "model.options.hidden=8", "model.options.width=3"],
     "unknown config key 'model.options.width' (valid: dropout, hidden)"),
    (["model.options.num_region=4"], "unknown config key 'model.options.num_region'"),
    (["data.cache_dir=5"], "data.cache_dir: expected a string or null, got 5"),
    (["data.n_events=0"], "data.n_events: must be >= 1 (or null for the preset's), got 0"),
    (["model=hept"], "model: expected a section (mapping), got 'hept'"),
    (["train.epochs.x=1"], "unknown config key 'train.epochs.x'"),
    (["=3"], "--set '=3': expected a dotted key"),
])
def test_config_errors_are_one_line(capsys, sets, expected) -> None:
    argv = ["train"]
    for s in sets:
        argv += ["--set", s]
    assert expected in _one_line(capsys, argv)


def test_yaml_file_errors_name_file_and_line(tmp_path: Path, capsys) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("train:\n  epochs: 3\n  lr: [0.1\n")
    err = _one_line(capsys, ["train", "--config", str(p)])
    assert "bad.yaml" in err and "line" in err and "invalid YAML" in err
    p.write_text("- 1\n- 2\n")
    assert "expected a mapping at the top level" in _one_line(capsys, ["generate", "--config", str(p)])
    p.write_text("task:\n  name: toy\ndata:\n  preset: small\n")  # a tracking key in a toy config
    assert "unknown config key 'data.preset' (valid keys in 'data': n_train, seed)" in _one_line(
        capsys, ["train", "--config", str(p)])


def test_every_train_key_is_in_the_schema_and_coerced() -> None:
    assert set(TRAIN_SCHEMA) == set(TrainConfig.field_names())
    assert coerce_value("train.lr", "1e-3", (float,)) == 1e-3  # PyYAML reads 1e-3 as a string
    assert coerce_value("train.epochs", 3.0, (int,)) == 3 and isinstance(coerce_value("k", 3.0, (int,)), int)
    assert coerce_value("train.compile", "aot_eager", (bool, str)) == "aot_eager"
    assert coerce_value("train.compile", True, (bool, str)) is True
    with pytest.raises(ConfigError, match=r"^train.epochs: expected an integer, got 2.5$"):
        coerce_value("train.epochs", 2.5, (int,))
    with pytest.raises(ConfigError, match=r"^train.lr: expected a number, got True$"):
        coerce_value("train.lr", True, (float,))


def test_defaults_come_from_the_task_spec(tmp_path: Path) -> None:
    d = task_default_config("toy")
    assert d["data"] == {"n_train": 9, "seed": 0} and d["task"] == {"name": "toy", "noise": 0.05, "host_rng": True}
    assert d["train"]["metric"] == "mse" and d["train"]["mode"] == "min" and d["model"]["name"] == "toy-mlp"
    # A file names only what differs from the task's defaults.
    p = tmp_path / "toy.yaml"
    p.write_text("task: {name: toy}\ntrain: {epochs: 3, batch_size: 2}\n")
    cfg = load_config(p, ["model.options.hidden=8"])
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["batch_size"] == 2 and cfg["train"]["lr"] == 1e-2
    assert cfg["train"]["precision"] == "fp32" and cfg["train"]["compile"] is False
    assert cfg["model"] == {"name": "toy-mlp", "options": {"hidden": 8}}
    # Switching the task from the demo's base drops every tracking key.
    cfg = load_config(None, ["task.name=toy"])
    assert cfg["data"] == {"n_train": 9, "seed": 0} and cfg["model"]["options"] == {}
    # The demo config resolves to task tracking with its own train section kept.
    demo = load_config()
    assert demo["task"]["name"] == "tracking" and demo["train"]["epochs"] == DEMO_CONFIG["train"]["epochs"]
    assert demo["train"]["batch_size"] == 1 and demo["train"]["metric"] == "ap@k"


def test_changing_model_name_drops_the_old_options() -> None:
    cfg = load_config(None, ["model.name=tracking-encoder", "model.options.attention=full"])
    assert cfg["model"] == {"name": "tracking-encoder", "options": {"attention": "full"}}


def test_model_option_names_follow_the_constructor() -> None:
    assert model_option_names("toy-mlp") == {"hidden", "dropout"}
    names = model_option_names("hept-tracking")  # **options factory -> PointTransformerJK.__init__
    assert names is not None and {"num_regions", "block_size", "n_layers", "dropout"} <= names
    assert "attention" in model_option_names("tracking-encoder")


def test_tracking_n_events_shrinks_the_preset_only(tmp_path: Path) -> None:
    """data.n_events keeps the preset's generator parameters and changes only the event count
    (tiny: 2 sectors per event; 80/10/10 split of the clouds)."""
    from pointformers.data.tracking import resolve_params
    from pointformers.tasks.registry import get_task
    from pointformers.tasks.tracking.spec import data_params

    cfg = load_config(None, [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.n_events=5"])
    params = data_params(cfg["data"])
    assert params.n_events == 5 and params.replace(n_events=10) == resolve_params("tiny")
    samples = get_task("tracking").load(cfg, ("train", "test"), False)
    assert len(samples["train"]) == 8 and len(samples["test"]) == 1
    full = load_config(None, [f"data.cache_dir={tmp_path}", "data.preset=tiny"])
    assert data_params(full["data"]) == "tiny"


def test_tracking_sector_options_reach_the_generator() -> None:
    from pointformers.tasks.tracking.spec import data_params

    cfg = load_config("configs/tracking-hept-small.yaml", ["data.sector_ds=1.3", "data.sector_di=0"])
    p = data_params(cfg["data"])
    assert (p.sector_ds, p.sector_di, p.sector_slope, p.n_sectors) == (1.3, 0.0, "auto", 2)
    assert data_params(load_config("configs/tracking-hept-small.yaml")["data"]) == "small"
    with pytest.raises(ValueError, match="^data.sector_ds: expected a finite number >= 1"):
        load_config("configs/tracking-hept-small.yaml", ["data.sector_ds=0.5"])
    with pytest.raises(ValueError, match="^data.sector_slope: 'arctan' wedges"):
        load_config("configs/tracking-hept-small.yaml", ["data.sector_slope=arctan"])


def test_a_task_key_that_moved_to_the_model_options_still_loads(tmp_path: Path) -> None:
    # track-reconstruction's fragment merging moved from task.merge_max_hits to the model's options: an older
    # config file, --set or a checkpoint's saved config loads with a warning, the value where it now lives
    import warnings as w

    path = tmp_path / "old.yaml"
    path.write_text("task: {name: track-reconstruction, merge_max_hits: 3}\nmodel: {name: track-reconstruction}\n")
    with pytest.warns(UserWarning, match="task.merge_max_hits is now model.options.merge_max_hits"):
        cfg = load_config(path)
    assert cfg["model"]["options"]["merge_max_hits"] == 3 and "merge_max_hits" not in cfg["task"]
    with pytest.warns(UserWarning, match="--set: task.merge_max_hits"):
        cfg = load_config(None, ["task.name=track-reconstruction", "task.merge_max_hits=0",
                                 "model.options.merge_max_hits=1"])
    assert cfg["model"]["options"]["merge_max_hits"] == 1          # the model option given wins
    saved = {**cfg, "task": {**cfg["task"], "merge_max_hits": 4}, "model": {"name": "track-reconstruction",
                                                                            "options": {}}}
    with pytest.warns(UserWarning, match="the saved config"):
        assert load_config(None, [], base=saved)["model"]["options"]["merge_max_hits"] == 4
    with w.catch_warnings():
        w.simplefilter("error")
        load_config(None, ["task.name=track-reconstruction"])    # nothing moved: no warning
    with pytest.raises(ConfigError, match="unknown config key 'task.merge_max_hits'"):
        load_config(None, ["task.name=tracking", "task.merge_max_hits=2"])   # only where the task moved it

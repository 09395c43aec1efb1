"""Checkpoint content hash (issue 21, "resume trusts everything"): ``save_checkpoint`` stores a
SHA-256 of the content, ``load_checkpoint`` recomputes it and refuses a file whose content
changed (one flipped byte inside a weight's storage) while older hash-less files still load."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from pointformers.engine.checkpoint import CheckpointError, content_hash, load_checkpoint, save_checkpoint

DATA = Path(__file__).parent / "data"
MARK = 1.2345  # a weight value whose float32 bytes are easy to find in the file


def _save(path: Path) -> Path:
    w = torch.full((32,), MARK, dtype=torch.float32)
    save_checkpoint(path, {"model": {"w": w, "b": torch.arange(3.0)}, "epoch": 3, "history": [{"a": 1.5}]})
    return path


def test_saved_checkpoint_carries_a_matching_hash(tmp_path: Path) -> None:
    ck = load_checkpoint(_save(tmp_path / "a.pt"))
    assert isinstance(ck["sha256"], str) and len(ck["sha256"]) == 64
    assert ck["sha256"] == content_hash(ck)
    # the hash covers the content, not the zip layout: the same content saved twice hashes the same
    assert load_checkpoint(_save(tmp_path / "b.pt"))["sha256"] == ck["sha256"]


def test_flipped_byte_in_a_weight_is_a_hash_mismatch(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck.pt")
    data = bytearray(path.read_bytes())
    pattern = struct.pack("<f", MARK) * 32
    assert data.count(pattern) == 1
    i = data.find(pattern)
    data[i + 4 * 5 + 1] ^= 0x01  # weight 5's mantissa: a slightly different float, the zip still reads
    path.write_bytes(bytes(data))
    raw = torch.load(path, weights_only=True)  # the file is readable, only its content changed
    assert raw["model"]["w"][5].item() != pytest.approx(MARK, abs=0, rel=0) and raw["model"]["w"][4] == raw["model"]["w"][6]
    with pytest.raises(CheckpointError, match=r"ck\.pt.*content hash mismatch \(corrupted\?\)"):
        load_checkpoint(path)


def test_changed_entry_is_a_hash_mismatch(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck.pt")
    ck = torch.load(path, weights_only=True)
    ck["epoch"] = 4  # edited by hand, hash kept
    torch.save(ck, path)
    with pytest.raises(CheckpointError, match="content hash mismatch"):
        load_checkpoint(path)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("checkpoint_v*.pt")))
def test_old_checkpoints_without_hash_still_load(name: str) -> None:
    ck = load_checkpoint(DATA / name)
    assert "sha256" not in ck


def test_hash_distinguishes_dtype_shape_and_structure() -> None:
    base = {"model": {"w": torch.zeros(4)}}
    variants = [{"model": {"w": torch.zeros(2, 2)}}, {"model": {"w": torch.zeros(4, dtype=torch.float64)}},
                {"model": {"w": torch.zeros(4)}, "x": None}, {"model": {"w": torch.zeros(4)}, "x": [1]},
                {"model": {"w": torch.zeros(4)}, "x": (1,)}, {"model": {"w": torch.zeros(4)}, "x": "1"}]
    hashes = {content_hash(v) for v in variants}
    assert len(hashes) == len(variants) and content_hash(base) not in hashes
    assert content_hash({**base, "sha256": "whatever"}) == content_hash(base)


# ---------------------------------------------------------------- every load path verifies the hash
def _tampered_model_checkpoint(tmp_path: Path) -> Path:
    """A valid tracking-encoder checkpoint (with its run config), then one weight changed by hand
    and saved back with the old hash: readable, but not what was written."""
    from pointformers import models
    from pointformers.engine.config import load_config

    torch.manual_seed(0)
    cfg = {"attention": "full", "heads": 2, "n_layers": 1, "mlp_hidden": 32, "mlp_layers": 3}
    model = models.build("tracking-encoder", **cfg)
    run_cfg = load_config(None, ["model.name=tracking-encoder", "data.preset=tiny"])
    path = tmp_path / "best.pt"
    save_checkpoint(path, {"model": model.state_dict(), "model_name": "tracking-encoder", "model_config": cfg,
                           "extra": {"config": run_cfg}})
    ck = torch.load(path, weights_only=True)
    key = next(iter(ck["model"]))
    ck["model"][key] = ck["model"][key] + 1.0
    torch.save(ck, path)
    return path


def _via_model_from_checkpoint(path: Path) -> None:
    from pointformers.engine.checkpoint import model_from_checkpoint
    model_from_checkpoint(path)


def _via_export(path: Path) -> None:
    from pointformers.export.onnx_export import load_model
    load_model(path)


def _via_tracking_eval(path: Path) -> None:
    from pointformers.trackml_eval import open_tracking_checkpoint
    open_tracking_checkpoint(path)


@pytest.mark.parametrize("load", [_via_model_from_checkpoint, _via_export, _via_tracking_eval],
                         ids=["model_from_checkpoint", "export.load_model", "trackml_eval"])
def test_every_loader_of_a_user_checkpoint_checks_the_hash(tmp_path: Path, load) -> None:
    path = _tampered_model_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"best\.pt.*content hash mismatch"):
        load(path)


@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_cli_commands_refuse_a_tampered_checkpoint(tmp_path: Path, capsys, command: str) -> None:
    from pointformers.cli import main
    path = _tampered_model_checkpoint(tmp_path)
    argv = {"evaluate": ["evaluate", "--checkpoint", str(path), "--split", "val"],
            "export": ["export", "--checkpoint", str(path), "--format", "torch.export",
                       "--out", str(tmp_path / "m.pt2")]}[command]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "content hash mismatch" in err and str(path) in err and err.count("\n") == 0, err


def test_resume_refuses_a_tampered_last_checkpoint(tmp_path: Path, capsys) -> None:
    import engine_toy_task  # noqa: F401  (registers task "toy")
    from engine_toy_task import TOY_SETS
    from pointformers.cli import main

    run = tmp_path / "run"
    sets = [*TOY_SETS, "--set", "train.epochs=1", "--set", "train.tensorboard=false", "--out", str(run)]
    assert main(["train", *sets]) == 0
    ck = torch.load(run / "last.pt", weights_only=True)
    ck["model"]["net.0.bias"] = ck["model"]["net.0.bias"] * 2
    torch.save(ck, run / "last.pt")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    assert main(["train", *sets, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{run / 'last.pt'}" in err and "content hash mismatch" in err and err.count("\n") == 0, err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_damaged_shipped_checkpoint_is_refused(tmp_path, monkeypatch):
    """The shipped authors' checkpoint is checked against its fixed sha256 when loaded by name."""
    import importlib
    import shutil

    hept_tracking = importlib.import_module("pointformers.models.hept_tracking")

    weights = tmp_path / "weights"
    weights.mkdir()
    good = Path(hept_tracking.__file__).parent / "weights" / "hept-tracking-60k.pt"
    data = bytearray(good.read_bytes())
    data[-100] ^= 0x01  # one flipped bit, in a tensor's bytes: torch.load would still read it
    (weights / "hept-tracking-60k.pt").write_bytes(bytes(data))
    monkeypatch.setattr(hept_tracking, "__file__", str(tmp_path / "hept_tracking.py"))
    with pytest.raises(ValueError, match="shipped checkpoint 'hept-tracking-60k' is damaged"):
        hept_tracking.from_reference_checkpoint("hept-tracking-60k")
    shutil.copy(good, weights / "hept-tracking-60k.pt")
    hept_tracking.from_reference_checkpoint("hept-tracking-60k")  # the intact file loads

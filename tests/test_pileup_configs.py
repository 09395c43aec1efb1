"""The pile-up baseline configs: each resolves, builds and is parameter-matched (±10 %) to HEPT's."""
import glob

import pytest
import torch

from pointformers.engine.config import load_config
from pointformers.models import build

BASELINES = sorted(p for p in glob.glob("configs/pileup-*.yaml") if not p.endswith("pileup-hept.yaml"))


def _params(cfg) -> int:
    return sum(p.numel() for p in build(cfg["model"]["name"], **cfg["model"]["options"]).parameters())


def test_there_are_baselines():
    assert len(BASELINES) >= 6


@pytest.mark.parametrize("path", BASELINES)
def test_pileup_baseline_matches_hept(path):
    hept = load_config("configs/pileup-hept.yaml")
    cfg = load_config(path)
    for section in ("data", "task", "train"):
        assert cfg[section] == hept[section], f"{path}: {section} differs from configs/pileup-hept.yaml"
    ratio = _params(cfg) / _params(hept)
    assert 0.9 <= ratio <= 1.1, f"{path}: {ratio:.3f} of HEPT's parameters"


@pytest.mark.parametrize("path", BASELINES + ["configs/pileup-hept.yaml"])
def test_pileup_config_runs_on_pileup_shaped_input(path):
    # 8 feature columns (PID last) and 4 coordinates, as the pile-up task feeds them
    cfg = load_config(path)
    torch.manual_seed(0)
    model = build(cfg["model"]["name"], **cfg["model"]["options"]).eval()
    x = torch.randn(1, 130, 8)
    x[..., -1] = torch.randint(0, 7, (1, 130)).float()
    with torch.no_grad():
        y = model(x, torch.randn(1, 130, 4))
    assert y.shape == (1, 130) and torch.isfinite(y).all()

"""Every config's model, where it can be exported, exports to a graph that computes the model itself.

``make test-release`` (a release check, not a step of .ci/run: about ten minutes on a fast 2-core
machine, hours on a slow shared VM, where CI could not finish): each config in configs/ is built as a training run
builds it (its ``model`` section, seeded), in float64; a model that :func:`check_exportable`
accepts is exported through ``torch.export`` and ONNX (onnxruntime) and both files are run on a
generated input at two point counts other than the traced one and compared with the model's own
output. New configs are covered automatically; a config whose model cannot be exported must say
why in an ``UnsupportedExportError``/``ValueError`` (recorded as a skip with that reason).
``make test`` keeps the cheap half for every config: the model builds and either has an export
path or names why not; the export paths themselves are exercised on small models of every
mechanism and every registered model (test_mechanism_export_mode, test_model_export_paths).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pointformers import models
from pointformers.engine.config import load_config
from pointformers.export import UnsupportedExportError, check_exportable, export_model, load_exported
from pointformers.export.onnx_export import example_inputs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*.yaml"))


def _model(config: str) -> torch.nn.Module:
    cfg = load_config(ROOT / config)
    torch.manual_seed(0)
    return models.build(cfg["model"]["name"], **dict(cfg["model"].get("options") or {})).double().eval()


def _inputs(model, n: int, seed: int):
    x, coords = example_inputs(model, n=n, dtype=torch.float64, seed=seed)
    if hasattr(model, "num_pid"):  # pile-up: the last column is the PID category
        x[:, -1] = torch.randint(0, model.num_pid, (n,), generator=torch.Generator().manual_seed(seed)).double()
    return x, coords


@pytest.mark.parametrize("config", CONFIGS)
def test_config_model_is_exportable_or_says_why(config):
    model = _model(config)
    try:
        check_exportable(model)
    except (UnsupportedExportError, ValueError) as exc:
        assert str(exc).strip() and ("model:" in str(exc) or isinstance(exc, UnsupportedExportError)), config
        return
    assert getattr(model, "export_inputs", None) == ("x", "coords"), config


@pytest.mark.release
@pytest.mark.parametrize("config", CONFIGS)
def test_config_model_exports_to_its_own_output(config, tmp_path):
    model = _model(config)
    try:
        check_exportable(model)
    except (UnsupportedExportError, ValueError) as exc:
        pytest.skip(f"not exportable: {exc}")
    formats = [("torch.export", "m.pt2")]
    try:
        import onnxruntime  # noqa: F401

        formats.append(("onnx", "m.onnx"))
    except ImportError:
        pass
    for fmt, name in formats:
        run = load_exported(export_model(model, tmp_path / name, format=fmt, dtype=torch.float64))
        for n, seed in ((run.min_points + 301, 1), (run.min_points + 1234, 2)):
            x, coords = _inputs(model, n, seed)
            with torch.no_grad():
                ref = model(x, coords)
            torch.testing.assert_close(torch.as_tensor(run(x, coords)), ref, rtol=1e-6, atol=1e-6,
                                       msg=lambda m: f"{config} ({fmt}, {n} points): {m}")

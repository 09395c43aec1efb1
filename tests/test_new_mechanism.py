"""Adding a mechanism is one file: examples/linear_attention.py registers "linear" and, without
touching any other file, it trains, is benchmarked and exports through the public API.

The file is loaded as a plugin (``pointformers --plugin FILE``, ``POINTFORMERS_PLUGINS``), the
way a user adds a mechanism to an installed package.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import pointformers
from pointformers.registry import PLUGIN_ENV, load_plugins

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = str(ROOT / "examples" / "linear_attention.py")


@pytest.fixture(scope="module")
def linear():
    (module,) = load_plugins([PLUGIN])
    assert "linear" in pointformers.attention.available()
    yield module
    pointformers.attention.MECHANISMS.unregister("linear")
    assert "linear" not in pointformers.attention.available()


def test_the_property_test_of_the_new_mechanism(linear):
    """Its own property test: equal to the dense formula, and padding never changes a real point."""
    torch.manual_seed(0)
    attn = pointformers.attention.build("linear", dim=16, heads=2).double()
    assert pointformers.attention.info("linear").bench == {"head_dim": 16}
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    y = attn(x, mask=mask)
    for b, n in ((0, 9), (1, 6)):
        q, k, v = attn.w_qkv(x[b:b + 1, :n]).view(n, 3, 2, 8).unbind(1)
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        a = torch.einsum("nhd,mhd->hnm", q, k)
        dense = attn.out_linear(torch.einsum("hnm,mhd->nhd", a / a.sum(-1, keepdim=True), v).reshape(n, 16))
        torch.testing.assert_close(y[b, :n], dense)
        torch.testing.assert_close(attn(x[b:b + 1, :n])[0], y[b, :n])  # alone = in a padded batch
    assert bool((y[1, 6:] == 0).all())


def test_it_trains_through_the_cli(linear, tmp_path):
    from pointformers.cli import main

    out = tmp_path / "run"
    rc = main(["--plugin", PLUGIN, "train", "--config", str(ROOT / "configs" / "tracking-performer-small.yaml"),
               "--set", "model.options.attention=linear", "--set", "model.options.attention_options={head_dim: 8}",
               "--set", "data.preset=tiny", "--set", f"data.cache_dir={tmp_path / 'cache'}",
               "--set", "train.epochs=1", "--threads", "1", "--out", str(out)])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert (out / "best.pt").is_file() and metrics
    model = pointformers.engine.model_from_checkpoint(out / "best.pt")
    assert model.blocks[0].mixer.registry_name == "linear"


@pytest.mark.release
def test_it_is_benchmarked_in_worker_processes(linear, monkeypatch):
    from pointformers.bench import flops, mechanisms

    f = flops.attention_flops("linear", n=512, dim=64, heads=4, head_dim=16)
    assert f.total() == 8 * 512 * 64 * 4 * 16 + 4 * 4 * 512 * 16 * 17
    monkeypatch.setenv(PLUGIN_ENV, PLUGIN)  # the workers are fresh processes: they load the plugin
    a = mechanisms.parser().parse_args(["--mechanisms", "linear", "full", "--sizes", "256", "--modes", "forward",
                                        "--repeats", "1", "--no-peak", "--plots", "", "--timeout", "120"])
    out = mechanisms.run(a, log=lambda s: None)
    rows = {r["mechanism"]: r for r in out["results"]}
    assert "seconds" in rows["linear"] and rows["linear"]["seconds"] > 0, rows["linear"]
    assert "| `linear` |" in out["text"] or "linear" in out["text"]


def test_it_exports_and_the_graph_computes_the_model(linear, tmp_path):
    from pointformers.export import export_model, load_exported, supported_mechanisms

    assert "linear" in supported_mechanisms()
    torch.manual_seed(0)
    model = pointformers.models.build("tracking-encoder", attention="linear", heads=2, n_layers=1, mlp_hidden=16,
                                      mlp_layers=2, attention_options={"head_dim": 8}).double().eval()
    run = load_exported(export_model(model, tmp_path / "linear.pt2", format="torch.export", dtype=torch.float64))
    g = torch.Generator().manual_seed(1)
    for n in (57, 301):
        x, c = torch.randn(n, 15, generator=g, dtype=torch.float64), torch.randn(n, 6, generator=g, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(torch.as_tensor(run(x, c)), model(x, c))

"""Deployment: ONNX / torch.export of trained models and the inference helpers (pointformers.export).

HEPT's output is a discontinuous function of its input (a sort into blocks), so exported and
PyTorch models are compared in float64, where sort-key near-ties are rare and agreement is
near-exact (see the reference README). Every exported file is run at two point counts.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math

import numpy as np
import pytest
import torch

from pointformers import models
from pointformers.data.tracking import generate_event
from pointformers.engine.checkpoint import save_checkpoint
from pointformers.export import (ExportableModel, TorchExportInference, UnsupportedExportError, export_model,
                                 load_exported, read_metadata, supported_mechanisms)
from pointformers.export.cli import add_export_parser, main as export_main
from pointformers.tasks.tracking import tracking_inputs

# A small HEPT tracking model: 2 heads, 2 layers, blocks of 64 (N not a multiple of it below).
HEPT_CONFIG = dict(heads=2, n_layers=2, block_size=64, num_regions=16, mlp_hidden=32, mlp_layers=3)


def _event(seed: int, n: int | None = None):
    """(x (n, 15), coords (n, 6)) float64 from a generated tracking event (first n hits)."""
    inp = tracking_inputs(generate_event("tiny", seed), dtype=torch.float64)
    n = n or inp.x.shape[0]
    assert inp.x.shape[0] >= n
    return inp.x[:n].contiguous(), inp.coords[:n].contiguous()


@pytest.fixture(scope="module")
def events():
    """Two generated events of different sizes (neither a multiple of the block size)."""
    a, b = _event(0), _event(1, 611)
    assert a[0].shape[0] != b[0].shape[0] and a[0].shape[0] % 64 and b[0].shape[0] % 64
    return [a, b]


@pytest.fixture(scope="module")
def hept_model():
    """float64 model whose weights are float32 numbers (so a float32 checkpoint holds them exactly).

    Its ω spans 1e-6 … 1e7 like the authors' trained checkpoint: the logits −½‖q̂ − k̂‖² are then
    differences of terms of order 1e8, so any weight or constant the export rounds to float32 shows
    (onnxscript's optimizer did exactly that; see export_model's ``optimize``).
    """
    torch.manual_seed(0)
    model = models.build("hept-tracking", **HEPT_CONFIG)
    with torch.no_grad():
        for blk in model.blocks:
            lo = blk.mixer.log_omega
            lo.copy_(torch.empty_like(lo).uniform_(math.log(1e-6), math.log(1e7)))
    return model.double().eval()


@pytest.fixture(scope="module")
def hept_checkpoint(tmp_path_factory, hept_model):
    """A training checkpoint (float32 weights, as the engine writes) of ``hept_model``."""
    path = tmp_path_factory.mktemp("run") / "best.pt"
    state = {k: v.float() for k, v in hept_model.state_dict().items()}
    save_checkpoint(path, {"model": state, "model_name": "hept-tracking", "model_config": HEPT_CONFIG})
    return path


@pytest.fixture(scope="module")
def hept_onnx(hept_checkpoint):
    """The checkpoint exported through the CLI: ``export --checkpoint best.pt --format onnx --dtype float64``,
    with its ``--check`` (the file against PyTorch on a generated event)."""
    for mod in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(mod)
    out = hept_checkpoint.with_name("hept.onnx")
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        rc = export_main(["--checkpoint", str(hept_checkpoint), "--format", "onnx", "--dtype", "float64",
                          "--out", str(out), "--check", "700"])
    assert rc == 0 and out.is_file()
    text = capture.getvalue()
    assert "wrote" in text and "check on 700 points: 100.00% of embeddings agree with PyTorch to 1e-5" in text
    return out


def _reference(model, x, coords, mask=None):
    with torch.no_grad():
        return model(x, coords, mask)


def _assert_close(out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-9):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
    assert err.max().item() < rtol, f"max relative error {err.max().item():.3g}"


# ----------------------------------------------------------------------------- ONNX

def test_onnx_hept_float64_matches_pytorch_at_two_point_counts(hept_onnx, hept_model, events):
    from pointformers.export import OnnxInference

    meta = read_metadata(hept_onnx)
    assert (meta["mechanism"], meta["dtype"], meta["in_dim"], meta["coord_dim"], meta["out_dim"]) == \
        ("hept", "float64", 15, 6, 12)
    run = OnnxInference(hept_onnx, threads=1)
    for x, coords in events:
        ref = _reference(hept_model, x, coords)
        out = run(x, coords)
        assert isinstance(out, torch.Tensor)
        _assert_close(out, ref)
    # numpy in, numpy out; the graph really is dynamic in N (raw onnxruntime session)
    x, coords = events[1]
    raw = run.session.run([run.session.get_outputs()[0].name], {"x": x.numpy(), "coords": coords.numpy()})[0]
    assert raw.shape == (x.shape[0], 12)
    assert isinstance(run(x.numpy(), coords.numpy()), np.ndarray)


def test_onnx_inference_batched_input_matches_padded_model(hept_onnx, hept_model, events):
    """(B, N, ·) + mask in, (B, N, out) out with zero padded rows, as the model returns."""
    run = load_exported(hept_onnx, threads=1)
    (xa, ca), (xb, cb) = events
    n = xa.shape[0]
    x = torch.zeros(2, n, 15, dtype=torch.float64)
    c = torch.zeros(2, n, 6, dtype=torch.float64)
    mask = torch.zeros(2, n, dtype=torch.bool)
    x[0], c[0], mask[0] = xa, ca, True
    x[1, :xb.shape[0]], c[1, :xb.shape[0]], mask[1, :xb.shape[0]] = xb, cb, True
    ref = _reference(hept_model, x, c, mask)  # (B, N, 12), padded rows zero
    out = run(x, c, mask)
    assert out.shape == ref.shape
    assert torch.all(out[1, xb.shape[0]:] == 0)
    _assert_close(out[mask], ref[mask])


def test_onnx_inference_rejects_bad_inputs(hept_onnx, events):
    run = load_exported(hept_onnx, threads=1)
    x, coords = events[1]
    with pytest.raises(ValueError, match=r"x: expected \(N, 15\)"):
        run(x[:, :14], coords)
    with pytest.raises(ValueError, match=r"coords: expected shape"):
        run(x, coords[:, :5])
    with pytest.raises(ValueError, match=r"coords: expected shape"):
        run(x, coords[:-1])
    bad = x.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match=r"x contains NaN"):
        run(bad, coords)
    bad = coords.clone()
    bad[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"coords contains NaN"):
        run(x, bad)
    with pytest.raises(ValueError, match=r"mask"):
        run(x[None], coords[None], torch.ones(1, x.shape[0] + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"exported model: no such file"):
        load_exported(hept_onnx.with_name("missing.onnx"))


# ----------------------------------------------------------------------------- torch.export

@pytest.fixture(scope="module")
def hept_pt2(hept_checkpoint):
    """The checkpoint exported through the ``export`` subcommand as registered by add_export_parser."""
    parser = argparse.ArgumentParser(prog="pointformers")
    add_export_parser(parser.add_subparsers(dest="command", required=True))
    out = hept_checkpoint.with_name("hept.pt2")
    args = parser.parse_args(["export", "--checkpoint", str(hept_checkpoint), "--format", "torch.export",
                              "--dtype", "float64", "--out", str(out)])
    assert args.func(args) == 0 and out.is_file()
    return out


def test_torch_export_hept_float64_matches_pytorch_at_two_point_counts(hept_pt2, hept_model, events):
    run = load_exported(hept_pt2)
    assert isinstance(run, TorchExportInference)
    meta = read_metadata(hept_pt2)
    assert (meta["format"], meta["dtype"], meta["mechanism"], meta["group_chunk"]) == \
        ("torch.export", "float64", "hept", 1)
    for x, coords in events:
        _assert_close(run(x, coords), _reference(hept_model, x, coords), rtol=1e-12)
    x, coords = events[1]
    with pytest.raises(ValueError, match=r"x contains NaN"):
        run(torch.full_like(x, float("nan")), coords)


# Small configurations of the other exportable mechanisms inside the tracking skeleton.
OTHER_MECHANISMS = {
    "full": {},
    "performer": dict(nb_features=16),
    "flt": dict(nb_features=16, coord_dim=6),
    "sft": dict(k=48),
    "samsa": dict(k=48),
    "serialized": dict(patch_size=128, coord_dim=6, shift=True),
}


def _small(mechanism: str, **attention_options):
    torch.manual_seed(0)
    return models.build("tracking-encoder", attention=mechanism, heads=2, n_layers=1, mlp_hidden=32, mlp_layers=3,
                        attention_options=attention_options).double().eval()


@pytest.mark.heavy
@pytest.mark.parametrize("mechanism", sorted(OTHER_MECHANISMS))
def test_torch_export_other_mechanisms_match_pytorch(tmp_path, mechanism, events):
    model = _small(mechanism, **OTHER_MECHANISMS[mechanism])
    run = load_exported(export_model(model, tmp_path / "m.pt2", format="torch.export", dtype=torch.float64))
    for x, coords in events:
        _assert_close(run(x, coords), _reference(model, x, coords), rtol=1e-12)


@pytest.mark.parametrize("mechanism,options", [
    ("hept", {}), ("kernel", {}), ("lsh_or", dict(block_size=64, coord_dim=6)),
    ("samsa", dict(k=48, support=False, eval_soft=False)), ("sft", dict(k=48, hard_eval=True)),
    *OTHER_MECHANISMS.items()])
def test_inference_paths_equal_the_modules(mechanism, options, events):
    """The export-friendly inference path of every supported mechanism computes the module's function."""
    assert mechanism in supported_mechanisms()
    model = _small(mechanism, **options)
    wrapper = ExportableModel(model)
    for x, coords in events:
        with torch.no_grad():
            _assert_close(wrapper(x, coords), _reference(model, x, coords), rtol=1e-12)


def test_sampling_mechanisms_record_their_minimum_point_count(tmp_path, events):
    model = _small("sft", k=48)
    path = export_model(model, tmp_path / "sft.pt2", format="torch.export", dtype=torch.float64)
    run = load_exported(path)
    assert run.min_points == 49
    x, coords = events[1]
    with pytest.raises(ValueError, match=r"needs at least 49"):
        run(x[:20], coords[:20])


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("mechanism,options,reason", [
    ("knn", dict(k=8, coord_dim=6), "depends on the point count"),
    ("sampled", {}, "randperm"),
    ("performer", dict(causal=True), "causal=True"),
    ("lsh_or", dict(n_and=2, coord_dim=6), "searchsorted"),
])
def test_unsupported_mechanisms_raise_a_clear_error(tmp_path, mechanism, options, reason):
    model = _small(mechanism, **options)
    out = tmp_path / "m.pt2"
    with pytest.raises(UnsupportedExportError, match=reason) as info:
        export_model(model, out, format="torch.export")
    assert info.value.mechanism == mechanism
    assert f"cannot export attention mechanism {mechanism!r}" in str(info.value)
    assert not out.exists()


def test_export_rejects_bad_arguments(tmp_path, hept_model):
    with pytest.raises(ValueError, match="format must be one of"):
        export_model(hept_model, tmp_path / "m.x", format="tflite")
    with pytest.raises(ValueError, match="dtype must be"):
        export_model(hept_model, tmp_path / "m.pt2", format="torch.export", dtype=torch.float16)
    with pytest.raises(ValueError, match="model: export supports the point models"):
        export_model(torch.nn.Linear(3, 3), tmp_path / "m.pt2", format="torch.export")


# ----------------------------------------------------------------------------- CLI

def test_cli_export_reports_errors(tmp_path, capsys):
    assert export_main(["--checkpoint", str(tmp_path / "nope.pt"), "--format", "torch.export"]) == 2
    assert "no such file" in capsys.readouterr().err
    torch.manual_seed(0)
    model = models.build("tracking-encoder", attention="sampled", heads=2, n_layers=1)
    path = tmp_path / "best.pt"
    save_checkpoint(path, {"model": model.state_dict(), "model_name": "tracking-encoder",
                           "model_config": {"attention": "sampled", "heads": 2, "n_layers": 1}})
    assert export_main(["--checkpoint", str(path), "--format", "torch.export"]) == 2
    err = capsys.readouterr().err
    assert "cannot export attention mechanism 'sampled'" in err


def test_shipped_checkpoint_name_loads_for_export_with_masked_padding():
    from pointformers.export import load_model
    from pointformers.export.cli import run
    import argparse

    model = load_model("hept-tracking-60k")
    assert model.padding == "mask" and model.in_dim == 15
    args = argparse.Namespace(checkpoint="hept-tracking-60k", out=None, format="onnx", check=None, group_chunk=None,
                              threads=None, dtype="float32", opset=20)
    with pytest.raises(ValueError, match="--out: needed with the shipped checkpoint"):
        run(args)


@pytest.mark.parametrize("attention", ["full", "performer", "hept"])
def test_export_wrapper_keeps_the_learned_positional_encoding(attention):
    """pe="learned" adds an encoding of the coordinates before the first block: the export wrapper
    must compute it too (it once left it out: max |Δ| 1.2–1.8 on 50 points)."""
    import pointformers

    torch.manual_seed(0)
    model = pointformers.models.build("tracking-encoder", attention=attention, pe="learned").double().eval()
    x, coords = torch.randn(50, 15, dtype=torch.float64), torch.randn(50, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ExportableModel(model)(x, coords), model(x, coords), rtol=1e-7, atol=1e-7)


def test_models_the_cli_trains_export_or_their_registry_entry_says_why(tmp_path):
    """Every registered model: its registry entry either says export handles it (export=None) or why not,
    and export_model refuses it with that reason."""
    from pointformers.models import MODELS

    for name in models.available():
        reason = MODELS.info(name).export
        if reason is None:
            continue
        assert isinstance(reason, str) and len(reason) > 20, name
    model = models.build("sft-cls", k=8, dim=16, depth=1, heads=2)
    with pytest.raises(ValueError, match=r"'sft-cls' cannot be exported: the `pointformers export` command writes "
                                         r"the per-point models"):
        export_model(model, tmp_path / "m.pt2", format="torch.export")


def test_the_exporters_op_table_is_built_once_and_never_shared():
    pytest.importorskip("onnxscript")
    from torch.onnx._internal.exporter import _registration

    from pointformers.export.onnx_export import _cached_torchlib_registry, onnx_translation_table

    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    with _cached_torchlib_registry():
        with _cached_torchlib_registry():  # re-entrant: the outer user keeps it installed
            a = _registration.ONNXRegistry().from_torchlib(opset_version=18)
        assert _registration.ONNXRegistry.__dict__["from_torchlib"] is not original
        for op, fn in onnx_translation_table().items():  # what torch.onnx.export does with a custom table
            a.register_op(op, fn)
        b = _registration.ONNXRegistry.from_torchlib(opset_version=18)
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is original  # restored by the last user
    assert a is not b and a.opset_version == b.opset_version == 18
    name = torch.ops.aten.sort.stable.name()
    assert any(d.is_custom for d in a.functions[name])
    assert not any(d.is_custom for d in b.functions.get(name, []))  # a's custom op did not leak into b
    assert set(b.functions) <= set(a.functions) and len(b.functions) > 100

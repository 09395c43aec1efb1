"""Issue 21 "nothing silent": bad input files give a ValueError naming the file (and line)."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from pointformers.data.tracking import TrackingParams, generate_event
from pointformers.data.trackml import read_trackml_event, write_trackml_event

from test_trackml_io import gzip_event


@pytest.fixture(scope="module")
def event():
    return generate_event(TrackingParams(mu=5), seed=2, event_id=1000)


@pytest.fixture()
def written(event, tmp_path: Path) -> Path:
    write_trackml_event(event, tmp_path, "event000001000")
    return tmp_path / "event000001000"


def _hits(prefix: Path) -> Path:
    return prefix.parent / (prefix.name + "-hits.csv")


def test_trackml_nan_coordinate_names_file_line_and_hit(written: Path) -> None:
    p = _hits(written)
    lines = p.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[3].split(",")
    fields[header.index("y")] = "nan"
    hit_id = fields[header.index("hit_id")]
    lines[3] = ",".join(fields)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{p.name}, line 4 \(hit_id {hit_id}\).*not finite"):
        read_trackml_event(written)


@pytest.mark.parametrize("value", ["inf", "-inf"])
def test_trackml_infinite_coordinate_is_refused(written: Path, value: str) -> None:
    p = _hits(written)
    lines = p.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[1].split(",")
    fields[header.index("z")] = value
    lines[1] = ",".join(fields)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{p.name}, line 2 .*not finite"):
        read_trackml_event(written)


def test_trackml_header_only_hits_file(written: Path) -> None:
    p = _hits(written)
    p.write_text(p.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=rf"{p.name}: no pixel hits"):
        read_trackml_event(written)


def test_trackml_truncated_gzip(written: Path) -> None:
    gzip_event(written)
    p = written.parent / (written.name + "-hits.csv.gz")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"file .*{p.name}: truncated or corrupted gzip"):
        read_trackml_event(written)


def test_trackml_not_gzip_at_all(written: Path) -> None:
    gzip_event(written)
    p = written.parent / (written.name + "-cells.csv.gz")
    p.write_bytes(b"hit_id,ch0,ch1,value\n1,2,3,0.1\n")
    with pytest.raises(ValueError, match=rf"file .*{p.name}: truncated or corrupted gzip"):
        read_trackml_event(written)


@pytest.mark.parametrize("gz", [False, True])
def test_trackml_not_utf8(written: Path, gz: bool) -> None:
    p = _hits(written)
    raw = p.read_bytes().split(b"\n")
    raw[5] = raw[5] + b"\xff\xfe"
    p.write_bytes(b"\n".join(raw))
    if gz:
        gzip_event(written)
        p = p.with_name(p.name + ".gz")
    with pytest.raises(ValueError, match=rf"file .*{p.name}: not UTF-8 text \(line 6\)"):
        read_trackml_event(written)


def test_trackml_missing_column(written: Path) -> None:
    p = _hits(written)
    lines = p.read_text().splitlines()
    header = lines[0].split(",")
    j = header.index("z")
    p.write_text("\n".join(",".join(f for k, f in enumerate(ln.split(",")) if k != j) for ln in lines) + "\n")
    with pytest.raises(ValueError, match=rf"{p.name}: missing column\(s\) \['z'\]"):
        read_trackml_event(written)


def _edit(path: Path, row: int, column: str, value: str) -> str:
    """Set ``column`` of the line ``row`` (1-based, header = 1) of a CSV; returns the old value."""
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[row - 1].split(",")
    old, fields[header.index(column)] = fields[header.index(column)], value
    lines[row - 1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return old


def _table(prefix: Path, kind: str) -> Path:
    return prefix.parent / ("detectors.csv" if kind == "detectors" else f"{prefix.name}-{kind}.csv")


@pytest.mark.parametrize("kind,column", [("particles", "px"), ("particles", "vz"), ("truth", "weight"),
                                         ("truth", "tx"), ("truth", "tpz"), ("cells", "value"),
                                         ("detectors", "rot_xu"), ("detectors", "pitch_v")])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_trackml_non_finite_values_name_file_line_and_column(written: Path, kind: str, column: str, value: str) -> None:
    p = _table(written, kind)
    _edit(p, 4, column, value)
    with pytest.raises(ValueError, match=rf"{p.name}, line 4, column '{column}': {value} is not a finite number"):
        read_trackml_event(written)


@pytest.mark.parametrize("kind,what", [("truth", "hit"), ("particles", "particle")])
def test_trackml_header_only_truth_and_particles(written: Path, kind: str, what: str) -> None:
    p = _table(written, kind)
    p.write_text(p.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=rf"{p.name}: no data lines \(only the header\); expected at least one {what}"):
        read_trackml_event(written)


def test_trackml_duplicate_truth_hit_id_names_both_lines(written: Path) -> None:
    p = _table(written, "truth")
    hit_id = p.read_text().splitlines()[2].split(",")[0]  # line 3
    _edit(p, 6, "hit_id", hit_id)
    with pytest.raises(ValueError, match=rf"{p.name}: hit_id {hit_id} appears 2 times \(lines 3 and 6\)"):
        read_trackml_event(written)


def test_trackml_duplicate_detector_module_names_both_lines(written: Path) -> None:
    p = _table(written, "detectors")
    lines = p.read_text().splitlines()
    lines[4] = lines[2]  # line 5 repeats line 3's module
    p.write_text("\n".join(lines) + "\n")
    v, l, m = lines[2].split(",")[:3]
    with pytest.raises(ValueError, match=rf"{p.name}: module \(volume_id, layer_id, module_id\) = \({v}, {l}, {m}\) "
                                         r"appears 2 times \(lines 3 and 5\)"):
        read_trackml_event(written)


@pytest.mark.parametrize("kind", ["truth", "cells"])
def test_trackml_rows_of_unknown_hits_name_file_and_line(written: Path, kind: str) -> None:
    p = _table(written, kind)
    _edit(p, 5, "hit_id", "987654321")
    with pytest.raises(ValueError, match=rf"{p.name}, line 5: hit_id 987654321 is not in .*-hits\.csv"):
        read_trackml_event(written)


def test_trackml_noise_hits_need_no_particle(written: Path) -> None:
    """particle_id 0 (noise) in the truth file is not looked up in the particles file: no warning."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ev = read_trackml_event(written)
    assert (ev.particle_id == 0).any() and 0 not in set(ev.particles_id.tolist())


# ---------------------------------------------------------------- ModelNet / ShapeNetPart
from test_modelnet_io import root as modelnet_root  # noqa: E402,F401  (fixture)
from test_shapenetpart_io import root as shapenet_root  # noqa: E402,F401  (fixture)

from pointformers.data.modelnet import load_modelnet_normal_resampled, read_modelnet_txt  # noqa: E402
from pointformers.data.shapenetpart import load_shapenetpart, read_shapenetpart_txt  # noqa: E402


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_modelnet_shape_file(modelnet_root, content: str) -> None:
    r, _ = modelnet_root
    p = r / "airplane" / "airplane_0001.txt"
    p.write_text(content)
    with pytest.raises(ValueError, match=rf"{p.name}: empty file"):
        read_modelnet_txt(p)
    with pytest.raises(ValueError, match=rf"{p.name}: empty file"):
        load_modelnet_normal_resampled(r, "train", num_points=16)


@pytest.mark.parametrize("name", ["modelnet40_shape_names.txt", "modelnet40_train.txt"])
def test_empty_modelnet_lists(modelnet_root, name: str) -> None:
    r, _ = modelnet_root
    (r / name).write_text("")
    with pytest.raises(ValueError, match=rf"{name}: empty file"):
        load_modelnet_normal_resampled(r, "train", num_points=16)


def test_modelnet_not_utf8(modelnet_root) -> None:
    r, _ = modelnet_root
    p = r / "airplane" / "airplane_0001.txt"
    p.write_bytes(p.read_bytes().replace(b"\n", b"\xff\n", 3))
    with pytest.raises(ValueError, match=rf"file .*{p.name}: not UTF-8 text \(line 1"):
        read_modelnet_txt(p)


def test_empty_shapenetpart_shape_file(shapenet_root) -> None:
    r, _ = shapenet_root
    p = r / "02691156" / "a1.txt"
    p.write_text("")
    with pytest.raises(ValueError, match=rf"{p.name}: empty file"):
        read_shapenetpart_txt(p)
    with pytest.raises(ValueError, match=rf"{p.name}: empty file"):
        load_shapenetpart(r, "train", num_points=16)


@pytest.mark.parametrize("name,content", [("synsetoffset2category.txt", ""),
                                          ("train_test_split/shuffled_train_file_list.json", "[]")])
def test_empty_shapenetpart_index_files(shapenet_root, name: str, content: str) -> None:
    r, _ = shapenet_root
    (r / name).write_text(content)
    with pytest.raises(ValueError, match=rf"{Path(name).name}: empty"):
        load_shapenetpart(r, "train", num_points=16)


# ---------------------------------------------------------------- truncated .pt files
import torch  # noqa: E402


@pytest.fixture()
def truncated_pt(tmp_path: Path) -> Path:
    p = tmp_path / "model.pt"
    torch.save({"regions": torch.zeros(3, 2, 4), "feat_encoder.0.weight": torch.zeros(8, 5)}, p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def test_reference_checkpoint_truncated_names_file(truncated_pt: Path) -> None:
    from pointformers.models import from_reference_checkpoint
    with pytest.raises(ValueError, match=rf"{truncated_pt.name}: cannot be read"):
        from_reference_checkpoint(truncated_pt)


def test_export_load_model_truncated_names_file(truncated_pt: Path) -> None:
    from pointformers.export.onnx_export import load_model
    with pytest.raises(ValueError, match=rf"{truncated_pt.name}.*cannot be read"):
        load_model(truncated_pt)


def test_load_checkpoint_truncated_names_file(truncated_pt: Path) -> None:
    from pointformers.engine.checkpoint import load_checkpoint
    with pytest.raises(ValueError, match=rf"{truncated_pt.name}.*cannot be read"):
        load_checkpoint(truncated_pt)


# ---------------------------------------------------------------- export --opset / --check
def _small_checkpoint(tmp_path: Path) -> Path:
    from pointformers import models
    from pointformers.engine.checkpoint import save_checkpoint
    torch.manual_seed(0)
    cfg = {"attention": "full", "heads": 2, "n_layers": 1, "mlp_hidden": 32, "mlp_layers": 3}
    model = models.build("tracking-encoder", **cfg)
    path = tmp_path / "best.pt"
    save_checkpoint(path, {"model": model.state_dict(), "model_name": "tracking-encoder", "model_config": cfg})
    return path


@pytest.mark.heavy
@pytest.mark.parametrize("opset", [18, 20])
def test_export_opset_is_honoured(tmp_path: Path, opset: int) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from pointformers.export.cli import main as export_main
    from pointformers.export.runtime import read_metadata
    ckpt = _small_checkpoint(tmp_path)
    out = tmp_path / f"m{opset}.onnx"
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out), "--opset", str(opset)]) == 0
    proto = onnx.load(str(out))
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    assert read_metadata(out)["opset"] == opset


def test_check_failure_rule() -> None:
    from pointformers.export.cli import check_failure
    good = {"agree_1e-5": 1.0, "agree_1e-3": 1.0, "agree_1e-1": 1.0}
    assert check_failure(good, "float64") is None and check_failure(good, "float32") is None
    assert "below the required 99.90%" in check_failure({**good, "agree_1e-5": 0.5}, "float64")
    assert check_failure({**good, "agree_1e-5": 0.5}, "float32") is None  # float32 judged to 1e-1
    assert "below the required 95.00%" in check_failure({**good, "agree_1e-1": 0.9}, "float32")
    assert check_failure({**good, "agree_1e-1": 0.9}, "float32", min_agree=0.8) is None
    assert check_failure({**good, "agree_1e-5": float("nan")}, "float64") is not None


@pytest.mark.heavy
def test_export_check_exits_nonzero_below_tolerance(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("onnxruntime")
    import pointformers.export.cli as ecli
    ckpt = _small_checkpoint(tmp_path)
    out = tmp_path / "m.onnx"
    args = ["--checkpoint", str(ckpt), "--out", str(out), "--check", "64"]
    assert ecli.main(args) == 0  # a faithful export passes
    capsys.readouterr()
    real = ecli.check_export
    monkeypatch.setattr(ecli, "check_export", lambda *a, **k: {**real(*a, **k), "agree_1e-1": 0.5})
    assert ecli.main(args) == 1
    assert "check failed: 50.00% of points agree" in capsys.readouterr().err
    assert ecli.main(args + ["--check-min-agree", "0.4"]) == 0
    assert ecli.main(args + ["--check-min-agree", "1.5"]) == 2


# ---------------------------------------------------------------- unwritable outputs
def _unwritable(tmp_path: Path) -> Path:
    """A folder path nobody can create, root included: it lies under a regular file."""
    (tmp_path / "afile").write_text("not a folder\n")
    return tmp_path / "afile" / "out"


def test_cached_arrays_is_quiet_unless_writes_are_required(tmp_path: Path) -> None:
    from pointformers.data.cache import CacheWriteError, cached_arrays, writes_required
    bad = _unwritable(tmp_path)
    build = lambda: {"a": np.arange(3)}  # noqa: E731
    assert cached_arrays(bad, "x", {"v": 1}, build)["a"].tolist() == [0, 1, 2]  # loading goes on uncached
    with writes_required(), pytest.raises(CacheWriteError, match=rf"cannot write {bad}/x-.*\.npz: "):
        cached_arrays(bad, "x", {"v": 1}, build)
    assert cached_arrays(bad, "x", {"v": 1}, build)["a"].tolist() == [0, 1, 2]  # the flag was reset


def test_generate_fails_when_it_cannot_write_its_cache(tmp_path: Path, capsys, monkeypatch) -> None:
    from pointformers.cli import main
    monkeypatch.setenv("CI", "1")
    bad = _unwritable(tmp_path)
    rc = main(["generate", "--set", "data.preset=tiny", "--set", f"data.cache_dir={bad}", "--splits", "val"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0, err
    assert f"cannot write {bad}" in err


def _one_line_exit_2(capsys, argv) -> str:
    from pointformers.cli import main
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0, err
    return err


def test_evaluate_json_into_unwritable_folder(tmp_path: Path, capsys) -> None:
    bad = _unwritable(tmp_path)
    # checked before the checkpoint is even read, for both evaluate paths
    err = _one_line_exit_2(capsys, ["evaluate", "--checkpoint", str(tmp_path / "best.pt"),
                                    "--json", str(bad / "r.json")])
    assert f"cannot write {bad / 'r.json'}: " in err
    err = _one_line_exit_2(capsys, ["evaluate", "--checkpoint", "hept-tracking-60k", "--data", str(tmp_path),
                                    "--json", str(bad / "r.json")])
    assert f"cannot write {bad / 'r.json'}: " in err


def test_predict_out_unwritable(event, tmp_path: Path, capsys) -> None:
    write_trackml_event(event, tmp_path / "events", "event000001000")
    bad = _unwritable(tmp_path)
    err = _one_line_exit_2(capsys, ["predict", "--checkpoint", "hept-tracking-60k", "--data",
                                    str(tmp_path / "events"), "--out", str(bad)])
    assert f"cannot write {bad}: " in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_predict_out_read_only_folder(event, tmp_path: Path, capsys) -> None:
    write_trackml_event(event, tmp_path / "events", "event000001000")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        err = _one_line_exit_2(capsys, ["predict", "--checkpoint", "hept-tracking-60k", "--data",
                                        str(tmp_path / "events"), "--out", str(ro)])
        assert f"cannot write {ro}: Permission denied" in err
    finally:
        ro.chmod(0o700)


def test_write_outputs_failure_names_the_file(tmp_path: Path) -> None:
    from pointformers.trackml_eval import _write_outputs
    bad = _unwritable(tmp_path)
    with pytest.raises(ValueError, match=rf"cannot write {bad / 't.csv'}: "):
        _write_outputs(bad / "t.csv", bad / "e.npz", np.arange(3), np.zeros((3, 2)), np.arange(3), 0.1)

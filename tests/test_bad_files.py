"""Issue 21 "nothing silent": bad input files give a ValueError naming the file (and line)."""
from __future__ import annotations

import gzip
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

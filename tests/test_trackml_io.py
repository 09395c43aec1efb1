"""TrackML CSV writer -> reader round trips and the reader's error handling."""
from __future__ import annotations

import gzip
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from pointformers.data.event import CLUSTER_FEATURES, TrackingEvent
from pointformers.data.tracking import TrackingParams, generate_event, preset_params
from pointformers.data.trackml import list_trackml_events, read_detectors, read_trackml_event, write_trackml_event

HIT_FIELDS = ("hit_id", "x", "y", "z", "volume_id", "layer_id", "module_id")
TRUTH_FIELDS = ("particle_id", "tx", "ty", "tz", "tpx", "tpy", "tpz", "weight")
PARTICLE_FIELDS = ("particles_id", "vx", "vy", "vz", "px", "py", "pz", "q", "nhits")


@pytest.fixture(scope="module")
def event() -> TrackingEvent:
    return generate_event(TrackingParams(mu=5), seed=2, event_id=1000)


@pytest.fixture()
def written(event: TrackingEvent, tmp_path: Path) -> Path:
    write_trackml_event(event, tmp_path, "event000001000")
    return tmp_path / "event000001000"


def test_round_trip_is_exact(event: TrackingEvent, written: Path) -> None:
    back = read_trackml_event(written)
    assert back.event_id == 1000
    for name in HIT_FIELDS + TRUTH_FIELDS + PARTICLE_FIELDS:
        a, b = getattr(event, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    # Cluster features recomputed from the cells + detectors.csv match the generated ones.
    np.testing.assert_allclose(back.cells, event.cells, atol=1e-5, rtol=1e-5)


def test_reader_without_detectors_falls_back_with_warning(event: TrackingEvent, written: Path) -> None:
    (written.parent / "detectors.csv").rename(written.parent / "geometry.csv")
    with pytest.warns(UserWarning, match="detectors"):
        back = read_trackml_event(written)
    keep = [CLUSTER_FEATURES.index(n) for n in ("charge_frac", "leta", "lphi", "lx", "ly", "lz")]
    np.testing.assert_allclose(back.cells[:, keep], event.cells[:, keep], atol=1e-5)
    assert np.all(back.cells[:, CLUSTER_FEATURES.index("geta")] == 0)
    # An explicit detectors file (path or table) restores the global features.
    for det in (written.parent / "geometry.csv", read_detectors(written.parent / "geometry.csv")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            back = read_trackml_event(written, detectors=det)
        np.testing.assert_allclose(back.cells, event.cells, atol=1e-5)


def test_gzip_files_and_listing(event: TrackingEvent, tmp_path: Path) -> None:
    write_trackml_event(event, tmp_path, "event000000001")
    write_trackml_event(event, tmp_path, "event000000002")
    for p in tmp_path.glob("event000000002-*.csv"):
        with open(p, "rb") as src, gzip.open(str(p) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        p.unlink()
    prefixes = list_trackml_events(tmp_path)
    assert [p.name for p in prefixes] == ["event000000001", "event000000002"]
    back = read_trackml_event(prefixes[1])
    assert back.event_id == 2 and np.array_equal(back.x, event.x)
    with pytest.raises(ValueError, match="2 events"):
        read_trackml_event(tmp_path)


def test_directory_with_one_event(event: TrackingEvent, written: Path) -> None:
    assert np.array_equal(read_trackml_event(written.parent).hit_id, event.hit_id)


def test_writer_fills_missing_truth_at_hit(event: TrackingEvent, tmp_path: Path) -> None:
    ev = event.copy()
    ev.tx = ev.ty = ev.tz = ev.tpx = ev.tpy = ev.tpz = None
    write_trackml_event(ev, tmp_path, "event000000005")
    back = read_trackml_event(tmp_path / "event000000005")
    assert np.array_equal(back.tx, ev.x)
    assert np.array_equal(back.tpx, ev.per_hit(ev.px).astype(np.float32))


def test_missing_file_is_named(written: Path) -> None:
    (written.parent / "event000001000-particles.csv").unlink()
    with pytest.raises(ValueError, match=r"event000001000-particles\.csv.*not found"):
        read_trackml_event(written)


def test_missing_column_is_named(written: Path) -> None:
    truth = written.parent / "event000001000-truth.csv"
    lines = truth.read_text().splitlines()
    cols = lines[0].split(",")
    j = cols.index("particle_id")
    truth.write_text("\n".join(",".join(f for i, f in enumerate(l.split(",")) if i != j) for l in lines) + "\n")
    with pytest.raises(ValueError, match=r"truth\.csv.*missing column.*particle_id"):
        read_trackml_event(written)


@pytest.mark.parametrize("bad, why", [
    ("5,abc,2.0,3.0,8,2,1", "column 'x'"), ("1.5,1.0,2.0,3.0,8,2,1", "column 'hit_id'"), ("7,1.0,2.0", "expected 7")])
def test_malformed_line_is_located(written: Path, bad: str, why: str) -> None:
    hits = written.parent / "event000001000-hits.csv"
    lines = hits.read_text().splitlines()
    lines[4] = bad  # line 5 of the file
    hits.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"hits\.csv, line 5.*{why}"):
        read_trackml_event(written)


def test_empty_file(written: Path) -> None:
    (written.parent / "event000001000-cells.csv").write_text("")
    with pytest.raises(ValueError, match=r"cells\.csv: empty"):
        read_trackml_event(written)


def test_reader_keeps_only_pixel_volumes(tmp_path: Path) -> None:
    # Hand-written event: hit 1 in the pixel barrel, hit 2 in a strip volume (12), hit 3 noise in volume 7.
    (tmp_path / "event000000042-hits.csv").write_text(
        "hit_id,x,y,z,volume_id,layer_id,module_id\n"
        "1,32.0,0.0,10.0,8,2,5\n"
        "2,400.0,0.0,10.0,12,2,7\n"
        "3,50.0,0.0,-1500.0,7,2,9\n")
    (tmp_path / "event000000042-cells.csv").write_text(
        "hit_id,ch0,ch1,value\n1,10,20,0.3\n1,11,21,0.1\n2,5,5,1.0\n3,7,7,0.2\n")
    (tmp_path / "event000000042-truth.csv").write_text(
        "hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight\n"
        "1,4503668346847232,32.0,0.0,10.0,1.0,0.0,0.5,0.5\n"
        "2,4503668346847232,400.0,0.0,10.0,1.0,0.0,0.5,0.5\n"
        "3,0,50.0,0.0,-1500.0,0.0,0.0,0.0,0.0\n")
    (tmp_path / "event000000042-particles.csv").write_text(
        "particle_id,vx,vy,vz,px,py,pz,q,nhits\n4503668346847232,0.0,0.0,1.0,1.0,0.0,0.5,1,2\n")
    with pytest.warns(UserWarning, match="detectors"):
        ev = read_trackml_event(tmp_path / "event000000042")
    assert ev.hit_id.tolist() == [1, 3]
    assert ev.volume_id.tolist() == [8, 7]
    assert ev.particle_id.tolist() == [4503668346847232, 0]  # int64 ids survive exactly
    assert ev.event_id == 42 and ev.num_particles == 1
    lx = ev.cells[:, CLUSTER_FEATURES.index("lx")]
    cf = ev.cells[:, CLUSTER_FEATURES.index("charge_frac")]
    np.testing.assert_allclose(lx, [2 * 0.05, 0.05])
    np.testing.assert_allclose(cf, [0.75, 1.0])


def test_truth_must_cover_pixel_hits(written: Path) -> None:
    truth = written.parent / "event000001000-truth.csv"
    lines = truth.read_text().splitlines()
    truth.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # drop hit_id 1
    with pytest.raises(ValueError, match=r"truth\.csv: no row for hit_id 1"):
        read_trackml_event(written)


def test_detectors_missing_module(written: Path) -> None:
    det = written.parent / "detectors.csv"
    lines = det.read_text().splitlines()
    det.write_text("\n".join(lines[:1]) + "\n")  # header only: no modules
    with pytest.raises(ValueError, match="no module"):
        read_trackml_event(written)


def test_round_trip_of_a_preset_cloud(tmp_path: Path) -> None:
    from pointformers.data.tracking import split_sectors

    p = preset_params("tiny")
    cloud = split_sectors(generate_event(p, 0), p.n_sectors)[1]
    write_trackml_event(cloud, tmp_path, "event000000000")
    back = read_trackml_event(tmp_path / "event000000000")
    assert np.array_equal(back.particle_id, cloud.particle_id) and np.array_equal(back.nhits, cloud.nhits)
    assert back.reconstructable.tolist() == cloud.reconstructable.tolist()

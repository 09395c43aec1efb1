"""TrackML CSV writer -> reader round trips, reading folders and unlabelled events, and errors."""
from __future__ import annotations

import gzip
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from pointformers.data.event import CLUSTER_FEATURES, TrackingEvent
from pointformers.data.tracking import GEOMETRY, TrackingParams, generate_event, preset_params
from pointformers.data.trackml import (list_trackml_events, read_detectors, read_trackml_event, read_trackml_events,
                                       write_trackml_event)

HIT_FIELDS = ("hit_id", "x", "y", "z", "volume_id", "layer_id", "module_id")
TRUTH_FIELDS = ("particle_id", "tx", "ty", "tz", "tpx", "tpy", "tpz", "weight")
PARTICLE_FIELDS = ("particles_id", "vx", "vy", "vz", "px", "py", "pz", "q", "nhits")
CF, LX, LY = (CLUSTER_FEATURES.index(n) for n in ("charge_frac", "lx", "ly"))


@pytest.fixture(scope="module")
def event() -> TrackingEvent:
    return generate_event(TrackingParams(mu=5), seed=2, event_id=1000)


@pytest.fixture()
def written(event: TrackingEvent, tmp_path: Path) -> Path:
    write_trackml_event(event, tmp_path, "event000001000")
    return tmp_path / "event000001000"


def gzip_event(prefix: Path) -> None:
    for p in prefix.parent.glob(prefix.name + "-*.csv"):
        with open(p, "rb") as src, gzip.open(str(p) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        p.unlink()


def without_cells(ev: TrackingEvent) -> TrackingEvent:
    """A copy without its cell table (the writer then synthesises cells from the features)."""
    ev = ev.copy()
    ev.cell_hit = ev.cell_ch0 = ev.cell_ch1 = ev.cell_value = None
    return ev


def read_cells(prefix: Path) -> np.ndarray:
    return np.loadtxt(prefix.parent / (prefix.name + "-cells.csv"), delimiter=",", skiprows=1, ndmin=2)


# ---------------------------------------------------------------- round trips
def test_round_trip_is_exact(event: TrackingEvent, written: Path) -> None:
    back = read_trackml_event(written)
    assert back.event_id == 1000
    for name in HIT_FIELDS + TRUTH_FIELDS + PARTICLE_FIELDS:
        a, b = getattr(event, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    # All 8 cluster features recomputed from the cells + detectors.csv equal the generated ones bit for bit.
    assert back.cells.dtype == np.float32
    for j, name in enumerate(CLUSTER_FEATURES):
        assert np.array_equal(back.cells[:, j], event.cells[:, j]), name
    # The generated event's own pixel cells are written and read back exactly.
    for name in ("cell_hit", "cell_ch0", "cell_ch1", "cell_value"):
        a, b = getattr(event, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name


def test_writer_writes_the_events_own_cells(event: TrackingEvent, written: Path) -> None:
    cells = read_cells(written)
    assert len(cells) == len(event.cell_hit) > event.num_hits
    assert np.array_equal(cells[:, 0].astype(int), event.hit_id[event.cell_hit])
    assert np.array_equal(cells[:, 1].astype(int), event.cell_ch0) and np.array_equal(cells[:, 2].astype(int), event.cell_ch1)
    assert np.array_equal(cells[:, 3].astype(np.float32), event.cell_value)


def test_writer_cells_are_a_staircase_of_equal_values(event: TrackingEvent, tmp_path: Path) -> None:
    event = without_cells(event)
    write_trackml_event(event, tmp_path, "event000001000")
    cells = read_cells(tmp_path / "event000001000")
    hid, ch0, ch1, value = cells[:, 0].astype(int), cells[:, 1].astype(int), cells[:, 2].astype(int), cells[:, 3]
    n_u = np.rint(event.cells[:, LX] / GEOMETRY.pitch_u).astype(int)
    n_v = np.rint(event.cells[:, LY] / GEOMETRY.pitch_v).astype(int)
    count = np.bincount(hid, minlength=event.hit_id.max() + 1)[event.hit_id]
    # The pixels a straight segment spanning n_u x n_v pixels crosses: n_u + n_v - 1, all distinct.
    assert np.array_equal(count, n_u + n_v - 1)
    assert len(np.unique(np.stack([hid, ch0, ch1], 1), axis=0)) == len(hid)
    assert ch0.min() >= 0 and ch1.min() >= 0
    # Every cell carries the hit's mean cell value, so the total is charge_frac * number of cells.
    row = np.searchsorted(event.hit_id, hid)
    assert np.array_equal(value.astype(np.float32), event.cells[row, CF])
    # Consecutive cells of a hit are neighbours (one step in u or in v).
    same = hid[1:] == hid[:-1]
    steps = np.abs(np.diff(ch0))[same] + np.abs(np.diff(ch1))[same]
    assert np.all(steps == 1)


def test_round_trip_of_a_preset_cloud(tmp_path: Path) -> None:
    from pointformers.data.tracking import split_sectors

    p = preset_params("tiny")
    cloud = split_sectors(generate_event(p, 0), p.n_sectors)[1]
    write_trackml_event(cloud, tmp_path, "event000000000")
    back = read_trackml_event(tmp_path / "event000000000")
    assert np.array_equal(back.particle_id, cloud.particle_id) and np.array_equal(back.nhits, cloud.nhits)
    assert np.array_equal(back.cells, cloud.cells)
    # TrackML files carry no sector information: the read-back cloud counts layers over its own hits.
    layers = {}
    for pid, key in zip(cloud.particle_id.tolist(), cloud.layer_index.tolist()):
        layers.setdefault(pid, set()).add(key)
    expected = [pid > 0 and len(layers[pid]) >= 3 for pid in cloud.particle_id.tolist()]
    assert back.reconstructable.tolist() == expected


def test_hits_without_cluster_round_trip_as_hits_without_cells(event: TrackingEvent, tmp_path: Path) -> None:
    ev = without_cells(event)
    ev.cells[:3] = 0.0
    write_trackml_event(ev, tmp_path, "event000000007")
    cells = read_cells(tmp_path / "event000000007")
    assert not np.isin(ev.hit_id[:3], cells[:, 0].astype(int)).any()
    with pytest.warns(UserWarning, match="3 pixel hits have no cells"):
        back = read_trackml_event(tmp_path / "event000000007")
    assert np.array_equal(back.cells, ev.cells)


def test_writer_rejects_bad_charge_frac(event: TrackingEvent, tmp_path: Path) -> None:
    ev = without_cells(event)
    ev.cells[5, CF] = -0.1
    with pytest.raises(ValueError, match=rf"charge_frac.*hit_id {int(ev.hit_id[5])}"):
        write_trackml_event(ev, tmp_path, "event000000008")


def test_writer_fills_missing_truth_at_hit(event: TrackingEvent, tmp_path: Path) -> None:
    ev = event.copy()
    ev.tx = ev.ty = ev.tz = ev.tpx = ev.tpy = ev.tpz = None
    write_trackml_event(ev, tmp_path, "event000000005")
    back = read_trackml_event(tmp_path / "event000000005")
    assert np.array_equal(back.tx, ev.x)
    assert np.array_equal(back.tpx, ev.per_hit(ev.px).astype(np.float32))


# ---------------------------------------------------------------- detectors.csv
def test_reader_without_detectors_falls_back_with_warning(event: TrackingEvent, written: Path) -> None:
    (written.parent / "detectors.csv").rename(written.parent / "geometry.csv")
    with pytest.warns(UserWarning, match="detectors"):
        back = read_trackml_event(written)
    # Nominal pitch and module_t are the simulated ones: the local features are unchanged.
    keep = [CLUSTER_FEATURES.index(n) for n in ("charge_frac", "leta", "lphi", "lx", "ly", "lz")]
    assert np.array_equal(back.cells[:, keep], event.cells[:, keep])
    assert np.all(back.cells[:, CLUSTER_FEATURES.index("geta")] == 0)
    assert np.all(back.cells[:, CLUSTER_FEATURES.index("gphi")] == 0)
    # An explicit detectors file (path or table) restores the global features.
    for det in (written.parent / "geometry.csv", read_detectors(written.parent / "geometry.csv")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            back = read_trackml_event(written, detectors=det)
        assert np.array_equal(back.cells, event.cells)


def test_detectors_in_parent_folder_challenge_layout(event: TrackingEvent, tmp_path: Path) -> None:
    # The challenge ships detectors.csv next to the train_* folders.
    write_trackml_event(event, tmp_path / "train_1", "event000001000")
    shutil.move(str(tmp_path / "train_1" / "detectors.csv"), str(tmp_path / "detectors.csv"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = read_trackml_event(tmp_path / "train_1" / "event000001000")
        (back2,) = list(read_trackml_events(tmp_path / "train_1"))
    assert np.array_equal(back.cells, event.cells) and np.array_equal(back2.cells, event.cells)


def test_detectors_table_must_be_complete(written: Path) -> None:
    table = read_detectors(written.parent / "detectors.csv")
    del table["rot"]
    with pytest.raises(ValueError, match=r"detectors: table lacks \['rot'\]"):
        read_trackml_event(written, detectors=table)
    with pytest.raises(ValueError, match="detectors: expected a path"):
        read_trackml_event(written, detectors=3)  # type: ignore[arg-type]


def test_detectors_missing_module(written: Path) -> None:
    det = written.parent / "detectors.csv"
    lines = det.read_text().splitlines()
    det.write_text("\n".join(lines[:1]) + "\n")  # header only: no modules
    with pytest.raises(ValueError, match=r"detectors\.csv: no module"):
        read_trackml_event(written)


# ---------------------------------------------------------------- folders of events
def test_gzip_files_and_listing(event: TrackingEvent, tmp_path: Path) -> None:
    write_trackml_event(event, tmp_path, "event000000001")
    write_trackml_event(event, tmp_path, "event000000002")
    gzip_event(tmp_path / "event000000002")
    prefixes = list_trackml_events(tmp_path)
    assert [p.name for p in prefixes] == ["event000000001", "event000000002"]
    back = read_trackml_event(prefixes[1])
    assert back.event_id == 2 and np.array_equal(back.x, event.x) and np.array_equal(back.cells, event.cells)


def test_read_trackml_events_reads_a_folder_in_name_order(tmp_path: Path) -> None:
    p = TrackingParams(mu=2)
    events = {i: generate_event(p, seed=4, event_id=i) for i in (21, 3, 1000)}
    for i, ev in events.items():
        write_trackml_event(ev, tmp_path, f"event{i:09d}", write_detectors_file=(i == 3))
        gzip_event(tmp_path / f"event{i:09d}")  # the challenge's layout: -hits.csv.gz …
    (tmp_path / "notes.txt").write_text("not an event\n")
    it = read_trackml_events(tmp_path)
    got = list(it)
    assert [e.event_id for e in got] == [3, 21, 1000]
    for e in got:
        ref = events[e.event_id]
        assert np.array_equal(e.hit_id, ref.hit_id) and np.array_equal(e.cells, ref.cells)
        assert np.array_equal(e.particle_id, ref.particle_id) and np.array_equal(e.particles_id, ref.particles_id)
    # One folder with several events is not one event: the error points to read_trackml_events.
    with pytest.raises(ValueError, match=r"3 events.*read_trackml_events"):
        read_trackml_event(tmp_path)


def test_directory_with_one_event(event: TrackingEvent, written: Path) -> None:
    assert np.array_equal(read_trackml_event(written.parent).hit_id, event.hit_id)


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="holds no TrackML event"):
        read_trackml_events(tmp_path)
    with pytest.raises(ValueError, match="holds no TrackML event"):
        read_trackml_event(tmp_path)
    with pytest.raises(ValueError, match="directory: .* is not a folder"):
        read_trackml_events(tmp_path / "missing")


# ---------------------------------------------------------------- unlabelled events, particles
def test_unlabelled_event_reads_hits_and_cells_only(event: TrackingEvent, written: Path) -> None:
    labelled = read_trackml_event(written)
    for kind in ("truth", "particles"):
        (written.parent / f"event000001000-{kind}.csv").unlink()
    with pytest.raises(ValueError, match=r"truth\.csv: file not found.*truth=False"):
        read_trackml_event(written)
    back = read_trackml_event(written, truth=False)
    assert np.array_equal(back.hit_id, event.hit_id) and np.array_equal(back.cells, labelled.cells)
    assert np.array_equal(back.x, event.x)
    assert back.particle_id.dtype == np.int64 and np.all(back.particle_id == 0)
    assert back.weight.dtype == np.float32 and np.all(back.weight == 0)
    assert back.num_particles == 0 and back.tx is None and back.tpz is None
    assert not back.reconstructable.any() and np.all(back.hit_pt == 0)
    (ev,) = list(read_trackml_events(written.parent, truth=False))
    assert np.array_equal(ev.cells, labelled.cells) and ev.num_particles == 0
    with pytest.raises(ValueError, match="truth: expected True"):
        read_trackml_event(written, truth="no")  # type: ignore[arg-type]


def test_truth_false_ignores_present_truth_files(written: Path) -> None:
    back = read_trackml_event(written, truth=False)
    assert np.all(back.particle_id == 0) and back.num_particles == 0


def test_hits_of_particles_missing_from_the_particles_file_are_kept(event: TrackingEvent, written: Path) -> None:
    parts = written.parent / "event000001000-particles.csv"
    lines = parts.read_text().splitlines()
    pid = event.particle_id
    victim = int(pid[pid > 0][0])
    victim_line = next(i for i, l in enumerate(lines) if i > 0 and int(l.split(",")[0]) == victim)
    parts.write_text("\n".join(lines[:victim_line] + lines[victim_line + 1:]) + "\n")
    with pytest.warns(UserWarning, match=rf"{int((pid == victim).sum())} pixel hits of 1 particles absent"):
        back = read_trackml_event(written)
    assert back.num_hits == event.num_hits and np.array_equal(back.particle_id, event.particle_id)
    mine = back.particle_id == victim
    assert np.all(back.hit_particle_index[mine] == -1) and np.all(back.hit_pt[mine] == 0)
    assert np.array_equal(back.hit_pt[~mine], event.hit_pt[~mine])
    assert np.array_equal(back.reconstructable, event.reconstructable)  # from particle_id and layers only


def test_duplicate_particle_rows_are_rejected(written: Path) -> None:
    parts = written.parent / "event000001000-particles.csv"
    lines = parts.read_text().splitlines()
    parts.write_text("\n".join(lines + [lines[1]]) + "\n")
    with pytest.raises(ValueError, match=rf"particles\.csv: particle_id {lines[1].split(',')[0]} appears 2 times"):
        read_trackml_event(written)


# ---------------------------------------------------------------- malformed files
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


def test_non_finite_cell_value_is_located(written: Path) -> None:
    cells = written.parent / "event000001000-cells.csv"
    lines = cells.read_text().splitlines()
    f = lines[6].split(",")
    lines[6] = ",".join(f[:3] + ["nan"])  # line 7 of the file
    cells.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"cells\.csv, line 7, column 'value': nan is not a finite number"):
        read_trackml_event(written)


def test_empty_file(written: Path) -> None:
    (written.parent / "event000001000-cells.csv").write_text("")
    with pytest.raises(ValueError, match=r"cells\.csv: empty"):
        read_trackml_event(written)


def test_truth_must_cover_pixel_hits(written: Path) -> None:
    truth = written.parent / "event000001000-truth.csv"
    lines = truth.read_text().splitlines()
    truth.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # drop hit_id 1
    with pytest.raises(ValueError, match=r"truth\.csv: no row for hit_id 1"):
        read_trackml_event(written)


def test_reader_keeps_only_pixel_volumes(tmp_path: Path) -> None:
    # Hand-written event: hit 1 in the pixel barrel, hit 2 in a strip volume (12), hit 3 noise in volume 7.
    (tmp_path / "event000000042-hits.csv").write_text(
        "hit_id,x,y,z,volume_id,layer_id,module_id\n"
        "1,32.0,0.0,10.0,8,2,5\n"
        "2,400.0,0.0,10.0,12,2,7\n"
        "3,50.0,0.0,-1500.0,7,2,9\n")
    (tmp_path / "event000000042-cells.csv").write_text(
        "hit_id,ch0,ch1,value\n1,10,20,0.3\n1,11,21,0.2\n2,5,5,1.0\n3,7,7,0.125\n")
    (tmp_path / "event000000042-truth.csv").write_text(
        "hit_id,particle_id,tx,ty,tz,tpx,tpy,tpz,weight\n"
        "1,4503668346847232,32.0,0.0,10.0,1.0,0.0,0.5,0.5\n"
        "2,4503668346847232,400.0,0.0,10.0,1.0,0.0,0.5,0.5\n"
        "3,0,50.0,0.0,-1500.0,0.0,0.0,0.0,0.0\n")
    (tmp_path / "event000000042-particles.csv").write_text(
        "particle_id,particle_type,vx,vy,vz,px,py,pz,q,nhits\n4503668346847232,211,0.0,0.0,1.0,1.0,0.0,0.5,1,2\n")
    with pytest.warns(UserWarning, match="detectors"):
        ev = read_trackml_event(tmp_path / "event000000042")
    assert ev.hit_id.tolist() == [1, 3]
    assert ev.volume_id.tolist() == [8, 7]
    assert ev.particle_id.tolist() == [4503668346847232, 0]  # int64 ids survive exactly
    assert ev.event_id == 42 and ev.num_particles == 1
    lx = ev.cells[:, LX]
    cf = ev.cells[:, CF]
    np.testing.assert_allclose(lx, [2 * 0.05, 0.05], rtol=1e-7)
    # charge_frac is the mean cell value (not the largest cell's share): (0.3 + 0.2) / 2 and 0.125 / 1.
    assert cf.tolist() == [np.float32(0.25), np.float32(0.125)]


def test_detectors_file_is_the_shipped_real_table(written: Path) -> None:
    from pointformers.data.tracking import DETECTORS_FILE, module_table

    back = read_detectors(written.parent / "detectors.csv")
    shipped = read_detectors(DETECTORS_FILE)
    t = module_table()
    assert len(back["module_id"]) == 4004
    for name, a in t.items():
        assert np.array_equal(back[name], a) and np.array_equal(shipped[name], a), name


def test_a_real_style_event_round_trips_its_cells(event: TrackingEvent, tmp_path: Path) -> None:
    """Reading gives back the cells as written, and writing what was read gives the same files."""
    write_trackml_event(event, tmp_path / "a", "event000000001")
    first = read_trackml_event(tmp_path / "a" / "event000000001")
    write_trackml_event(first, tmp_path / "b", "event000000001")
    for kind in ("hits", "cells", "truth", "particles"):
        a = (tmp_path / "a" / f"event000000001-{kind}.csv").read_text()
        b = (tmp_path / "b" / f"event000000001-{kind}.csv").read_text()
        assert a == b, kind

"""``pointformers evaluate --data`` and ``pointformers predict`` with the shipped HEPT checkpoint
on small generated events written as TrackML files: the printed and JSON numbers against the
task's metrics computed directly, the output files' format, refusal to overwrite, atomic
writes and one-line errors."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers.cli import main
from pointformers.data.tracking import generate_event, preset_params
from pointformers.data.trackml import PIXEL_VOLUMES, read_trackml_event, write_trackml_event
from pointformers.models import from_reference_checkpoint
from pointformers.models.hept_tracking import reference_checkpoint_path
from pointformers.tasks.tracking.building import choose_dbscan_eps, dbscan_tracks
from pointformers.trackml_eval import REFERENCE_EPS, submission_track_ids
from pointformers.tasks.tracking.trackml_score import trackml_score
from pointformers.tasks.tracking import ap_at_k, tracking_inputs

NAMES = ("event000000101", "event000000102")
# The numbers are compared with the model run here on the CPU: HEPT's hashing makes a GPU's
# rounding visible in single rows, so the commands run on the CPU too.
CPU = ["--device", "cpu"]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("trackml") / "labelled"
    for seed, name in zip((11, 12), NAMES):
        write_trackml_event(generate_event(preset_params("tiny"), seed=seed), folder, name)
    return folder


@pytest.fixture
def unlabelled(labelled: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "unlabelled"
    shutil.copytree(labelled, folder)
    for p in list(folder.glob("*-truth.csv")) + list(folder.glob("*-particles.csv")):
        p.unlink()
    # The challenge's compressed layout for the second event.
    for kind in ("hits", "cells"):
        p = folder / f"{NAMES[1]}-{kind}.csv"
        with open(p, "rb") as src, gzip.open(str(p) + ".gz", "wb") as dst:
            dst.write(src.read())
        p.unlink()
    return folder


@pytest.fixture(scope="module")
def direct(labelled: Path) -> dict[str, dict]:
    """Per event: the model's embeddings and the event, computed here without the CLI."""
    model = from_reference_checkpoint("hept-tracking-60k")
    out = {}
    for name in NAMES:
        ev = read_trackml_event(labelled / name)
        inp = tracking_inputs(ev)
        with torch.no_grad():
            emb = model(inp.x, inp.coords)
        out[name] = {"event": ev, "inputs": inp, "emb": emb}
    return out


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.count("\n") == 0 and "error:" in err, err
    assert cap.out == ""  # nothing is printed (nor computed) before the arguments are checked
    return err


def _hits_file_pixel_ids(folder: Path, name: str) -> np.ndarray:
    p = folder / f"{name}-hits.csv"
    text = gzip.open(str(p) + ".gz", "rt").read() if not p.exists() else p.read_text()
    rows = [line.split(",") for line in text.strip().splitlines()]
    head = rows[0]
    ids = np.array([int(r[head.index("hit_id")]) for r in rows[1:]])
    vol = np.array([int(r[head.index("volume_id")]) for r in rows[1:]])
    return ids[np.isin(vol, PIXEL_VOLUMES)]


# ------------------------------------------------------------------------------ evaluate --data
def test_evaluate_reference_checkpoint_on_a_folder(labelled, direct, tmp_path, capsys) -> None:
    js = tmp_path / "eval.json"
    assert main(["evaluate", *CPU, "--checkpoint", "hept-tracking-60k", "--data", str(labelled), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(js.read_text())
    assert [r["event"] for r in res["events"]] == list(NAMES)
    assert res["dbscan_eps"] == REFERENCE_EPS and res["pt_min"] == 0.9 and res["K"] == 19
    lines = printed.splitlines()
    for r in res["events"]:
        d = direct[r["event"]]
        ev, inp, emb = d["event"], d["inputs"], d["emb"]
        # One cloud per event: every pixel hit of the file.
        assert r["num_hits"] == ev.num_hits == len(_hits_file_pixel_ids(labelled, r["event"]))
        ap = ap_at_k(emb, inp.particle_id, inp.pt, inp.reconstructable)
        assert 0.0 <= r["ap@k"] <= 1.0 and r["ap@k"] == pytest.approx(ap, abs=1e-6)
        score = trackml_score(dbscan_tracks(emb, REFERENCE_EPS), ev.particle_id, ev.weight.astype(np.float64))
        assert 0.0 <= r["trackml_score"] <= 1.0 and r["trackml_score"] == pytest.approx(score, abs=1e-6)
        row = next(line for line in lines if line.startswith(r["event"]))
        assert f"{r['ap@k']:.4f}" in row and f"{r['trackml_score']:.4f}" in row and str(r["num_hits"]) in row
    # Overall: the mean over events (both have query hits and truth weight).
    o = res["overall"]
    assert o["ap@k"] == pytest.approx(np.mean([r["ap@k"] for r in res["events"]]))
    assert o["trackml_score"] == pytest.approx(np.mean([r["trackml_score"] for r in res["events"]]))
    assert o["num_hits"] == sum(r["num_hits"] for r in res["events"])
    overall = next(line for line in lines if line.startswith("overall"))
    assert f"{o['ap@k']:.4f}" in overall and f"{o['trackml_score']:.4f}" in overall
    # Track matching of the same DBSCAN tracks: per event, the event's own rates; overall and the
    # tables, the counts summed over events.
    from pointformers.tasks.tracking.metrics import particle_eta, track_match_counts, track_matching_metrics

    total = None
    for r in res["events"]:
        d = direct[r["event"]]
        ev, inp = d["event"], d["inputs"]
        args = (dbscan_tracks(d["emb"], REFERENCE_EPS), inp.particle_id, inp.pt,
                ev.per_hit(particle_eta(ev.px, ev.py, ev.pz), 0.0), inp.reconstructable)
        m = track_matching_metrics(*args)
        for k in ("eff_dm", "eff_perfect", "eff_lhc", "fake_dm", "dup_lhc"):
            assert r[k] == pytest.approx(m[k])
        assert 0 < r["eff_dm"] <= 1 and r["eff_perfect"] <= r["eff_dm"]
        c = track_match_counts(*args)
        total = c if total is None else {k: total[k] + v for k, v in c.items()}
        row = next(line for line in lines if line.startswith(r["event"]))
        assert f"{r['eff_dm']:.4f}" in row
    tm = res["track_metrics"]
    assert {k: tm["overall"][k] for k in total} == total
    assert o["eff_dm"] == pytest.approx(total["matched_particles_dm"] / total["particles"])
    assert tm["overall"]["eff_dm"] == pytest.approx(o["eff_dm"]) and f"{o['eff_dm']:.4f}" in overall
    assert tm["cuts"]["pt_min"] == 0.9 and tm["cuts"]["eta_max"] == 4.0 and tm["cuts"]["min_hits"] == 3
    assert sum(b["particles"] for b in tm["vs_eta"]) == tm["overall"]["particles"]
    assert [b["lo"] for b in tm["vs_pt"]][:3] == [0.0, 0.5, 0.9]
    assert "track matching" in printed and any(line.startswith("pT [0.9, 1.5)") for line in lines)
    # The model is not a constant: the two events' AP@k differ from each other.
    assert res["events"][0]["ap@k"] != res["events"][1]["ap@k"]
    # --json refuses to overwrite without --force; the file stays as it was.
    before = js.read_bytes()
    err = _one_line_error(capsys, ["evaluate", "--checkpoint", "hept-tracking-60k", "--data", str(labelled),
                                   "--json", str(js)])
    assert "--json" in err and "--force" in err and js.read_bytes() == before


def test_evaluate_match_cuts_from_the_command_line(labelled, tmp_path, capsys) -> None:
    js = tmp_path / "cuts.json"
    assert main(["evaluate", *CPU, "--checkpoint", "hept-tracking-60k", "--data", str(labelled), "--json", str(js),
                 "--match-pt-min", "0.5", "--match-eta-max", "2.5"]) == 0
    capsys.readouterr()
    tm = json.loads(js.read_text())["track_metrics"]
    assert tm["cuts"]["pt_min"] == 0.5 and tm["cuts"]["eta_max"] == 2.5
    err = _one_line_error(capsys, ["evaluate", "--checkpoint", "hept-tracking-60k", "--data", str(labelled),
                                   "--match-eta-max", "0"])
    assert "--match-eta-max" in err


def test_evaluate_eps_number_and_auto(labelled, direct, tmp_path, capsys) -> None:
    js = tmp_path / "e.json"
    state_dict = tmp_path / "authors.pt"  # --checkpoint PATH to an authors' state_dict
    shutil.copy(reference_checkpoint_path("hept-tracking-60k"), state_dict)
    argv = ["evaluate", *CPU, "--checkpoint", str(state_dict), "--data", str(labelled), "--json", str(js)]
    assert main(argv + ["--eps", "0.3"]) == 0
    res = json.loads(js.read_text())
    assert res["dbscan_eps"] == 0.3 and "authors' state_dict" in res["model"]
    for r in res["events"]:
        d = direct[r["event"]]
        assert r["trackml_score"] == pytest.approx(
            trackml_score(dbscan_tracks(d["emb"], 0.3), d["event"].particle_id, d["event"].weight.astype(float)))
    assert main(argv + ["--force", "--eps", "auto", "--eps-data", str(labelled)]) == 0
    res = json.loads(js.read_text())
    sel = choose_dbscan_eps([direct[n]["emb"] for n in NAMES], [direct[n]["event"].particle_id for n in NAMES],
                            [direct[n]["event"].weight.astype(np.float64) for n in NAMES])
    assert res["dbscan_eps"] == pytest.approx(sel.eps)
    assert res["overall"]["trackml_score"] == pytest.approx(sel.score)
    assert "optimistic" in capsys.readouterr().out  # the radius was chosen on the evaluated events


# ------------------------------------------------------------------------------ predict
def test_predict_writes_tracks_and_embeddings(unlabelled, direct, tmp_path, capsys) -> None:
    out = tmp_path / "pred"
    assert main(["predict", *CPU, "--checkpoint", "hept-tracking-60k", "--data", str(unlabelled), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[1/2]" in printed and "[2/2]" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{n}-tracks.csv" for n in NAMES] + [f"{n}-embeddings.npz" for n in NAMES])  # no temporaries left
    for name in NAMES:
        lines = (out / f"{name}-tracks.csv").read_text().splitlines()
        assert lines[0] == "hit_id,track_id"
        csv = np.array([[int(v) for v in line.split(",")] for line in lines[1:]])
        hit_ids = _hits_file_pixel_ids(unlabelled, name)
        np.testing.assert_array_equal(csv[:, 0], hit_ids)
        z = np.load(out / f"{name}-embeddings.npz")
        assert z["hit_id"].dtype == np.int64 and z["hit_id"].shape == (len(hit_ids),)
        assert z["embedding"].dtype == np.float32 and z["embedding"].shape == (len(hit_ids), 12)
        np.testing.assert_array_equal(z["hit_id"], hit_ids)
        np.testing.assert_array_equal(z["track_id"], csv[:, 1])
        assert float(z["dbscan_eps"]) == REFERENCE_EPS
        # The embeddings are the model's on the whole event (truth files or not).
        np.testing.assert_allclose(z["embedding"], direct[name]["emb"].numpy(), rtol=1e-5, atol=1e-5)
        # Track ids: the DBSCAN partition, ids >= 1, one-hit tracks after the clusters.
        labels = dbscan_tracks(direct[name]["emb"], REFERENCE_EPS)
        tid = csv[:, 1]
        n_clusters = labels.max() + 1
        assert tid.min() >= 1 and n_clusters > 0 and (labels < 0).any()
        np.testing.assert_array_equal(tid[labels >= 0], labels[labels >= 0] + 1)
        free = tid[labels < 0]
        assert free.min() > n_clusters and len(np.unique(free)) == len(free)


def test_predict_refuses_to_overwrite_and_writes_atomically(unlabelled, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "pred"
    argv = ["predict", *CPU, "--checkpoint", "hept-tracking-60k", "--data", str(unlabelled), "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    err = _one_line_error(capsys, argv)
    assert "--out" in err and "--force" in err and "already exists" in err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    # A failure while writing with --force loses nothing: the npz of event 1 is intact, no temporaries.
    def broken_savez(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(RuntimeError, match="disk full"):
        main(argv + ["--force"])
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {k: v[0] for k, v in before.items()}
    assert main(argv + ["--force"]) == 0  # deterministic: the same files again
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {k: v[0] for k, v in before.items()}


def test_missing_detectors_is_a_one_line_warning(unlabelled, tmp_path, capsys) -> None:
    (unlabelled / "detectors.csv").unlink()
    out = tmp_path / "pred"
    assert main(["predict", "--checkpoint", "hept-tracking-60k", "--data", str(unlabelled), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pointformers predict: warning: ") and "detectors" in err[0]
    assert len(list(out.glob("*-tracks.csv"))) == 2


def test_errors_are_one_line(labelled, unlabelled, tmp_path, capsys) -> None:
    ref = ["--checkpoint", "hept-tracking-60k"]
    out = ["--out", str(tmp_path / "o")]
    err = _one_line_error(capsys, ["predict", *ref, "--data", str(tmp_path / "missing"), *out])
    assert "--data" in err and "missing" in err and "does not exist" in err
    (tmp_path / "empty").mkdir()
    err = _one_line_error(capsys, ["predict", *ref, "--data", str(tmp_path / "empty"), *out])
    assert "holds no TrackML event" in err and "hits" in err
    err = _one_line_error(capsys, ["evaluate", *ref, "--data", str(unlabelled)])
    assert "truth" in err and "predict" in err
    err = _one_line_error(capsys, ["evaluate", *ref])
    assert "--data" in err
    err = _one_line_error(capsys, ["evaluate", "--checkpoint", str(tmp_path / "nope.pt"), "--data", str(labelled)])
    assert "nope.pt" in err and "hept-tracking-60k" in err
    for eps in ("abc", "-1", "0"):
        assert "--eps" in _one_line_error(capsys, ["evaluate", *ref, "--data", str(labelled), "--eps", eps])
    assert "--eps-data" in _one_line_error(capsys, ["evaluate", *ref, "--data", str(labelled), "--eps", "auto"])
    err = _one_line_error(capsys, ["predict", *ref, "--data", str(unlabelled), *out, "--detectors",
                                   str(tmp_path / "det.csv")])
    assert "--detectors" in err
    assert "--set" in _one_line_error(capsys, ["evaluate", *ref, "--data", str(labelled), "--set", "task.pt_min=1"])
    assert "--split" in _one_line_error(capsys, ["evaluate", *ref, "--data", str(labelled), "--split", "val"])
    (tmp_path / "afile").write_text("x")
    err = _one_line_error(capsys, ["predict", *ref, "--data", str(unlabelled), "--out", str(tmp_path / "afile")])
    assert "--out" in err and "not a folder" in err
    assert not (tmp_path / "o").exists()


def test_help_documents_formats_and_eps(capsys) -> None:
    for cmd in ("predict", "evaluate"):
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert str(REFERENCE_EPS) in text and "Tracking-60k" in text and "--eps-data" in text
        if cmd == "predict":
            for s in ("hit_id,track_id", "embedding float32 (N, 12)", "volumes 7, 8, 9", "--force"):
                assert s in text


def test_submission_track_ids() -> None:
    np.testing.assert_array_equal(submission_track_ids(np.array([-1, 0, 1, -1, 0])), [3, 1, 2, 4, 1])
    np.testing.assert_array_equal(submission_track_ids(np.array([-1, -1])), [1, 2])
    assert submission_track_ids(np.zeros(0, np.int64)).shape == (0,)

"""The realism report (``python -m pointformers.bench.realism``) in quick mode.

A fake "real" folder holds the generated subsets themselves, written as TrackML files: the
real-vs-generated code then compares identical data, so every KS distance is 0 and the AP@k
ratio is 1, and any difference points at the comparison (or at the TrackML round trip).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from pointformers.bench import realism
from pointformers.data.tracking import GENERATOR_VERSION, generate_event
from pointformers.data.trackml import write_trackml_event

SEED = 3


def _table_rows(text: str, section: str) -> dict[str, list[str]]:
    """Rows of the markdown tables of ``section``: first cell -> the other cells."""
    body = text[text.index(f"<!-- {section}:begin -->"):text.index(f"<!-- {section}:end -->")]
    rows = {}
    for line in body.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.setdefault(cells[0], cells[1:])
    return rows


def _fmt(v: float) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.4f}"


@pytest.fixture(scope="module")
def fake_real(tmp_path_factory):
    """The quick run's generated subsets written as TrackML events (a stand-in for real data)."""
    cfg, _ = realism.config_from_args(["--quick", "--seed", str(SEED)])
    subsets = realism.generated_subsets(cfg, realism.REAL_NOISE_SHARE)
    folder = tmp_path_factory.mktemp("real_events")
    for i, ev in enumerate(subsets):
        write_trackml_event(ev, folder, f"event{i:09d}", write_detectors_file=(i == 0))
    return folder, subsets


@pytest.fixture(scope="module")
def report(fake_real, tmp_path_factory):
    folder, _ = fake_real
    doc = tmp_path_factory.mktemp("docs") / "realism.md"
    argv = ["--quick", "--seed", str(SEED), "--write", str(doc), "--real", str(folder),
            "--detectors", str(folder / "detectors.csv"), "--noise-share", repr(realism.REAL_NOISE_SHARE)]
    return realism.main(argv), doc, folder


def test_identical_data_compare_as_identical(report, fake_real):
    res, _, _ = report
    _, subsets = fake_real
    acc = res["acceptance"]
    assert acc["real_stats"]["events"] == len(subsets) == 2
    assert acc["real"] == acc["generated"]  # per event, the same AP@k through the reader
    assert acc["ratio"] == pytest.approx(1.0, abs=1e-12)
    assert 0 < acc["generated_ap"] <= 1
    for row in res["features"]:
        assert row["ks"] == pytest.approx(0.0, abs=1e-12), row
        assert row["real_median"] == row["gen_median"] and row["real_q90"] == row["gen_q90"]
    gen_x, real_x = res["feature_arrays"]
    assert gen_x.shape == real_x.shape == (sum(e.num_hits for e in subsets), 15)


def test_numbers_in_the_markdown_are_the_measured_ones(report):
    res, doc, folder = report
    text = doc.read_text()
    for name in realism.SECTIONS:
        assert text.count(f"<!-- {name}:begin -->") == 1 and text.count(f"<!-- {name}:end -->") == 1
    # the command is named, the real sample's paths are not
    assert "--real FOLDER --detectors FILE" in text
    assert str(folder) not in text and folder.name not in text
    assert realism.REAL_LABEL in text
    assert text.count(f"Generator version {GENERATOR_VERSION}, seed {SEED}") == len(realism.SECTIONS)

    acc = res["acceptance"]
    rows = _table_rows(text, "realism-acceptance")
    assert rows["generated subsets"][-1] == _fmt(acc["generated_ap"])
    assert rows[realism.REAL_LABEL][-1] == _fmt(acc["real_ap"])
    assert f"**{_fmt(acc['ratio'])}**" in text and "target >= 0.8: met" in text

    feats = _table_rows(text, "realism-features")
    for row in res["features"]:
        cells = feats[row["feature"]]
        assert cells == [_fmt(row[k]) for k in ("gen_median", "real_median", "gen_q10", "real_q10", "gen_q90",
                                                 "real_q90", "ks")]
        assert cells[-1] == "0.0000"

    ck = _table_rows(text, "realism-checkpoint")
    labels = list(realism._ROW_LABELS.items())
    tables = re.split(r"\*\*`tracking-", text[text.index("<!-- realism-checkpoint:begin -->"):])
    assert len(res["checkpoint"]) == 2
    for (preset, part), chunk in zip(res["checkpoint"].items(), tables[1:]):
        assert chunk.startswith(preset.removeprefix("tracking-"))
        for key, label in labels:
            line = next(l for l in chunk.splitlines() if l.startswith(f"| {label} |"))
            cells = [c.strip() for c in line.strip("|").split("|")][1:]
            assert cells == [_fmt(part["rows"][key][k]) for _, k in realism._METRIC_COLS]
    assert set(ck) >= {label for _, label in labels}


def test_png_written_atomically(report):
    res, doc, _ = report
    png = doc.with_name("realism_features.png")
    assert res["png"] == png
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "![model-input histograms](realism_features.png)" in doc.read_text()
    assert sorted(p.name for p in doc.parent.iterdir()) == ["realism.md", "realism_features.png"]  # no temp files


def test_real_ap_matches_the_folder_evaluation(report):
    """The real side is what ``pointformers evaluate --data`` reports on the folder."""
    from pointformers.trackml_eval import REFERENCE_EPS, evaluate_folder, open_tracking_checkpoint

    res, _, folder = report
    tm = open_tracking_checkpoint(realism.CHECKPOINT, device="cpu")
    out = evaluate_folder(tm, folder, REFERENCE_EPS)
    assert [r["ap@k"] for r in out["events"]] == res["acceptance"]["real"]
    assert out["overall"]["ap@k"] == res["acceptance"]["real_ap"]


def test_knn_row_is_the_task_baseline(report):
    from pointformers.tasks.tracking.training import knn_baseline_metrics, prepare_tracking_clouds

    res, _, _ = report
    cfg, _ = realism.config_from_args(["--quick", "--seed", str(SEED)])
    clouds = prepare_tracking_clouds([generate_event(cfg.presets["tracking-60k"], SEED, 0)], with_pairs=False)
    base = knn_baseline_metrics(clouds)
    knn = res["checkpoint"]["tracking-60k"]["rows"]["knn"]
    assert knn["ap@k"] == base["ap@k"] and knn["recall@K"] == base["recall@K"]
    ck = res["checkpoint"]["tracking-60k"]["rows"]["checkpoint"]
    assert ck["ap@k"] > knn["ap@k"]  # the trained checkpoint beats position-only neighbours
    assert ck["dbscan_eps"] == 0.55
    assert res["checkpoint"]["tracking-6k"]["rows"]["checkpoint"]["clouds"] == 10  # one cloud per φ-sector


def test_subset_keeps_whole_particles_and_the_noise_share():
    cfg, _ = realism.config_from_args(["--quick"])
    ev = generate_event(cfg.presets["tracking-60k"], 0, 0)
    sub = realism.subset_event(ev, 40, 0.055, np.random.default_rng(0))
    ids = np.unique(sub.particle_id[sub.particle_id > 0])
    assert ids.size == 40
    for pid in ids:  # every hit of a chosen particle
        assert (sub.particle_id == pid).sum() == (ev.particle_id == pid).sum()
    n_part = int((sub.particle_id > 0).sum())
    assert int((sub.particle_id == 0).sum()) == round(0.055 / 0.945 * n_part)
    assert np.isin(sub.hit_id, ev.hit_id).all() and (np.diff(np.searchsorted(ev.hit_id, sub.hit_id)) > 0).all()
    assert set(sub.particles_id.tolist()) == set(ids.tolist())
    again = realism.subset_event(ev, 40, 0.055, np.random.default_rng(0))
    assert np.array_equal(again.hit_id, sub.hit_id)


@pytest.mark.release
def test_rerun_replaces_sections_in_place(tmp_path):
    doc = tmp_path / "realism.md"
    doc.write_text("# Realism\n\nHand-written prose.\n\n<!-- realism-acceptance:begin -->\nold\n"
                   "<!-- realism-acceptance:end -->\n\nMore prose.\n")
    res = realism.main(["--quick", "--write", str(doc)])
    text = doc.read_text()
    assert "Hand-written prose." in text and "More prose." in text and "\nold\n" not in text
    for name in realism.SECTIONS:
        assert text.count(f"<!-- {name}:begin -->") == 1
    assert math.isnan(res["acceptance"]["ratio"]) and res["acceptance"]["real_stats"] is None
    assert "No real sample given" in text
    assert all(r["ks"] is None for r in res["features"])
    assert "| feature | gen median | gen q10 | gen q90 |" in text


@pytest.mark.parametrize("argv, flag", [
    (["--events", "0"], "--events"),
    (["--events", "two"], "--events"),
    (["--seed", "-1"], "--seed"),
    (["--subsets", "0"], "--subsets"),
    (["--noise-share", "1.5"], "--noise-share"),
    (["--noise-share", "nan"], "--noise-share"),
    (["--detectors", "x.csv"], "--detectors"),
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_name_the_flag(argv, flag):
    with pytest.raises(ValueError, match=re.escape(flag)):
        realism.config_from_args(["--quick", *argv])


def test_bad_real_folder_and_too_many_particles(tmp_path):
    with pytest.raises(ValueError, match="--real"):
        realism.config_from_args(["--real", str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="--real"):
        realism.config_from_args(["--real", str(tmp_path)])  # a folder without events
    cfg, _ = realism.config_from_args(["--quick", "--subset-particles", "100000"])
    with pytest.raises(ValueError, match="--subset-particles"):
        realism.generated_subsets(cfg, 0.05)
    with pytest.raises(ValueError, match="--write"):
        realism.config_from_args(["--quick", "--write", str(tmp_path)])


def test_feature_table_detects_a_shift():
    rng = np.random.default_rng(0)
    gen = rng.normal(size=(4000, 15))
    real = gen.copy()
    real[:, 6] += 0.5  # charge_frac shifted by half a standard deviation
    rows = realism.feature_table(gen, real)
    assert rows[6]["feature"] == "charge_frac" and rows[6]["ks"] > 0.15
    assert rows[6]["real_median"] == pytest.approx(rows[6]["gen_median"] + 0.5)
    assert all(r["ks"] == 0 for i, r in enumerate(rows) if i != 6)


def test_ratio_is_generated_over_real(fake_real, monkeypatch):
    _, subsets = fake_real
    cfg, _ = realism.config_from_args(["--quick", "--seed", str(SEED)])
    ap = {id(subsets[0]): 0.9, id(subsets[1]): 0.6}
    monkeypatch.setattr(realism, "_ap_at_k", lambda tm, events: [ap[id(e)] for e in events])
    acc = realism.acceptance_section(cfg, None, subsets, subsets[:1], 0.05)
    assert acc["generated"] == [0.9, 0.6] and acc["real"] == [0.9]
    assert acc["generated_ap"] == pytest.approx(0.75) and acc["real_ap"] == pytest.approx(0.9)
    assert acc["ratio"] == pytest.approx(0.75 / 0.9)
    assert acc["real_stats"]["events"] == 1 and acc["generated_stats"]["events"] == 2
    ap[id(subsets[1])] = float("nan")  # a subset without query hits is skipped, as the task averages clouds
    assert realism.acceptance_section(cfg, None, subsets, [], 0.05)["generated_ap"] == pytest.approx(0.9)


def test_recorded_command_hides_the_real_paths():
    cmd = realism._command(["--write", "docs/realism.md", "--real=/data/secret/events", "--detectors",
                            "/data/secret/detectors.csv", "--events", "3"])
    assert cmd == ("python -m pointformers.bench.realism --write docs/realism.md --real FOLDER --detectors FILE "
                   "--events 3")


def test_ks_critical_value():
    assert realism.ks_critical(1000, 1000) == pytest.approx(1.3581 * math.sqrt(2 / 1000), rel=1e-4)
    rng = np.random.default_rng(1)  # two samples of one distribution exceed it about 5 % of the time
    from scipy.stats import ks_2samp

    over = [ks_2samp(rng.normal(size=500), rng.normal(size=300)).statistic > realism.ks_critical(500, 300)
            for _ in range(400)]
    assert 0.01 < np.mean(over) < 0.10

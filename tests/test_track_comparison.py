"""The end-to-end vs HEPT + DBSCAN comparison (pointformers.bench.track_comparison): its tables and claims from
known rows, and the latency of two pipelines on a generated event."""
from __future__ import annotations

import pytest
import torch

from pointformers.bench import track_comparison as tc


def _report(eff):
    bins = [{"bin": "0.9–1.5", "eff_dm": eff, "particles": 10}, {"bin": "≥ 1.5", "eff_dm": eff + 0.05, "particles": 4}]
    return {"vs_pt": bins, "vs_eta": [{"bin": "-1–1", "eff_dm": eff, "particles": 14}]}


def _rows(e2e_eff, e2e_fake):
    rows = []
    for name, cfg, effs, fakes in (("HEPT", "configs/tracking-hept-small.yaml", (0.80, 0.81, 0.79), (0.05, 0.06, 0.05)),
                                   ("track-reconstruction", "configs/track-reconstruction-6k.yaml", e2e_eff, e2e_fake)):
        for seed, eff, fake in zip((42, 43, 44), effs, fakes):
            rows.append({"config": cfg, "model": name, "seed": seed, "eff_dm": eff, "eff_perfect": eff - 0.1,
                         "eff_lhc": eff + 0.05, "fake_dm": fake, "dup_lhc": 0.01, "trackml_score": eff - 0.05,
                         "infer_ms": 100.0, "track_report": _report(eff)})
    return rows


def test_the_claims_follow_the_seeds_rule():
    better = tc.accuracy_text(_rows((0.90, 0.91, 0.89), (0.02, 0.02, 0.03)))
    assert "efficiency than HEPT + DBSCAN (seeds' rule): **holds**" in better
    assert "fake rate than HEPT + DBSCAN (seeds' rule): **holds**" in better
    assert "| HEPT | `tracking-hept-small.yaml` | 3 | 0.800 ± 0.010 |" in better
    assert "| 0.9–1.5 (10) | 0.800 ± 0.010 | 0.900 ± 0.010 |" in better   # efficiency against pT, per seed mean
    worse = tc.accuracy_text(_rows((0.70, 0.71, 0.69), (0.10, 0.11, 0.10)))
    assert "efficiency than HEPT + DBSCAN (seeds' rule): **fails**" in worse
    assert "fake rate than HEPT + DBSCAN (seeds' rule): **fails**" in worse
    close = tc.accuracy_text(_rows((0.80, 0.83, 0.78), (0.05, 0.07, 0.04)))
    assert "**within spread**" in close


def test_latency_of_both_pipelines_on_a_generated_event():
    from pointformers import models

    torch.manual_seed(0)
    e2e = models.build("track-reconstruction", dim=16, heads=2, n_layers=1, num_slots=8, block_size=32,
                       num_regions=4, decoder_heads=2)
    hept = models.build("hept-tracking", num_regions=8, block_size=100, dropout=0.0)
    pipes = [tc._Pipeline("HEPT + DBSCAN", hept, eps=0.3), tc._Pipeline("end-to-end", e2e)]
    labels = pipes[1](*tc_inputs())
    assert labels.dtype.kind == "i" and labels.shape == (1500,)
    rows = tc.latency(pipes, [1500], repeats=2, log=None)
    assert rows[0]["n"] == 1500 and all(rows[0][f"{p.name} s"] > 0 for p in pipes)
    assert all(rows[0][f"{p.name} peak_mb"] >= 0 for p in pipes)
    text = tc.latency_text(rows, rows, [p.name for p in pipes], 2)
    assert "| 1,500 |" in text and "×" in text


def tc_inputs():
    from pointformers.bench.hep_comparison import _speed_event

    return _speed_event(1500, 0)


@pytest.mark.heavy
def test_the_comparison_runs_end_to_end(tmp_path, monkeypatch):
    # both configs trained for one epoch on three seeds of the tiny preset, scored, timed and written as a section
    from pathlib import Path

    monkeypatch.setenv("POINTFORMERS_CACHE", str(tmp_path / "cache"))
    root = Path(__file__).resolve().parents[1]
    doc = tmp_path / "results.md"
    res = tc.main(["--preset", "tiny", "--seeds", "1", "2", "3", "--epochs", "1", "--hept",
                   str(root / "configs/tracking-hept-small.yaml"), "--e2e",
                   str(root / "configs/track-reconstruction-small.yaml"), "--out", str(tmp_path / "runs"),
                   "--repeats", "1", "--sizes", "1000", "--curve", "--write", str(doc)])
    assert len(res["rows"]) == 6 and all("eff_dm" in r and r.get("track_report") for r in res["rows"])
    text = doc.read_text()
    assert "<!-- track-comparison-tiny:begin -->" in text and "seeds' rule" in text and "| 1,000 |" in text
    # the same section from the recorded rows of the pieces, training nothing (the latency skipped: no sizes)
    again = tc.main(["--preset", "tiny", "--seeds", "1", "2", "3", "--epochs", "1", "--hept",
                     str(root / "configs/tracking-hept-small.yaml"), "--e2e",
                     str(root / "configs/track-reconstruction-small.yaml"), "--out", str(tmp_path / "again"),
                     "--reuse", str(tmp_path / "runs" / "results-tiny.json"), "--reused-only", "--sizes", "--curve"])
    assert [(r["config"], r["seed"], r["eff_dm"]) for r in again["rows"]] == \
        [(r["config"], r["seed"], r["eff_dm"]) for r in res["rows"]]
    assert not (tmp_path / "again" / "tracking-hept-small-tiny-seed1").exists() and again["latency"] == []
    with pytest.raises(ValueError, match="reuse|missing|recorded"):
        tc.main(["--preset", "tiny", "--seeds", "4", "--epochs", "1", "--hept", str(root / "configs/tracking-hept-small.yaml"),
                 "--e2e", str(root / "configs/track-reconstruction-small.yaml"), "--out", str(tmp_path / "none"),
                 "--reuse", str(tmp_path / "runs" / "results-tiny.json"), "--reused-only", "--sizes", "--curve"])

"""Every baseline config of HEPT's comparison resolves, builds, runs, differs from HEPT's only in
its model, and matches HEPT's parameter count within 10% (as the paper matches parameters)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pointformers.bench.hep_comparison import check_orderings, comparison_table, model_label
from pointformers.cli import load_config

ROOT = Path(__file__).resolve().parents[1]
HEPT = ROOT / "configs" / "tracking-hept-small.yaml"
BASELINES = sorted(p for p in (ROOT / "configs").glob("tracking-*-small.yaml") if p != HEPT)


def _params(cfg) -> int:
    from pointformers import models

    torch.manual_seed(0)
    return sum(p.numel() for p in models.build(cfg["model"]["name"], **cfg["model"]["options"]).parameters())


@pytest.fixture(scope="module")
def hept():
    cfg = load_config(HEPT)
    return cfg, _params(cfg)


def test_every_required_baseline_has_a_config():
    labels = {model_label(load_config(p)) for p in BASELINES}
    want = {"performer", "flt", "sft", "samsa", "sampled", "full", "DGCNN (EdgeConv)", "GravNet",
            "OR-only LSH", "OR-only LSH*", "OR & AND LSH", "OR & AND LSH*"}
    assert want <= labels, f"missing configs for {want - labels}"
    assert model_label(load_config(HEPT)) == "HEPT"


@pytest.mark.parametrize("path", BASELINES, ids=lambda p: p.stem)
def test_config_builds_runs_and_matches_hept(path, hept):
    hept_cfg, hept_params = hept
    cfg = load_config(path)
    for section in ("data", "task", "train"):  # only the model (and the run folder) differ
        assert cfg[section] == hept_cfg[section], f"{path.name}: section {section!r} differs from HEPT's"
    n = _params(cfg)
    assert abs(n / hept_params - 1) <= 0.10, f"{path.name}: {n} parameters vs HEPT's {hept_params}"
    from pointformers import models

    torch.manual_seed(0)
    m = models.build(cfg["model"]["name"], **cfg["model"]["options"]).eval()
    g = torch.Generator().manual_seed(0)
    x, c = torch.randn(130, 15, generator=g), torch.rand(130, 6, generator=g)
    with torch.no_grad():
        y = m(x, c)
    assert y.shape == (130, 12) and torch.isfinite(y).all()


def test_ordering_checks_and_table():
    def row(model, ap, seed=0):
        return {"model": model, "config": f"configs/{model}.yaml", "metric": "ap@k", "ap@k": ap, "params": 1,
                "seed": seed, "trackml_score": ap / 2, "dbscan_eps": 0.1, "infer_ms": 1.0, "peak_mb": 1.0,
                "hits_per_event": 10.0, "train_s": 1.0, "epochs": 1}

    aps = {"HEPT": 0.8, "performer": 0.6, "flt": 0.7, "DGCNN (EdgeConv)": 0.9, "OR & AND LSH*": 0.75,
           "OR-only LSH*": 0.65, "OR & AND LSH": 0.5, "OR-only LSH": 0.55}

    def seeded(aps, jitter=(0.0, 0.01, -0.01)):   # three seeds, std 0.01 each
        return [row(m, ap + j, seed) for m, ap in aps.items() for seed, j in enumerate(jitter)]

    t1, t3 = check_orderings(seeded(aps))
    assert t1.startswith("Table 1") and t1.endswith("HOLDS.") and "beyond the seeds' spread" in t1
    assert "flt 0.7000 ± 0.0100" in t1 and "OR-only LSH* 0.6500 ± 0.0100" in t1 and "DGCNN" not in t1
    assert t3.endswith("HOLDS.")
    # performer above HEPT; OR-only LSH* below OR-only LSH
    t1, t3 = check_orderings(seeded({**aps, "performer": 0.85, "OR-only LSH*": 0.52}))
    assert t1.endswith("DOES NOT HOLD for performer.") and t3.endswith("DOES NOT HOLD.")
    # HEPT 0.015 above flt, inside the spread (0.02): not decided in HEPT's favour
    t1, _ = check_orderings(seeded({**aps, "flt": 0.785}))
    assert t1.endswith("DOES NOT HOLD for flt.")
    # one seed: undecided, with what the means show
    t1, t3 = check_orderings([row(m, ap) for m, ap in aps.items()])
    assert t1.startswith("Table 1") and "UNDECIDED (fewer than 3 seeds; on the means it holds)" in t1
    assert "skipped" in check_orderings([row("HEPT", 0.8)])[0]
    table = comparison_table(seeded(aps))
    assert table.count("\n") == len(aps) + 1 and "| HEPT | `HEPT.yaml` |" in table and "TrackML score" in table
    assert "| 0.8000 ± 0.0100 | 0.4000 ± 0.0050 |" in table and table.splitlines()[2].endswith("| 0, 1, 2 |")
    single = comparison_table([row(m, ap) for m, ap in aps.items()])
    assert "Seeds" not in single and "| 0.8000 | 0.4000 |" in single


def test_speed_comparison_small(tmp_path):
    from pointformers.bench.hep_comparison import DEFAULT_SPEED_CONFIGS, speed_comparison

    doc = tmp_path / "results.md"
    configs = [str(ROOT / p) for p in DEFAULT_SPEED_CONFIGS]
    res = speed_comparison(150, configs, repeats=1, device="cpu", doc=str(doc), command="CMD", log=None)
    assert [r["model"] for r in res["rows"]] == ["HEPT", "DGCNN (EdgeConv)", "GravNet"]
    assert res["n_hits"] == 150 and res["rows"][0]["vs_hept"] == 1.0
    for r in res["rows"]:
        assert r["median_ms"] > 0 and len(r["times_ms"]) == 1 and r["peak_mb"] >= 0
        assert r["vs_hept"] == pytest.approx(r["median_ms"] / res["rows"][0]["median_ms"])
    assert res["min_gnn_speedup"] == pytest.approx(min(r["vs_hept"] for r in res["rows"][1:]))
    text = doc.read_text()
    assert "<!-- hep-speed-150:begin -->" in text and "Generated by `CMD`" in text and "| GravNet |" in text
    with pytest.raises(ValueError, match="n_hits"):
        speed_comparison(0, configs, log=None)
    with pytest.raises(ValueError, match="no such file"):
        speed_comparison(10, ["nope.yaml"], log=None)


def test_ordering_checks_ignore_other_tasks_and_check_pileup_on_its_ap():
    assert check_orderings([{"model": "HEPT", "metric": "accuracy", "accuracy": 0.4}]) == []
    rows = [{"model": m, "metric": "ap", "ap": v, "seed": s} for m, base in (("HEPT", 0.71), ("performer", 0.62))
            for s, v in zip((1, 2, 3), (base, base + 0.002, base - 0.002))]
    lines = check_orderings(rows)
    assert len(lines) == 1 and lines[0].startswith("Table 1 ordering (HEPT pile-up AP") and lines[0].endswith("HOLDS.")
    close = rows[:3] + [{**r, "ap": r["ap"] + 0.0895} for r in rows[3:]]   # performer 0.7095: within the spread
    assert check_orderings(close)[0].endswith("DOES NOT HOLD for performer.")


@pytest.mark.release
def test_comparison_split_over_processes_resumes_into_one_table(tmp_path):
    """compare --resume: two calls on disjoint configs, then one over both with resume, give the rows a
    single call gives (finished runs are only evaluated); without resume a used folder is refused."""
    from pointformers.bench.hep_comparison import compare_configs

    configs = ["configs/tracking-hept-small.yaml", "configs/tracking-performer-small.yaml"]
    common = dict(preset="tiny", epochs=1, overrides=[f"data.cache_dir={tmp_path / 'cache'}", "model.options.n_layers=1"],
                  repeats=1, max_timing_events=1, log=None)
    first = compare_configs(configs[:1], out_dir=tmp_path / "runs", **common)
    second = compare_configs(configs[1:], out_dir=tmp_path / "runs", **common)
    both = compare_configs(configs, out_dir=tmp_path / "runs", resume=True, **common)
    for alone, joined in zip(first + second, both):
        assert joined["ap@k"] == alone["ap@k"] and joined["train_s"] == alone["train_s"] > 0
        assert joined["best_epoch"] == alone["best_epoch"] == 1
    with pytest.raises(ValueError, match="holds a run"):
        compare_configs(configs[:1], out_dir=tmp_path / "runs", **common)
    again = compare_configs(configs[:1], out_dir=tmp_path / "runs", overwrite=True, **common)
    assert again[0]["ap@k"] == first[0]["ap@k"]  # trained again from scratch: the same seeded run


@pytest.mark.heavy
def test_comparison_on_several_seeds_runs_each_seed_as_its_own_run(tmp_path):
    from pointformers.bench.hep_comparison import compare_configs

    common = dict(preset="tiny", epochs=1, repeats=1, max_timing_events=1, log=None)
    sets = [f"data.cache_dir={tmp_path / 'cache'}", "model.options.n_layers=1"]
    rows = compare_configs(["configs/tracking-hept-small.yaml"], out_dir=tmp_path / "runs", overrides=sets,
                           seeds=[3, 4], **common)
    assert [r["seed"] for r in rows] == [3, 4]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == \
        ["tracking-hept-small-tiny-seed3", "tracking-hept-small-tiny-seed4"]
    # each run's checkpoint carries its experiment config (what `pointformers evaluate` rebuilds the run from)
    from pointformers.engine import load_checkpoint

    stored = load_checkpoint(tmp_path / "runs" / "tracking-hept-small-tiny-seed4" / "best.pt")["extra"]["config"]
    assert stored["train"]["seed"] == 4 and stored["model"]["options"]["n_layers"] == 1
    assert stored["data"]["preset"] == "tiny"
    alone = compare_configs(["configs/tracking-hept-small.yaml"], out_dir=tmp_path / "alone",
                            overrides=[*sets, "train.seed=4"], **common)
    assert alone[0]["seed"] == 4 and alone[0]["ap@k"] == rows[1]["ap@k"]   # the seed is the run's train.seed
    with pytest.raises(ValueError, match="seeds"):
        compare_configs(["configs/tracking-hept-small.yaml"], seeds=[1, 1], **common)


def test_comparison_trained_in_pieces_is_written_by_one_call_that_reuses_them(tmp_path):
    """--reuse: rows recorded by earlier calls (other processes or sessions) are taken when their resolved
    config equals the run's, nothing is trained again, and every timing column is measured again here;
    a row trained with another config, or one that does not record its config, is refused by name."""
    import json

    from pointformers.bench.hep_comparison import compare_configs

    configs = ["configs/tracking-hept-small.yaml", "configs/tracking-performer-small.yaml"]
    common = dict(preset="tiny", epochs=1, overrides=[f"data.cache_dir={tmp_path / 'cache'}", "model.options.n_layers=1"],
                  repeats=1, max_timing_events=1, log=None)
    first = compare_configs(configs[:1], out_dir=tmp_path / "a", **common)
    second = compare_configs(configs[1:], out_dir=tmp_path / "b", **common)
    files = [tmp_path / "a" / "results-tiny.json", tmp_path / "b" / "results-tiny.json"]
    doc = tmp_path / "doc.md"
    both = compare_configs(configs, out_dir=tmp_path / "c", reuse=files, doc=str(doc), command="CMD", **common)
    assert not [p for p in (tmp_path / "c").iterdir() if p.is_dir()]  # nothing trained
    for alone, joined in zip(first + second, both):
        assert joined["ap@k"] == alone["ap@k"] and joined["train_s"] == alone["train_s"]
        assert joined["timing"] == "retimed" and joined["infer_ms"] > 0 and joined["machine"]
    assert "Timing columns:" in doc.read_text() and "| HEPT |" in doc.read_text()
    assert [r["model"] for r in json.loads((tmp_path / "c" / "results-tiny.json").read_text())["rows"]] == \
        ["HEPT", "performer"]
    with pytest.raises(ValueError, match="no recorded row of tracking-performer-small.yaml seed"):
        compare_configs(configs, out_dir=tmp_path / "e", reuse=files[:1], reused_only=True, **common)
    assert not (tmp_path / "e").exists() or not [p for p in (tmp_path / "e").iterdir() if p.is_dir()]
    changed = {**common, "overrides": [*common["overrides"], "model.options.block_size=50"]}
    with pytest.raises(ValueError, match="different config .*model"):
        compare_configs(configs[:1], out_dir=tmp_path / "d", reuse=files[:1], **changed)
    old = json.loads(files[0].read_text())
    del old["rows"][0]["run_config"]
    files[0].write_text(json.dumps(old))
    with pytest.raises(ValueError, match="does not record its config"):
        compare_configs(configs[:1], out_dir=tmp_path / "d", reuse=files[:1], **common)
    files[1].write_text("{")
    with pytest.raises(ValueError, match="reuse: .* not a readable"):
        compare_configs(configs[1:], out_dir=tmp_path / "d", reuse=files[1:], **common)

"""point_results: claims checked on given numbers, a tiny end-to-end run, the doc section, the memory worker."""
from __future__ import annotations

import json

import pytest

from pointformers.bench import point_results as pr


def _row(stem, oa, rot=None, metric="oa", seed=0):
    return {"stem": stem, "model": stem, "seed": seed, "params": 1, "metric": metric, "test": {metric: oa},
            "test_rotated": None if rot is None else {metric: rot}, "train_s": 1.0}


def _mem(variant, pts):
    return [{"variant": variant, "points": n, "peak_mb": m, "step_s": 0.1} for n, m in pts]


def _seeds(stem, oa, rot=None, metric="oa", jitter=(0.0, 0.01, -0.01)):
    """Three seeds' rows around ``oa`` (and ``rot``): std 1 point with the default jitter."""
    return [_row(stem, oa + j, None if rot is None else rot + j, metric, seed=i) for i, j in enumerate(jitter)]


def test_claims_hold_or_not_on_the_numbers():
    S = "shape-classification-"
    shapes = [*_seeds(S + "mlp-cls", 0.70), *_seeds(S + "sft-cls", 0.80, 0.10), *_seeds(S + "full-cls", 0.805),
              *_seeds(S + "sft-ri-cls", 0.70, 0.70), *_seeds(S + "sampled-cls", 0.75),
              *_seeds(S + "sampled-cls-full", 0.74)]
    listops = [*_seeds("listops-samsa-seq", 0.36, metric="accuracy"), *_seeds("listops-mlp-seq", 0.20, metric="accuracy")]
    memory = (_mem("sampled", [(1024, 10), (2048, 20), (4096, 40)])
              + _mem("full (materialised, MATH kernel)", [(1024, 50), (2048, 200), (4096, 800)])
              + _mem("full (fused SDPA kernel)", [(1024, 10), (2048, 20), (4096, 40)]))
    claims = pr.check_claims(shapes, listops, memory)
    assert len(claims) == 6 and all(c.startswith("HOLDS") for c in claims), claims
    assert "MLP 70.0 ± 1.0" in claims[0] and "sft-cls 80.0 ± 1.0 vs full-cls 80.5 ± 1.0 (-0.5, spread 2.0)" in claims[1]
    assert "70.0 ± 1.0 -> 70.0 ± 1.0" in claims[2] and "80.0 ± 1.0 -> 10.0 ± 1.0" in claims[2]
    # 80 % of the non-invariant SFT: 0.8 x (80 ± 1) = 64 ± 0.8, cleared by 6 points against a spread of 1.8
    assert "sft-ri-cls 70.0 ± 1.0 against 0.8 x sft-cls = 64.0 ± 0.8, +6.0, spread 1.8" in claims[3]
    assert "samsa-seq 36.0 ± 1.0 (spread 2.0) vs mlp-seq 20.0 ± 1.0" in claims[4]
    assert "x2.00 per doubling" in claims[5] and "x4.00 per doubling" in claims[5]

    def set_oa(stem, oa, key="test"):
        for r, j in zip([r for r in shapes + listops if r["stem"] == stem], (0.0, 0.01, -0.01)):
            r[key][r["metric"]] = oa + j

    set_oa(S + "mlp-cls", 0.78)                             # the MLP now beats sampled-cls (75)
    set_oa(S + "full-cls", 0.90)                            # sft-cls 10 points below its twin
    set_oa(S + "sft-ri-cls", 0.50)                          # below 80 % of sft-cls's 80
    set_oa(S + "sft-ri-cls", 0.30, "test_rotated")          # the invariant model drops
    set_oa("listops-mlp-seq", 0.40)
    memory = memory[:3] + _mem("full (materialised, MATH kernel)", [(1024, 50), (2048, 100), (4096, 200)])
    claims = pr.check_claims(shapes, listops, memory)
    assert all(c.startswith("DOES NOT HOLD") for c in claims), claims
    assert "not beaten beyond the spread by sft-cls, sampled-cls, sampled-cls-full." in claims[0]
    assert "too far" in claims[1]


def test_a_difference_inside_the_seeds_spread_does_not_hold():
    S = "shape-classification-"
    mlp = _seeds(S + "mlp-cls", 0.790)
    # 0.2 points above the MLP on the mean, but with 1-point stds: inside the spread (2.0)
    close = _seeds(S + "sampled-hier-cls", 0.792)
    claims = pr.check_claims(mlp + close, [], [])
    assert claims[0].startswith("DOES NOT HOLD") and "not beaten beyond the spread by sampled-hier-cls" in claims[0]
    # the same means on exactly reproducible seeds (std 0): the difference clears a zero spread
    claims = pr.check_claims(_seeds(S + "mlp-cls", 0.790, jitter=(0, 0, 0))
                             + _seeds(S + "sampled-hier-cls", 0.792, jitter=(0, 0, 0)), [], [])
    assert claims[0].startswith("HOLDS"), claims
    # fewer than MIN_SEEDS seeds: undecided, whatever the numbers
    claims = pr.check_claims([_row(S + "mlp-cls", 0.5), _row(S + "sft-cls", 0.9)], [], [])
    assert claims[0].startswith("UNDECIDED"), claims


def test_compare_and_spread():
    assert pr.spread([1, 2, 3], [5, 5, 5]) == 1.0 and pr.spread([1], [2]) == 0.0
    assert pr.compare([10, 11, 12], [5, 6, 7]) == "holds"              # +5 > spread 2
    assert pr.compare([10, 11, 12], [9, 10, 11]) == "within spread"    # +1, spread 2
    assert pr.compare([5, 6, 7], [10, 11, 12]) == "fails"              # -5 + 2 <= 0
    assert pr.compare([8, 9, 10], [10, 11, 12], margin=3) == "within spread"   # -2 - 2 = -4 < -3 < -2 + 2
    assert pr.compare([9.5, 10, 10.5], [10, 11, 12], margin=3) == "holds"      # -1 - 1.5 > -3
    assert pr.compare([1, 2], [0, 0, 0]) == "undecided"


def test_tiny_end_to_end_run_writes_only_its_section(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\n<!-- hep-comparison-small:begin -->\nHEP table\n<!-- hep-comparison-small:end -->\n")
    shape_set = [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.classes=[cone, cuboid, torus]",
                 "data.per_class=[2, 1, 2]", "data.num_points=24", "data.mini_batch=3", "train.epochs=1"]
    out = pr.run_point_results(
        shape_configs=["configs/shape-classification-mlp-cls.yaml", "configs/shape-classification-sft-ri-cls.yaml",
                       "configs/shape-classification-sft-cls.yaml"],
        listops_configs=["configs/listops-mlp-seq.yaml"], seeds=[3], memory_sizes=(),
        shape_overrides=shape_set, listops_overrides=[f"data.cache_dir={tmp_path}", "data.preset=tiny",
                                                      "train.epochs=1"],
        out_dir=tmp_path / "runs", doc=str(doc), command="python -m pointformers.bench.point_results --tiny", log=None,
        pretraining=False)
    assert [r["stem"] for r in out["shapes"]] == ["shape-classification-mlp-cls", "shape-classification-sft-ri-cls",
                                                  "shape-classification-sft-cls"]
    ri = out["shapes"][1]
    # the rotation-invariant model scores the same on rotated test shapes (exact invariance)
    assert ri["test_rotated"]["oa"] == pytest.approx(ri["test"]["oa"])
    assert ri["test_rotated"]["loss"] == pytest.approx(ri["test"]["loss"], rel=1e-4)
    text = doc.read_text()
    assert "HEP table" in text and text.count("<!-- point-results:begin -->") == 1
    assert "python -m pointformers.bench.point_results --tiny" in text and "Seeds: 3" in text
    assert "every attention model beats the MLP" in text and "rotation-invariant SFT" in text
    saved = json.loads((tmp_path / "runs" / "point-results.json").read_text())
    assert saved["seeds"] == [3] and len(saved["listops"]) == 1
    pr.write_section(str(doc), "point-results", "again", "cmd")                    # replaced, not appended
    assert doc.read_text().count("point-results:begin") == 1 and "HEP table" in doc.read_text()
    # --reuse: the same rows again without training, the claims recomputed from them
    again = pr.run_point_results(seeds=[99], memory_sizes=(), out_dir=tmp_path / "runs2", doc=None, log=None,
                                 reuse=tmp_path / "runs" / "point-results.json")
    assert again["shapes"] == saved["shapes"] and again["claims"] == saved["claims"]
    with pytest.raises(ValueError, match="reuse"):
        pr.run_point_results(memory_sizes=(), log=None, reuse=tmp_path / "missing.json")


def test_memory_worker_measures_one_training_step(capsys):
    opts = {"num_classes": 4, "in_dim": 0, "dim": 16, "mlp_hidden": 8, "heads": 2, "head_dim": 8, "ffn_hidden": 16}
    for attention, kernel in (("sampled", "default"), ("full", "math")):
        pr._memory_worker(["--options", json.dumps(opts), "--attention", attention, "--kernel", kernel,
                           "--points", "64", "--repeats", "1"])
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["step_s"] > 0 and r["peak_mb"] >= 0
    with pytest.raises(ValueError, match="sizes"):
        pr.memory_comparison(sizes=[1])


def test_reuse_merges_runs_made_in_parallel(tmp_path):
    S = "shape-classification-"
    a = {"seeds": [0, 1, 2], "shapes": _seeds(S + "mlp-cls", 0.70), "listops": [],
         "memory": _mem("sampled", [(1024, 10), (2048, 20)])}
    b = {"seeds": [0, 1, 2], "shapes": _seeds(S + "sft-cls", 0.90, 0.10) + [_row(S + "mlp-cls", 0.10, seed=2)],
         "listops": _seeds("listops-mlp-seq", 0.2, metric="accuracy"), "memory": []}
    for name, d in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(d))
    out = pr.run_point_results(memory_sizes=(), out_dir=tmp_path / "merged", doc=None, log=None,
                               reuse=[tmp_path / "a.json", tmp_path / "b.json"])
    stems = [(r["stem"], r["seed"]) for r in out["shapes"]]
    assert len(stems) == 6 and len(set(stems)) == 6                       # one row per config and seed
    mlp2 = next(r for r in out["shapes"] if r["stem"] == S + "mlp-cls" and r["seed"] == 2)
    assert mlp2["test"]["oa"] == 0.10                                      # the later file's row wins
    assert len(out["listops"]) == 3 and out["memory"] == a["memory"]      # memory from the file that has some
    with pytest.raises(ValueError, match="b.json"):
        (tmp_path / "b.json").write_text("{")
        pr.run_point_results(memory_sizes=(), log=None, reuse=[tmp_path / "a.json", tmp_path / "b.json"])


def test_pretraining_claim_holds_or_not_on_the_numbers():
    ft, scratch = "x" + pr.PRETRAINED_SUFFIX, "x" + pr.SCRATCH_SUFFIX
    pre = [_row("pre", 0.03, metric="chamfer", seed=i) for i in range(3)]
    claims = pr.check_claims([], [], [], pre + _seeds(ft, 0.80) + _seeds(scratch, 0.75))
    assert len(claims) == 1 and claims[0].startswith("HOLDS"), claims
    assert "fine-tuned 80.0 ± 1.0 vs from scratch 75.0 ± 1.0, +5.0, spread 2.0" in claims[0]
    claims = pr.check_claims([], [], [], pre + _seeds(ft, 0.76) + _seeds(scratch, 0.75))   # inside the spread
    assert claims[0].startswith("DOES NOT HOLD"), claims
    claims = pr.check_claims([], [], [], pre + _seeds(ft, 0.70) + _seeds(scratch, 0.75))
    assert claims[0].startswith("DOES NOT HOLD"), claims


def test_pretraining_comparison_fine_tunes_from_each_seeds_checkpoint(tmp_path):
    tiny = [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.classes=[cone, cuboid, torus]",
            "data.per_class=[2, 1, 2]", "data.num_points=40", "data.mini_batch=3", "train.epochs=1",
            "model.options.num_groups=4", "model.options.group_size=8"]
    rows = pr.pretraining_comparison([5], overrides=tiny, out_dir=tmp_path / "runs", log=None)
    pre, scratch, ft = rows
    assert pre["metric"] == "chamfer" and pre["test"]["chamfer"] > 0
    assert scratch["stem"].endswith(pr.SCRATCH_SUFFIX) and ft["stem"].endswith(pr.PRETRAINED_SUFFIX)
    assert {r["seed"] for r in rows} == {5}
    # the fine-tuned run was built from the pre-training's best checkpoint, the scratch run from nothing
    import torch
    config = lambda r: torch.load(f"{r['run']}/best.pt", weights_only=True)["model_config"]  # noqa: E731
    assert config(ft)["pretrained"] == f"{pre['run']}/best.pt" and config(scratch)["pretrained"] is None
    md = pr.results_markdown([], [], [], [5], pretrain_rows=rows)
    assert "Masked pre-training" in md and "Chamfer-L2" in md and "-pretrained" in md

"""The benchmark's authors-style baseline (HEPT's materialized reference path) computes the same
function as the fused HEPT."""
import os

import pytest
import torch

from pointformers.attention import build
from pointformers.bench.speed import report


@pytest.mark.parametrize("all_heads", [False, True])
def test_materialized_hept_equals_fused_hept_with_gradients(all_heads):
    torch.manual_seed(0)
    opts = dict(dim=16, heads=4, coord_dim=3, block_size=8, n_hashes=3, num_regions=6)
    fused = build("hept", **opts, all_heads=all_heads).double()
    mat = build("hept", **opts, implementation="materialized").double()
    mat.load_state_dict(fused.state_dict())
    x = torch.randn(2, 37, 16, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(2, 37, 3, dtype=torch.float64)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False
    y1, y2 = fused(x, pos, mask), mat(x, pos, mask)
    torch.testing.assert_close(y1, y2)
    g1, = torch.autograd.grad(y1.pow(2).sum(), x)
    g2, = torch.autograd.grad(y2.pow(2).sum(), x)
    torch.testing.assert_close(g1, g2)
    gw1 = torch.autograd.grad(fused(x, pos, mask).pow(2).sum(), [fused.w_q.weight, fused.log_omega])
    gw2 = torch.autograd.grad(mat(x, pos, mask).pow(2).sum(), [mat.w_q.weight, mat.log_omega])
    for a, b in zip(gw1, gw2):
        torch.testing.assert_close(a, b)


def test_report_ratios():
    rs = [{"mechanism": m, "n": 100, "mode": "forward", "seconds": s, "peak_mb": 10.0}
          for m, s in (("hept", 1.0), ("hept-materialized", 5.0), ("full", 2.0), ("kernel", 3.0))]
    rs += [{"mechanism": m, "n": 50, "mode": "train", "seconds": 1.0, "peak_mb": mb}
           for m, mb in (("hept", 50.0), ("hept-materialized", 400.0), ("full", 100.0))]
    text = report(rs, [100], 50)
    assert "| 100 | 1.00 | 5.00 | 2.00 | 3.00 |" in text and "| 5.0× | 2.0× |" in text
    assert "| hept | 1.00 | 50 | 0.50 |" in text


MEASURE_TWICE = """
import torch
from pointformers.bench.harness import measure

held = torch.ones(8 * 2**20)  # 32 MB resident before the calls
for _ in range(2):
    junk = [torch.ones(4 * 2**20) for _ in range(20)]  # freed before the call: the allocator keeps it
    del junk
    r = measure(lambda: torch.ones(16 * 2**20).sum(), repeats=2)
    print(r["runs"], r["seconds"], r["peak_mb"])
"""


def test_measure_reports_a_calls_own_peak_memory():
    # 64 MB allocated and touched inside the call: the peak counts it, the time is positive; memory
    # held before the call (32 MB) is not counted, nor is memory freed before it. A second
    # measurement in the process counts the call too (freed pages are handed back first: without
    # that it read 0 MB). In a fresh process, as the harness runs every measurement: in this test
    # worker, heap memory that earlier tests freed was not always handed back (after
    # tests/test_allocator.py the call read 0 MB in about one run in three)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEASURE_TWICE], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = [line.split() for line in out.stdout.strip().splitlines()[-2:]]
    assert len(rows) == 2, out.stdout
    for runs, seconds, peak_mb in rows:
        assert int(runs) == 2 and float(seconds) > 0
        assert 60 < float(peak_mb) < 100, rows


def test_mechanisms_budget_and_limits_skip_with_reasons():
    # a spent time budget skips every measurement, each saying why, without starting a process
    from pointformers.bench import mechanisms

    rs = mechanisms.run_all(["hept", "full"], [1024, 4096], ["forward"], 1, 60.0, "cpu", 1e9,
                            log=lambda s: None, budget=0.0)
    assert len(rs) == 4 and all(r["skipped"] == "the run's time budget was spent" for r in rs)
    assert all(r["flops"] > 0 for r in rs)


def test_speed_skips_sizes_predicted_past_the_limit():
    from pointformers.bench.speed import skip_reason

    prev = {"mechanism": "kernel", "n": 6000, "seconds": 10.0}
    assert skip_reason(None, "kernel", 6000, 3, 100) is None
    assert skip_reason(prev, "kernel", 20000, 1, 100).startswith("predicted 111 s")  # quadratic
    assert skip_reason({**prev, "mechanism": "hept"}, "hept", 20000, 1, 100) is None  # linear: 33 s
    assert skip_reason({**prev, "error": "timeout"}, "hept", 20000, 1, 100) == "N = 6000 failed"


def test_mechanisms_growth_ratio_and_verdict_columns():
    from pointformers.bench import mechanisms

    def row(m, n, s, mb):
        return {"mechanism": m, "n": n, "mode": "forward", "seconds": s, "peak_mb": mb, "flops": 1, "gflops": 1.0}

    layer = [row("hept", 8192, 0.1, 10.0), row("hept", 65536, 0.9, 80.0),
             row("full", 8192, 0.2, 50.0), row("full", 65536, 12.8, 3200.0)]
    assert abs(mechanisms.growth(layer, "hept", "forward", "seconds") - 9.0) < 1e-12
    assert abs(mechanisms.growth(layer, "full", "forward", "peak_mb") - 64.0) < 1e-12
    text = mechanisms.report(layer, [8192, 65536], ["forward"], [], "cpu", None)
    hept_line = next(l for l in text.splitlines() if l.startswith("| hept |") and "9.0" in l)
    full_line = next(l for l in text.splitlines() if l.startswith("| full |") and "64.0" in l)
    assert hept_line.endswith("| 9.0 | yes |") and full_line.endswith("| 64.0 | no |")


@pytest.mark.heavy
def test_peak_of_a_worker_started_by_a_large_process_is_its_own():
    # The kernel folds a parent's resident size at fork into an exec'ed child's ru_maxrss; the
    # harness must report the worker's own peak (VmHWM), not the parent's size.
    import subprocess
    import sys

    held = torch.ones(900 * 2**20 // 4)  # noqa: F841  (900 MB resident here, the parent)
    held += 1
    code = ("import torch; from pointformers.bench.harness import measure; "
            "print(measure(lambda: torch.ones(4 * 2**20).sum(), repeats=1)['peak_mb'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) < 100

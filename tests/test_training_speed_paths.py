"""Training speed paths of the tracking task (issue 20): pairs cached on disk with the data, the
per-step random pairs drawn as before, and a seeded run's losses equal to the old per-step path."""
import copy
import math
import os

import numpy as np
import pytest
import torch

from pointformers import models
from pointformers.data import cache as cache_mod
from pointformers.data.tracking import load_tracking_dataset
from pointformers.tasks.tracking import training
from pointformers.tasks.tracking.core import (TrackingPairs, _label_pairs, _undirected_sorted, add_random_pairs,
                                              build_tracking_pairs, infonce_loss)
from pointformers.tasks.tracking.training import TrackingTask, prepare_tracking_clouds


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    return load_tracking_dataset("tiny", "train", cache_dir=tmp_path_factory.mktemp("data"))[:3]


def _old_step_pairs(inputs, fraction: float, generator: torch.Generator) -> TrackingPairs:
    """The per-step pairs as the task built them before the pairs were cached (reference, the code
    of that commit): the full list from build_tracking_pairs, made one-way and mirrored, the random
    pairs of add_random_pairs appended, then the mirrored layout of the listed and random pairs."""
    full = build_tracking_pairs(inputs)
    keep = full.edge_index[0] < full.edge_index[1]
    e = full.edge_index[:, keep].to(torch.int32).long()
    pairs = TrackingPairs(torch.cat([e, e.flip(0)], dim=1), full.is_positive[keep].repeat(2), full.particle_id,
                          full.eligible)
    n_listed, h, n = pairs.num_pairs, pairs.num_pairs // 2, pairs.num_hits
    m = int(pairs.num_pairs * fraction / 2)
    if m > 0:  # add_random_pairs before this change
        rnd = torch.randint(0, n, (2, m), generator=generator)
        extra = _undirected_sorted(rnd[0], rnd[1], n)
        pairs = TrackingPairs(torch.cat([pairs.edge_index, extra], dim=1),
                              torch.cat([pairs.is_positive, _label_pairs(extra, pairs.particle_id, pairs.eligible)]),
                              pairs.particle_id, pairs.eligible)
    extra = pairs.edge_index[:, n_listed:]
    one_way = extra[0] < extra[1]
    half = torch.cat([pairs.edge_index[:, :h], extra[:, one_way]], dim=1)
    pos = torch.cat([pairs.is_positive[:h], pairs.is_positive[n_listed:][one_way]])
    return TrackingPairs(torch.cat([half, half.flip(0)], dim=1), pos.repeat(2), pairs.particle_id, pairs.eligible)


def _count_builds(monkeypatch) -> list:
    calls = []
    real = training.build_tracking_pairs

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "build_tracking_pairs", counting)
    return calls


def test_seeded_losses_equal_the_old_per_step_pairs(events, tmp_path):
    prepare_tracking_clouds(events, cache_dir=tmp_path)            # builds and stores the pairs
    clouds = prepare_tracking_clouds(events, cache_dir=tmp_path)   # trains on pairs read back from disk
    torch.manual_seed(0)
    model = models.build("hept-tracking", n_layers=2, num_regions=4, block_size=50, dropout=0.0,
                         mlp_layers=2, mlp_hidden=32)
    ref_model = copy.deepcopy(model)
    task = TrackingTask()
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=3e-3) for m in (model, ref_model))
    gen, ref_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    losses, ref_losses = [], []
    for step in range(2):
        for cloud in clouds:
            opt.zero_grad()
            loss = task.loss(model, cloud, gen)
            loss.backward()
            opt.step()
            ref_opt.zero_grad()
            pairs = _old_step_pairs(cloud.inputs, task.random_pairs, ref_gen)
            ref = infonce_loss(ref_model(cloud.inputs.x, cloud.inputs.coords), pairs, task.similarity, task.tau,
                               task.sigma)
            ref.backward()
            ref_opt.step()
            losses.append(loss.item())
            ref_losses.append(ref.item())
    assert losses == ref_losses                       # exactly equal, step by step
    assert len(set(losses)) == len(losses)            # and the steps did change something
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("fraction", [0.0, 0.2, 1.5])
def test_step_pairs_equal_the_old_layout(events, tmp_path, fraction):
    (cloud,) = prepare_tracking_clouds(events[:1], cache_dir=tmp_path)
    got = cloud.training_pairs(fraction, torch.Generator().manual_seed(3))
    ref = _old_step_pairs(cloud.inputs, fraction, torch.Generator().manual_seed(3))
    for name in ("edge_index", "is_positive", "particle_id", "eligible"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    # add_random_pairs (now drawing through draw_random_pairs) appends the same random pairs
    listed = cloud.pairs()
    appended = add_random_pairs(listed, fraction, generator=torch.Generator().manual_seed(3))
    extra = appended.edge_index[:, listed.num_pairs:]
    one_way = extra[0] < extra[1]
    assert torch.equal(extra[:, one_way], got.edge_index[:, listed.num_pairs // 2:got.num_pairs // 2])
    assert got.edge_index.dtype == torch.long and (fraction == 0 or got.num_pairs > cloud.half_edges.shape[1] * 2)


def test_pairs_are_built_once_and_rebuilt_when_a_parameter_changes(events, tmp_path, monkeypatch):
    calls = _count_builds(monkeypatch)
    first = prepare_tracking_clouds(events, cache_dir=tmp_path)
    assert len(calls) == len(events)
    files = sorted((tmp_path / "tracking").glob("pairs-*.npz"))
    assert len(files) == 1 and not list((tmp_path / "tracking").glob(".*tmp"))
    again = prepare_tracking_clouds(events, cache_dir=tmp_path)
    assert len(calls) == len(events)                  # read back, nothing rebuilt
    for a, b in zip(first, again):
        assert torch.equal(a.half_edges, b.half_edges) and torch.equal(a.half_positive, b.half_positive)
        assert a.half_edges.dtype == torch.int32
    for change in ({"radius": 0.5}, {"max_num_neighbors": 16}, {"pt_min": 0.5}):
        before = len(calls)
        changed = prepare_tracking_clouds(events, cache_dir=tmp_path, **change)
        assert len(calls) == before + len(events), change
        assert calls[-1][next(iter(change))] == next(iter(change.values()))
        ref = build_tracking_pairs(changed[0].inputs, **change)
        assert changed[0].pairs().num_pairs == ref.num_pairs
    before = len(calls)
    prepare_tracking_clouds(events[:2], cache_dir=tmp_path)        # other clouds: another entry
    prepare_tracking_clouds(events[::-1], cache_dir=tmp_path)      # same clouds, other order
    assert len(calls) == before + 2 + len(events)
    assert len(list((tmp_path / "tracking").glob("pairs-*.npz"))) == 6


def test_changed_cloud_contents_rebuild(events, tmp_path, monkeypatch):
    calls = _count_builds(monkeypatch)
    prepare_tracking_clouds(events[:1], cache_dir=tmp_path)
    ev = copy.deepcopy(events[0])
    ev.particle_id = np.asarray(ev.particle_id).copy()
    ev.particle_id[:5] = 0                                   # same sizes, other truth
    (cloud,) = prepare_tracking_clouds([ev], cache_dir=tmp_path)
    assert len(calls) == 2
    ref = build_tracking_pairs(cloud.inputs)
    assert torch.equal(cloud.pairs().is_positive.sum(), ref.is_positive.sum())


def test_bad_cache_entries_are_rebuilt_and_no_cache_writes_nothing(events, tmp_path, monkeypatch):
    calls = _count_builds(monkeypatch)
    good = prepare_tracking_clouds(events[:2], cache_dir=tmp_path)
    (path,) = (tmp_path / "tracking").glob("pairs-*.npz")
    path.write_bytes(path.read_bytes()[:100])                    # truncated: a miss
    again = prepare_tracking_clouds(events[:2], cache_dir=tmp_path)
    assert len(calls) == 4 and torch.equal(again[1].half_edges, good[1].half_edges)
    with np.load(path) as z:                                      # complete but inconsistent content
        arrays = {k: z[k] for k in z.files if k != "__cache_params__"}
        params = __import__("json").loads(str(z["__cache_params__"]))
    arrays["offsets"] = arrays["offsets"][:-1]
    cache_mod.save_arrays(path, params, arrays)
    fixed = prepare_tracking_clouds(events[:2], cache_dir=tmp_path)
    assert len(calls) == 6 and torch.equal(fixed[0].half_positive, good[0].half_positive)
    assert cache_mod.load_arrays(path, params)["offsets"].shape == (3,)   # overwritten with a good entry
    nocache = tmp_path / "none"
    plain = prepare_tracking_clouds(events[:2], cache_dir=False)
    assert len(calls) == 8 and not nocache.exists()
    assert torch.equal(plain[0].half_edges, good[0].half_edges)
    with pytest.raises(ValueError, match="cache_dir"):
        prepare_tracking_clouds(events[:1], cache_dir=True)


def test_cache_entries_are_written_atomically(events, tmp_path, monkeypatch):
    """The entry goes through the project's atomic writer: a failing write leaves no file."""
    import pointformers.files as files

    def failing(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod, "atomic_write", failing)
    clouds = prepare_tracking_clouds(events[:1], cache_dir=tmp_path)   # goes on uncached
    assert clouds[0].has_pairs and not list((tmp_path / "tracking").glob("*"))
    seen = []
    monkeypatch.setattr(cache_mod, "atomic_write", lambda p, w: seen.append(os.fspath(p)) or files.atomic_write(p, w))
    prepare_tracking_clouds(events[:1], cache_dir=tmp_path)
    assert len(seen) == 1 and seen[0].endswith(".npz")


def test_cached_arrays_rebuilds_an_entry_its_check_refuses(tmp_path):
    built = []

    def build():
        built.append(1)
        return {"a": np.arange(3)}

    def check(arrays):
        if arrays["a"].shape != (3,):
            raise ValueError("bad")

    cache_mod.cached_arrays(tmp_path, "x", {"v": 1}, build, validate=check)
    cache_mod.cached_arrays(tmp_path, "x", {"v": 1}, build, validate=check)
    assert len(built) == 1
    cache_mod.save_arrays(cache_mod.cache_path(tmp_path, "x", {"v": 1}), {"v": 1}, {"a": np.arange(2)})
    out = cache_mod.cached_arrays(tmp_path, "x", {"v": 1}, build, validate=check)
    assert len(built) == 2 and out["a"].shape == (3,)
    assert cache_mod.load_arrays(cache_mod.cache_path(tmp_path, "x", {"v": 1}), {"v": 1})["a"].shape == (3,)


def test_training_benchmark_step_plan_and_report(tmp_path):
    from pointformers.bench import training as bt

    r = bt.worker("hept", 300, 1, 1, str(tmp_path))
    assert r["num_pairs"] > 0 and math.isfinite(r["peak_mb"]) and r["runs"] == 1   # RSS counters may lag: ≈ 0 may read < 0
    assert all(r[p] >= 0 for p in bt.PHASES)
    assert r["seconds"] == pytest.approx(sum(r[p] for p in bt.PHASES))
    done = [{"mechanism": "kernel", "n": 1000, "seconds": 1.0, "peak_mb": 100.0},
            {"mechanism": "kernel", "n": 2000, "seconds": 4.0, "peak_mb": 400.0}]
    assert bt.plan([], 10**6, 1, 1.0, 1.0) is None                      # nothing measured: run it
    assert bt.plan(done[:1], 2000, 1, 1e9, 1e9) is None
    assert "does not fit" in bt.plan(done, 64000, 1, 1e9, 24 * 1024)   # quadratic: 400 MB · 32² > 24 GB
    assert bt.plan(done[:1], 64000, 1, 1e9, 24 * 1024) is None           # linear from one size: 6.4 GB
    assert "limit" in bt.plan(done, 8000, 3, 100.0, 1e9)                # 4 s · 4² · 4 steps > 100 s
    assert bt.plan(done + [{"mechanism": "kernel", "n": 4000, "skipped": "predicted 9 s > 5 s limit"}], 8000, 1,
                   1e9, 1e9) == "as at N = 4000: not run"
    assert bt.plan(done + [{"mechanism": "kernel", "n": 4000, "skipped": "does not fit in 12 GB (…)"}], 8000, 1,
                   1e9, 1e9) == "as at N = 4000: does not fit"
    text = bt.report([{**r, "mechanism": "hept", "n": 300},
                      {"mechanism": "kernel", "n": 300, "skipped": "does not fit: predicted 30 GB > 24 GB"}], 1, 1024)
    assert "| 300 | " in text and "`hept`" in text and "not run: does not fit" in text
    msg = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 14745600000 bytes."
    assert bt.out_of_memory_detail(msg) == "ran out of memory: a further 13.7 GB"
    assert bt.out_of_memory_detail("Killed") == "ran out of memory"
    with pytest.raises(SystemExit, match="unknown"):
        bt.main(["--mechanisms", "nope"])


def test_one_way_pairs_are_the_full_lists_forward_rows(events):
    # build_tracking_pairs(one_way=True): exactly the rows with anchor < other of the full
    # (symmetric) list, in its order, with the same labels
    from pointformers.tasks.tracking import tracking_inputs
    from pointformers.tasks.tracking.core import build_tracking_pairs

    for ev in events[:3]:
        inp = tracking_inputs(ev)
        full = build_tracking_pairs(inp)
        half = build_tracking_pairs(inp, one_way=True)
        fwd = full.edge_index[0] < full.edge_index[1]
        assert half.edge_index.shape[1] * 2 == full.edge_index.shape[1] > 0
        assert torch.equal(half.edge_index, full.edge_index[:, fwd])
        assert torch.equal(half.is_positive, full.is_positive[fwd])

"""The Delphes ROOT reader on small files the tests write with uproot.

What differs from a real Delphes file: Delphes stores the particle-flow collection as a split
``TClonesArray`` branch ``PF`` whose leaves are sub-branches (paths ``PF/PF.PT``, ...), which
uproot cannot write. The files here hold the nearest structure uproot can write: one jagged
branch per leaf, named ``PF.PT``, ``PF.Eta``, ... (counter ``PF_size``) in a TTree ``Delphes``.
The values per particle, their types (float32 kinematics, int32 Charge/IsPU/PID) and the
per-event (jagged) layout are the same; the reader looks up both naming schemes.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from pointformers.data.pileup import generate_events

uproot = pytest.importorskip("uproot", reason="uproot (the optional 'io' extra) is not installed, so no ROOT "
                                              "file can be written or read; pip install pointformers[io]")
ak = pytest.importorskip("awkward", reason="awkward (installed with uproot) is missing")

from pointformers.data.delphes import (  # noqa: E402
    HEPT_FILES,
    count_delphes_events,
    load_delphes_splits,
    read_delphes,
    write_delphes,
)

FIELDS = ("PT", "Eta", "Phi", "Charge", "IsPU", "PID", "Rapidity", "E", "Px", "Py")


def write_tree(path, columns: dict, tree: str = "Delphes") -> None:
    """Write jagged branches ``PF.<name>`` from ``{name: list of per-event lists}`` with uproot directly
    (independent of the writer under test); float columns as float32, the rest int32."""
    arrays = {}
    for name, events in columns.items():
        dtype = np.int32 if name in ("Charge", "IsPU", "PID") else np.float32
        counts = [len(e) for e in events]
        flat = np.concatenate([np.asarray(e, dtype) for e in events]) if sum(counts) else np.zeros(0, dtype)
        arrays[f"PF.{name}"] = ak.unflatten(flat, counts)
    with uproot.recreate(path) as f:
        # mktree: a TTree as Delphes writes (assigning a dict would write an RNTuple in uproot >= 5.7).
        f.mktree(tree, {k: v.type for k, v in arrays.items()})
        f[tree].extend(arrays)


def hand_columns() -> dict:
    """Three events: 3 particles (π+, γ from the LC; n from pile-up), 1 particle (K0L, pile-up), none."""
    return {
        "PT": [[10.0, 2.0, 1.5], [0.7], []], "Eta": [[0.1, -0.2, 2.9], [-3.1], []],
        "Phi": [[0.3, 3.0, -1.0], [2.0], []], "Charge": [[1, 0, 0], [0], []], "IsPU": [[0, 0, 1], [1], []],
        "PID": [[211, 22, -2112], [130], []], "Rapidity": [[0.099, -0.2, 2.5], [-2.9], []],
        "E": [[10.1, 2.04, 14.0], [7.8], []], "Px": [[9.55, -1.98, 0.81], [-0.29], []],
        "Py": [[2.96, 0.28, -1.26], [0.64], []],
    }


def test_reads_a_hand_written_file(tmp_path) -> None:
    path = tmp_path / "hand.root"
    write_tree(path, hand_columns())
    evs = read_delphes(path)
    assert count_delphes_events(path) == 3 and [e.num_particles for e in evs] == [3, 1, 0]
    a, b, _ = evs
    np.testing.assert_allclose(a.pt, [10.0, 2.0, 1.5])
    np.testing.assert_allclose(a.eta, [0.1, -0.2, 2.9])
    np.testing.assert_allclose(a.phi, [0.3, 3.0, -1.0])
    np.testing.assert_allclose(a.rapidity, [0.099, -0.2, 2.5], rtol=1e-6)
    np.testing.assert_allclose(a.energy, [10.1, 2.04, 14.0], rtol=1e-6)
    np.testing.assert_allclose(a.px, [9.55, -1.98, 0.81], rtol=1e-6)
    np.testing.assert_allclose(a.py, [2.96, 0.28, -1.26], rtol=1e-6)
    assert a.charge.tolist() == [1, 0, 0] and a.pdg.tolist() == [211, 22, -2112]
    assert a.is_pu.tolist() == [False, False, True] and b.is_pu.tolist() == [True]
    assert a.pid_category.tolist() == [0, 1, 4] and b.pid_category.tolist() == [2]
    assert (a.vertex == -1).all() and (a.jet == -1).all()  # not stored by Delphes
    assert [a.event_id, b.event_id] == [0, 1]
    assert [e.event_id for e in read_delphes(path, entry_start=1, entry_stop=2)] == [1]


def test_writer_round_trip(tmp_path) -> None:
    evs = generate_events("pileup-tiny", 4, seed=7)
    path = tmp_path / "gen.root"
    write_delphes(path, evs)
    keys = set(uproot.open(path)["Delphes"].keys())
    assert {f"PF.{f}" for f in FIELDS} <= keys
    back = read_delphes(path)
    for a, b in zip(evs, back):
        for k in ("pt", "eta", "phi", "px", "py", "energy", "rapidity", "charge", "pdg", "is_pu"):
            assert np.array_equal(getattr(a, k), getattr(b, k)), k


def test_hept_layout_split(tmp_path) -> None:
    evs = generate_events("pileup-tiny", 7, seed=1)
    write_delphes(tmp_path / HEPT_FILES[0], evs[:3])
    write_delphes(tmp_path / HEPT_FILES[1], evs[3:])
    raw = load_delphes_splits(tmp_path, seed=0, permute=False)
    assert [len(raw[s]) for s in ("train", "val", "test")] == [3, 2, 2]  # part 2 halved: val ⌊4/2⌋
    assert all(np.array_equal(a.pt, b.pt) for a, b in zip(raw["train"], evs[:3]))
    ids = sorted(e.event_id for e in raw["val"] + raw["test"])
    assert ids == [3, 4, 5, 6]  # part 2's events, numbered after part 1's
    for e in raw["val"] + raw["test"]:
        assert np.array_equal(e.pt, evs[e.event_id].pt)
    # Particle permutation: seeded, per event, independent of the splits asked for.
    perm = load_delphes_splits(tmp_path, seed=0)
    only_val = load_delphes_splits(tmp_path, ("val",), seed=0)
    assert np.array_equal(perm["val"][0].pt, only_val["val"][0].pt)
    e0, r0 = perm["train"][0], raw["train"][0]
    assert not np.array_equal(e0.pt, r0.pt) and np.array_equal(np.sort(e0.pt), np.sort(r0.pt))
    order = np.argsort(r0.pt, kind="stable")
    assert np.array_equal(np.sort(e0.pt), r0.pt[order])
    assert np.array_equal(e0.is_pu[np.argsort(e0.pt, kind="stable")], r0.is_pu[order])  # labels move with rows


def test_generic_folder_is_cut_by_fractions(tmp_path) -> None:
    evs = generate_events("pileup-tiny", 10, seed=2)
    write_delphes(tmp_path / "a.root", evs[:6])
    write_delphes(tmp_path / "b.root", evs[6:])
    sp = load_delphes_splits(tmp_path, seed=0, permute=False)
    assert [[e.event_id for e in sp[s]] for s in ("train", "val", "test")] == [list(range(8)), [8], [9]]
    assert np.array_equal(sp["test"][0].pt, evs[9].pt)
    one = load_delphes_splits(tmp_path / "a.root", ("train", "test"), seed=0, permute=False)
    assert len(one["train"]) == 4 and len(one["test"]) == 2  # 6 events: train floor(4.8), val floor(0.6), test the rest


# ------------------------------------------------------------------ malformed input
def test_missing_or_non_root_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        read_delphes(tmp_path / "absent.root")
    bad = tmp_path / "bad.root"
    bad.write_text("this is not ROOT\n")
    with pytest.raises(ValueError, match=r"bad\.root: not a readable ROOT file"):
        read_delphes(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"data\.root: no \*\.root files"):
        load_delphes_splits(empty)
    with pytest.raises(ValueError, match=r"data\.root: .* is neither a file nor a folder"):
        load_delphes_splits(tmp_path / "nowhere")


def test_missing_tree_or_branch(tmp_path) -> None:
    cols = hand_columns()
    path = tmp_path / "t.root"
    write_tree(path, cols, tree="Events")
    with pytest.raises(ValueError, match=r"t\.root: no TTree 'Delphes'.*Events"):
        read_delphes(path)
    del cols["IsPU"]
    path2 = tmp_path / "nopu.root"
    write_tree(path2, cols)
    with pytest.raises(ValueError, match=r"nopu\.root: branch 'PF\.IsPU' missing from tree 'Delphes'"):
        read_delphes(path2)


def test_inconsistent_lengths_nan_and_unknown_pid(tmp_path) -> None:
    cols = hand_columns()
    cols["Eta"] = [[0.1, -0.2], [-3.1], []]  # event 0 has 3 PTs but 2 Etas
    path = tmp_path / "len.root"
    write_tree(path, cols)
    with pytest.raises(ValueError, match=r"len\.root: branch 'PF\.Eta' has 2 particles in entry 0 but 'PF\.PT' has 3"):
        read_delphes(path)

    cols = hand_columns()
    cols["PT"] = [[10.0, 2.0, 1.5], [float("nan")], []]
    path = tmp_path / "nan.root"
    write_tree(path, cols)
    with pytest.raises(ValueError, match=r"nan\.root: branch 'PF\.PT' has a non-finite value \(nan\) in entry 1"):
        read_delphes(path)

    cols = hand_columns()
    cols["PID"] = [[211, 22, -2112], [111], []]  # a neutral pion is none of HEPT's categories
    path = tmp_path / "pid.root"
    write_tree(path, cols)
    with pytest.raises(ValueError, match=r"pid\.root: entry 1, branch 'PF\.PID'.*PDG code 111"):
        read_delphes(path)


def test_flat_branch_is_rejected(tmp_path) -> None:
    path = tmp_path / "flat.root"
    arrays = {f"PF.{f}": np.zeros(2, np.float32) for f in FIELDS}
    with uproot.recreate(path) as f:
        f.mktree("Delphes", {k: v.dtype for k, v in arrays.items()})
        f["Delphes"].extend(arrays)
    with pytest.raises(ValueError, match=r"flat\.root: branch 'PF\.PT' .*not a per-particle \(jagged\) array"):
        read_delphes(path)


def test_missing_uproot_names_the_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "uproot", None)  # import uproot -> ImportError
    with pytest.raises(ImportError, match=r"pip install pointformers\[io\]"):
        read_delphes(tmp_path / "x.root")


def test_empty_event_is_dropped_when_preparing_samples(tmp_path) -> None:
    from pointformers.tasks.pileup import prepare_pileup_samples

    path = tmp_path / "hand.root"
    write_tree(path, hand_columns())
    with pytest.warns(UserWarning, match=r"1 of 3 events have no particles .*event ids \[2\]"):
        samples = prepare_pileup_samples(read_delphes(path))
    assert [s.event_id for s in samples] == [0, 1]


def test_task_reads_a_delphes_folder(tmp_path) -> None:
    from pointformers.tasks.registry import get_task

    evs = generate_events("pileup-tiny", 5, seed=4)
    write_delphes(tmp_path / "events.root", evs)
    spec = get_task("pileup")
    cfg = {"data": {**spec.data_defaults, "root": str(tmp_path)}, "task": dict(spec.task_defaults)}
    spec.validate(cfg)
    samples = spec.load(cfg, ("train", "test"), False)
    assert [len(samples["train"]), len(samples["test"])] == [4, 1]
    s = samples["test"][0]
    assert s.event_id == 4 and s.num_particles == evs[4].num_particles
    assert int(s.label.sum()) == int(evs[4].is_lc.sum())
    with pytest.raises(ValueError, match="data.root"):
        spec.validate({"data": {**spec.data_defaults, "root": str(tmp_path / "missing")},
                       "task": dict(spec.task_defaults)})

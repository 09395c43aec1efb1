"""Readers of LRGB's released split files (Peptides ``.pt``, PascalVOC-sp ``.pickle``) into GraphSet."""
import io
import os
import pickle

import numpy as np
import pytest
import torch

from pointformers.data import graphs as G


def _peptide_items(count=3, seed=0, targets=10):
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(count):
        n, e = 4 + i, 3 + i
        x = torch.randint(0, 9, (n, 9), generator=g)
        ei = torch.randint(0, n, (2, 2 * e), generator=g)
        ea = torch.randint(0, 3, (2 * e, 3), generator=g)
        items.append((x, ea, ei, torch.rand(1, targets, generator=g)))
    return items


def _voc_items(count=3, seed=0, y_as_list=False):
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(count):
        n, e = 5 + i, 6 + i
        y = torch.randint(0, 21, (n,), generator=g)
        items.append((torch.rand(n, 14, generator=g), torch.rand(e, 2, generator=g),
                      torch.randint(0, n, (2, e), generator=g), y.tolist() if y_as_list else y))
    return items


def _assert_same(gs, items, graph_level=True):
    assert len(gs) == len(items)
    for i, (x, ea, ei, y) in enumerate(items):
        assert np.array_equal(gs.nodes[i], np.asarray(x)) and np.array_equal(gs.edges[i], np.asarray(ea))
        assert np.array_equal(gs.edge_index[i], np.asarray(ei)) and gs.edge_index[i].dtype == np.int64
        if graph_level:
            assert np.allclose(gs.targets[i], np.asarray(y).ravel())
        else:
            assert np.array_equal(gs.targets[i], np.asarray(y)) and gs.targets[i].dtype == np.int64


def test_peptides_pt_round_trip(tmp_path):
    for name, t in (("peptides-func", 10), ("peptides-struct", 11)):
        items = _peptide_items(targets=t)
        (tmp_path / name / "raw").mkdir(parents=True)
        torch.save(items, tmp_path / name / "raw" / "val.pt")
        gs = G.load_lrgb(tmp_path / name, name, "val")  # found in root/raw
        _assert_same(gs, items)
        assert gs.level == "graph" and gs.feature_kind == G.CATEGORICAL and gs.name == name
        assert gs.targets.shape == (3, t) and gs.targets.dtype == np.float32 and gs.nodes[0].dtype == np.int64
        assert gs.meta["metric"] == G.LRGB_METRIC[name] and G.LRGB_NUM_TARGETS[name] == t
    # PyG's layout: <root>/<name>/raw/<split>.pt
    assert len(G.load_lrgb(tmp_path, "peptides-func", "val")) == 3


def test_pascalvoc_pickle_round_trip(tmp_path):
    for y_as_list in (False, True):
        items = _voc_items(y_as_list=y_as_list)
        with open(tmp_path / "train.pickle", "wb") as f:
            pickle.dump(items, f)
        gs = G.load_lrgb(tmp_path, "pascalvoc-sp", "train")
        _assert_same(gs, items, graph_level=False)
        assert gs.level == "node" and gs.feature_kind == G.CONTINUOUS and gs.nodes[0].dtype == np.float32
    # numpy arrays inside the pickle are rebuilt too (protocol 4 and 5 pickle them differently)
    items = [tuple(np.asarray(v) for v in it) for it in _voc_items()]
    for protocol in (2, 4, 5):
        (tmp_path / "test.pickle").write_bytes(pickle.dumps(items, protocol=protocol))
        _assert_same(G.read_lrgb_file(tmp_path / "test.pickle", "pascalvoc-sp"), items, graph_level=False)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Sneaky:
    """A storage-looking global whose bytes carry a malicious legacy torch.save payload."""

    def __init__(self, payload):
        self.payload = payload

    def __reduce__(self):
        from torch.storage import _load_from_bytes
        return _load_from_bytes, (self.payload,)


def test_forbidden_globals_are_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "train.pickle"
    items = _voc_items(2)
    items[1] = (items[1][0], items[1][1], items[1][2], _Evil(marker))
    path.write_bytes(pickle.dumps(items))
    with pytest.raises(ValueError, match=r"train\.pickle.*refused.*system"):
        G.read_lrgb_file(path, "pascalvoc-sp")
    # torch.storage._load_from_bytes is allowed, but its bytes are loaded with weights_only
    buf = io.BytesIO()
    torch.save(_Evil(marker), buf, _use_new_zipfile_serialization=False)
    path.write_bytes(pickle.dumps([_Sneaky(buf.getvalue())]))
    with pytest.raises(ValueError, match=r"train\.pickle: refused .*system"):
        G.read_lrgb_file(path, "pascalvoc-sp")
    # a .pt file is read with weights_only=True
    pt = tmp_path / "train.pt"
    torch.save([_Evil(marker)], pt)
    with pytest.raises(ValueError, match=r"train\.pt: refused .*system"):
        G.read_lrgb_file(pt, "peptides-func")
    assert not marker.exists()


def test_truncated_and_corrupt_files_name_the_file(tmp_path):
    pt, pk = tmp_path / "train.pt", tmp_path / "train.pickle"
    torch.save(_peptide_items(), pt)
    pt.write_bytes(pt.read_bytes()[: pt.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"train\.pt: cannot read"):
        G.read_lrgb_file(pt, "peptides-func")
    pk.write_bytes(pickle.dumps(_voc_items())[:300])
    with pytest.raises(ValueError, match=r"train\.pickle: cannot read"):
        G.read_lrgb_file(pk, "pascalvoc-sp")
    pk.write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match=r"train\.pickle"):
        G.read_lrgb_file(pk, "pascalvoc-sp")
    pk.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(ValueError, match="list of"):
        G.read_lrgb_file(pk, "pascalvoc-sp")


@pytest.mark.parametrize("change, message", [
    (lambda it: it[:3], "expected a tuple"),
    (lambda it: (it[0][:, :8],) + it[1:], r"x must have shape \(N >= 1, 9\)"),
    (lambda it: (it[0], it[1][:-1]) + it[2:], "edge_attr must have shape"),
    (lambda it: it[:2] + (it[2] + 100,) + it[3:], r"edge_index holds node ids"),
    (lambda it: (it[0].float(),) + it[1:], "integer codes"),
    (lambda it: it[:3] + (torch.full((1, 10), float("nan")),), "NaN"),
    (lambda it: it[:3] + (torch.zeros(1, 11),), r"y must have shape \(1, 10\)"),
])
def test_bad_peptide_items_name_file_and_item(tmp_path, change, message):
    items = _peptide_items()
    items[1] = change(items[1])
    torch.save(items, tmp_path / "train.pt")
    with pytest.raises(ValueError, match=rf"train\.pt: item 1: .*{message}"):
        G.read_lrgb_file(tmp_path / "train.pt", "peptides-func")


@pytest.mark.parametrize("change, message", [
    (lambda it: (it[0].clone().index_fill_(0, torch.tensor([0]), float("nan")),) + it[1:], "x must hold finite"),
    (lambda it: (it[0], it[1].clone().fill_(float("inf"))) + it[2:], "edge_attr must hold finite"),
    (lambda it: it[:3] + (it[3][:-1],), "one integer class per node"),
    (lambda it: it[:3] + (it[3] + 21,), r"expected \[0, 20\]"),
])
def test_bad_voc_items_name_file_and_item(tmp_path, change, message):
    items = _voc_items()
    items[2] = change(items[2])
    (tmp_path / "val.pickle").write_bytes(pickle.dumps(items))
    with pytest.raises(ValueError, match=rf"val\.pickle: item 2: .*{message}"):
        G.read_lrgb_file(tmp_path / "val.pickle", "pascalvoc-sp")


def test_missing_split_lists_paths_and_bad_names(tmp_path):
    with pytest.raises(ValueError, match=r"looked for .*test\.pt, .*raw.*test\.pt"):
        G.load_lrgb(tmp_path, "peptides-struct", "test")
    with pytest.raises(ValueError, match="name"):
        G.load_lrgb(tmp_path, "zinc", "test")
    with pytest.raises(ValueError, match="split"):
        G.load_lrgb(tmp_path, "peptides-func", "dev")

"""The generated Peptides stand-in: OGB-coded peptide graphs, labels and targets computed from the graph."""
import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from pointformers.data import peptides as P

# OGB's value counts per atom column (allowable_features incl. 'misc') and bond column
ATOM_RANGES = (119, 4, 12, 12, 10, 6, 6, 2, 2)
BOND_RANGES = (5, 6, 2)


def test_seeded_shapes_and_ogb_codes():
    f, s = P.generate_peptides(24, seed=3)
    f2, s2 = P.generate_peptides(24, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(f.nodes + f.edge_index, f2.nodes + f2.edge_index))
    assert np.array_equal(f.targets, f2.targets) and np.array_equal(s.targets, s2.targets)
    assert not np.array_equal(f.sizes(), P.generate_peptides(24, seed=4)[0].sizes())
    assert (f.name, s.name, f.level, f.feature_kind) == ("peptides-func", "peptides-struct", "graph", "categorical")
    assert f.targets.shape == (24, 10) and s.targets.shape == (24, 11)
    assert f.targets.dtype == s.targets.dtype == np.float32 and set(np.unique(f.targets)) <= {0.0, 1.0}
    assert all(a is b for a, b in zip(f.nodes, s.nodes))  # the same molecules
    for x, ei, e in zip(f.nodes, f.edge_index, f.edges):
        assert x.dtype == ei.dtype == e.dtype == np.int64 and x.shape[1] == 9 and e.shape == (ei.shape[1], 3)
        assert (x >= 0).all() and (x < np.array(ATOM_RANGES)).all() and (x[:, 5] == 0).all()
        assert (e >= 0).all() and (e < np.array(BOND_RANGES)).all() and (e[:, 1] == 0).all()
        assert set(np.unique(x[:, 0])) <= {5, 6, 7, 15}  # C N O S
        # both directions of every bond, with the same features, and degree = heavy neighbours
        fwd = {(u, v): tuple(r) for (u, v), r in zip(ei.T.tolist(), e.tolist())}
        assert len(fwd) == ei.shape[1] and all(fwd[(v, u)] == r for (u, v), r in fwd.items())
        assert np.array_equal(x[:, 2], np.bincount(ei[0], minlength=len(x)))
        g = csr_matrix((np.ones(ei.shape[1]), tuple(ei)), shape=(len(x),) * 2)
        assert connected_components(g, directed=False)[0] == 1


def test_default_size_matches_the_real_set():
    f, s = P.generate_peptides(150, seed=0)
    assert 135 < f.sizes().mean() < 165  # real: 150.9 nodes
    assert 280 < np.mean([e.shape[1] for e in f.edge_index]) < 340  # real: ~307 directed edges
    # targets standardised with the fixed constants: roughly zero mean, unit std
    assert np.abs(s.targets.mean(0)).max() < 0.35 and (0.6 < s.targets.std(0)).all() and (s.targets.std(0) < 1.5).all()
    rates = f.targets.mean(0)
    assert (rates > 0.05).all() and (rates < 0.75).all(), dict(zip(P.FUNC_LABELS, rates))


def test_hand_built_residues():
    m = P.build_peptide("PAKW")
    assert m.nodes[0].tolist() == [6, 0, 2, 5, 1, 0, 2, 0, 1]  # N-terminal proline N: 1 H, sp3, in ring
    k_nz = m.nodes[(m.nodes[:, 0] == 6) & (m.nodes[:, 3] == 6)]
    assert k_nz.tolist() == [[6, 0, 1, 6, 3, 0, 2, 0, 0]]  # lysine's NH3+
    assert m.nodes[:, 7].sum() == 9 and m.nodes[:, 8].sum() == 5 + 9  # proline's ring, indole's two
    assert m.nodes[m.c_term, 0] == 5 and m.nodes[-1].tolist() == [7, 0, 1, 5, 1, 0, 1, 0, 0]  # C-terminal OH


def _label(seq, name):
    return P.func_labels(P.build_peptide(seq))[P.FUNC_LABELS.index(name)]


def _same_bag(a, b):
    """Same multiset of node-feature rows (and of edge-feature rows)."""
    ma, mb = P.build_peptide(a), P.build_peptide(b)
    return (sorted(map(tuple, ma.nodes.tolist())) == sorted(map(tuple, mb.nodes.tolist()))
            and sorted(map(tuple, ma.edges.tolist())) == sorted(map(tuple, mb.edges.tolist())))


@pytest.mark.parametrize("a, b, name", [
    ("GAAKAAG", "GKAAAAG", "middle_charged"),       # the charged residue in the middle vs near an end
    ("GKAAAAG", "GAAAAKG", "charge_n_biased"),      # the charge nearer the N- or the C-terminus
    ("GCAAAAAG", "GAAAAACG", "n_term_sulfur"),      # the sulfur near the N-terminus or far from it
    ("GFAAAAAAFG", "GFFAAAAAAG", "aromatic_both_ends"),
    ("GAFAAAKAG", "GAKAAAFAG", "aromatic_first"),
    ("GKAAADAAAAAG", "GKDAAAAAAAAG", "salt_bridge"),
    ("GFPAG", "GPFAG", "aromatic_proline"),
])
def test_labels_depend_on_arrangement_not_on_the_bag_of_atoms(a, b, name):
    assert _same_bag(a, b)  # pooling the node features cannot tell the two apart
    assert _label(a, name) != _label(b, name), name


def test_count_and_end_labels():
    assert _label("AGGGV", "ends_match") == 1 and _label("AGGGK", "ends_match") == 0
    assert _label("KKD", "cationic") == 1 and _label("KDD", "cationic") == 0
    assert _label("AVLGG", "aliphatic_rich") == 1 and _label("AGGGG", "aliphatic_rich") == 0


def _target(seq, name):
    return P.struct_targets(P.build_peptide(seq), standardise=False)[P.STRUCT_TARGETS.index(name)]


@pytest.mark.parametrize("a, b, name", [
    ("GWAAAAAAG", "GAAAAAAWG", "ring_from_n"),        # the ring near the N- or the C-terminus
    ("GAAAAAAWG", "GWAAAAAAG", "ring_from_c"),
    ("GKAAAAAAG", "GAAAAAAKG", "charge_from_n"),
    ("GAAAAAAKG", "GKAAAAAAG", "charge_from_c"),
    ("GCAAAAAAG", "GAAAAAACG", "sulfur_from_n"),
    ("GAAAAAAFG", "GFAAAAAAG", "aromatic_from_c"),
])
def test_structural_targets_depend_on_arrangement(a, b, name):
    assert _same_bag(a, b)
    assert _target(a, name) < _target(b, name), name  # the atom sits nearer the terminus the target reads


@pytest.mark.parametrize("a, b, name", [
    ("SGAAAAAAG", "GAAAAAAGS", "hetero_near_n"),      # serine's O near the N- or the C-terminus
    ("GAAAAAAGS", "SGAAAAAAG", "hetero_near_c"),
    ("GAAAAAAGV", "VGAAAAAAG", "branch_near_c"),      # valine's branched CB
    ("FGAAAAAAG", "GAAAAAAGF", "ring_near_n"),
])
def test_structural_counts_depend_on_arrangement(a, b, name):
    assert _same_bag(a, b)
    assert _target(a, name) > _target(b, name), name


def test_structural_target_values():
    # N-term N, CA, CB, SG: the sulfur of an N-terminal cysteine is 3 bonds away; the C-term carbon is
    # the last residue's backbone C: CA-CB-SG of a C-terminal cysteine 1 + 2 bonds away
    assert _target("CAAAAA", "sulfur_from_n") == 3 and _target("AAAAAC", "aromatic_from_c") == P.STRUCT_CAP
    assert _target("AAAAAA", "ring_from_n") == P.STRUCT_CAP  # no ring: the cap
    assert _target("W" + "G" * 30, "ring_from_c") == P.STRUCT_CAP  # a ring farther than the cap
    # N-term N (1), its residue's O (d 3); the next residue's N (d 3) and O (d 6); ...: glycines only
    n = P.build_peptide("G" * 10)
    d = n.distances()[n.n_term]
    hetero = np.isin(n.nodes[:, 0], (6, 7))
    assert _target("G" * 10, "hetero_near_n") == (hetero & (d <= 10)).sum() > 3
    assert _target("FAAA", "aromatic_fraction") == _target("AAAF", "aromatic_fraction") > 0
    for seq in ("GWAAKAAAC", "KDEFHWY", "CMPSWKKD"):
        t = P.struct_targets(P.build_peptide(seq), standardise=False)
        assert np.isfinite(t).all() and (t[:6] <= P.STRUCT_CAP).all() and (t >= 0).all()


def test_cache_round_trip(tmp_path, monkeypatch):
    f = P.load_generated_peptides("func", "val", preset="tiny", cache_dir=tmp_path)
    assert len(f) == 16 and len(list(tmp_path.glob("peptides-val-*.npz"))) == 1
    assert f.sizes().max() <= 8 * 14 + 1  # few residues

    def fail(*a, **k):
        raise AssertionError("regenerated instead of loading the cache")

    monkeypatch.setattr(P, "generate_peptides", fail)
    f2 = P.load_generated_peptides("func", "val", preset="tiny", cache_dir=tmp_path)
    s = P.load_generated_peptides("struct", "val", preset="tiny", cache_dir=tmp_path)
    monkeypatch.undo()
    direct_f, direct_s = P.generate_peptides(16, P.PeptideParams(min_residues=3, max_residues=8), seed=1)
    for g in (f2, direct_f):
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(f.nodes + f.edges + f.edge_index,
                                                                                 g.nodes + g.edges + g.edge_index))
        assert np.array_equal(f.targets, g.targets)
    assert np.array_equal(s.targets, direct_s.targets) and s.name == "peptides-struct"
    test = P.load_generated_peptides("func", "test", preset="tiny", cache_dir=tmp_path)
    assert not np.array_equal(test.sizes(), f.sizes())  # each split its own seed


@pytest.mark.parametrize("call, name", [
    (lambda: P.PeptideParams(min_residues=1), "min_residues"),
    (lambda: P.PeptideParams(min_residues=8, max_residues=5), "max_residues"),
    (lambda: P.PeptideParams(max_residues=2.5), "max_residues"),
    (lambda: P.PeptideParams(residues="AXZ"), "residues"),
    (lambda: P.PeptideParams(residues="AA"), "residues"),
    (lambda: P.generate_peptides(-1), "count"),
    (lambda: P.build_peptide("AB"), "sequence"),
    (lambda: P.load_generated_peptides("both", "train"), "kind"),
    (lambda: P.load_generated_peptides("func", "dev"), "split"),
    (lambda: P.load_generated_peptides("func", "train", preset="huge"), "preset"),
])
def test_bad_parameters_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name}"):
        call()

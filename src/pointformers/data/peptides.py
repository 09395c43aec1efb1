"""A generated stand-in for LRGB's Peptides-func and Peptides-struct: peptide-like molecular graphs
whose labels are computed from the graph itself.

**The real set** (Dwivedi et al., 2022): 15,535 peptides from SATPdb as molecular graphs of heavy atoms
(OGB's ``smiles2graph``: 9 categorical atom features, 3 categorical bond features, both directions of
every bond listed), on average ~150.9 nodes and ~307 directed edges per graph, average diameter ~57;
split 10,873 / 2,331 / 2,331. Peptides-func: 10 functional classes (antifungal, antiviral, toxic, ...),
multi-label and imbalanced, scored by average precision. Peptides-struct: 11 regression targets from
3-D conformers (inertia, length, sphericity, plane fit, ...), normalised, scored by mean absolute error.

**The stand-in** keeps the structure: chains of residues, each a backbone N - Calpha - C(=O) joined to
the next by a peptide bond, with side chains from :data:`RESIDUES` (15 templates: small, branched,
5- and 6-membered rings, aromatic rings incl. a fused one, sulfur-bearing, charged), every atom and bond
coded as OGB codes them (:data:`ATOM_COLUMNS`, :data:`BOND_COLUMNS`), termini as free amine and acid.
With the default :class:`PeptideParams` (6-30 residues, uniform) graphs have ~152 nodes, ~318 directed
edges and diameter ~58, like the real set. Its 10 labels (:data:`FUNC_LABELS`) are rules over the
residue sequence and shortest-path distances in the graph; 8 of them depend on where things are in the
chain (termini, middle, separations of up to the whole chain), which a pooled bag of node features
cannot tell (a linear model on counts of atom-code rows reaches test AUC 0.99 on the two count labels
but 0.50 on ``charge_n_biased``, 0.57 on ``ends_match``, 0.67 on ``middle_charged`` and 0.70-0.88 on
the others, which correlate with composition). Label rates lie between ~17 % and ~58 % (2,000 graphs
of the default parameters, seed 0: :data:`FUNC_RATES`). Its 11 targets (:data:`STRUCT_TARGETS`) are
shortest-path statistics read from the termini, standardised with fixed constants (:data:`STRUCT_MEAN`,
:data:`STRUCT_STD`, measured once on the default parameters): how far from the N- or the C-terminus
the nearest ring, charged, sulfur or aromatic atom lies (capped at :data:`STRUCT_CAP` bonds), how many
hetero, branching or ring atoms lie within 10-12 bonds of a terminus, and the aromatic share. None
grows with the chain beyond the cap, and ten depend on the residues' order: gradient-boosted trees on
atom-code fractions and size reach MAE 0.63 over the 11 standardised targets against 0.78 for the
mean (0.04 on the aromatic share, the control; 0.61-0.79 on the others). The real targets are 3-D
shape descriptors, most of them extensive (inertia, lengths), which here would be graph-size proxies:
with them (version 1 of this generator) the same bag reached MAE 0.21, so the set did not ask for
mixing along the graph. Version 2's targets (where kinds of atoms sit along the whole chain, as mean
signed positions between the termini) did ask for it but were not learnt by any model here within
the CPU budget (full attention and the attention-free baseline alike learnt only the aromatic share).

What it cannot reproduce: biology (the real functions come from assays, not from rules) and 3-D
geometry (no conformers: the "structure" here is graph distance, not space, and no target grows
with the molecule), the real residue statistics (residues are drawn uniformly, no non-standard
residues, cyclisations or disulfide bridges), the real node-count distribution (here uniform
residue counts, the real one is skewed) and ring count (~7 rings per graph here, as 5 of the 15
residues carry rings, against ~3.6 in the real set). Atoms are numbered along the chain
(N-terminus first), as SMILES of peptides usually are.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
try:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components, shortest_path
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.data.peptides needs scipy: pip install 'pointformers[tasks]'",
                              name=exc.name) from exc

from .graphs import CATEGORICAL, GraphSet

__all__ = ["PeptideParams", "Peptide", "RESIDUES", "RESIDUE_CLASSES", "ATOM_COLUMNS", "BOND_COLUMNS",
           "FUNC_LABELS", "FUNC_RATES", "STRUCT_TARGETS", "STRUCT_CAP", "STRUCT_MEAN", "STRUCT_STD", "PRESETS",
           "GENERATOR_VERSION", "build_peptide", "func_labels", "struct_targets", "generate_peptides",
           "load_generated_peptides"]

GENERATOR_VERSION = 3  # 2: intensive, order-dependent Peptides-struct targets; 3: read from the termini

#: OGB's atom feature columns (``ogb.utils.features``): atomic number - 1; chirality (0 unspecified,
#: 1 CW, 2 CCW); heavy-atom degree; formal charge + 5; number of Hs; radical electrons; hybridisation
#: (0 SP, 1 SP2, 2 SP3); is aromatic; is in ring.
ATOM_COLUMNS = ("atomic_num", "chirality", "degree", "formal_charge", "num_hs", "num_radicals",
                "hybridization", "is_aromatic", "is_in_ring")
#: OGB's bond feature columns: bond type (0 single, 1 double, 2 triple, 3 aromatic); stereo (0 none);
#: is conjugated.
BOND_COLUMNS = ("bond_type", "stereo", "is_conjugated")

_SP2, _SP3 = 1, 2
_SINGLE, _DOUBLE, _AROMATIC = 0, 1, 3
_CA, _N = -1, -2  # bond ends naming the residue's backbone C-alpha and N (proline's ring closes on N)


def _atom(z: int, hs: int, hyb: int = _SP3, aromatic: int = 0, charge: int = 0) -> tuple:
    return z, hs, hyb, aromatic, charge


def _ring(first: int, size: int) -> list[tuple]:
    """Aromatic (conjugated) bonds closing the ring first, first + 1, ..., first + size - 1."""
    return [(first + k, first + (k + 1) % size, _AROMATIC, 1) for k in range(size)]


_C, _Nn, _O, _S = 6, 7, 8, 16
_AR = dict(hyb=_SP2, aromatic=1)
#: Side-chain templates: one-letter code -> (atoms (element, Hs, hybridisation, aromatic, charge),
#: bonds (a, b, type, conjugated) between side-chain atoms or to the backbone's C-alpha / N).
RESIDUES: dict[str, tuple[list[tuple], list[tuple]]] = {
    "G": ([], []),
    "A": ([_atom(_C, 3)], [(_CA, 0, _SINGLE, 0)]),
    "S": ([_atom(_C, 2), _atom(_O, 1)], [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0)]),
    "C": ([_atom(_C, 2), _atom(_S, 1)], [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0)]),
    "M": ([_atom(_C, 2), _atom(_C, 2), _atom(_S, 0), _atom(_C, 3)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0), (1, 2, _SINGLE, 0), (2, 3, _SINGLE, 0)]),
    "V": ([_atom(_C, 1), _atom(_C, 3), _atom(_C, 3)], [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0), (0, 2, _SINGLE, 0)]),
    "L": ([_atom(_C, 2), _atom(_C, 1), _atom(_C, 3), _atom(_C, 3)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0), (1, 2, _SINGLE, 0), (1, 3, _SINGLE, 0)]),
    "P": ([_atom(_C, 2), _atom(_C, 2), _atom(_C, 2)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0), (1, 2, _SINGLE, 0), (2, _N, _SINGLE, 0)]),
    "F": ([_atom(_C, 2), _atom(_C, 0, **_AR)] + [_atom(_C, 1, **_AR)] * 5,
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0)] + _ring(1, 6)),
    "Y": ([_atom(_C, 2), _atom(_C, 0, **_AR)] + [_atom(_C, 1, **_AR)] * 2 + [_atom(_C, 0, **_AR)]
          + [_atom(_C, 1, **_AR)] * 2 + [_atom(_O, 1, _SP2)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0)] + _ring(1, 6) + [(4, 7, _SINGLE, 1)]),
    "H": ([_atom(_C, 2), _atom(_C, 0, **_AR), _atom(_Nn, 1, **_AR), _atom(_C, 1, **_AR), _atom(_Nn, 0, **_AR),
           _atom(_C, 1, **_AR)], [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0)] + _ring(1, 5)),
    # indole: CG(1) CD1(2) NE1(3) CE2(4) CZ2(5) CH2(6) CZ3(7) CE3(8) CD2(9); rings 1-2-3-4-9, 4-5-6-7-8-9
    "W": ([_atom(_C, 2), _atom(_C, 0, **_AR), _atom(_C, 1, **_AR), _atom(_Nn, 1, **_AR), _atom(_C, 0, **_AR)]
          + [_atom(_C, 1, **_AR)] * 4 + [_atom(_C, 0, **_AR)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0)]
          + [(a, b, _AROMATIC, 1) for a, b in ((1, 2), (2, 3), (3, 4), (4, 9), (9, 1), (4, 5), (5, 6), (6, 7),
                                               (7, 8), (8, 9))]),
    "K": ([_atom(_C, 2)] * 4 + [_atom(_Nn, 3, charge=1)],
          [(_CA, 0, _SINGLE, 0)] + [(k, k + 1, _SINGLE, 0) for k in range(4)]),
    "D": ([_atom(_C, 2), _atom(_C, 0, _SP2), _atom(_O, 0, _SP2), _atom(_O, 0, _SP2, charge=-1)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0), (1, 2, _DOUBLE, 1), (1, 3, _SINGLE, 1)]),
    "E": ([_atom(_C, 2), _atom(_C, 2), _atom(_C, 0, _SP2), _atom(_O, 0, _SP2), _atom(_O, 0, _SP2, charge=-1)],
          [(_CA, 0, _SINGLE, 0), (0, 1, _SINGLE, 0), (1, 2, _SINGLE, 0), (2, 3, _DOUBLE, 1), (2, 4, _SINGLE, 1)]),
}

#: Residue classes the labels use (a partition of :data:`RESIDUES`).
RESIDUE_CLASSES = {"aliphatic": "AVLMP", "aromatic": "FYHW", "charged": "KDE", "small_polar": "GSC"}
_CLASS_OF = {r: k for k, (_, rs) in enumerate(RESIDUE_CLASSES.items()) for r in rs}


def _template_arrays(code: str) -> tuple[np.ndarray, np.ndarray]:
    """One inner residue: atoms (k, 9) OGB codes without degree (filled in later) and bonds (b, 5)
    (a, b, type, stereo, conjugated) in local ids; backbone atoms N 0, CA 1, C 2, O 3, side chain 4..."""
    side, side_bonds = RESIDUES[code]
    gly, pro = code == "G", code == "P"
    atoms = [(_Nn, 0 if pro else 1, _SP2, 0, 0), (_C, 2 if gly else 1, _SP3, 0, 0), (_C, 0, _SP2, 0, 0),
             (_O, 0, _SP2, 0, 0)] + list(side)
    bonds = [(0, 1, _SINGLE, 0), (1, 2, _SINGLE, 0), (2, 3, _DOUBLE, 1)]
    local = {_CA: 1, _N: 0}
    bonds += [(local.get(a, a + 4), local.get(b, b + 4), t, c) for a, b, t, c in side_bonds]
    x = np.zeros((len(atoms), 9), np.int64)
    for i, (z, hs, hyb, ar, q) in enumerate(atoms):
        x[i] = (z - 1, 0, 0, q + 5, hs, 0, hyb, ar, 0)
    x[1, 1] = 0 if gly else 2  # C-alpha: one fixed tetrahedral tag (L-residues)
    b = np.array(bonds, np.int64)
    # is_in_ring: an atom on a bond whose removal keeps its ends connected (rings stay inside a residue)
    for k, (u, v, _, _) in enumerate(b):
        rest = np.delete(b, k, axis=0)
        g = csr_matrix((np.ones(len(rest)), (rest[:, 0], rest[:, 1])), shape=(len(atoms),) * 2)
        labels = connected_components(g, directed=False)[1]
        if labels[u] == labels[v]:
            x[[u, v], 8] = 1
    return x, np.column_stack([b[:, :3], np.zeros(len(b), np.int64), b[:, 3]])


_TEMPLATES = {code: _template_arrays(code) for code in RESIDUES}


@dataclass(frozen=True)
class PeptideParams:
    """Options of :func:`generate_peptides`.

    Attributes:
        min_residues, max_residues: residues per chain, drawn uniformly from this range (inclusive);
            the default 6-30 gives ~150 atoms per graph like the real set.
        residues: the one-letter codes drawn from (uniformly), a subset of :data:`RESIDUES`.
    """

    min_residues: int = 6
    max_residues: int = 30
    residues: str = "GASCMVLPFYHWKDE"

    def __post_init__(self) -> None:
        for name in ("min_residues", "max_residues"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 2 <= v <= 500:
                raise ValueError(f"{name}: expected an integer number of residues in [2, 500], got {v!r}")
        if self.max_residues < self.min_residues:
            raise ValueError(f"max_residues: expected >= min_residues = {self.min_residues}, got {self.max_residues!r}")
        r = self.residues
        if not isinstance(r, str) or not r or len(set(r)) != len(r) or not set(r) <= set(RESIDUES):
            raise ValueError(f"residues: expected distinct one-letter codes from {''.join(RESIDUES)!r}, got {r!r}")

    def replace(self, **changes: Any) -> "PeptideParams":
        return replace(self, **changes)


@dataclass
class Peptide:
    """One molecule: ``sequence`` (n residues, N- to C-terminus), ``nodes`` (N, 9) int64 OGB atom codes,
    ``edge_index`` (2, E) int64 with both directions of each bond, ``edges`` (E, 3) int64 OGB bond codes,
    ``residue`` (N,) int64 residue index of each atom, ``n_term`` the N-terminal nitrogen's id,
    ``c_term`` the C-terminal carboxyl carbon's id."""

    sequence: str
    nodes: np.ndarray
    edge_index: np.ndarray
    edges: np.ndarray
    residue: np.ndarray
    n_term: int
    c_term: int

    def distances(self) -> np.ndarray:
        """(N, N) float64 shortest-path lengths in bonds (the graph is connected)."""
        n = len(self.nodes)
        g = csr_matrix((np.ones(self.edge_index.shape[1]), tuple(self.edge_index)), shape=(n, n))
        return shortest_path(g, method="D", unweighted=True)


def build_peptide(sequence: str) -> Peptide:
    """The molecular graph of ``sequence`` (one-letter codes of :data:`RESIDUES`, N- to C-terminus, at
    least 1 residue): free amine at the N-terminus, free acid (an extra O with one H) at the C-terminus."""
    if not isinstance(sequence, str) or not sequence or not set(sequence) <= set(RESIDUES):
        raise ValueError(f"sequence: expected one-letter codes from {''.join(RESIDUES)!r}, got {sequence!r}")
    xs, bs, res, start = [], [], [], 0
    for i, code in enumerate(sequence):
        x, b = _TEMPLATES[code]
        b = b.copy()
        b[:, :2] += start
        xs.append(x)
        bs.append(b)
        if i:  # peptide bond: previous residue's C to this N (an amide: conjugated)
            bs.append(np.array([[prev_c, start, _SINGLE, 0, 1]]))
        res.append(np.full(len(x), i))
        prev_c, start = start + 2, start + len(x)
    xs.append(np.array([[_O - 1, 0, 0, 5, 1, 0, _SP2, 0, 0]]))  # the C-terminal OH
    bs.append(np.array([[prev_c, start, _SINGLE, 0, 1]]))
    res.append([len(sequence) - 1])
    x, b = np.concatenate(xs), np.concatenate(bs)
    x[0, 4] += 1  # N-terminal amine: one H more and sp3 (no amide)
    x[0, 6] = _SP3
    x[:, 2] = np.bincount(b[:, :2].ravel(), minlength=len(x))  # heavy-atom degree
    edge_index = np.stack([b[:, :2].ravel(), b[:, 1::-1].ravel()])  # u->v then v->u, OGB's order
    edges = np.repeat(b[:, 2:], 2, axis=0)
    return Peptide(sequence, x, edge_index, edges, np.concatenate(res).astype(np.int64), 0, prev_c)


#: The 10 functional labels (rules; ``d`` = shortest-path length in bonds, "N-term" the N-terminal
#: nitrogen, "C-term" the C-terminal carboxyl carbon). Only the first two are counts.
FUNC_LABELS = (
    "cationic",            # net formal charge >= +1 (count)
    "aliphatic_rich",      # >= 40 % of residues aliphatic (A V L M P) (count)
    "ends_match",          # first and last residue of the same class (RESIDUE_CLASSES): spans the chain
    "n_term_sulfur",       # a sulfur atom within d <= 7 of the N-term
    "aromatic_both_ends",  # an aromatic atom within d <= 12 of the N-term and one within d <= 12 of the C-term
    "aromatic_first",      # the aromatic atom nearest the N-term is nearer than every charged atom
    "aromatic_proline",    # an aromatic residue directly followed (towards the C-term) by proline
    "middle_charged",      # a charged atom a with |d(N-term, a) - d(C-term, a)| <= 3 (the middle residue)
    "salt_bridge",         # a positive and a negative atom at d <= 16
    "charge_n_biased",     # more charged atoms nearer the N-term than nearer the C-term
)
#: Label rates measured on 2,000 graphs of the default :class:`PeptideParams` (seed 0).
FUNC_RATES = {"cationic": 0.171, "aliphatic_rich": 0.287, "ends_match": 0.258, "n_term_sulfur": 0.246,
              "aromatic_both_ends": 0.502, "aromatic_first": 0.576, "aromatic_proline": 0.288, "middle_charged": 0.282,
              "salt_bridge": 0.356, "charge_n_biased": 0.364}

#: The 11 structural targets (before standardisation), in bonds (``d`` = shortest-path length; "N-term"
#: the N-terminal nitrogen, "C-term" the C-terminal carboxyl carbon). Each of the first ten is read
#: from one terminus or the other: where the nearest atom of a kind lies (capped at :data:`STRUCT_CAP`
#: bonds, the cap also where the graph has no such atom) or how many atoms of a kind lie near it. A
#: pooled bag of node features sees neither the termini nor the distances; Laplacian identifiers tell a
#: node how near *an* end it is but not which one (their signs are randomised in training), so reading
#: them asks a node to compare itself with the terminus: mixing along the graph. No target grows with
#: the chain's length beyond the cap; the last is a composition control that a bag can read.
STRUCT_TARGETS = (
    "ring_from_n",         # d(N-term, nearest ring atom)
    "ring_from_c",         # d(C-term, nearest ring atom)
    "charge_from_n",       # d(N-term, nearest charged atom)
    "charge_from_c",       # d(C-term, nearest charged atom)
    "sulfur_from_n",       # d(N-term, nearest sulfur atom)
    "aromatic_from_c",     # d(C-term, nearest aromatic atom)
    "hetero_near_n",       # N, O, S atoms at d <= 10 from the N-term (the N-term itself included)
    "hetero_near_c",       # N, O, S atoms at d <= 10 from the C-term
    "branch_near_c",       # atoms of >= 3 heavy neighbours at d <= 10 from the C-term
    "ring_near_n",         # ring atoms at d <= 12 from the N-term
    "aromatic_fraction",   # share of aromatic atoms (composition: the control)
)
#: The distance targets' cap in bonds (the real set's mean diameter is ~57).
STRUCT_CAP = 40
#: Fixed standardisation: ``target = (raw - STRUCT_MEAN) / STRUCT_STD``, measured on 4,000 graphs of
#: the default parameters (seed 0; not the split's own statistics, so all splits share one scale).
STRUCT_MEAN = np.array([8.564, 8.4, 16.28, 16.41, 20.05, 11.09, 9.018, 9.976, 10.02, 6.786, 0.2044])
STRUCT_STD = np.array([7.547, 7.319, 10.99, 11.11, 13.34, 9.111, 1.241, 1.22, 1.489, 5.411, 0.07803])


def func_labels(p: Peptide, d: np.ndarray | None = None) -> np.ndarray:
    """(10,) float32 0/1 labels of :data:`FUNC_LABELS`; ``d`` = ``p.distances()`` if already known."""
    d = p.distances() if d is None else d
    x, seq = p.nodes, p.sequence
    charge = x[:, 3] - 5
    pos, neg, charged = charge > 0, charge < 0, charge != 0
    sulfur, aromatic = np.flatnonzero(x[:, 0] == _S - 1), x[:, 7] == 1
    dn, dc = d[p.n_term], d[p.c_term]
    out = [
        charge.sum() >= 1,
        sum(c in RESIDUE_CLASSES["aliphatic"] for c in seq) >= 0.4 * len(seq),
        _CLASS_OF[seq[0]] == _CLASS_OF[seq[-1]],
        sulfur.size > 0 and dn[sulfur].min() <= 7,
        aromatic.any() and dn[aromatic].min() <= 12 and dc[aromatic].min() <= 12,
        aromatic.any() and dn[aromatic].min() < dn[charged].min(initial=np.inf),
        any(a in RESIDUE_CLASSES["aromatic"] and b == "P" for a, b in zip(seq, seq[1:])),
        bool((np.abs(dn - dc)[charged] <= 3).any()),
        pos.any() and neg.any() and d[np.ix_(pos, neg)].min() <= 16,
        (dn[charged] < dc[charged]).sum() > (dc[charged] < dn[charged]).sum(),
    ]
    return np.array(out, dtype=np.float32)


def struct_targets(p: Peptide, d: np.ndarray | None = None, standardise: bool = True) -> np.ndarray:
    """(11,) float32 targets of :data:`STRUCT_TARGETS`, standardised with the fixed constants unless
    ``standardise`` is False; ``d`` = ``p.distances()`` if already known."""
    d = p.distances() if d is None else d
    x = p.nodes
    dn, dc = d[p.n_term], d[p.c_term]
    charged = x[:, 3] != 5
    ring, aromatic, sulfur = x[:, 8] == 1, x[:, 7] == 1, x[:, 0] == _S - 1
    hetero = np.isin(x[:, 0], (_Nn - 1, _O - 1, _S - 1))

    def nearest(dist: np.ndarray, sel: np.ndarray) -> float:
        return float(min(dist[sel].min(), STRUCT_CAP)) if sel.any() else float(STRUCT_CAP)

    raw = np.array([
        nearest(dn, ring), nearest(dc, ring), nearest(dn, charged), nearest(dc, charged),
        nearest(dn, sulfur), nearest(dc, aromatic),
        (hetero & (dn <= 10)).sum(), (hetero & (dc <= 10)).sum(), ((x[:, 2] >= 3) & (dc <= 10)).sum(),
        (ring & (dn <= 12)).sum(),
        aromatic.mean(),
    ], dtype=np.float64)
    return ((raw - STRUCT_MEAN) / STRUCT_STD if standardise else raw).astype(np.float32)


def _sequences(count: int, params: PeptideParams, seed: int) -> list[str]:
    rng = np.random.default_rng([int(seed), 15535])
    alphabet = np.array(list(params.residues))
    lengths = rng.integers(params.min_residues, params.max_residues + 1, size=count)
    return ["".join(rng.choice(alphabet, size=int(n))) for n in lengths]


def generate_peptides(count: int, params: PeptideParams = PeptideParams(), seed: int = 0) -> tuple[GraphSet, GraphSet]:
    """``count`` peptide graphs as two sets over the same molecules: Peptides-func (targets (S, 10)
    float32 0/1, :data:`FUNC_LABELS`) and Peptides-struct (targets (S, 11) float32 standardised,
    :data:`STRUCT_TARGETS`). Seeded: the same ``seed`` and ``params`` give the same graphs."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count: expected a number of graphs >= 0, got {count!r}")
    if not isinstance(params, PeptideParams):
        raise ValueError(f"params: expected PeptideParams, got {type(params).__name__}")
    mols = [build_peptide(s) for s in _sequences(int(count), params, seed)]
    func, struct = np.zeros((len(mols), 10), np.float32), np.zeros((len(mols), 11), np.float32)
    for i, m in enumerate(mols):
        d = m.distances()
        func[i], struct[i] = func_labels(m, d), struct_targets(m, d)
    return _sets([m.nodes for m in mols], [m.edge_index for m in mols], [m.edges for m in mols], func, struct,
                 {"params": asdict(params), "seed": int(seed), "generator_version": GENERATOR_VERSION})


def _sets(nodes, index, edges, func, struct, meta) -> tuple[GraphSet, GraphSet]:
    f = GraphSet(nodes, index, edges, func, "graph", "peptides-func", CATEGORICAL,
                 {**meta, "metric": "ap", "label_names": FUNC_LABELS})
    s = GraphSet(nodes, index, edges, struct, "graph", "peptides-struct", CATEGORICAL,
                 {**meta, "metric": "mae", "target_names": STRUCT_TARGETS})
    return f, s


#: Split sizes (train, val, test) and :class:`PeptideParams` fields of the generated stand-in: ``tiny``
#: for tests (3-8 residues, ~48 nodes), ``small`` for CPU training (~4 s for the three splits on one
#: core), ``lrgb`` the real split sizes (~20 s).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"sizes": (64, 16, 16), "params": dict(min_residues=3, max_residues=8)},
    "small": {"sizes": (2000, 250, 250), "params": {}},
    "lrgb": {"sizes": (10873, 2331, 2331), "params": {}},
}
_SPLITS = ("train", "val", "test")


def _pack(nodes, index, edges, func, struct) -> dict[str, np.ndarray]:
    """Ragged per-graph arrays flattened with offsets (no object arrays in the cache)."""
    node_off = np.r_[0, np.cumsum([len(x) for x in nodes])].astype(np.int64)
    edge_off = np.r_[0, np.cumsum([e.shape[1] for e in index])].astype(np.int64)
    return {"nodes": np.concatenate(nodes).astype(np.uint8), "node_offsets": node_off,
            "edge_index": np.concatenate(index, axis=1).astype(np.int32), "edges": np.concatenate(edges).astype(np.uint8),
            "edge_offsets": edge_off, "func": func, "struct": struct}


def _check_packed(a) -> None:
    no, eo, s = a["node_offsets"], a["edge_offsets"], len(a["func"])
    if (len(no) != s + 1 or len(eo) != s + 1 or no[-1] != len(a["nodes"]) or eo[-1] != a["edge_index"].shape[1]
            or len(a["edges"]) != eo[-1] or len(a["struct"]) != s or np.any(np.diff(no) < 1) or np.any(np.diff(eo) < 0)):
        raise ValueError("cached peptides: offsets and arrays disagree")


def load_generated_peptides(kind: str, split: str, preset: str = "small", seed: int = 0,
                            cache_dir: str | os.PathLike | None = None,
                            params: PeptideParams | None = None) -> GraphSet:
    """Split ``split`` of the generated stand-in, Peptides-func (``kind="func"``) or -struct
    (``"struct"``): :data:`PRESETS` ``[preset]`` sizes and parameters (``params`` replaces the latter),
    each split from its own seed (``3 * seed + split index``), cached under ``cache_dir`` (default: the
    package's data cache) keyed by the parameters, size, seed and :data:`GENERATOR_VERSION`."""
    from .cache import cached_arrays, default_cache_dir

    if kind not in ("func", "struct"):
        raise ValueError(f"kind: expected 'func' or 'struct', got {kind!r}")
    if split not in _SPLITS:
        raise ValueError(f"split: expected one of {list(_SPLITS)}, got {split!r}")
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown peptides preset {preset!r}; valid presets: {sorted(PRESETS)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if params is not None and not isinstance(params, PeptideParams):
        raise ValueError(f"params: expected PeptideParams or None, got {type(params).__name__}")
    k = _SPLITS.index(split)
    p = params if params is not None else PeptideParams(**PRESETS[preset]["params"])
    count, split_seed = int(PRESETS[preset]["sizes"][k]), 3 * int(seed) + k
    key = {"generator": "pointformers.peptides", "version": GENERATOR_VERSION, "params": asdict(p),
           "count": count, "seed": split_seed}

    def build() -> dict[str, np.ndarray]:
        f, s = generate_peptides(count, p, split_seed)
        return _pack(f.nodes, f.edge_index, f.edges, f.targets, s.targets)

    a = cached_arrays(cache_dir if cache_dir is not None else default_cache_dir(), f"peptides-{split}", key, build,
                      _check_packed)
    no, eo = a["node_offsets"], a["edge_offsets"]
    nodes = [a["nodes"][no[i]:no[i + 1]].astype(np.int64) for i in range(len(no) - 1)]
    index = [a["edge_index"][:, eo[i]:eo[i + 1]].astype(np.int64) for i in range(len(eo) - 1)]
    edges = [a["edges"][eo[i]:eo[i + 1]].astype(np.int64) for i in range(len(eo) - 1)]
    meta = {"params": asdict(p), "seed": split_seed, "generator_version": GENERATOR_VERSION, "preset": preset}
    f, s = _sets(nodes, index, edges, a["func"].astype(np.float32), a["struct"].astype(np.float32), meta)
    return f if kind == "func" else s

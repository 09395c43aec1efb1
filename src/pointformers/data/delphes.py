"""Reader (and writer) for the Delphes ROOT trees of HEPT's Pileup-10k data (optional extra).

HEPT reads the ``Delphes`` TTree of ``testTTbar_part1.root`` / ``testTTbar_part2.root`` and,
per event, the particle-flow collection ``PF`` with the per-particle leaves
``PF.PT, PF.Eta, PF.Phi, PF.Charge, PF.IsPU, PF.PID, PF.Rapidity, PF.E, PF.Px, PF.Py``
(as the HEPT authors' code reads them). Delphes writes ``PF`` as a split ``TClonesArray``, so
the leaves are sub-branches with paths ``PF/PF.PT``, ...; uproot cannot write ``TClonesArray``
objects, so :func:`write_delphes` writes the nearest structure it can: one jagged branch per leaf,
named ``PF.PT``, ... (no parent), with the counter ``PF_size``. The reader accepts both layouts (and
``PF_PT``-style names, uproot's default for jagged records).

Reading needs ``uproot`` (and ``awkward``, which uproot depends on): ``pip install
pointformers[io]``. They are imported only when a file is read or written.

Split convention (:func:`load_delphes_splits`): a folder holding HEPT's two files is split as
the authors do (part 1 → train; part 2 shuffled with the seed and halved → validation, test);
any other file or folder of ``*.root`` files is read in sorted file order and cut by event
into train/val/test fractions (80/10/10 by default).
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .pileup import PileupEvent, pid_category, split_ranges

#: The leaves of the PF collection HEPT reads, in its order.
DELPHES_FIELDS: tuple[str, ...] = ("PT", "Eta", "Phi", "Charge", "IsPU", "PID", "Rapidity", "E", "Px", "Py")

#: HEPT's raw file names (part 1 = training events, part 2 = validation + test events).
HEPT_FILES: tuple[str, str] = ("testTTbar_part1.root", "testTTbar_part2.root")

_INSTALL_HINT = "reading Delphes ROOT files needs the optional extra 'io': pip install pointformers[io]"


def _require_uproot():
    """``(uproot, awkward)``, or ImportError with the install command."""
    try:
        import awkward as ak
        import uproot
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"{_INSTALL_HINT} (missing: {exc.name})") from exc
    return uproot, ak


def _branch_names(tree: Any, path: str, tree_name: str, collection: str) -> dict[str, str]:
    """Field -> branch path in ``tree`` for every leaf of :data:`DELPHES_FIELDS`."""
    keys = set(tree.keys(recursive=True, full_paths=True)) | set(tree.keys(recursive=True, full_paths=False))
    out = {}
    for f in DELPHES_FIELDS:
        cands = (f"{collection}/{collection}.{f}", f"{collection}.{f}", f"{collection}/{f}", f"{collection}_{f}")
        hit = next((c for c in cands if c in keys), None)
        if hit is None:
            shown = sorted(keys)[:12]
            raise ValueError(f"{path}: branch '{collection}.{f}' missing from tree '{tree_name}' "
                             f"(looked for {', '.join(cands)}; the tree has {shown}"
                             f"{' ...' if len(keys) > 12 else ''})")
        out[f] = hit
    return out


def _reason(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (uproot's messages span several)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _is_damage(exc: BaseException) -> bool:
    """True for the errors of a truncated or corrupted file: a short read, a failed
    decompression (zlib/lz4/zstd checksums) or a structure uproot cannot deserialise."""
    return isinstance(exc, (OSError, EOFError, zlib.error)) or "Deserializ" in type(exc).__name__ or \
        "decompress" in str(exc).lower()


def _open_tree(path: str | os.PathLike, tree_name: str):
    uproot, _ = _require_uproot()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        f = uproot.open(path)
    except Exception as exc:  # uproot raises many types for a non-ROOT or truncated file
        raise ValueError(f"{path}: not a readable ROOT file (truncated or corrupted?) ({_reason(exc)})") from None
    end = getattr(getattr(f, "file", None), "fEND", None)  # the file's length its header records
    size = path.stat().st_size
    if isinstance(end, int) and size < end:
        f.close()
        raise ValueError(f"{path}: truncated ROOT file ({size} bytes; its header says {end})")
    try:
        tree = f[tree_name]
    except Exception as exc:
        try:
            names = sorted({k.split(";")[0] for k in f.keys()})
        except Exception:  # the directory itself is damaged
            names = None
        f.close()
        if names is not None and tree_name in names:  # listed, but its header cannot be read
            raise ValueError(f"{path}: TTree '{tree_name}' cannot be read: the file is truncated or corrupted "
                             f"({_reason(exc)})") from None
        raise ValueError(f"{path}: no TTree '{tree_name}' (the file holds {names})") from None
    from uproot.behaviors.TTree import TTree

    if not isinstance(tree, TTree):  # e.g. an RNTuple: Delphes writes TTrees
        f.close()
        raise ValueError(f"{path}: '{tree_name}' is a {type(tree).__name__}, not a TTree")
    return f, tree


def count_delphes_events(path: str | os.PathLike, tree: str = "Delphes") -> int:
    """Number of events (tree entries) in a Delphes file."""
    f, t = _open_tree(path, tree)
    with f:
        return int(t.num_entries)


def iter_delphes(
    path: str | os.PathLike,
    tree: str = "Delphes",
    collection: str = "PF",
    entry_start: int | None = None,
    entry_stop: int | None = None,
    step_size: int = 100,
) -> Iterator[PileupEvent]:
    """Events of a Delphes file one by one, reading ``step_size`` entries at a time.

    Each event becomes a :class:`~pointformers.data.pileup.PileupEvent` (``event_id`` = tree
    entry number, ``vertex`` and ``jet`` = −1: Delphes' PF collection does not store them;
    ``is_pu`` = ``IsPU != 0``), particles in file order.

    Raises:
        ImportError: uproot/awkward missing (names ``pip install pointformers[io]``).
        ValueError: the file is missing or not ROOT, the tree or a branch is missing, a branch
            is not per-particle (jagged), branches of one event disagree in length, a value is
            NaN/inf, a charge is not an integer, or a neutral PID is not one of HEPT's
            categories -- always naming the file (and branch / entry).
    """
    _, ak = _require_uproot()
    if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
        raise ValueError(f"step_size: expected an integer >= 1, got {step_size!r}")
    f, t = _open_tree(path, tree)
    with f:
        names = _branch_names(t, str(path), tree, collection)
        n = int(t.num_entries)
        start = 0 if entry_start is None else max(0, int(entry_start))
        stop = n if entry_stop is None else min(n, int(entry_stop))
        for s in range(start, stop, step_size):
            e = min(stop, s + step_size)
            cols: dict[str, np.ndarray] = {}
            counts = None
            for fld, br in names.items():
                try:
                    arr = t[br].array(entry_start=s, entry_stop=e, library="ak")
                    c = np.asarray(ak.num(arr, axis=1), np.int64)
                    flat = np.asarray(ak.to_numpy(ak.flatten(arr, axis=1)))
                except Exception as exc:
                    if _is_damage(exc):
                        raise ValueError(f"{path}: branch '{br}' (entries {s}..{e - 1}) cannot be read: the file "
                                         f"is truncated or corrupted ({_reason(exc)})") from None
                    raise ValueError(f"{path}: branch '{br}' (entries {s}..{e - 1}) is not a per-particle "
                                     f"(jagged) array of numbers ({_reason(exc)})") from None
                if flat.dtype.kind not in "biuf":
                    raise ValueError(f"{path}: branch '{br}' holds {flat.dtype}, expected numbers")
                if counts is None:
                    counts = c
                elif not np.array_equal(c, counts):
                    bad = int(np.flatnonzero(c != counts)[0])
                    raise ValueError(f"{path}: branch '{br}' has {int(c[bad])} particles in entry {s + bad} but "
                                     f"'{names[DELPHES_FIELDS[0]]}' has {int(counts[bad])}")
                if flat.dtype.kind == "f" and not np.isfinite(flat).all():
                    i = int(np.flatnonzero(~np.isfinite(flat))[0])
                    ent = s + int(np.searchsorted(np.cumsum(counts), i, side="right"))
                    raise ValueError(f"{path}: branch '{br}' has a non-finite value ({flat[i]}) in entry {ent}")
                cols[fld] = flat
            assert counts is not None
            off = np.r_[0, np.cumsum(counts)]
            charge = cols["Charge"]
            if charge.dtype.kind == "f" and (charge != np.round(charge)).any():
                i = int(np.flatnonzero(charge != np.round(charge))[0])
                ent = s + int(np.searchsorted(off[1:], i, side="right"))
                raise ValueError(f"{path}: branch '{names['Charge']}' has a non-integer charge {charge[i]} "
                                 f"in entry {ent}")
            for k in range(e - s):
                sl = slice(int(off[k]), int(off[k + 1]))
                pdg = cols["PID"][sl].astype(np.int64)
                q = np.round(charge[sl]).astype(np.int64)
                try:
                    pid_category(pdg, q)
                except ValueError as exc:
                    raise ValueError(f"{path}: entry {s + k}, branch '{names['PID']}': {exc}") from None
                m = int(counts[k])
                yield PileupEvent(
                    pt=cols["PT"][sl].astype(np.float32), eta=cols["Eta"][sl].astype(np.float32),
                    phi=cols["Phi"][sl].astype(np.float32), px=cols["Px"][sl].astype(np.float32),
                    py=cols["Py"][sl].astype(np.float32), energy=cols["E"][sl].astype(np.float32),
                    rapidity=cols["Rapidity"][sl].astype(np.float32), charge=q, pdg=pdg,
                    is_pu=cols["IsPU"][sl] != 0, vertex=np.full(m, -1, np.int64), jet=np.full(m, -1, np.int64),
                    event_id=s + k,
                )


def read_delphes(
    path: str | os.PathLike,
    tree: str = "Delphes",
    collection: str = "PF",
    entry_start: int | None = None,
    entry_stop: int | None = None,
) -> list[PileupEvent]:
    """All events (or the entries ``[entry_start, entry_stop)``) of a Delphes file; see :func:`iter_delphes`."""
    return list(iter_delphes(path, tree, collection, entry_start, entry_stop))


def write_delphes(path: str | os.PathLike, events: Sequence[PileupEvent], tree: str = "Delphes",
                  collection: str = "PF") -> None:
    """Write events as a Delphes-like tree: jagged branches ``PF.PT``, ``PF.Eta``, ... and
    the counter ``PF_size`` (the nearest uproot can write to Delphes' split TClonesArray;
    see the module doc). Float leaves are float32, Charge/IsPU/PID int32, as in Delphes."""
    uproot, ak = _require_uproot()
    if len(events) == 0:
        raise ValueError("events: expected at least one event to write")
    counts = np.asarray([e.num_particles for e in events], np.int64)

    def jag(values: list[np.ndarray], dtype) -> Any:
        return ak.unflatten(np.concatenate(values).astype(dtype), counts)

    rec = ak.zip({
        "PT": jag([e.pt for e in events], np.float32), "Eta": jag([e.eta for e in events], np.float32),
        "Phi": jag([e.phi for e in events], np.float32), "Charge": jag([e.charge for e in events], np.int32),
        "IsPU": jag([e.is_pu for e in events], np.int32), "PID": jag([e.pdg for e in events], np.int32),
        "Rapidity": jag([e.rapidity for e in events], np.float32), "E": jag([e.energy for e in events], np.float32),
        "Px": jag([e.px for e in events], np.float32), "Py": jag([e.py for e in events], np.float32),
    })
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with uproot.recreate(path) as f:
        f.mktree(tree, {collection: rec.type.content}, field_name=lambda outer, inner: f"{outer}.{inner}",
                 counter_name=lambda c: f"{c}_size")
        f[tree].extend({collection: rec})


def _root_files(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ValueError(f"data.root: {root} is neither a file nor a folder")
    files = sorted(p for p in root.iterdir() if p.suffix == ".root" and p.is_file())
    if not files:
        raise ValueError(f"data.root: no *.root files in {root}")
    return files


def _permuted(ev: PileupEvent, rng: np.random.Generator) -> PileupEvent:
    p = rng.permutation(ev.num_particles)
    return PileupEvent(**{k: getattr(ev, k)[p] for k in ("pt", "eta", "phi", "px", "py", "energy", "rapidity",
                                                          "charge", "pdg", "is_pu", "vertex", "jet")},
                       event_id=ev.event_id)


def load_delphes_splits(
    root: str | os.PathLike,
    splits: Sequence[str] = ("train", "val", "test"),
    seed: int = 0,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    tree: str = "Delphes",
    collection: str = "PF",
    permute: bool = True,
) -> dict[str, list[PileupEvent]]:
    """The requested splits of a real data set in ``root`` (a Delphes file or a folder of them).

    HEPT's layout (both :data:`HEPT_FILES` in the folder): part 1 is the training set; part 2's
    events are shuffled with ``seed`` and halved into validation (first ⌊n/2⌋) and test.
    Otherwise the events of all files (sorted by name) are cut in order by ``fractions``.
    ``permute``: shuffle the particles within each event with ``seed`` (HEPT does, so that the
    file's particle order cannot leak the label). ``event_id`` becomes the event's index in
    the concatenated data set. Only the files a requested split needs are read.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    for s in splits:
        if s not in ("train", "val", "test"):
            raise ValueError(f"splits: expected 'train', 'val' or 'test', got {s!r}")
    files = _root_files(root)
    out: dict[str, list[PileupEvent]] = {}
    names = {p.name: p for p in files}
    if Path(root).is_dir() and all(h in names for h in HEPT_FILES):
        p1, p2 = names[HEPT_FILES[0]], names[HEPT_FILES[1]]
        n1 = count_delphes_events(p1, tree)
        if "train" in splits:
            out["train"] = read_delphes(p1, tree, collection)
        if "val" in splits or "test" in splits:
            second = read_delphes(p2, tree, collection)
            order = np.random.default_rng(int(seed)).permutation(len(second))
            n_val = len(second) // 2
            for j, ev in enumerate(second):
                ev.event_id = n1 + j
            if "val" in splits:
                out["val"] = [second[i] for i in order[:n_val]]
            if "test" in splits:
                out["test"] = [second[i] for i in order[n_val:]]
    else:
        counts = [count_delphes_events(p, tree) for p in files]
        starts = np.r_[0, np.cumsum(counts)]
        ranges = split_ranges(int(starts[-1]), fractions)
        for s in splits:
            a, b = ranges[s]
            evs: list[PileupEvent] = []
            for i, p in enumerate(files):
                lo, hi = max(a, int(starts[i])), min(b, int(starts[i + 1]))
                if lo < hi:
                    for ev in iter_delphes(p, tree, collection, lo - int(starts[i]), hi - int(starts[i])):
                        ev.event_id += int(starts[i])
                        evs.append(ev)
            out[s] = evs
    if permute:
        # One generator per event, so a particle order does not depend on which splits were asked for.
        out = {s: [_permuted(ev, np.random.default_rng([int(seed), 0x5EED, ev.event_id])) for ev in evs]
               for s, evs in out.items()}
    return {s: out[s] for s in splits}


__all__ = ["DELPHES_FIELDS", "HEPT_FILES", "count_delphes_events", "iter_delphes", "load_delphes_splits",
           "read_delphes", "write_delphes"]

"""Tracking checkpoints on folders of TrackML events: ``pointformers evaluate --data`` and
``pointformers predict``.

A checkpoint is either a shipped/authors' HEPT model (``"hept-tracking-60k"``, or a file holding
an authors' ``state_dict``; :func:`pointformers.models.from_reference_checkpoint`) or a run
checkpoint of ``pointformers train`` for the tracking task (hit embeddings, tracks by DBSCAN) or the
track-reconstruction task (an end-to-end model,
:class:`~pointformers.models.track_reconstruction.TrackReconstructor`,
that assigns the hits to tracks itself). Each TrackML event of the folder is read with
:func:`pointformers.data.trackml.read_trackml_events` (pixel volumes 7, 8, 9 only, noise hits
included) and is **one cloud**: the model runs on the whole event at once, as the HEPT authors'
Tracking-60k. An end-to-end model cuts it into φ-sectors of at most ``sector_hits`` hits each (the
size of its training clouds' sectors, see :func:`sector_hits_on_validation`), so that its slots per
sector cover a full event's tracks.

Metrics (``evaluate``), per event and overall:

* AP@k, precision@K, recall@K: :func:`~.tracking.tracking_metrics_at_k` (the authors'
  ``accuracy@0.9``: queries are reconstructable hits with pT > ``pt_min``, K = 19). Overall =
  mean over events of the per-event values, skipping events without a query hit, exactly as the
  task averages clouds (:func:`~.tracking.ap_at_k_split`).
* TrackML score: :func:`~.tasks.tracking.trackml_score.trackml_score` of the track candidates (DBSCAN's,
  :func:`~.tasks.tracking.building.dbscan_tracks` with ``min_samples`` 2, or the end-to-end model's own
  labels; AP@k is then that of its InfoNCE hit embedding) against the truth particle ids and
  the files' truth weights (normalised over the event's pixel hits); overall = mean over events,
  as the challenge averages events (:func:`~.tasks.tracking.trackml_score.trackml_score_split`).
* Track matching (:mod:`~.tasks.tracking.metrics`) of the same tracks (3 hits or more):
  double-majority, perfect and LHC efficiencies, fake and duplicate rates, for particles with
  pT >= ``match_pt_min`` (0.9 GeV), |η| < ``match_eta_max`` (4, η of the particle's momentum)
  and hits on >= 3 pixel layers. Per event: ``eff_dm``, ``eff_perfect``, ``eff_lhc``,
  ``fake_dm``, ``dup_lhc``; overall: the same rates of the counts summed over events, and
  ``"track_metrics"`` with every rate and count, overall and against pT and η.

DBSCAN's radius ``eps``:

* a run checkpoint: chosen on the run's validation split (the generated data it was trained
  for), by the TrackML score, exactly as ``pointformers evaluate --split test`` does
  (:func:`~.tasks.tracking.building.choose_dbscan_eps`);
* a reference checkpoint has no validation split: :data:`REFERENCE_EPS` (see there for how it
  was chosen), or ``eps="auto"`` on a separate folder of labelled events;
* always overridable by a number. The evaluated events are never used to choose it unless that
  folder is also passed as the ``eps`` folder.

An end-to-end checkpoint has no radius: its assignment threshold and merging radius are the ones its
run's validation chose (stored in ``best.pt``'s model config).

Output of ``predict`` (per event ``<name>``, files written atomically):

* ``<name>-tracks.csv``: ``hit_id,track_id``, one line per pixel hit in the hits file's order
  (the TrackML submission columns for one event; add an ``event_id`` column to concatenate
  events into a challenge submission). Every hit has a track id >= 1: ids ``1..C`` are the
  DBSCAN clusters (2 or more hits each), ids ``C+1..`` are one-hit tracks, one per hit that
  DBSCAN left unassigned (the way :func:`~.tasks.tracking.trackml_score.trackml_score` treats them).
* ``<name>-embeddings.npz``: ``hit_id`` int64 ``(N,)``, ``embedding`` float32 ``(N, d)``
  (d = 12 for the HEPT tracking models; an end-to-end model's InfoNCE embedding), ``track_id`` int64
  ``(N,)`` (as in the CSV) and ``dbscan_eps`` float64 ``()`` (an end-to-end model: ``threshold``,
  ``merge_radius``, ``hit_threshold`` float64 ``()`` and ``sector_hits`` int64 ``()`` instead); rows in the same order as
  the CSV. For an end-to-end model ids ``1..C`` are its tracks (every labelled group, whatever its
  size) and ``C+1..`` one per hit it left without a track.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

# The metric and clustering modules (scipy, scikit-learn) are imported where they are used, so
# that building the command-line parser, which reads REFERENCE_EPS, stays fast.
if TYPE_CHECKING:
    from .data.event import TrackingEvent
    from .tasks.tracking.building import EpsSelection
    from .tasks.tracking import TrackingInputs

__all__ = ["REFERENCE_EPS", "DBSCAN_MIN_SAMPLES", "TrackingModel", "open_tracking_checkpoint", "embed_event",
           "event_tracks", "sector_hits_on_validation", "choose_eps_on_folder", "choose_eps_on_validation",
           "evaluate_folder", "predict_folder", "submission_track_ids", "output_paths", "format_event_table",
           "check_event_folder", "check_outputs"]

#: DBSCAN radius for reference checkpoints (no validation split of their own).
#: Chosen with the published ``hept-tracking-60k`` model on a public real TrackML event (the
#: gnn_tracking project's test event ``event000000001``: 548 particles with all their hits plus
#: noise, 2,783 pixel hits; AP@k 0.976) made as dense as a Tracking-60k event: 20 copies of it
#: rotated by random angles about the beam axis and overlaid (55,660 pixel hits, ~11k
#: particles). Maximising the TrackML score over a grid gave eps = 0.56 and 0.53 for two random
#: overlays (score 0.45 and 0.48; within 0.01 of the best from 0.47 to 0.60); 0.55 is their mean.
#: The best radius depends on the hit density: 0.47 for 30 copies, 0.56 for 10, 1.0 for the
#: single sparse event (where 0.55 scores 0.64 instead of 0.72). For other data choose it on
#: labelled events of the same kind (``--eps auto --eps-data FOLDER``).
REFERENCE_EPS = 0.55

#: DBSCAN ``min_samples`` (a core hit has another hit within eps), as the tracking task uses.
DBSCAN_MIN_SAMPLES = 2


@dataclass
class TrackingModel:
    """A tracking model ready to embed events.

    Attributes:
        model: the network in eval mode on ``device``; ``model(x, coords)`` -> ``(n, d)``.
        label: how to name it in output (e.g. ``"hept-tracking-60k (reference checkpoint)"``).
        reference: True for an authors' model (no config, no validation split).
        device: where the model runs.
        cfg: the run's resolved config (None for a reference checkpoint).
        pt_min, K: AP@k settings (the task's ``pt_min``, an end-to-end model's ``match_pt_min``; K = 19).
        precision: ``"fp32"`` or ``"bf16"`` (autocast, run checkpoints trained with it).
        end_to_end: a track-reconstruction model: ``model(x[None], coords[None])`` gives the track labels
            (no DBSCAN); :func:`event_tracks` reads its labels and InfoNCE embedding in one pass.
    """

    model: nn.Module
    label: str
    reference: bool
    device: torch.device
    cfg: Mapping[str, Any] | None = None
    pt_min: float = 0.9
    K: int = 19
    precision: str = "fp32"
    end_to_end: bool = False

    def autocast(self):
        """bf16 autocast for a run trained with ``precision: bf16``, else a no-op context."""
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def open_tracking_checkpoint(checkpoint: str | os.PathLike, device: str | None = None,
                             config_for: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
                             ) -> TrackingModel:
    """Load a reference checkpoint (shipped name or authors' ``state_dict`` file) or a run
    checkpoint of the tracking task.

    Args:
        checkpoint: ``"hept-tracking-60k"``, a path to an authors' state_dict, or ``RUN/best.pt``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:K"``; None = ``"auto"`` for reference
            checkpoints, the run config's ``train.device`` for run checkpoints.
        config_for: ``config_for(checkpoint dict) -> resolved config`` for run checkpoints
            (default: the config stored in the checkpoint).
    Raises:
        ValueError naming ``--checkpoint`` for a missing file or a non-tracking run checkpoint.
    """
    from .engine import load_checkpoint, model_from_checkpoint
    from .engine.distributed import resolve_device
    from .models.hept_tracking import REFERENCE_CHECKPOINTS, from_reference_checkpoint, is_reference_checkpoint

    name = os.fspath(checkpoint)
    if not (isinstance(checkpoint, str) and checkpoint in REFERENCE_CHECKPOINTS) and not Path(name).is_file():
        raise ValueError(f"--checkpoint: no file {name!r}, and not the name of a shipped checkpoint "
                         f"({', '.join(sorted(REFERENCE_CHECKPOINTS))})")
    if is_reference_checkpoint(checkpoint):
        dev = resolve_device(device or "auto")
        model = from_reference_checkpoint(checkpoint).to(dev).eval()
        kind = "shipped" if name in REFERENCE_CHECKPOINTS else "authors' state_dict"
        return TrackingModel(model, f"{Path(name).name} (reference checkpoint, {kind})", True, dev)
    ckpt = load_checkpoint(name, required=("model", "model_name", "model_config"))
    if config_for is not None:
        cfg = config_for(ckpt)
    else:
        from .engine.config import load_config

        stored = (ckpt.get("extra") or {}).get("config")
        if not isinstance(stored, Mapping):
            raise ValueError(f"--checkpoint: {name} stores no run config; pass --config")
        cfg = load_config(None, (), base=stored)
    if cfg["task"]["name"] not in ("tracking", "track-reconstruction"):
        raise ValueError(f"--checkpoint: {name} is a {cfg['task']['name']!r} checkpoint; TrackML events need a "
                         f"tracking or track-reconstruction model")
    end_to_end = cfg["task"]["name"] == "track-reconstruction"
    dev = resolve_device(device or cfg["train"]["device"])
    model = model_from_checkpoint(ckpt, map_location=dev).eval()
    label = f"{ckpt['model_name']} ({Path(name).name}, epoch {ckpt.get('epoch', '?')})"
    # AP@k's query cut: the tracking task's positives'; for an end-to-end model the metrics' cut (its own
    # pt_min may be 0: every particle a target)
    pt_min = float(cfg["task"]["match_pt_min"] if end_to_end else cfg["task"]["pt_min"])
    return TrackingModel(model, label, False, dev, cfg, pt_min, 19, cfg["train"]["precision"], end_to_end)


def _out_dim(model: nn.Module) -> int:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return int(linears[-1].out_features) if linears else 0


@torch.no_grad()
def embed_event(tm: TrackingModel, event: TrackingEvent) -> tuple[TrackingInputs, torch.Tensor]:
    """Model inputs and embeddings ``(n, d)`` (CPU float32) of one whole event (one cloud); an end-to-end model's
    InfoNCE embedding."""
    from .tasks.tracking import tracking_inputs

    if tm.end_to_end:
        inp, emb, _ = _end_to_end_event(tm, event)
        return inp, emb
    inp = tracking_inputs(event, dtype=torch.float32)
    if inp.num_hits == 0:
        return inp, torch.zeros(0, _out_dim(tm.model))
    with tm.autocast():
        emb = tm.model(inp.x.to(tm.device), inp.coords.to(tm.device))
    return inp, emb.float().cpu()


@torch.no_grad()
def event_tracks(tm: TrackingModel, event: TrackingEvent, eps: float | None
                 ) -> tuple[TrackingInputs, torch.Tensor, np.ndarray]:
    """Model inputs, hit embeddings ``(n, d)`` (CPU float32) and track labels ``(n,)`` int64 (−1: none) of one
    whole event: DBSCAN's clusters of the embedding at radius ``eps``, or an end-to-end model's own labels
    (``eps`` None) with its InfoNCE embedding, from one forward pass."""
    from .tasks.tracking.building import dbscan_tracks

    if tm.end_to_end:
        return _end_to_end_event(tm, event)
    if eps is None:
        raise ValueError("eps: an embedding model's tracks are DBSCAN clusters; give its radius")
    inp, emb = embed_event(tm, event)
    return inp, emb, dbscan_tracks(emb, eps, DBSCAN_MIN_SAMPLES)


@torch.no_grad()
def _end_to_end_event(tm: TrackingModel, event: TrackingEvent) -> tuple[TrackingInputs, torch.Tensor, np.ndarray]:
    """:func:`event_tracks` of an end-to-end model: its labels and InfoNCE embedding from one forward pass."""
    from .tasks.tracking import tracking_inputs

    inp = tracking_inputs(event, dtype=torch.float32)
    if inp.num_hits == 0:
        return inp, torch.zeros(0, tm.model.embed_head.out_features), np.zeros(0, dtype=np.int64)
    with tm.autocast():
        labels, emb = tm.model.labels_and_embedding(inp.x.to(tm.device)[None], inp.coords.to(tm.device)[None])
    return inp, emb[0].float().cpu(), labels[0].cpu().numpy().astype(np.int64)


def sector_hits_on_validation(tm: TrackingModel) -> int:
    """An end-to-end run's sector size for whole events: ⌈median real hits of its validation clouds / the
    model's ``sectors``⌉, so that a larger event is cut into sectors of the size its slots were trained on
    (the model's ``sector_hits``)."""
    from .tasks.registry import get_task

    if tm.cfg is None or not tm.end_to_end:
        raise ValueError("sector_hits: only an end-to-end run checkpoint has sectors")
    spec = get_task(tm.cfg["task"]["name"])
    val = spec.load(tm.cfg, ("val",), False)["val"]
    if not val:
        raise ValueError("--sector-hits: the run's validation split is empty; give the sector size")
    return int(math.ceil(float(np.median([c.num_hits for c in val])) / tm.model.num_sectors))


# ------------------------------------------------------------------------------ folders
def _event_names(folder: str | os.PathLike, arg: str) -> list[str]:
    from .data.trackml import list_trackml_events

    d = Path(folder)
    if not d.exists():
        raise ValueError(f"{arg}: {d} does not exist")
    if not d.is_dir():
        raise ValueError(f"{arg}: {d} is not a folder")
    names = [p.name for p in list_trackml_events(d)]
    if not names:
        raise ValueError(f"{arg}: {d} holds no TrackML event (no <event>-hits.csv or <event>-hits.csv.gz file)")
    return names


def _require_truth(folder: Path, names: Sequence[str], arg: str) -> None:
    for name in names:
        for kind in ("truth", "particles"):
            if not any((folder / f"{name}-{kind}{s}").is_file() for s in (".csv", ".csv.gz")):
                raise ValueError(f"{arg}: {folder / (name + '-' + kind + '.csv')} not found: evaluating needs "
                                 f"labelled events (truth and particles files); pointformers predict runs a "
                                 f"checkpoint on unlabelled ones")


def check_event_folder(folder: str | os.PathLike, truth: bool, detectors=None, arg: str = "--data") -> list[str]:
    """The event names of ``folder`` (sorted), after checking that it is a folder with events, that
    every event has truth and particles files (``truth``) and that ``detectors`` exists.
    Raises ValueError naming ``arg`` / ``--detectors``."""
    names = _event_names(folder, arg)
    if truth:
        _require_truth(Path(folder), names, arg)
    if detectors is not None and not Path(detectors).is_file():
        raise ValueError(f"--detectors: {detectors} not found")
    return names


def _read_events(folder: str | os.PathLike, detectors, truth: bool, arg: str
                 ) -> tuple[list[str], Iterator[tuple[str, TrackingEvent]]]:
    """The event names of ``folder`` and a lazy iterator of ``(name, event)``; everything
    :func:`check_event_folder` checks is checked at once."""
    from .data.trackml import read_trackml_events

    names = check_event_folder(folder, truth, detectors, arg)
    return names, zip(names, read_trackml_events(folder, detectors=detectors, truth=truth))


def choose_eps_on_folder(tm: TrackingModel, folder: str | os.PathLike, detectors=None,
                         arg: str = "--eps-data") -> EpsSelection:
    """The DBSCAN radius maximising the mean TrackML score over the labelled events of ``folder``."""
    from .tasks.tracking.building import choose_dbscan_eps

    embs, pids, ws = [], [], []
    _, events = _read_events(folder, detectors, True, arg)
    for _, ev in events:
        _, emb = embed_event(tm, ev)
        embs.append(emb)
        pids.append(np.asarray(ev.particle_id))
        ws.append(np.asarray(ev.weight, dtype=np.float64))
    try:
        return choose_dbscan_eps(embs, pids, ws, min_samples=DBSCAN_MIN_SAMPLES)
    except ValueError as exc:
        raise ValueError(f"{arg}: cannot choose the DBSCAN radius on {folder}: {str(exc).splitlines()[0]}") from None


def choose_eps_on_validation(tm: TrackingModel) -> EpsSelection:
    """The DBSCAN radius a run checkpoint's ``evaluate --split test`` uses: chosen on the run's
    validation split by the TrackML score."""
    from .tasks.registry import get_task
    from .tasks.tracking.building import choose_dbscan_eps
    from .tasks.tracking.training import TrackingTask, cloud_truth_weights

    if tm.cfg is None:
        raise ValueError("--eps: a reference checkpoint has no validation split; pass a number or "
                         "--eps-data FOLDER of labelled events")
    spec = get_task(tm.cfg["task"]["name"])
    val = spec.load(tm.cfg, ("val",), False)["val"]
    task = TrackingTask(pt_min=tm.pt_min, K=tm.K, dbscan_min_samples=DBSCAN_MIN_SAMPLES)
    with tm.autocast():
        emb = task.embed(tm.model, val)
    return choose_dbscan_eps(emb, [c.inputs.particle_id for c in val], [cloud_truth_weights(c) for c in val],
                             min_samples=DBSCAN_MIN_SAMPLES)


# ------------------------------------------------------------------------------ evaluate
_COLUMNS = (("hits", "num_hits", 7), ("AP@k", "ap@k", 7), ("prec@K", "precision@K", 7),
            ("rec@K", "recall@K", 7), ("TrackML", "trackml_score", 7), ("effDM", "eff_dm", 7),
            ("fakeDM", "fake_dm", 7), ("tracks", "num_tracks", 7), ("time_s", "seconds", 7))


def _cell(v: Any, key: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if key in ("num_hits", "num_tracks"):
        return str(int(v))
    if key == "seconds":
        return f"{v:.1f}"
    return f"{v:.4f}"


def format_event_table(names: Sequence[str]) -> tuple[str, Callable[[str, Mapping[str, Any]], str]]:
    """Header lines for a per-event table of ``names`` (plus ``overall``) and a row formatter."""
    w = max([len("event"), len("overall")] + [len(n) for n in names])
    header = f"{'event':<{w}}  " + "  ".join(f"{h:>{cw}}" for h, _, cw in _COLUMNS)
    rule = "-" * len(header)

    def row(name: str, m: Mapping[str, Any]) -> str:
        return f"{name:<{w}}  " + "  ".join(f"{_cell(m.get(k), k):>{cw}}" for _, k, cw in _COLUMNS)

    return header + "\n" + rule, row


def evaluate_folder(tm: TrackingModel, folder: str | os.PathLike, eps: float | None, detectors=None,
                    log: Callable[[str], None] | None = None, match_pt_min: float = 0.9,
                    match_eta_max: float = 4.0) -> dict[str, Any]:
    """AP@k, precision@K, recall@K, the TrackML score and the track-matching rates of every
    labelled event of ``folder``.

    Returns ``{"events": [{"event", "num_hits", "ap@k", "precision@K", "recall@K", "num_queries",
    "trackml_score", "eff_dm", "eff_perfect", "eff_lhc", "fake_dm", "dup_lhc", "num_tracks",
    "seconds"}, ...], "overall": {...}, "track_metrics": {"cuts", "overall", "vs_pt", "vs_eta"}}``
    (``track_metrics``: :meth:`~.tasks.tracking.metrics.TrackMetricsAccumulator.result`, counts
    summed over events; ``match_pt_min``/``match_eta_max`` its particle cuts). ``log`` gets the
    table (header, then one row per event as it is done, then the overall row), then the
    track-matching table. ``eps``: DBSCAN's radius (None for an end-to-end model, whose own labels count).
    """
    from .tasks.tracking.metrics import OVERALL_KEYS, TrackMetricsAccumulator, format_track_metrics, particle_eta
    from .tasks.tracking.trackml_score import trackml_score, trackml_score_split
    from .tasks.tracking import ap_at_k_split, tracking_metrics_at_k

    try:
        acc = TrackMetricsAccumulator(pt_min=match_pt_min, eta_max=match_eta_max,
                                      tracks="the model's tracks" if tm.end_to_end else "DBSCAN clusters")
    except ValueError as exc:
        raise ValueError(f"match_{exc}") from None
    names, events = _read_events(folder, detectors, True, "--data")
    header, row_fmt = format_event_table(names)
    if log:
        log(header)
    rows: list[dict[str, Any]] = []
    for name, ev in events:
        t0 = time.perf_counter()
        inp, emb, labels = event_tracks(tm, ev, eps)
        m = tracking_metrics_at_k(emb, inp.particle_id, inp.pt, inp.reconstructable, tm.pt_min, tm.K)
        score = trackml_score(labels, ev.particle_id, np.asarray(ev.weight, dtype=np.float64))
        eta = np.nan_to_num(ev.per_hit(particle_eta(ev.px, ev.py, ev.pz), 0.0).astype(np.float64), nan=0.0)
        match = acc.add(labels, inp.particle_id, inp.pt, eta, inp.reconstructable)
        r = {"event": name, "num_hits": inp.num_hits, "ap@k": m["accuracy"], "precision@K": m["precision"],
             "recall@K": m["recall"], "num_queries": m["num_queries"], "trackml_score": score,
             **{k: match[k] for k in OVERALL_KEYS},
             "num_tracks": int(len(np.unique(labels[labels >= 0]))), "seconds": time.perf_counter() - t0}
        rows.append(r)
        if log:
            log(row_fmt(name, r))
    overall = {"num_events": len(rows), "num_hits": sum(r["num_hits"] for r in rows),
               "ap@k": ap_at_k_split([r["ap@k"] for r in rows]),
               "precision@K": ap_at_k_split([r["precision@K"] for r in rows]),
               "recall@K": ap_at_k_split([r["recall@K"] for r in rows]),
               "num_queries": sum(r["num_queries"] for r in rows),
               "trackml_score": trackml_score_split([r["trackml_score"] for r in rows]),
               **acc.overall_metrics(),
               "num_tracks": sum(r["num_tracks"] for r in rows), "seconds": sum(r["seconds"] for r in rows)}
    report = acc.result()
    if log:
        log("-" * len(row_fmt("overall", overall)))
        log(row_fmt("overall", overall))
        log(format_track_metrics(report))
    return {"events": rows, "overall": overall, "track_metrics": report}


# ------------------------------------------------------------------------------ predict
def submission_track_ids(labels: np.ndarray) -> np.ndarray:
    """Track labels (−1 = unassigned; DBSCAN's clusters or an end-to-end model's tracks) -> track ids >= 1: the
    distinct labels in increasing order -> 1, 2, … (DBSCAN's ``0..C-1`` -> ``1..C``), and each unassigned hit its own
    id after them (a one-hit track), in hit order."""
    labels = np.asarray(labels, dtype=np.int64)
    free = labels < 0
    uniq, inv = np.unique(labels[~free], return_inverse=True)
    out = np.empty_like(labels)
    out[~free] = inv + 1
    out[free] = len(uniq) + 1 + np.arange(int(free.sum()))
    return out


def output_paths(out: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """``(OUT/<name>-tracks.csv, OUT/<name>-embeddings.npz)``."""
    d = Path(out)
    return d / f"{name}-tracks.csv", d / f"{name}-embeddings.npz"


def check_writable_folder(folder: str | os.PathLike, target: str | os.PathLike | None = None) -> None:
    """Create ``folder`` if needed and make sure a file can be written in it (before any work).

    Raises ValueError ``"cannot write TARGET: reason"`` (``target`` defaults to ``folder``), e.g.
    for a read-only folder or a path under a regular file.
    """
    import tempfile

    folder = Path(folder)
    target = folder if target is None else target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write {target}: {exc.strerror or exc}") from None


def check_outputs(out: str | os.PathLike, names: Sequence[str], force: bool) -> None:
    """Refuse (ValueError naming ``--out``) when ``out`` is a file or, without ``force``, when an
    output file of one of the events ``names`` exists."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a folder")
    targets = [p for n in names for p in output_paths(out, n)]
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise ValueError(f"--out: {existing[0]} already exists ({len(existing)} of the {len(targets)} output files "
                         f"do); pass --force to overwrite")
    check_writable_folder(out)


def _write_outputs(tracks: Path, npz: Path, hit_id: np.ndarray, emb: np.ndarray, track_id: np.ndarray,
                   settings: Mapping[str, Any]) -> None:
    from .files import atomic_write

    lines = "".join(f"{h},{t}\n" for h, t in zip(hit_id.tolist(), track_id.tolist()))
    target = tracks
    try:
        atomic_write(tracks, lambda f: f.write(("hit_id,track_id\n" + lines).encode()))
        target = npz
        atomic_write(npz, lambda f: np.savez(f, hit_id=hit_id.astype(np.int64), embedding=emb.astype(np.float32),
                                             track_id=track_id.astype(np.int64),
                                             **{k: np.asarray(v) for k, v in settings.items()}))
    except OSError as exc:
        raise ValueError(f"cannot write {target}: {exc.strerror or exc}") from None


def predict_folder(tm: TrackingModel, folder: str | os.PathLike, out: str | os.PathLike, eps: float | None,
                   detectors=None, force: bool = False, log: Callable[[str], None] | None = None) -> list[Path]:
    """Run the model on every event of ``folder`` (hits and cells; truth files are not read)
    and write ``<name>-tracks.csv`` and ``<name>-embeddings.npz`` per event into ``out`` (format:
    module docstring). ``eps``: DBSCAN's radius (None for an end-to-end model). Refuses (ValueError
    naming ``--out``) before any work when an output file exists, unless ``force``. Returns the written
    paths."""
    if tm.end_to_end:
        settings = {"threshold": np.float64(tm.model.threshold), "merge_radius": np.float64(tm.model.merge_radius),
                    "hit_threshold": np.float64(tm.model.hit_threshold),
                    "sector_hits": np.int64(tm.model.sector_hits)}
    else:
        settings = {"dbscan_eps": np.float64(eps)}
    names, events = _read_events(folder, detectors, False, "--data")
    out = Path(out)
    check_outputs(out, names, force)  # also creates ``out`` and checks it is writable
    written: list[Path] = []
    for i, (name, ev) in enumerate(events, start=1):
        t0 = time.perf_counter()
        _, emb, labels = event_tracks(tm, ev, eps)
        track_id = submission_track_ids(labels)
        tracks, npz = output_paths(out, name)
        _write_outputs(tracks, npz, np.asarray(ev.hit_id, dtype=np.int64), emb.numpy(), track_id, settings)
        written += [tracks, npz]
        if log:
            n_tracks = len(np.unique(labels[labels >= 0]))
            kind = "tracks" if tm.end_to_end else "tracks of 2+ hits"
            log(f"[{i}/{len(names)}] {name}: {ev.num_hits} pixel hits -> {n_tracks} {kind}, "
                f"{int((labels < 0).sum())} one-hit tracks ({time.perf_counter() - t0:.1f} s): "
                f"{tracks.name}, {npz.name}")
    return written

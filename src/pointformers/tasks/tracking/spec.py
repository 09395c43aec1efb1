"""The ``tracking`` and ``track-reconstruction`` tasks for configs and the CLI (registered at import as
``task.name: tracking`` and ``task.name: track-reconstruction``).

Config sections (defaults: the HEPT authors' tracking settings)::

    data: {preset: small, seed: 0, cache_dir: null,    # data/tracking.py presets, generated and cached
           n_events: null,                           # optional: the preset with this many events
           sector_ds: null, sector_di: null,         # optional: the φ-sectors' extended-wedge options
           sector_slope: null}                       # (null = the preset's; see split_sectors)
    task: {name: tracking, similarity: l2_rbf, tau: 0.05, sigma: 0.75, random_pairs: 0.2,
           pt_min: 0.9, radius: 1.0, max_num_neighbors: 256,
           match_pt_min: 0.9, match_eta_max: 4.0}

``similarity``/``tau``/``sigma`` are the InfoNCE options, ``random_pairs`` the fraction of
random pairs added each step, ``pt_min`` the AP@k filter (GeV), ``radius`` and
``max_num_neighbors`` the (eta, phi) radius graph that labels the training pairs,
``match_pt_min``/``match_eta_max`` the particle cuts (pT >= 0.9 GeV, |eta| < 4) of the
track-matching metrics ``evaluate --split test`` reports (:mod:`.metrics`). ``n_events``
(null = the preset's) keeps every other parameter of the preset and changes only the number of
generated events, e.g. a shorter ``tracking-6k`` run on fewer 6k-hit clouds; ``sector_ds``,
``sector_di``, ``sector_slope`` likewise replace the φ-sector options (the HEPT authors' class
defaults 1.1, 1e-4 and "auto"; their build script passes ``sector_ds: 1.3, sector_di: 0``). The
validation metric is ``ap@k`` (maximised).

``track-reconstruction`` (the end-to-end model, :mod:`.reconstruction`) has the same ``data:`` section
and the tracking task's keys, plus::

    task: {name: track-reconstruction, w_class: 0.1, w_focal: 200.0, w_dice: 2.0,   # cost = loss weights
           focal_alpha: 0.25, focal_gamma: 2.0, no_object: 1.0,  # unmatched slots' weight in the class term
           min_hits: 3,                                           # a sector's targets: >= 3 of their hits
           hit_weight: 1.0, embed_weight: 1.0, param_weight: 1.0, # auxiliary losses (0 turns one off)
           hit_pt_min: null}   # the hit classifier's targets: pT above this [GeV] (null: pt_min)

Its validation metric is ``trackml_score`` (maximised). Merging tracks by embedding is the model's
(``model.options.merge_max_hits``, ``merge_radius``); an older config's ``task.merge_max_hits`` is read as
``model.options.merge_max_hits``. Everything here is glue around
:mod:`.training`, :mod:`.reconstruction`, :mod:`.core` and :mod:`.display`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..registry import TaskSpec, register_task

__all__ = ["TRACKING_SPEC", "RECONSTRUCTION_SPEC", "tracking_cache_files"]

_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "n_events": (int, None),
                "sector_ds": (float, None), "sector_di": (float, None), "sector_slope": (str, None)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "n_events": None, "sector_ds": None,
                  "sector_di": None, "sector_slope": None}
#: data keys that replace the preset's generator parameter of the same name (``sector_*``) or ``n_events``
_PARAM_KEYS = {"n_events": "n_events", "sector_ds": "sector_ds", "sector_di": "sector_di", "sector_slope": "sector_slope"}
_TASK_SCHEMA = {"similarity": (str,), "tau": (float,), "sigma": (float,), "random_pairs": (float,),
                "pt_min": (float,), "radius": (float,), "max_num_neighbors": (int,), "match_pt_min": (float,),
                "match_eta_max": (float,)}
_TASK_DEFAULTS = {"similarity": "l2_rbf", "tau": 0.05, "sigma": 0.75, "random_pairs": 0.2, "pt_min": 0.9,
                  "radius": 1.0, "max_num_neighbors": 256, "match_pt_min": 0.9, "match_eta_max": 4.0}


def data_params(d: Mapping[str, Any]):
    """What the generator gets for a data section: the preset name, or its parameters with the
    section's ``n_events`` / ``sector_*`` values replaced."""
    changes = {param: d[key] for key, param in _PARAM_KEYS.items() if d.get(key) is not None}
    if not changes:
        return d["preset"]
    from ...data.tracking import resolve_params

    return resolve_params(d["preset"]).replace(**changes)


def _build(cfg: Mapping[str, Any]):
    from .training import TrackingTask

    t = cfg["task"]
    return TrackingTask(t["similarity"], t["tau"], t["sigma"], t["random_pairs"], t["pt_min"],
                        match_pt_min=t.get("match_pt_min", 0.9), match_eta_max=t.get("match_eta_max", 4.0))


def _validate(cfg: Mapping[str, Any]) -> None:
    from ...data.tracking import PRESETS

    d, t = cfg["data"], cfg["task"]
    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    if d["seed"] < 0:
        raise ValueError(f"data.seed: must be >= 0, got {d['seed']}")
    if d.get("n_events") is not None and d["n_events"] < 1:
        raise ValueError(f"data.n_events: must be >= 1 (or null for the preset's), got {d['n_events']}")
    if any(d.get(k) is not None for k in ("sector_ds", "sector_di", "sector_slope")):
        from ...data.tracking import resolve_params, sector_slope

        p = resolve_params(d["preset"])
        sector_slope(p.n_sectors, p.sector_ds if d.get("sector_ds") is None else d["sector_ds"],
                     p.sector_di if d.get("sector_di") is None else d["sector_di"],
                     p.sector_slope if d.get("sector_slope") is None else d["sector_slope"],
                     names=("data.n_sectors", "data.sector_ds", "data.sector_di", "data.sector_slope"))
    try:
        _build(cfg)
    except ValueError as exc:
        raise ValueError(f"task.{str(exc).splitlines()[0]}") from None
    if not (math.isfinite(t["radius"]) and t["radius"] > 0):
        raise ValueError(f"task.radius: must be a finite number > 0, got {t['radius']}")
    if t["max_num_neighbors"] < 1:
        raise ValueError(f"task.max_num_neighbors: must be >= 1, got {t['max_num_neighbors']}")


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False, pairs: bool = True) -> dict[str, list]:
    """TrackingCloud samples per split; training clouds carry their labelled pairs (unless ``pairs`` is False)."""
    from .training import load_tracking_splits, prepare_tracking_clouds

    d, t = cfg["data"], cfg["task"]
    events = load_tracking_splits(data_params(d), splits, cache_dir=d["cache_dir"], seed=d["seed"])
    return {s: prepare_tracking_clouds(events[s], with_pairs=pairs and s == "train", radius=t["radius"],
                                       max_num_neighbors=t["max_num_neighbors"], pt_min=t["pt_min"],
                                       progress=progress and s == "train", desc=f"{s} pairs",
                                       cache_dir=d["cache_dir"])
            for s in splits}


def tracking_cache_files(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    """Generate (or find) the cached clouds of ``splits``; returns the cache file of each split.

    The file name follows :func:`pointformers.data.tracking.load_tracking_dataset`'s cache
    key; if that key ever changes, the cache folder is returned instead of a wrong name.
    """
    from ...data.cache import cache_path, default_cache_dir, load_arrays
    from ...data.tracking import GENERATOR_VERSION, load_tracking_dataset, resolve_params

    d = cfg["data"]
    root = Path(d["cache_dir"]) if d["cache_dir"] is not None else default_cache_dir()
    params = resolve_params(data_params(d))
    name = d["preset"] if data_params(d) == d["preset"] else "custom"
    out = []
    for split in splits:
        load_tracking_dataset(data_params(d), split, cache_dir=d["cache_dir"], seed=d["seed"])
        key = {"generator": "pointformers.tracking", "version": GENERATOR_VERSION, "params": params.to_dict(),
               "seed": int(d["seed"]), "split": split}
        path = cache_path(root / "tracking", f"{name}-{split}", key)
        out.append(str(path) if load_arrays(path, key) is not None else str(root / "tracking"))
    return out


def _baselines(cfg: Mapping[str, Any], samples: Sequence[Any]) -> dict[str, dict[str, float]]:
    from .training import knn_baseline_metrics

    return {"kNN in (eta, phi)": knn_baseline_metrics(samples, cfg["task"]["pt_min"])}


def _plot(cfg: Mapping[str, Any], model: Any, samples: Sequence[Any], out_dir: str | Path) -> list[Path]:
    """Figures of validation cloud 0, DBSCAN clusters of the embeddings (radius chosen on the
    given validation clouds by the track-match score):

    * ``event_display.png``: x-y and r-z views, hits coloured by true particle and by
      reconstructed track, a track matched to a particle in that particle's colour
      (:func:`~.display.draw_track_display`);
    * ``hept_buckets.png`` (models with HEPT attention): the query blocks of table 0, head 0 of
      the first HEPT layer in eta-phi (:func:`~.display.draw_hept_buckets`).
    """
    from .core import ap_at_k, cluster_tracks
    from .display import choose_eps, draw_hept_buckets, draw_track_display, hept_query_blocks
    from .training import load_tracking_splits

    if not samples:
        raise ValueError("samples: need at least one validation cloud for the event display")
    task = _build(cfg)
    emb = task.embed(model, samples)
    eps, scores = choose_eps(emb, [c.inputs.particle_id for c in samples], [c.inputs.pt for c in samples],
                             [c.inputs.reconstructable for c in samples])
    cloud = samples[0]
    event = cloud.event
    if event is None:  # the hits' positions live in the cached events, in the same order
        d = cfg["data"]
        event = load_tracking_splits(data_params(d), ("val",), cache_dir=d["cache_dir"], seed=d["seed"])["val"][0]
    labels = cluster_tracks(emb[0], eps)
    ap = ap_at_k(emb[0], cloud.inputs.particle_id, cloud.inputs.pt, cloud.inputs.reconstructable,
                 cfg["task"]["pt_min"])
    name = f"{cfg['model']['name']} - validation cloud 0 ({cloud.num_hits} hits)"
    out = [draw_track_display(Path(out_dir) / "event_display.png", event.x, event.y, event.z, labels,
                              cloud.inputs.particle_id, title=f"{name}, AP@k {ap:.3f}",
                              note=f"DBSCAN on embeddings, eps={eps:.3g} (best track-match score on val: "
                                   f"{scores[eps]:.3f})")]
    from ...attention.hept import HEPTAttention

    if any(isinstance(m, HEPTAttention) for m in model.modules()):
        was_training = model.training
        model.eval()
        try:
            dev = next(model.parameters()).device
            blocks = hept_query_blocks(model, cloud.inputs.x.to(dev), cloud.inputs.coords.to(dev))
        finally:
            model.train(was_training)
        out.append(draw_hept_buckets(Path(out_dir) / "hept_buckets.png", cloud.inputs.coords[:, 0],
                                     cloud.inputs.coords[:, 1], blocks, cloud.inputs.particle_id,
                                     title=f"{name}: query blocks of the first HEPT layer (table 0, head 0)"))
    return out


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    return tracking_cache_files(cfg, splits)


TRACKING_SPEC = register_task(TaskSpec(
    name="tracking",
    description="charged-particle tracking: per-hit embeddings trained with InfoNCE, scored by AP@k (HEPT)",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="ap@k", mode="max", validate=_validate, generate=_generate,
    default_model="hept-tracking", baselines=_baselines, plot=_plot,
))


# ---------------------------------------------------------------------------- track-reconstruction
#: The end-to-end task's own keys (the set criterion, the auxiliary weights) on top of
#: the tracking task's (InfoNCE options, pair building, matching cuts).
_RECO_OWN_SCHEMA = {"w_class": (float,), "w_focal": (float,), "w_dice": (float,), "focal_alpha": (float,),
                    "focal_gamma": (float,), "no_object": (float,), "min_hits": (int,), "hit_weight": (float,),
                    "embed_weight": (float,), "param_weight": (float,), "hit_pt_min": (float, None)}
_RECO_OWN_DEFAULTS = {"w_class": 0.1, "w_focal": 200.0, "w_dice": 2.0, "focal_alpha": 0.25, "focal_gamma": 2.0,
                      "no_object": 1.0, "min_hits": 3, "hit_weight": 1.0, "embed_weight": 1.0, "param_weight": 1.0,
                      "hit_pt_min": None}


#: SetCriterionWeights field -> its config key
_WEIGHT_KEYS = {"cls": "w_class", "focal": "w_focal", "dice": "w_dice", "alpha": "focal_alpha", "gamma": "focal_gamma",
                "no_object": "no_object"}


def _build_reconstruction(cfg: Mapping[str, Any]):
    from .reconstruction import TrackReconstructionTask
    from .set_criterion import SetCriterionWeights

    t = cfg["task"]
    try:
        weights = SetCriterionWeights(t["w_class"], t["w_focal"], t["w_dice"], t["focal_alpha"], t["focal_gamma"],
                                      t["no_object"])
    except ValueError as exc:  # name the config key, not the dataclass field
        msg = str(exc)
        for field, key in _WEIGHT_KEYS.items():
            msg = msg.replace(f"SetCriterionWeights.{field}", key)
        raise ValueError(msg) from None
    return TrackReconstructionTask(weights, t["min_hits"], t["pt_min"], t["hit_weight"], t["embed_weight"],
                                   t["param_weight"], t["similarity"], t["tau"], t["sigma"], t["random_pairs"],
                                   t["match_pt_min"], t["match_eta_max"], t["hit_pt_min"])


def _validate_reconstruction(cfg: Mapping[str, Any]) -> None:
    _validate(cfg)   # the data section and the shared task keys
    try:
        _build_reconstruction(cfg)
    except ValueError as exc:
        raise ValueError(f"task.{str(exc).splitlines()[0]}") from None


def _load_reconstruction(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list]:
    """As the tracking task's; training clouds carry labelled pairs only when the InfoNCE term is on."""
    return _load(cfg, splits, progress, pairs=cfg["task"]["embed_weight"] > 0)


RECONSTRUCTION_SPEC = register_task(TaskSpec(
    name="track-reconstruction",
    description="end-to-end tracking: an encoder and a track-slot decoder from hits to track labels, "
                "scored by the TrackML score and track matching",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema={**_TASK_SCHEMA, **_RECO_OWN_SCHEMA}, task_defaults={**_TASK_DEFAULTS, **_RECO_OWN_DEFAULTS},
    load=_load_reconstruction, build=_build_reconstruction, metric="trackml_score", mode="max",
    validate=_validate_reconstruction, generate=_generate, default_model="track-reconstruction",
    moved_keys={"merge_max_hits": "merge_max_hits"},
))

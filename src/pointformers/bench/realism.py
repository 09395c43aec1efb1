"""How realistic are the generated tracking events? One command measures it and writes the docs.

``python -m pointformers.bench.realism --write docs/realism.md [--real FOLDER [--detectors FILE]]
[--events N] [--seed S] [--quick]`` measures, on events of :mod:`pointformers.data.tracking`:

1. **The published checkpoint on generated data** (section ``realism-checkpoint``): the HEPT
   authors' ``hept-tracking-60k`` model (:func:`~pointformers.trackml_eval.open_tracking_checkpoint`)
   on whole ``tracking-60k`` events (one cloud per event) and on the φ-sectors of ``tracking-6k``
   events (:func:`~pointformers.data.tracking.split_sectors`, one cloud per sector): AP@k
   (:func:`~pointformers.tasks.tracking.training.evaluate_embeddings`, queries pT > 0.9 GeV, K = 19),
   the TrackML score of DBSCAN tracks and the track-matching efficiencies, fake and duplicate rates
   (:mod:`~pointformers.tasks.tracking.metrics`), exactly as ``pointformers evaluate --data`` computes
   them. DBSCAN runs with the reference radius :data:`~pointformers.trackml_eval.REFERENCE_EPS` and
   with a radius chosen on separate generated validation events; beside it the kNN-in-(η, φ)
   baseline of the tracking task (:func:`~pointformers.tasks.tracking.training.knn_baseline_metrics`)
   on the same clouds, its radius chosen on the same validation events.
2. **The acceptance measurement** (section ``realism-acceptance``): generated ``tracking-60k``
   events cut down as the public real TrackML subset was made: ``--subset-particles`` (548) random
   particles among those that leave pixel hits, all their pixel hits, and noise hits drawn at random
   at the real sample's share (measured on ``--real``, else :data:`REAL_NOISE_SHARE`). The checkpoint's
   AP@k on them and, with ``--real``, on the real events read by
   :func:`~pointformers.data.trackml.read_trackml_events`, and the ratio generated / real
   (target: >= :data:`TARGET_RATIO`).
3. **Feature distributions** (section ``realism-features``): the 15 model inputs
   (:data:`~pointformers.tasks.tracking.TRACKING_FEATURES`) of the generated subsets, histograms in a
   PNG next to the markdown file (the real events' overlaid with ``--real``) and a table of median,
   10 % and 90 % quantiles and the two-sample Kolmogorov–Smirnov statistic generated vs real.

Each section replaces its ``<!-- name:begin -->`` / ``<!-- name:end -->`` block of the file
(:func:`~.harness.write_section`) and names the command, the machine, the generator version
(:data:`~pointformers.data.tracking.GENERATOR_VERSION`) and the date. The real files stay where
the user keeps them: the document records the command with ``FOLDER`` / ``FILE`` in place of their
paths. The default run (2 events per preset) takes a few minutes on one CPU core; ``--quick``
(small μ = 5 events, 100-particle subsets) takes seconds and is what the tests run.

:func:`main` returns the measured numbers (the dict the document is written from).
"""
from __future__ import annotations

import argparse
import datetime
import io
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .harness import machine, recorded_command, write_section

__all__ = ["SUBSET_PARTICLES", "REAL_NOISE_SHARE", "TARGET_RATIO", "CHECKPOINT", "SECTIONS", "RealismConfig",
           "config_from_args", "generated_events", "subset_event", "generated_subsets", "read_real_events",
           "sample_stats", "evaluate_clouds", "ks_critical", "checkpoint_section", "acceptance_section", "feature_table",
           "plot_features", "run", "main"]

#: Particles in the public real TrackML subset the acceptance measurement imitates.
SUBSET_PARTICLES = 548
#: Noise share of the pixel hits of that subset (152 of 2,783), used when no real sample is given.
REAL_NOISE_SHARE = 152 / 2783
#: The issue's acceptance target: AP@k on generated subsets / AP@k on real ones.
TARGET_RATIO = 0.8
#: The checkpoint measured.
CHECKPOINT = "hept-tracking-60k"
#: Section names written into the markdown file.
SECTIONS = ("realism-checkpoint", "realism-acceptance", "realism-features")
#: How the real sample is named in the document (its path never is).
REAL_LABEL = "a real TrackML subset (user-provided)"

_PT_MIN, _K = 0.9, 19
_QUICK_MU = 5.0
_QUICK_SUBSET_PARTICLES = 100


# ------------------------------------------------------------------------------ configuration
@dataclass
class RealismConfig:
    """What one run measures (see the module docstring; :func:`config_from_args` builds it).

    Attributes:
        events: generated events per preset that are evaluated (``--events``).
        seed: generator seed (``--seed``); evaluated events have ids ``0..events-1``, validation
            events the next ``validation_events`` ids.
        validation_events: events per preset on which the DBSCAN radii are chosen.
        subsets: subsets cut from each evaluated ``tracking-60k`` event (``--subsets``).
        subset_particles: particles per subset (``--subset-particles``).
        noise_share: noise share of a subset's hits; None = the real sample's, else
            :data:`REAL_NOISE_SHARE`.
        real: folder of real TrackML events (``--real``) or None; detectors: its ``detectors.csv``.
        quick: small events (μ = 5) for tests.
        device: where the checkpoint runs.
    """

    events: int = 2
    seed: int = 0
    validation_events: int = 1
    subsets: int = 10
    subset_particles: int = SUBSET_PARTICLES
    noise_share: float | None = None
    real: str | None = None
    detectors: str | None = None
    quick: bool = False
    device: str = "cpu"
    presets: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, arg, lo in (("events", "--events", 1), ("validation_events", "--validation-events", 1),
                              ("subsets", "--subsets", 1), ("subset_particles", "--subset-particles", 1),
                              ("seed", "--seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"{arg}: expected an integer >= {lo}, got {v!r}")
        if self.noise_share is not None and not (isinstance(self.noise_share, (int, float))
                                                 and math.isfinite(self.noise_share) and 0 <= self.noise_share < 1):
            raise ValueError(f"--noise-share: expected a number in [0, 1), got {self.noise_share!r}")
        if self.device not in ("cpu", "cuda", "auto") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"--device: expected cpu, cuda, cuda:K or auto, got {self.device!r}")
        if self.detectors is not None and self.real is None:
            raise ValueError("--detectors: only used with --real FOLDER")
        if self.real is not None:
            from ..trackml_eval import check_event_folder

            check_event_folder(self.real, truth=True, detectors=self.detectors, arg="--real")
        if not self.presets:
            from ..data.tracking import preset_params

            extra = {"mu": _QUICK_MU} if self.quick else {}
            self.presets = {"tracking-60k": preset_params("tracking-60k", **extra),
                            "tracking-6k": preset_params("tracking-6k", **extra)}


def _int_arg(text: str, arg: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{arg}: expected an integer, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pointformers.bench.realism",
                                description="Measure how realistic the generated tracking events are and write "
                                            "the realism sections of a markdown file.")
    p.add_argument("--write", metavar="PATH", help="markdown file to update (PNGs go next to it); default: print")
    p.add_argument("--real", metavar="FOLDER", help="folder of real labelled TrackML events to compare with")
    p.add_argument("--detectors", metavar="FILE", help="detectors.csv of the real events (default: looked for "
                                                       "next to them)")
    p.add_argument("--events", default=None, help="generated events per preset (default 2; quick 1)")
    p.add_argument("--seed", default="0", help="generator seed (default 0)")
    p.add_argument("--subsets", default=None, help="subsets per generated event (default 10; quick 2)")
    p.add_argument("--subset-particles", default=None,
                   help=f"particles per subset (default {SUBSET_PARTICLES}; quick {_QUICK_SUBSET_PARTICLES})")
    p.add_argument("--noise-share", default=None, help="noise share of a subset's hits (default: the real "
                                                       f"sample's, without --real {REAL_NOISE_SHARE:.4f})")
    p.add_argument("--device", default="cpu", help="where the checkpoint runs: cpu (default), cuda, auto")
    p.add_argument("--quick", action="store_true", help="a few small events (μ = 5), for tests")
    return p


def config_from_args(argv: Sequence[str]) -> tuple[RealismConfig, argparse.Namespace]:
    """Parse command-line arguments into a checked :class:`RealismConfig` (ValueError names the flag)."""
    a = _parser().parse_args(list(argv))
    quick = bool(a.quick)
    noise = None
    if a.noise_share is not None:
        try:
            noise = float(a.noise_share)
        except ValueError:
            raise ValueError(f"--noise-share: expected a number in [0, 1), got {a.noise_share!r}") from None
    if a.write is not None and (a.write == "" or Path(a.write).is_dir()):
        raise ValueError(f"--write: expected a markdown file path, got {a.write!r}")
    cfg = RealismConfig(
        events=_int_arg(a.events, "--events") if a.events is not None else (1 if quick else 2),
        seed=_int_arg(a.seed, "--seed"),
        subsets=_int_arg(a.subsets, "--subsets") if a.subsets is not None else (2 if quick else 10),
        subset_particles=(_int_arg(a.subset_particles, "--subset-particles") if a.subset_particles is not None
                          else (_QUICK_SUBSET_PARTICLES if quick else SUBSET_PARTICLES)),
        noise_share=noise, real=a.real, detectors=a.detectors, quick=quick, device=a.device)
    return cfg, a


def _command(argv: Sequence[str]) -> str:
    """The command line as the document records it: the real sample's paths replaced."""
    return recorded_command("pointformers.bench.realism", argv, {"--real": "FOLDER", "--detectors": "FILE"})


# ------------------------------------------------------------------------------ data
def generated_events(cfg: RealismConfig, preset: str, validation: bool = False) -> list:
    """The evaluated (ids ``0..events-1``) or validation (the next ids) events of ``preset``."""
    from ..data.tracking import generate_event

    ids = range(cfg.events, cfg.events + cfg.validation_events) if validation else range(cfg.events)
    return [generate_event(cfg.presets[preset], cfg.seed, event_id=i) for i in ids]


def subset_event(event, n_particles: int, noise_share: float, rng: np.random.Generator):
    """``event`` cut down as the real TrackML subset was made: ``n_particles`` random particles
    among those with hits in ``event``, all their hits, and random noise hits so that noise is
    ``noise_share`` of the result's hits (rounded). Hits keep the event's order.

    Raises:
        ValueError naming ``--subset-particles`` / ``--noise-share`` when the event has too few
        particles or noise hits.
    """
    pid = np.asarray(event.particle_id, np.int64)
    ids = np.unique(pid[pid > 0])
    if n_particles > ids.size:
        raise ValueError(f"--subset-particles: {n_particles} requested but only {ids.size} particles leave hits "
                         f"in generated event {event.event_id}")
    chosen = rng.choice(ids, n_particles, replace=False)
    keep = np.isin(pid, chosen)
    n_noise = int(round(noise_share / (1.0 - noise_share) * int(keep.sum())))
    noise = np.flatnonzero(pid == 0)
    if n_noise > noise.size:
        raise ValueError(f"--noise-share: {n_noise} noise hits needed but generated event {event.event_id} has "
                         f"only {noise.size}")
    keep[rng.choice(noise, n_noise, replace=False)] = True
    return event.subset(keep, np.isin(np.asarray(event.particles_id, np.int64), chosen))


def generated_subsets(cfg: RealismConfig, noise_share: float, events: Sequence | None = None) -> list:
    """``cfg.subsets`` subsets (:func:`subset_event`) of each evaluated ``tracking-60k`` event, in order
    (event, subset); subset k of event i draws from ``default_rng([seed, i, k])``."""
    events = generated_events(cfg, "tracking-60k") if events is None else events
    out = []
    for i, ev in enumerate(events):
        for k in range(cfg.subsets):
            out.append(subset_event(ev, cfg.subset_particles, noise_share,
                                    np.random.default_rng([cfg.seed, i, k])))
    return out


def read_real_events(cfg: RealismConfig) -> list:
    """Every labelled event of ``cfg.real`` (pixel hits, noise included); [] without ``--real``."""
    if cfg.real is None:
        return []
    from ..data.trackml import read_trackml_events

    return list(read_trackml_events(cfg.real, detectors=cfg.detectors, truth=True))


def sample_stats(events: Sequence) -> dict[str, float]:
    """Events, mean pixel hits and particles with hits per event, hits per particle and the noise
    share of a list of events."""
    hits = [e.num_hits for e in events]
    parts = [int(np.unique(e.particle_id[e.particle_id > 0]).size) for e in events]
    noise = sum(int((e.particle_id == 0).sum()) for e in events)
    particle_hits = sum(int((e.particle_id > 0).sum()) for e in events)
    return {"events": len(events), "hits": float(np.mean(hits)) if hits else float("nan"),
            "particles": float(np.mean(parts)) if parts else float("nan"),
            "hits_per_particle": particle_hits / sum(parts) if sum(parts) else float("nan"),
            "noise_share": noise / sum(hits) if sum(hits) else float("nan")}


# ------------------------------------------------------------------------------ measurements
def _clouds(events: Sequence, n_sectors: int) -> list:
    from ..data.tracking import split_sectors
    from ..tasks.tracking.training import prepare_tracking_clouds

    parts = [c for ev in events for c in (split_sectors(ev, n_sectors) if n_sectors > 1 else [ev])]
    return prepare_tracking_clouds(parts, with_pairs=False)


def evaluate_clouds(embeddings: Sequence[torch.Tensor], clouds: Sequence, eps: float) -> dict[str, float]:
    """AP@k, precision@K, recall@K (mean over clouds), the TrackML score of DBSCAN(``eps``) tracks
    (mean over clouds) and the pooled track-matching rates, as ``pointformers evaluate`` reports."""
    from ..tasks.tracking.building import dbscan_tracks
    from ..tasks.tracking.metrics import OVERALL_KEYS
    from ..tasks.tracking.trackml_score import trackml_score, trackml_score_split
    from ..tasks.tracking.training import cloud_truth_weights, evaluate_embeddings, track_matching_report
    from ..trackml_eval import DBSCAN_MIN_SAMPLES

    out = evaluate_embeddings(embeddings, clouds, _PT_MIN, _K)
    labels = [dbscan_tracks(e, eps, DBSCAN_MIN_SAMPLES) for e in embeddings]
    out["trackml_score"] = trackml_score_split(
        [trackml_score(lab, c.inputs.particle_id, cloud_truth_weights(c)) for lab, c in zip(labels, clouds)])
    report = track_matching_report(labels, clouds)
    out.update({k: float(report["overall"][k]) for k in OVERALL_KEYS})
    out["dbscan_eps"] = float(eps)
    out["clouds"] = len(clouds)
    out["hits"] = float(np.mean([c.num_hits for c in clouds]))
    return out


def _choose_eps(embeddings: Sequence[torch.Tensor], clouds: Sequence) -> float:
    from ..tasks.tracking.building import choose_dbscan_eps
    from ..tasks.tracking.training import cloud_truth_weights
    from ..trackml_eval import DBSCAN_MIN_SAMPLES

    return choose_dbscan_eps(embeddings, [c.inputs.particle_id for c in clouds],
                             [cloud_truth_weights(c) for c in clouds], min_samples=DBSCAN_MIN_SAMPLES).eps


def _embed(tm, clouds: Sequence) -> list[torch.Tensor]:
    from ..tasks.tracking.training import TrackingTask

    with tm.autocast():
        return TrackingTask(pt_min=_PT_MIN, K=_K).embed(tm.model, clouds)


def checkpoint_section(cfg: RealismConfig, tm, say: Callable[[str], None] = lambda s: None,
                       events60: Sequence | None = None) -> dict[str, Any]:
    """Part 1: per preset (``tracking-60k`` whole events, ``tracking-6k`` φ-sectors) the rows
    ``checkpoint`` (eps = REFERENCE_EPS), ``checkpoint_val`` (eps chosen on validation events) and
    ``knn`` (kNN in (η, φ), AP@k of :func:`knn_baseline_metrics`, eps chosen on validation events)."""
    from ..tasks.tracking import knn_eta_phi_embedding
    from ..trackml_eval import REFERENCE_EPS

    out: dict[str, Any] = {}
    for preset in ("tracking-60k", "tracking-6k"):
        t0 = time.perf_counter()
        n_sec = cfg.presets[preset].n_sectors
        evs = events60 if (preset == "tracking-60k" and events60 is not None) else generated_events(cfg, preset)
        clouds = _clouds(evs, n_sec)
        val = _clouds(generated_events(cfg, preset, validation=True), n_sec)
        emb, val_emb = _embed(tm, clouds), _embed(tm, val)
        knn_emb = [knn_eta_phi_embedding(c.inputs) for c in clouds]
        knn_val = [knn_eta_phi_embedding(c.inputs) for c in val]
        rows = {"checkpoint": evaluate_clouds(emb, clouds, REFERENCE_EPS),
                "checkpoint_val": evaluate_clouds(emb, clouds, _choose_eps(val_emb, val))}
        # AP@k of these embeddings is the task's knn_baseline_metrics (same embedding, same function).
        rows["knn"] = knn = evaluate_clouds(knn_emb, clouds, _choose_eps(knn_val, val))
        out[preset] = {"rows": rows, "events": len(evs), "sectors": n_sec, "seconds": time.perf_counter() - t0}
        say(f"{preset}: {len(clouds)} clouds, checkpoint AP@k {rows['checkpoint']['ap@k']:.4f}, "
            f"kNN AP@k {knn['ap@k']:.4f} ({out[preset]['seconds']:.0f} s)")
    return out


def _ap_at_k(tm, events: Sequence) -> list[float]:
    """Per event (one cloud each) the checkpoint's AP@k (NaN where no hit qualifies)."""
    from ..tasks.tracking.training import evaluate_embeddings

    clouds = _clouds(events, 1)
    emb = _embed(tm, clouds)
    return [evaluate_embeddings([e], [c], _PT_MIN, _K)["ap@k"] for e, c in zip(emb, clouds)]


def acceptance_section(cfg: RealismConfig, tm, subsets: Sequence, real: Sequence, noise_share: float) -> dict:
    """Part 2: the checkpoint's AP@k per generated subset and per real event, their means
    (:func:`~pointformers.tasks.tracking.ap_at_k_split`) and the ratio generated / real."""
    from ..tasks.tracking import ap_at_k_split

    gen = _ap_at_k(tm, subsets)
    out = {"generated": gen, "generated_ap": ap_at_k_split(gen), "generated_stats": sample_stats(subsets),
           "noise_share": noise_share, "real": None, "real_ap": float("nan"), "ratio": float("nan"),
           "real_stats": None}
    finite = [v for v in gen if not math.isnan(v)]
    out["generated_std"] = float(np.std(finite)) if finite else float("nan")
    if real:
        r = _ap_at_k(tm, real)
        out.update(real=r, real_ap=ap_at_k_split(r), real_stats=sample_stats(real))
        out["ratio"] = out["generated_ap"] / out["real_ap"] if out["real_ap"] > 0 else float("nan")
    return out


def _features(events: Sequence) -> np.ndarray:
    from ..tasks.tracking import tracking_inputs

    xs = [tracking_inputs(e).x.numpy() for e in events]
    return np.concatenate(xs).astype(np.float64) if xs else np.zeros((0, 15))


def feature_table(gen: np.ndarray, real: np.ndarray | None) -> list[dict[str, Any]]:
    """Per model input: name, generated (and real) median / 10 % / 90 % quantiles, and the
    two-sample Kolmogorov–Smirnov statistic (sup |F_gen − F_real|; None without real data)."""
    from scipy.stats import ks_2samp

    from ..tasks.tracking import TRACKING_FEATURES

    rows = []
    for j, name in enumerate(TRACKING_FEATURES):
        g = gen[:, j]
        row: dict[str, Any] = {"feature": name, "gen_median": float(np.median(g)),
                               "gen_q10": float(np.quantile(g, 0.1)), "gen_q90": float(np.quantile(g, 0.9)),
                               "real_median": None, "real_q10": None, "real_q90": None, "ks": None}
        if real is not None and len(real):
            r = real[:, j]
            row.update(real_median=float(np.median(r)), real_q10=float(np.quantile(r, 0.1)),
                       real_q90=float(np.quantile(r, 0.9)), ks=float(ks_2samp(g, r).statistic))
        rows.append(row)
    return rows


def ks_critical(n: int, m: int, alpha: float = 0.05) -> float:
    """Asymptotic critical value of the two-sample KS statistic for samples of ``n`` and ``m``
    independent values: ``sqrt(-ln(alpha/2)/2 · (n + m)/(n m))`` (1.358·… at alpha = 0.05)."""
    return math.sqrt(-math.log(alpha / 2) / 2 * (n + m) / (n * m))


def plot_features(gen: np.ndarray, real: np.ndarray | None, path: str | os.PathLike, title: str) -> Path:
    """A 3 × 5 grid of normalised histograms of the 15 model inputs (generated filled, real as a
    line), written atomically to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..files import atomic_write
    from ..tasks.tracking import TRACKING_FEATURES

    fig, axes = plt.subplots(3, 5, figsize=(17, 9.5))
    for j, (ax, name) in enumerate(zip(axes.flat, TRACKING_FEATURES)):
        g = gen[:, j]
        both = g if real is None or not len(real) else np.concatenate([g, real[:, j]])
        lo, hi = np.quantile(both, [0.002, 0.998])
        if not hi > lo:
            lo, hi = float(both.min()) - 0.5, float(both.max()) + 0.5
        bins = np.linspace(lo, hi, 51)
        ax.hist(np.clip(g, lo, hi), bins=bins, density=True, color="tab:blue", alpha=0.45,
                label=f"generated ({len(g):,} hits)")
        if real is not None and len(real):
            ax.hist(np.clip(real[:, j], lo, hi), bins=bins, density=True, histtype="step", color="tab:red", lw=1.4,
                    label=f"real ({len(real):,} hits)")
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return atomic_write(path, lambda f: f.write(buf.getvalue()))  # with the user's umask


# ------------------------------------------------------------------------------ markdown
def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _f(v: Any, spec: str = ".4f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


_ROW_LABELS = {"checkpoint": "HEPT checkpoint, eps = REFERENCE_EPS",
               "checkpoint_val": "HEPT checkpoint, eps chosen on generated validation",
               "knn": "kNN in (η, φ), eps chosen on generated validation"}
_METRIC_COLS = (("AP@k", "ap@k"), ("prec@K", "precision@K"), ("rec@K", "recall@K"), ("TrackML", "trackml_score"),
                ("eff DM", "eff_dm"), ("eff perfect", "eff_perfect"), ("eff LHC", "eff_lhc"), ("fake DM", "fake_dm"),
                ("dup LHC", "dup_lhc"), ("DBSCAN eps", "dbscan_eps"))


def _header(res: dict) -> str:
    from ..data.tracking import GENERATOR_VERSION

    return (f"Run {res['date']}, {'quick mode' if res['quick'] else 'full run'}, {res['seconds']:.0f} s. "
            f"Machine: {res['machine']}; checkpoint on {res['device']}. Generator version {GENERATOR_VERSION}, "
            f"seed {res['seed']}.")


def _checkpoint_text(res: dict) -> str:
    lines = [_header(res), "",
             f"The HEPT authors' published `{CHECKPOINT}` checkpoint on generated events, beside the tracking "
             "task's kNN-in-(η, φ) baseline on the same clouds. AP@k, precision@K and recall@K: queries are "
             f"reconstructable hits with pT > {_PT_MIN} GeV, K = {_K}, mean over clouds. TrackML: the score of "
             "DBSCAN tracks (min_samples 2), mean over clouds. Track matching (DBSCAN tracks of >= 3 hits, "
             "particles with pT >= 0.9 GeV, |η| < 4, >= 3 layers; counts pooled over clouds): efficiencies "
             "(double majority, perfect, LHC), fake rate (DM) and duplicate rate (LHC). The DBSCAN radius: "
             "`REFERENCE_EPS` of `pointformers.trackml_eval` (chosen on overlaid real events), or chosen by "
             "TrackML score on separate generated validation events (ids after the evaluated ones).", ""]
    for preset, part in res["checkpoint"].items():
        rows = part["rows"]
        any_row = next(iter(rows.values()))
        what = ("whole events, one cloud per event" if part["sectors"] == 1
                else f"{part['sectors']} φ-sectors per event (`split_sectors`), one cloud per sector")
        lines += [f"**`{preset}`** ({'μ = ' + format(_QUICK_MU, 'g') + ', ' if res['quick'] else ''}"
                  f"{_n(part['events'], 'event')}, {what}: {_n(any_row['clouds'], 'cloud')} of "
                  f"{any_row['hits']:,.0f} hits "
                  f"on average; {part['seconds']:.0f} s)", "",
                  "| method | " + " | ".join(h for h, _ in _METRIC_COLS) + " |",
                  "|---|" + "---:|" * len(_METRIC_COLS)]
        for key, r in rows.items():
            lines.append(f"| {_ROW_LABELS[key]} | " + " | ".join(_f(r[k]) for _, k in _METRIC_COLS) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _stats_sentence(s: dict) -> str:
    return (f"{s['events']} events, {s['hits']:,.0f} pixel hits and {s['particles']:,.0f} particles with hits "
            f"per event on average, noise {100 * s['noise_share']:.1f} % of hits")


def _acceptance_text(res: dict) -> str:
    a = res["acceptance"]
    cfg = res["config"]
    g = a["generated_stats"]
    lines = [_header(res), "",
             f"Generated `tracking-60k` events cut down as the real TrackML subset was made: {cfg['subset_particles']} "
             f"random particles among those that leave pixel hits, all their hits, plus random noise hits at "
             f"{100 * a['noise_share']:.2f} % of the hits "
             f"({'the real sample' + chr(39) + 's share' if cfg['noise_from_real'] else 'given share' if cfg['noise_given'] else 'the share measured on the public real subset, 152 of 2,783'}); "
             f"{_n(cfg['subsets'], 'subset')} per event, {g['events']} in all. AP@k of the `{CHECKPOINT}` checkpoint "
             "(one cloud per event or subset, queries pT > 0.9 GeV, K = 19), mean over the events of each "
             "sample. Particles / event counts the particles that leave pixel hits (a real sample's particle "
             "table may also list particles whose hits are all outside the pixel volumes); "
             "`--subset-particles` sets the generated count.", "",
             "| sample | events | hits / event | particles / event | hits / particle | noise share | AP@k |",
             "|---|---:|---:|---:|---:|---:|---:|",
             f"| generated subsets | {g['events']} | {g['hits']:,.0f} | {g['particles']:,.0f} | "
             f"{_f(g['hits_per_particle'], '.2f')} | {_f(g['noise_share'])} | {_f(a['generated_ap'])} |"]
    if a["real_stats"] is not None:
        r = a["real_stats"]
        lines.append(f"| {REAL_LABEL} | {r['events']} | {r['hits']:,.0f} | {r['particles']:,.0f} | "
                     f"{_f(r['hits_per_particle'], '.2f')} | {_f(r['noise_share'])} | {_f(a['real_ap'])} |")
        met = math.isfinite(a["ratio"]) and a["ratio"] >= TARGET_RATIO
        lines += ["", f"AP@k ratio generated / real: **{_f(a['ratio'])}** (target >= {TARGET_RATIO}: "
                      f"{'met' if met else 'NOT met'}). Per generated subset: "
                      + ", ".join(_f(v) for v in a["generated"]) + f" (std {_f(a['generated_std'])}); per real "
                      "event: " + ", ".join(_f(v) for v in a["real"]) + "."]
    else:
        lines += ["", "No real sample given (`--real FOLDER`): the ratio generated / real is not measured. "
                      "Per generated subset: " + ", ".join(_f(v) for v in a["generated"]) + "."]
    return "\n".join(lines) + "\n"


def _features_text(res: dict, png: str | None) -> str:
    rows = res["features"]
    real = res["acceptance"]["real_stats"] is not None
    lines = [_header(res), "",
             "The 15 model inputs (`tracking_inputs(event).x`, in `TRACKING_FEATURES` order, as the model sees them: "
             "r/1000, φ/π, z/1000, η, u·1000, v·1000, cluster features, layer/10) of the generated subsets of the "
             "acceptance section" + (f" against {REAL_LABEL}" if real else "") + ": median and 10 % / 90 % quantiles"
             + (", and the two-sample Kolmogorov–Smirnov statistic (largest gap between the two cumulative "
                "distributions; 0 = identical)." if real else "."), ""]
    if real:
        lines += ["| feature | gen median | real median | gen q10 | real q10 | gen q90 | real q90 | KS |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['feature']} | {_f(r['gen_median'])} | {_f(r['real_median'])} | {_f(r['gen_q10'])} | "
                         f"{_f(r['real_q10'])} | {_f(r['gen_q90'])} | {_f(r['real_q90'])} | {_f(r['ks'])} |")
    else:
        lines += ["| feature | gen median | gen q10 | gen q90 |", "|---|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['feature']} | {_f(r['gen_median'])} | {_f(r['gen_q10'])} | {_f(r['gen_q90'])} |")
    if real:
        worst = sorted(rows, key=lambda r: -r["ks"])[:3]
        n, m = res["feature_arrays"][0].shape[0], res["feature_arrays"][1].shape[0]
        lines += ["", "Largest KS distances: " + ", ".join(f"`{r['feature']}` {_f(r['ks'])}" for r in worst)
                  + f". With {n:,} generated and {m:,} real hits, two samples of one distribution give a KS "
                  f"distance above {_f(ks_critical(n, m))} in 5 % of draws (asymptotic; hits of one particle are "
                  "correlated, so the real spread is somewhat larger)."]
    if png:
        lines += ["", f"![model-input histograms]({png})"]
    return "\n".join(lines) + "\n"


_INTRO = """# Realism of the generated tracking events

How close are the events of `pointformers.data.tracking` to real TrackML events, measured the way a
physicist would: the HEPT authors' published checkpoint (trained on real TrackML events) run on them,
and the model inputs compared feature by feature with a real sample. Every section below is written
by one command, which it names together with the machine, the generator version and the date:

```
python -m pointformers.bench.realism --write docs/realism.md --real FOLDER --detectors FILE
```

`FOLDER` is the user's own folder of labelled real TrackML events (for example a subset of the
challenge's training data); it is read in place, never copied here, and named below only as
"a real TrackML subset (user-provided)". Without `--real` the generated side is measured alone.
`--events N` (default 2), `--seed S`, `--subsets`, `--subset-particles`, `--noise-share` change the
sample; `--quick` runs small events in seconds.
"""


# ------------------------------------------------------------------------------ driver
def run(cfg: RealismConfig, say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Measure everything (parts 1–3 of the module docstring); returns the numbers."""
    from ..trackml_eval import open_tracking_checkpoint

    t0 = time.perf_counter()
    tm = open_tracking_checkpoint(CHECKPOINT, device=cfg.device)
    real = read_real_events(cfg)
    if cfg.noise_share is not None:
        noise_share = float(cfg.noise_share)
    elif real:
        noise_share = sample_stats(real)["noise_share"]
    else:
        noise_share = REAL_NOISE_SHARE
    events60 = generated_events(cfg, "tracking-60k")
    subsets = generated_subsets(cfg, noise_share, events60)
    say(f"{len(subsets)} generated subsets, {len(real)} real events")
    acc = acceptance_section(cfg, tm, subsets, real, noise_share)
    say(f"acceptance: generated AP@k {acc['generated_ap']:.4f}, real {acc['real_ap']:.4f}, ratio {acc['ratio']:.4f}")
    gen_x = _features(subsets)
    real_x = _features(real) if real else None
    ckpt = checkpoint_section(cfg, tm, say, events60)
    return {"checkpoint": ckpt, "acceptance": acc, "features": feature_table(gen_x, real_x),
            "feature_arrays": (gen_x, real_x), "seed": cfg.seed, "quick": cfg.quick, "device": str(tm.device),
            "machine": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": time.perf_counter() - t0,
            "config": {"events": cfg.events, "subsets": cfg.subsets, "subset_particles": cfg.subset_particles,
                       "noise_given": cfg.noise_share is not None,
                       "noise_from_real": cfg.noise_share is None and bool(real)}}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point (see the module docstring); returns :func:`run`'s numbers plus
    ``"sections"`` (name -> markdown text) and ``"png"`` (the plot's path or None)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, a = config_from_args(argv)
    command = _command(argv)
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    res = run(cfg, say)
    png = None
    if a.write:
        doc = Path(a.write)
        png = doc.with_name(f"{doc.stem}_features.png")
        gen_x, real_x = res["feature_arrays"]
        plot_features(gen_x, real_x, png,
                      f"Model inputs: generated subsets (generator version {_generator_version()})"
                      + (f" vs {REAL_LABEL}" if real_x is not None else ""))
    sections = {"realism-checkpoint": _checkpoint_text(res), "realism-acceptance": _acceptance_text(res),
                "realism-features": _features_text(res, png.name if png else None)}
    if a.write:
        if not doc.exists():
            doc.parent.mkdir(parents=True, exist_ok=True)
            doc.write_text(_INTRO)
        for name, text in sections.items():
            write_section(str(doc), name, text, command)
        say(f"wrote {', '.join(sections)} of {doc} and {png}")
    else:
        for name, text in sections.items():
            print(f"## {name}\n\nGenerated by `{command}`.\n\n{text}")
    res["sections"], res["png"] = sections, png
    return res


def _generator_version() -> int:
    from ..data.tracking import GENERATOR_VERSION

    return GENERATOR_VERSION


if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:
        sys.exit(f"error: {exc}")

"""Track-parameter resolution plots of the end-to-end model (``pointformers evaluate --plot FILE``).

Four panels from the double-majority matched tracks of selected particles
(:meth:`~.reconstruction.TrackReconstructionTask.evaluate_report` keeps their predicted and true
parameters in ``param_pairs``): the distributions of pT_pred / pT_true − 1, of η_pred − η_true and of
φ_pred − φ_true (wrapped), each with its robust width (1.4826 × MAD, the number ``evaluate``
reports), and the pT resolution in bins of true pT; with ``fitted``, the same from the helix fit of
the same tracks' hits (:mod:`.track_fit`) beside them. The model's parameters are, with its ``param_fit``,
the fit of the hits its slot claims where there are three or more (before merging), its head's elsewhere. Drawn on matplotlib's Agg canvas (no pyplot),
written atomically.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ...files import atomic_write
from .track_fit import robust_width

__all__ = ["draw_resolutions", "PT_BINS"]

#: True-pT bin edges [GeV] of the resolution-against-pT panel (the last bin is open).
PT_BINS = (0.9, 1.5, 3.0, 10.0, np.inf)


def draw_resolutions(predicted: Mapping[str, np.ndarray], truth: Mapping[str, np.ndarray],
                     path: str | os.PathLike, title: str = "", dpi: int = 110,
                     fitted: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write the resolution panels of tracks with ``predicted`` and ``truth`` parameters (``pt``, ``eta``,
    ``phi`` arrays ``(T,)``, ``charge`` optional) to ``path`` (PNG); ``fitted``: a second estimate of the same
    tracks' parameters (the helix fit), drawn beside. Returns ``path`` as a Path.

    Raises ValueError (naming the argument) when there is no track or the arrays disagree in length."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    for name, d in (("predicted", predicted), ("truth", truth)) + ((("fitted", fitted),) if fitted is not None else ()):
        missing = {"pt", "eta", "phi"} - set(d)
        if missing:
            raise ValueError(f"{name}: missing {sorted(missing)}")
    n = len(truth["pt"])
    if n == 0:
        raise ValueError("truth: no matched track to plot (no double-majority match of a selected particle)")
    sets = [d for d in (predicted, fitted) if d is not None]
    if any(len(d[k]) != n for d in (*sets, truth) for k in ("pt", "eta", "phi")):
        raise ValueError("predicted, truth, fitted: every array needs one entry per track")
    pt_t = np.asarray(truth["pt"], dtype=np.float64)

    def residuals(d: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"pT_pred / pT_true − 1": np.asarray(d["pt"], dtype=np.float64) / pt_t - 1,
                "η_pred − η_true": np.asarray(d["eta"], dtype=np.float64) - np.asarray(truth["eta"], dtype=np.float64),
                "φ_pred − φ_true": np.angle(np.exp(1j * (np.asarray(d["phi"], dtype=np.float64)
                                                         - np.asarray(truth["phi"], dtype=np.float64))))}
    all_res = [residuals(d) for d in sets]
    names = ["model", "helix fit of the track"][:len(sets)]
    colours = ["tab:blue", "tab:orange"]
    fig = Figure(figsize=(12.6, 3.2), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4)
    for ax, label in zip(axes, all_res[0]):
        ws = [robust_width(r[label]) for r in all_res]
        finite = np.concatenate([r[label][np.isfinite(r[label])] for r in all_res])
        w = max((x for x in ws if np.isfinite(x) and x > 0), default=float("nan"))
        lim = 5 * w if np.isfinite(w) else (np.abs(finite).max() if finite.size else 1.0)
        for r, name, colour in zip(all_res, names, colours):
            v = r[label][np.isfinite(r[label])]
            ax.hist(np.clip(v, -lim, lim), bins=40, range=(-lim, lim), color=colour, alpha=0.6,
                    label=f"{name}: width {robust_width(v):.3g}" if len(all_res) > 1 else None)
        ax.set_title(f"{label}\nwidth {ws[0]:.3g} ({int(np.isfinite(all_res[0][label]).sum())} tracks)"
                     if len(all_res) == 1 else f"{label} ({n} tracks)", fontsize=9)
        if len(all_res) > 1:
            ax.legend(fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    ax = axes[3]
    labels = [f"{lo:g}–{hi:g}" if np.isfinite(hi) else f"≥ {lo:g}" for lo, hi in zip(PT_BINS[:-1], PT_BINS[1:])]
    bins = [(pt_t >= lo) & (pt_t < hi) for lo, hi in zip(PT_BINS[:-1], PT_BINS[1:])]
    shown = [i for i, sel in enumerate(bins) if sel.sum() >= 3]
    step = 0.8 / len(all_res)
    for j, (r, name, colour) in enumerate(zip(all_res, names, colours)):
        rel = r["pT_pred / pT_true − 1"]
        ax.bar(np.arange(len(shown)) + (j - (len(all_res) - 1) / 2) * step, [robust_width(rel[bins[i]]) for i in shown],
               width=step, color=colour, alpha=0.8, label=name if len(all_res) > 1 else None)
    ax.set_xticks(range(len(shown)), [labels[i] for i in shown], fontsize=7)
    ax.set_title("pT resolution against true pT [GeV]\n(bins with ≥ 3 tracks)", fontsize=9)
    if len(all_res) > 1:
        ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25, axis="y")
    acc = [f"{name} {float(np.mean(np.sign(d['charge']) == np.sign(truth['charge']))):.1%}"
           for d, name in zip(sets, names) if "charge" in d and "charge" in truth and len(d["charge"]) == n]
    if acc:
        fig.text(0.995, 0.01, "charge right: " + ", ".join(acc), ha="right", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))

"""Track-parameter resolution plots of the end-to-end model (``pointformers evaluate --plot FILE``).

Four panels from the double-majority matched tracks of selected particles
(:meth:`~.reconstruction.TrackReconstructionTask.evaluate_report` keeps their predicted and true
parameters in ``param_pairs``): the distributions of pT_pred / pT_true − 1, of η_pred − η_true and of
φ_pred − φ_true (wrapped), each with its robust width (1.4826 × MAD, the number ``evaluate``
reports), and the pT resolution in bins of true pT. Drawn on matplotlib's Agg canvas (no pyplot),
written atomically.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ...files import atomic_write

__all__ = ["draw_resolutions", "PT_BINS"]

#: True-pT bin edges [GeV] of the resolution-against-pT panel (the last bin is open).
PT_BINS = (0.9, 1.5, 3.0, 10.0, np.inf)


def _width(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(1.4826 * np.median(np.abs(v - np.median(v)))) if v.size else float("nan")


def draw_resolutions(predicted: Mapping[str, np.ndarray], truth: Mapping[str, np.ndarray],
                     path: str | os.PathLike, title: str = "", dpi: int = 110) -> Path:
    """Write the resolution panels of tracks with ``predicted`` and ``truth`` parameters (``pt``, ``eta``,
    ``phi`` arrays ``(T,)``, ``charge`` optional) to ``path`` (PNG). Returns ``path`` as a Path.

    Raises ValueError (naming the argument) when there is no track or the arrays disagree in length."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    for name, d in (("predicted", predicted), ("truth", truth)):
        missing = {"pt", "eta", "phi"} - set(d)
        if missing:
            raise ValueError(f"{name}: missing {sorted(missing)}")
    n = len(truth["pt"])
    if n == 0:
        raise ValueError("truth: no matched track to plot (no double-majority match of a selected particle)")
    if any(len(d[k]) != n for d in (predicted, truth) for k in ("pt", "eta", "phi")):
        raise ValueError("predicted, truth: every array needs one entry per track")
    pt_t = np.asarray(truth["pt"], dtype=np.float64)
    res = {"pT_pred / pT_true − 1": np.asarray(predicted["pt"], dtype=np.float64) / pt_t - 1,
           "η_pred − η_true": np.asarray(predicted["eta"], dtype=np.float64) - np.asarray(truth["eta"], dtype=np.float64),
           "φ_pred − φ_true": np.angle(np.exp(1j * (np.asarray(predicted["phi"], dtype=np.float64)
                                                    - np.asarray(truth["phi"], dtype=np.float64))))}
    fig = Figure(figsize=(12.6, 3.2), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4)
    for ax, (label, v) in zip(axes, res.items()):
        w = _width(v)
        finite = v[np.isfinite(v)]
        lim = 5 * w if np.isfinite(w) and w > 0 else (np.abs(finite).max() if finite.size else 1.0)
        ax.hist(np.clip(finite, -lim, lim), bins=40, range=(-lim, lim), color="tab:blue", alpha=0.8)
        ax.set_title(f"{label}\nwidth {w:.3g} ({len(finite)} tracks)", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    ax = axes[3]
    centres, widths = [], []
    rel = res["pT_pred / pT_true − 1"]
    for lo, hi in zip(PT_BINS[:-1], PT_BINS[1:]):
        sel = (pt_t >= lo) & (pt_t < hi)
        if sel.sum() >= 3:
            centres.append(f"{lo:g}–{hi:g}" if np.isfinite(hi) else f"≥ {lo:g}")
            widths.append(_width(rel[sel]))
    ax.bar(range(len(widths)), widths, color="tab:orange", alpha=0.8)
    ax.set_xticks(range(len(widths)), centres, fontsize=7)
    ax.set_title("pT resolution against true pT [GeV]\n(bins with ≥ 3 tracks)", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25, axis="y")
    if "charge" in predicted and "charge" in truth and len(predicted["charge"]) == n:
        acc = float(np.mean(np.sign(predicted["charge"]) == np.sign(truth["charge"])))
        fig.text(0.995, 0.01, f"charge right: {acc:.1%}", ha="right", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))

"""Learning curves of a run folder as a PNG (``pointformers plot RUN_DIR``).

One panel each for the training loss, every validation metric and the learning rate, all
against the epoch, read from the run's ``metrics.json`` (or ``metrics.csv``); the best
epoch is marked. Drawing uses matplotlib's Agg canvas directly (no pyplot, no global
backend switch), so it works headless and inside other programs.
"""
from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..files import atomic_write
from .logs import read_metrics_csv

__all__ = ["read_history", "draw_learning_curves"]


def read_history(run_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(history, metadata)`` of a run: the per-epoch rows (``epoch``, ``lr``, ``train_loss``,
    ``val`` dict) and the rest of ``metrics.json`` (empty when only ``metrics.csv`` exists).

    Raises:
        ValueError naming the folder or file when there is nothing to read.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"RUN_DIR {str(run_dir)!r}: no such folder")
    mj = run_dir / "metrics.json"
    if mj.is_file():
        try:
            data = json.loads(mj.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{mj}: not valid JSON ({exc})") from None
        rows = data.get("epochs") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise ValueError(f"{mj}: expected an 'epochs' list (a metrics.json written by pointformers train)")
        meta = {k: v for k, v in data.items() if k != "epochs"}
        return [dict(r) for r in rows], meta
    mc = run_dir / "metrics.csv"
    if mc.is_file():
        hist = []
        for r in read_metrics_csv(mc):
            hist.append({"epoch": int(r["epoch"]), "lr": r.get("lr"), "train_loss": r.get("train_loss"),
                         "best": bool(r.get("best")), "val": {k[4:]: v for k, v in r.items() if k.startswith("val/")}})
        return hist, {}
    raise ValueError(f"RUN_DIR {str(run_dir)!r}: no metrics.json or metrics.csv (not a training run folder?)")


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def draw_learning_curves(history: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str = "",
                         metric: str | None = None, dpi: int = 110) -> Path:
    """Write the learning curves of ``history`` to ``path`` (PNG).

    Args:
        history: the engine's per-epoch rows.
        metric: the selection metric (its panel comes first and the best epoch is marked).
    Returns:
        ``path`` as a Path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not history:
        raise ValueError("history: no completed epoch to plot")
    epochs = [int(r["epoch"]) for r in history]
    names: list[str] = []
    for r in history:
        for k in r.get("val", {}):
            if k not in names:
                names.append(k)
    if metric in names:
        names.remove(metric)
        names.insert(0, metric)
    panels: list[tuple[str, list[float], bool]] = [("train loss", [_num(r.get("train_loss")) for r in history], False)]
    panels += [(f"val {k}", [_num(r.get("val", {}).get(k)) for r in history], False) for k in names]
    panels.append(("learning rate", [_num(r.get("lr")) for r in history], True))
    best = [e for e, r in zip(epochs, history) if r.get("best")]
    best_epoch = best[-1] if best else None

    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (label, ys, log_y) in zip(axes, panels):
        ax.plot(epochs, ys, marker="o" if len(epochs) <= 30 else None, ms=3, lw=1.4)
        if log_y and all(y > 0 for y in ys if math.isfinite(y)) and any(math.isfinite(y) for y in ys):
            ax.set_yscale("log")
        if best_epoch is not None:
            ax.axvline(best_epoch, color="tab:green", lw=0.8, ls="--", alpha=0.7)
        ax.set_title(label + (" (selects best.pt)" if metric is not None and label == f"val {metric}" else ""),
                     fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    atomic_write(path, lambda f: f.write(buffer.getvalue()))  # readers never see a half-written PNG
    return path

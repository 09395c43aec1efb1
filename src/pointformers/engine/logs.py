"""Per-epoch training logs: ``metrics.csv``, TensorBoard event files and the progress bar.

``metrics.csv`` holds one row per completed epoch. Its columns are stable: the fixed ones
(:data:`CSV_FIXED_COLUMNS`), then ``val/<metric>`` for every validation metric in the order
the metrics first appeared. The whole file is rewritten atomically from the run's history
after each epoch, so a resumed run never holds rows of epochs it re-ran, and a crash never
leaves half a row.

TensorBoard logging uses :mod:`torch.utils.tensorboard` (needs the ``tensorboard`` package:
``pip install pointformers[logging]``); with ``train.tensorboard: null`` it is used when
installed and silently skipped otherwise.
"""
from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .checkpoint import atomic_write

__all__ = ["CSV_FIXED_COLUMNS", "csv_columns", "write_metrics_csv", "read_metrics_csv", "tensorboard_available",
           "TensorBoardLog", "EpochProgress"]

#: The columns every ``metrics.csv`` starts with.
CSV_FIXED_COLUMNS: tuple[str, ...] = ("epoch", "lr", "train_loss", "train_seconds", "seconds", "best")


def csv_columns(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """Fixed columns plus ``val/<name>`` for each validation metric, in order of first appearance."""
    cols = list(CSV_FIXED_COLUMNS)
    seen: set[str] = set()
    for row in history:
        for k in row.get("val", {}):
            if k not in seen:
                seen.add(k)
                cols.append(f"val/{k}")
    return cols


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return str(v)


def write_metrics_csv(path: str | os.PathLike, history: Sequence[Mapping[str, Any]]) -> Path:
    """Atomically write ``history`` (the engine's per-epoch dicts) as CSV; floats keep full precision."""
    cols = csv_columns(history)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for row in history:
        val = row.get("val", {})
        w.writerow([_cell(val.get(c[4:]) if c.startswith("val/") else row.get(c)) for c in cols])
    data = buf.getvalue().encode()
    return atomic_write(path, lambda f: f.write(data))


def read_metrics_csv(path: str | os.PathLike) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` as dicts of floats (empty cells -> NaN).

    Raises:
        ValueError naming the file and line for a malformed file.
    """
    path = Path(path)
    rows: list[dict[str, float]] = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or header[0] != "epoch":
            raise ValueError(f"{path}: line 1: expected a header starting with 'epoch', got {header!r}")
        for lineno, rec in enumerate(reader, start=2):
            if len(rec) != len(header):
                raise ValueError(f"{path}: line {lineno}: expected {len(header)} columns, got {len(rec)}")
            try:
                rows.append({k: (float(v) if v != "" else float("nan")) for k, v in zip(header, rec)})
            except ValueError:
                raise ValueError(f"{path}: line {lineno}: non-numeric value in {rec!r}") from None
    return rows


def tensorboard_available() -> bool:
    """Whether :mod:`torch.utils.tensorboard` can be imported (the ``tensorboard`` package is installed)."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except Exception:  # ImportError, or a broken tensorboard install
        return False
    return True


class TensorBoardLog:
    """Scalars per epoch into ``log_dir``: ``train/loss``, ``train/lr``, ``val/<metric>``.

    Args:
        log_dir: event-file folder (``RUN_DIR/tensorboard``).
        enabled: True (ValueError when tensorboard is missing), False, or None (when installed).
    """

    def __init__(self, log_dir: str | os.PathLike, enabled: bool | None = None):
        self.writer = None
        if enabled is False:
            return
        if not tensorboard_available():
            if enabled:
                raise ValueError("train.tensorboard: true, but the tensorboard package is not installed "
                                 "(pip install 'pointformers[logging]', or set train.tensorboard: null)")
            return
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    @property
    def active(self) -> bool:
        return self.writer is not None

    def log_epoch(self, row: Mapping[str, Any]) -> None:
        """Write one engine history row (step = epoch)."""
        if self.writer is None:
            return
        step = int(row["epoch"])
        self.writer.add_scalar("train/loss", float(row["train_loss"]), step)
        self.writer.add_scalar("train/lr", float(row["lr"]), step)
        for k, v in row.get("val", {}).items():
            if v is not None:
                self.writer.add_scalar(f"val/{k}", float(v), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class EpochProgress:
    """A tqdm bar over one epoch's samples showing the running loss and the latest validation metric.

    A no-op object when ``enabled`` is False (other ranks, CI logs, pipes).
    """

    def __init__(self, enabled: bool, total: int, desc: str, metric_name: str, last_metric: float | None):
        self.bar = None
        self.metric_name, self.last_metric = metric_name, last_metric
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)

    def update(self, n: int, mean_loss: float) -> None:
        if self.bar is None:
            return
        self.bar.update(n)
        post = {"loss": f"{mean_loss:.4f}"}
        if self.last_metric is not None and math.isfinite(self.last_metric):
            post[f"val {self.metric_name}"] = f"{self.last_metric:.4f}"
        self.bar.set_postfix(post)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

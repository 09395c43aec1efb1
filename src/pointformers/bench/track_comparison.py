"""End-to-end track reconstruction against HEPT + DBSCAN, side by side on the same generated events.

Issue 24's comparison, written as the section ``track-comparison-<preset>`` of ``docs/results.md``:

* **Accuracy.** Both configs (a HEPT tracking config, whose tracks come from DBSCAN on its hit
  embeddings with the radius chosen on the validation clouds, and a ``track-reconstruction``
  config) are trained once per seed on the same data through the same engine
  (:func:`~.hep_comparison.compare_configs`) and scored on the same test clouds: double-majority,
  perfect and LHC efficiency, fake and duplicate rates (:mod:`~pointformers.tasks.tracking.metrics`,
  counts pooled over the clouds), the TrackML score, and the resolutions of a helix fit of the matched
  tracks' hits (pT, η, charge; :mod:`~pointformers.tasks.tracking.track_fit`, the same fit for both
  pipelines' tracks); mean ± std over seeds, the claims "higher
  double-majority efficiency" and "lower fake rate" decided by the seeds' rule (:mod:`.seed_rule`).
  The efficiency against pT and η is the mean over seeds of each bin's efficiency.
* **Latency.** The first seed's two trained models, end to end from hits to track labels (HEPT:
  the forward pass, then DBSCAN at the radius it chose; the end-to-end model: its forward pass with
  the assignment and merging steps), on one generated event per size (:func:`~.hep_comparison._speed_event`),
  one process, the two pipelines alternated per repetition, eval mode without autograd; median of
  ``repeats`` calls after a warm-up, and the peak memory of one call (:mod:`.harness`). The sizes
  of the table (6k and 60k hits by default) and of the curve (10k to 500k by default) are options.
  The end-to-end model keeps the sector size it was trained on (its ``sector_hits``, unless set, the
  hits per sector of its training clouds): a larger event gets more sectors, so its slots cover the
  event's tracks (three sectors of a 60k-hit event would give it 1,800 slots for ~10k particles).

Usage::

    python -m pointformers.bench.track_comparison --preset tracking-6k --seeds 42 43 44 \\
        --hept configs/tracking-hept-small.yaml --e2e configs/track-reconstruction-6k.yaml \\
        --out runs/track-comparison --write docs/results.md
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from .harness import machine, recorded_command, without_bookkeeping
from .hep_comparison import _by_config
from .seed_rule import compare as seed_compare
from .seed_rule import mean_std

__all__ = ["compare_accuracy", "latency", "accuracy_text", "latency_text", "main", "TABLE_SIZES", "CURVE_SIZES"]

#: Event sizes [hits] of the latency table (with peak memory) and of the latency curve.
TABLE_SIZES = (6000, 60000)
CURVE_SIZES = (10000, 25000, 50000, 100000, 250000, 500000)

#: The accuracy columns: (header, row key, format).
_COLUMNS = (("eff DM", "eff_dm", ".3f"), ("eff perfect", "eff_perfect", ".3f"), ("eff LHC", "eff_lhc", ".3f"),
            ("fake DM", "fake_dm", ".3f"), ("dup LHC", "dup_lhc", ".3f"), ("TrackML score", "trackml_score", ".3f"),
            ("fit pT res", "fit_pt_rel_res", ".3f"), ("fit η res", "fit_eta_res", ".4f"),
            ("fit charge", "fit_charge_acc", ".3f"))


def compare_accuracy(hept_config: str, e2e_config: str, preset: str | None, seeds: Sequence[int],
                     out_dir: str, epochs: int | None = None, overrides: Sequence[str] = (), resume: bool = False,
                     log: Callable[[str], None] | None = print, reuse: Sequence[str] = (),
                     reused_only: bool = False) -> list[dict[str, Any]]:
    """Train and test both configs once per seed (:func:`~.hep_comparison.compare_configs`): one row per
    (config, seed) with the test metrics and the task's ``track_report`` (the tables against pT and η).
    ``reuse``/``reused_only``: rows of earlier pieces (``results-<preset>.json``), as
    :func:`~.hep_comparison.compare_configs` takes them (a row recorded with another config is refused)."""
    from .hep_comparison import compare_configs

    return compare_configs([hept_config, e2e_config], preset=preset, epochs=epochs, out_dir=out_dir, seeds=seeds,
                           overrides=overrides, resume=resume, log=log, reuse=reuse, reused_only=reused_only)


def _vals(group: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in group if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]


def _binned(group: Sequence[Mapping[str, Any]], table: str, key: str = "eff_dm") -> list[tuple[str, str]]:
    """(bin label, mean ± std over seeds of ``key``) of each bin of the reports' ``table`` (vs_pt / vs_eta)."""
    reports = [r["track_report"] for r in group if r.get("track_report")]
    if not reports:
        return []
    out = []
    for i, row in enumerate(reports[0][table]):
        vals = [float(rep[table][i][key]) for rep in reports
                if rep[table][i].get(key) is not None and math.isfinite(float(rep[table][i][key]))]
        particles = sum(int(rep[table][i].get("particles", 0)) for rep in reports) / len(reports)
        out.append((f"{row['bin']} ({particles:.0f})", mean_std(vals, ".3f") if vals else "n/a"))
    return out


def accuracy_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: the metrics table (mean ± std over seeds), the two claims by the seeds' rule, and the
    double-majority efficiency against pT and η."""
    groups = _by_config(rows)
    head = "| model | config | seeds | " + " | ".join(h for h, _, _ in _COLUMNS) + " | ms / cloud (forward) |"
    lines = [head, "|" + "---|" * (len(_COLUMNS) + 4)]
    for g in groups:
        cells = [mean_std(_vals(g, k), f) if _vals(g, k) else "n/a" for _, k, f in _COLUMNS]
        lines.append(f"| {g[0]['model']} | `{Path(g[0]['config']).name}` | {len(g)} | " + " | ".join(cells)
                     + f" | {mean_std(_vals(g, 'infer_ms'), '.0f')} |")
    text = "\n".join(lines)
    if len(groups) == 2:
        hept, e2e = groups
        eff = seed_compare(_vals(e2e, "eff_dm"), _vals(hept, "eff_dm"))
        fake = seed_compare([-v for v in _vals(e2e, "fake_dm")], [-v for v in _vals(hept, "fake_dm")])
        text += (f"\n\n- Higher double-majority efficiency than HEPT + DBSCAN (seeds' rule): **{eff}**."
                 f"\n- Lower double-majority fake rate than HEPT + DBSCAN (seeds' rule): **{fake}**.")
    for table, name in (("vs_pt", "pT [GeV]"), ("vs_eta", "η")):
        cols = [(_binned(g, table), g[0]["model"]) for g in groups]
        if not all(c for c, _ in cols):
            continue
        text += (f"\n\nDouble-majority efficiency against {name} (bin (selected particles per test set); mean ± std "
                 f"over seeds; the other cuts kept):\n\n| {name} | " + " | ".join(m for _, m in cols) + " |\n|"
                 + "---|" * (len(cols) + 1))
        for i, (label, _) in enumerate(cols[0][0]):
            text += f"\n| {label} | " + " | ".join(c[i][1] for c, _ in cols) + " |"
    return text


class _Pipeline:
    """Hits to track labels: ``(x (N, F), coords (N, c)) -> labels (N,)`` int64."""

    def __init__(self, name: str, model: torch.nn.Module, eps: float | None = None, min_samples: int = 2):
        self.name, self.model, self.eps, self.min_samples = name, model.eval(), eps, min_samples

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, coords: torch.Tensor) -> np.ndarray:
        if self.eps is None:  # the end-to-end model: labels from its forward
            return self.model(x[None], coords[None])[0].cpu().numpy()
        from ..tasks.tracking.building import dbscan_tracks

        return dbscan_tracks(self.model(x, coords), self.eps, self.min_samples)


def latency(pipes: Sequence[_Pipeline], sizes: Sequence[int], repeats: int = 3, memory: bool = True,
            seed: int = 0, log: Callable[[str], None] | None = print) -> list[dict[str, Any]]:
    """Per size: each pipeline's median seconds over ``repeats`` calls (after one warm-up; the pipelines
    alternated per call) and, with ``memory``, the peak memory of one call. One generated event per size."""
    from .hep_comparison import _peak_mb, _speed_event

    say = log or (lambda s: None)
    out = []
    for n in sizes:
        x, c = _speed_event(int(n), seed)
        row: dict[str, Any] = {"n": int(n)}
        times: dict[str, list] = {p.name: [] for p in pipes}
        for p in pipes:
            p(x, c)  # warm-up
            if memory:
                row[f"{p.name} peak_mb"] = _peak_mb(p, x, c, torch.device("cpu"))
        for _ in range(repeats):
            for p in pipes:
                t0 = time.perf_counter()
                p(x, c)
                times[p.name].append(time.perf_counter() - t0)
        for p in pipes:
            row[f"{p.name} s"] = statistics.median(times[p.name])
        say(f"  {n} hits: " + ", ".join(f"{p.name} {row[f'{p.name} s']:.3f} s" for p in pipes))
        out.append(row)
    return out


def latency_text(table: Sequence[Mapping[str, Any]], curve: Sequence[Mapping[str, Any]], names: Sequence[str],
                 repeats: int) -> str:
    """Markdown: time per event and peak memory at the table's sizes, and the curve of time per event."""
    text = (f"End to end from hits to track labels, the first seed's models, one generated event per size, eval mode "
            f"without autograd, the pipelines alternated (the end-to-end model with as many sectors as keep each "
            f"within the hits per sector of its training clouds); median of {repeats} calls after a warm-up. Peak MB = "
            f"resident memory growth of one call; the last column is the first pipeline's time over the second's "
            f"(> 1: the second is faster).\n\n| hits | " + " | ".join(f"{n} s | {n} peak MB" for n in names)
            + f" | {names[0]} / {names[1]} |\n|" + "---|" * (2 * len(names) + 2))
    for r in table:
        cells = " | ".join(f"{r[f'{n} s']:.3f} | {r[f'{n} peak_mb']:.0f}" for n in names)
        text += f"\n| {r['n']:,} | {cells} | {r[f'{names[0]} s'] / r[f'{names[1]} s']:.2f}× |"
    if curve:
        n0 = curve[0]
        text += ("\n\nLatency against event size (`× N₀` = time / time at the smallest size; linear growth: the ratio "
                 "of the sizes):\n\n| hits | N / N₀ | " + " | ".join(f"{n} s | × N₀" for n in names) + " |\n|"
                 + "---|" * (2 * len(names) + 2))
        for r in curve:
            cells = " | ".join(f"{r[f'{n} s']:.3f} | {r[f'{n} s'] / n0[f'{n} s']:.1f}" for n in names)
            text += f"\n| {r['n']:,} | {r['n'] / n0['n']:.1f} | {cells} |"
    return text


def _trained(rows: Sequence[Mapping[str, Any]], out_dir: str) -> list[_Pipeline]:
    """The first seed's trained model of each config, as pipelines (HEPT with its DBSCAN radius)."""
    from ..engine.checkpoint import model_from_checkpoint

    pipes = []
    for g in _by_config(rows):
        r = min(g, key=lambda row: row["seed"])
        run = Path(out_dir) / (f"{Path(r['config']).stem}-{r['preset']}-seed{r['seed']}")
        ckpt = run / "best.pt" if (run / "best.pt").exists() else run / "last.pt"
        if not ckpt.exists():
            raise ValueError(f"latency: times the first seed's trained models, but {run} holds no checkpoint "
                             f"(rows reused from another machine?); put that run folder there, or skip the "
                             f"latency with --sizes --curve (no sizes)")
        model = model_from_checkpoint(ckpt)
        eps = r.get("dbscan_eps")
        e2e = r["model_name"] == "track-reconstruction"
        if e2e and not model.sector_hits:   # the sector size of its training clouds, in events of any size
            model.sector_hits = math.ceil(float(r["hits_per_event"]) / model.num_sectors)
        pipes.append(_Pipeline("end-to-end" if e2e else f"{r['model']} + DBSCAN", model, None if e2e else float(eps)))
    return pipes


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from ..engine import write_json
    from .hep_comparison import _write_doc

    p = argparse.ArgumentParser(prog="python -m pointformers.bench.track_comparison", description=__doc__.split("\n")[0])
    p.add_argument("--hept", required=True, help="the HEPT tracking config (tracks by DBSCAN)")
    p.add_argument("--e2e", required=True, help="the track-reconstruction config")
    p.add_argument("--preset", default=None, help="data preset of both (default: the configs' own)")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--epochs", type=int, default=None, help="epochs of every run (default: the configs' own)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for both configs (repeatable), e.g. data.n_events=8")
    p.add_argument("--out", default="runs/track-comparison", help="run folders and results JSON")
    p.add_argument("--sizes", type=int, nargs="*", default=list(TABLE_SIZES), help="latency table sizes [hits]")
    p.add_argument("--curve", type=int, nargs="*", default=list(CURVE_SIZES), help="latency curve sizes [hits]")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--resume", action="store_true", help="evaluate finished runs, resume unfinished ones")
    p.add_argument("--reuse", nargs="+", default=[], metavar="JSON",
                   help="results-<preset>.json files of earlier pieces: runs recorded there with the same resolved "
                        "config are taken from them (their timing columns measured again)")
    p.add_argument("--reused-only", action="store_true",
                   help="train nothing: every run must be found in --reuse (the missing ones are named)")
    p.add_argument("--write", default=None, help="markdown file whose section is replaced")
    a = p.parse_args(argv)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    rows = compare_accuracy(a.hept, a.e2e, a.preset, a.seeds, a.out, a.epochs, a.overrides, a.resume,
                            reuse=a.reuse, reused_only=a.reused_only)
    table, curve, names = [], [], []
    if a.sizes or a.curve:
        pipes = _trained(rows, a.out)
        names = [p.name for p in pipes]
        print("latency:")
        table = latency(pipes, a.sizes, a.repeats)
        curve = latency(pipes, a.curve, a.repeats, memory=False)
    res = {"machine": machine(), "rows": rows, "latency": table, "curve": curve}
    write_json(Path(a.out) / "track-comparison.json", res)
    tag = rows[0]["preset"]
    trained_on = "; ".join(sorted({r.get("machine") or "not recorded" for r in rows}))
    text = (f"Machine: {machine()}; torch threads {torch.get_num_threads()} (training: {trained_on}). Data preset "
            f"`{tag}`, test split; both "
            f"configs trained with their `train` sections{f' for {a.epochs} epochs' if a.epochs else ''} once per "
            f"seed ({', '.join(map(str, a.seeds))}).\n\n" + accuracy_text(rows) + "\n\n"
            + (latency_text(table, curve, names, a.repeats) if table or curve else "Latency: not measured (no sizes)."))
    print(text)
    if a.write:
        cmd = recorded_command("pointformers.bench.track_comparison",
                               without_bookkeeping(list(argv if argv is not None else sys.argv[1:])))
        _write_doc(a.write, f"track-comparison-{tag}", text, cmd)
    return res


if __name__ == "__main__":
    main()

"""HEPT's comparison reproduced: every model config trained and scored on the same data, side by side.

Two measurements, each written as a section of ``docs/results.md`` together with the machine
and the exact command that produced it:

* :func:`compare_configs` -- for a list of configs and a data preset: train each model (its
  config's own ``train`` section, or ``--epochs`` for a short run), then on the test split report
  AP@k and the TrackML score of DBSCAN track building (radius chosen on validation clouds,
  :meth:`~pointformers.tasks.tracking.training.TrackingTask.evaluate_report`) -- or the task's own
  metric for other tasks (e.g. pile-up AP) --, the parameter count, the median inference time per
  event (test clouds, batch 1, eval mode, ``no_grad``; GNN graphs are built inside the forward
  pass, so their construction is included, as the paper counts it at inference) and the peak
  memory of one event's inference. With ``seeds``, every config is trained once per seed and the
  table shows mean ± std over seeds. It also checks HEPT's Table 1 ordering (HEPT's AP@k above
  every other efficient transformer) and Table 3 ordering (HEPT > OR & AND tied > OR-only tied >
  the untied variants) on the numbers it measured, by the seeds' rule of :mod:`.seed_rule` (on at
  least three seeds a comparison holds only beyond the seeds' spread; fewer: undecided). Its
  ``results-<preset>.json`` (rewritten after every run) can be given to a later comparison with
  ``--reuse``: runs recorded there with the same resolved config are taken instead of trained, and the
  timing columns are then measured again side by side in that process (``--retime``), so a comparison
  may be trained in pieces -- several processes, sessions or machines -- and written by one command.
* :func:`speed_comparison` -- one generated event of ``n_hits`` hits (60k by default, HEPT's
  Tracking-60k size) through HEPT and the kNN-graph GNNs in one process, repetitions interleaved
  round-robin so machine drift hits all models alike; reports median ms, peak memory and each
  model's time relative to HEPT's.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above the memory held before the call;
on CPU the growth of the process's peak resident size during the call (:mod:`.harness`, Linux
``clear_refs``) after freed heap memory has been returned to the OS (glibc ``malloc_trim``); the
CPU number is approximate (allocator and thread-pool behaviour), the CUDA one exact.

Usage::

    python -m pointformers.bench.hep_comparison compare --preset small --epochs 24 --seeds 42 43 44 \\
        --configs configs/tracking-hept-small.yaml configs/tracking-performer-small.yaml ... \\
        --write docs/results.md
    python -m pointformers.bench.hep_comparison speed --hits 60000 --write docs/results.md
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from .harness import (check_recorded_config, machine, peak_bytes, recorded_command, release_free_memory,
                      reset_peak_rss, rss_bytes, run_config_record, without_bookkeeping, write_section)
from .seed_rule import MIN_SEEDS, compare, mean_std

__all__ = ["compare_configs", "speed_comparison", "comparison_table", "speed_table", "check_orderings",
           "DEFAULT_SPEED_CONFIGS", "main"]

#: Models of the speed comparison: HEPT and the two kNN-graph GNNs, as configured for the comparison.
DEFAULT_SPEED_CONFIGS = ("configs/tracking-hept-small.yaml", "configs/tracking-edgeconv-small.yaml",
                         "configs/tracking-gravnet-small.yaml")

# Table 3 variants by (attention, n_and, tied) of a "tracking-encoder" model.
_ABLATION_NAMES = {(1, False): "OR-only LSH", (1, True): "OR-only LSH*", (3, False): "OR & AND LSH",
                   (3, True): "OR & AND LSH*"}
_GNN_MODELS = ("tracking-edgeconv", "tracking-gravnet")


# ------------------------------------------------------------------------------ helpers
def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but no CUDA device is available")
    return dev


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load(path: str, overrides: Sequence[str]) -> dict[str, Any]:
    from ..engine.config import load_config

    return load_config(path, list(overrides))


def model_label(cfg: Mapping[str, Any]) -> str:
    """A short, human name of a config's model (e.g. "HEPT", "performer", "OR & AND LSH*", "DGCNN (EdgeConv)")."""
    name, opts = cfg["model"]["name"], cfg["model"].get("options") or {}
    if name in ("hept-tracking", "hept-pileup") or (name in ("tracking-encoder", "pileup-encoder")
                                                     and opts.get("attention", "hept") == "hept"):
        return "HEPT"
    if name == "tracking-edgeconv":
        return "DGCNN (EdgeConv)"
    if name == "tracking-gravnet":
        return "GravNet"
    if name in ("tracking-encoder", "pileup-encoder"):
        attn = opts.get("attention", "hept")
        if attn == "lsh_or":
            a = opts.get("attention_options") or {}
            return _ABLATION_NAMES.get((int(a.get("n_and", 1)), bool(a.get("tied", False))),
                                       f"lsh_or (n_and={a.get('n_and', 1)}, tied={a.get('tied', False)})")
        return attn
    return name


def _forward_args(sample: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, coords) of one sample: ``sample.inputs.x/coords`` (tracking) or ``sample.x/coords``."""
    for obj in (getattr(sample, "inputs", None), sample):
        if obj is not None and isinstance(getattr(obj, "x", None), torch.Tensor) \
                and isinstance(getattr(obj, "coords", None), torch.Tensor):
            return obj.x, obj.coords
    raise ValueError(f"sample: cannot find model inputs (expected .inputs.x/.inputs.coords or .x/.coords) on "
                     f"{type(sample).__name__}")


def _task_and_samples(cfg: Mapping[str, Any], progress: bool) -> tuple[Any, dict[str, list], str]:
    """(task object, {split: samples}, main metric key) of a resolved config."""
    name = cfg["task"].get("name", "tracking") if isinstance(cfg.get("task"), Mapping) else "tracking"
    try:
        from ..tasks.registry import available_tasks, get_task

        registered = name in available_tasks()
    except ImportError:  # pragma: no cover - registry always present in this package
        registered = False
    if registered:
        spec = get_task(name)
        return spec.build(cfg), spec.load(cfg, ("train", "val", "test"), progress), spec.metric
    if name != "tracking":
        raise ValueError(f"task.name: {name!r} is not a registered task")
    from ..tasks.tracking.training import TrackingTask, load_tracking_splits, prepare_tracking_clouds

    d, t = cfg["data"], cfg["task"]
    events = load_tracking_splits(d["preset"], ("train", "val", "test"), cache_dir=d["cache_dir"], seed=d["seed"])
    clouds = {s: prepare_tracking_clouds(events[s], with_pairs=s == "train", radius=t["radius"],
                                         max_num_neighbors=t["max_num_neighbors"], pt_min=t["pt_min"],
                                         progress=progress and s == "train", desc=f"{s} pairs",
                                         cache_dir=d["cache_dir"])
              for s in events}
    task = TrackingTask(t["similarity"], t["tau"], t["sigma"], t["random_pairs"], t["pt_min"])
    return task, clouds, "ap@k"


def _count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def _time_forward(model: torch.nn.Module, x: torch.Tensor, c: torch.Tensor, device: torch.device,
                  repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        model(x, c)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


@torch.no_grad()
def _peak_mb(model: torch.nn.Module, x: torch.Tensor, c: torch.Tensor, device: torch.device) -> float:
    """Peak memory of one forward above what was held before it (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        model(x, c)
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    release_free_memory()
    reset_peak_rss()
    before = rss_bytes()
    model(x, c)
    return max(0, peak_bytes() - before) / 2**20


def _inference_stats(model: torch.nn.Module, samples: Sequence[Any], device: torch.device, repeats: int,
                     max_events: int) -> dict[str, float]:
    """Median over events of each event's median forward time [ms] and the peak memory of the
    largest event [MB]; the first call per event is a warm-up and not timed."""
    model.eval()
    use = list(samples)[:max_events]
    if not use:
        raise ValueError("samples: no test events to time")
    per_event, sizes = [], []
    for s in use:
        x, c = (t.to(device) for t in _forward_args(s))
        _time_forward(model, x, c, device, 1)  # warm-up
        per_event.append(statistics.median(_time_forward(model, x, c, device, repeats)))
        sizes.append(x.shape[0])
    big = use[int(np.argmax(sizes))]
    x, c = (t.to(device) for t in _forward_args(big))
    return {"infer_ms": 1e3 * statistics.median(per_event), "peak_mb": _peak_mb(model, x, c, device),
            "hits_per_event": float(np.mean(sizes))}


# ------------------------------------------------------------------------------ comparison
def compare_configs(configs: Sequence[str], preset: str | None = None, epochs: int | None = None,
                    out_dir: str | os.PathLike = "runs/hep-comparison", device: str = "auto", repeats: int = 3,
                    max_timing_events: int = 10, overrides: Sequence[str] = (), doc: str | None = None,
                    command: str | None = None, progress: bool = False,
                    log: Callable[[str], None] | None = print, resume: bool = False,
                    overwrite: bool = False, seeds: Sequence[int] | None = None,
                    reuse: Sequence[str | os.PathLike] = (), retime: bool = False,
                    reused_only: bool = False) -> list[dict[str, Any]]:
    """Train, evaluate and time every config on ``preset``; optionally write the table to ``doc``.

    Args:
        configs: YAML config paths (one model each; all should share the data/task sections).
        preset: data preset for every config (``data.preset``); None keeps each config's own.
        epochs: training epochs override (None = each config's ``train.epochs``).
        out_dir: run folders (checkpoints, metrics) go to ``out_dir/<config stem>-<preset>``.
        device: "auto", "cpu", "cuda" or "cuda:K" for training and timing.
        repeats: timed forward passes per test event (after one warm-up).
        max_timing_events: test events used for timing (the first ones).
        overrides: extra ``section.key=value`` items applied to every config.
        doc: markdown file to update (section ``hep-comparison-<preset>``); None = do not write.
        command: the command line recorded in the doc (default: this process's argv).
        resume: continue the run folders already in ``out_dir`` (the engine's ``--resume``: same
            config, exact continuation) instead of refusing them, so a comparison stopped part-way,
            or split over several processes with disjoint ``configs``, ends as one uninterrupted
            run would: finished runs are only evaluated. ``train_s`` is always the sum of the
            epochs' own times (training and validation), not this call's wall time.
        overwrite: replace the runs already in ``out_dir`` (their checkpoints and metrics) instead.
            Neither: a run folder that holds a run is refused (``RunFolderError``).
        seeds: train every config once per seed (``train.seed``; run folders
            ``<config stem>-<preset>-seed<seed>``); None: once, with the config's own seed.
        reuse: ``results-<preset>.json`` files of earlier comparisons (other processes, sessions or
            machines): a run whose resolved config (model, data, task and ``train`` sections, seed and
            epochs included) equals a recorded row's is taken from it instead of trained; a row of the
            same config file and seed recorded with a different config is refused (``ValueError``), so a
            stale row never enters a table. Reusing implies ``retime``. Processes that train pieces in
            parallel should each have their own ``out_dir`` (each rewrites its results file).
        retime: measure the timing columns (``infer_ms``, ``peak_mb``) again at the end, one config
            after another in this process, with freshly initialised weights of each config's model
            (seeded; the models' cost does not depend on their weights: fixed-size LSH blocks, samples,
            feature maps and kNN graphs), so rows trained in different processes or on different
            machines get timings measured side by side on one machine.
        reused_only: train nothing: every run must be found in ``reuse`` (``ValueError`` naming the
            missing ones before any work), e.g. to rewrite a section from its rows alone.
    Returns:
        One dict per config and seed: ``config, model, seed, params, metric`` and the test metrics (``ap@k``,
        ``trackml_score``, ``dbscan_eps``... for tracking), ``infer_ms``, ``peak_mb``,
        ``hits_per_event``, ``train_s``, ``epochs``, ``best_epoch``.
    """
    from ..engine import TrainConfig, fit
    from ..engine.run_folder import RunLock, check_run_folder, remove_run_files
    from .. import models

    if not configs:
        raise ValueError("configs: need at least one config path")
    if seeds is not None and (not seeds or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in seeds)
                              or len(set(seeds)) != len(seeds)):
        raise ValueError(f"seeds: expected distinct non-negative integers, got {seeds!r}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs: must be an integer >= 1, got {epochs!r}")
    for p in configs:
        if not Path(p).is_file():
            raise ValueError(f"configs: no such file {p!r}")
    say = log or (lambda s: None)
    dev = _device(device)
    extra = list(overrides) + ([f"data.preset={preset}"] if preset is not None else []) \
        + ([f"train.epochs={epochs}"] if epochs is not None else [])
    runs = [(p, _load(p, extra if seed is None else [*extra, f"train.seed={seed}"]), seed)
            for p in configs for seed in (seeds or [None])]
    presets = {c["data"]["preset"] for _, c, _ in runs}
    tag = preset if preset is not None else "+".join(sorted(presets))

    earlier = _reused_rows(reuse)
    retime = retime or bool(reuse)
    if reused_only:
        missing = [f"{Path(p).name} seed {c['train']['seed']}" for p, c, _ in runs if _matching_row(earlier, p, c) is None]
        if missing:
            raise ValueError(f"reuse: no recorded row of {', '.join(missing)} (--reused-only trains nothing)")
    from ..engine import write_json

    rows: list[dict[str, Any]] = []
    cache: dict[str, tuple] = {}  # data/task sections -> (task, samples, metric): prepared once

    def data_of(cfg: Mapping[str, Any]) -> tuple:
        key = repr((sorted(cfg["data"].items()), sorted(cfg["task"].items())))
        if key not in cache:
            say(f"data: preset {cfg['data']['preset']!r}, task {cfg['task'].get('name', 'tracking')!r}")
            cache[key] = _task_and_samples(cfg, progress)
        return cache[key]

    results_file = Path(out_dir) / f"results-{tag}.json"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for path, cfg, seed in runs:
        recorded = _matching_row(earlier, path, cfg)
        if recorded is not None:
            rows.append(recorded)
            say(f"[{len(rows)}/{len(runs)}] {recorded['model']} ({path}, seed {cfg['train']['seed']}): reused "
                f"({recorded['metric']} {recorded.get(recorded['metric'], float('nan')):.4f})")
            continue
        task, samples, metric = data_of(cfg)
        torch.manual_seed(cfg["train"]["seed"])
        model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
        label = model_label(cfg)
        run_dir = Path(out_dir) / (f"{Path(path).stem}-{tag}" + ("" if seed is None else f"-seed{seed}"))
        tcfg = TrainConfig(**{**cfg["train"], "device": str(dev)})
        say(f"[{len(rows) + 1}/{len(runs)}] {label} ({path}, seed {cfg['train']['seed']}): "
            f"{_count_params(model)} parameters, {tcfg.epochs} epochs")
        # a run folder holding another run is refused unless resuming; the lock keeps a second
        # comparison (e.g. one split over processes with overlapping configs) out of it
        check_run_folder(run_dir, resume=resume, overwrite=overwrite)
        with RunLock(run_dir):
            if overwrite:
                remove_run_files(run_dir)
            # the experiment's config in the checkpoints, as `pointformers train` stores it: `pointformers evaluate`
            # and `predict` rebuild the run's task and data from it
            res = fit(model, task, samples["train"], samples["val"], tcfg, run_dir, cfg["model"]["name"],
                      cfg["model"]["options"], log=None, resume=resume, extra={"config": cfg})
        train_s = sum(float(r["seconds"]) for r in res.history)  # every epoch's, resumed ones too
        model = model.to(dev)
        if hasattr(task, "evaluate_report"):
            test = task.evaluate_report(model, samples["val"], samples["test"])
        else:
            test = task.evaluate(model, samples["test"])
        row = {"config": str(path), "model": label, "seed": int(cfg["train"]["seed"]), "model_name": cfg["model"]["name"],
               "options": cfg["model"]["options"], "params": _count_params(model), "metric": metric,
               **{k: float(v) for k, v in test.items()},
               **_inference_stats(model, samples["test"], dev, repeats, max_timing_events),
               "train_s": train_s, "epochs": tcfg.epochs, "best_epoch": res.best_epoch, "preset": cfg["data"]["preset"],
               "machine": machine(), "run_config": run_config_record(cfg)}
        if getattr(task, "track_report", None) is not None:  # the track-matching tables (against pT and η)
            row["track_report"] = task.track_report
            task.track_report = None
        rows.append(row)
        say(f"      {metric} {row.get(metric, float('nan')):.4f}"
            + (f", TrackML {row['trackml_score']:.4f}" if "trackml_score" in row else "")
            + (f" (eps {row['dbscan_eps']:.3g})" if "dbscan_eps" in row else "")
            + f", {row['infer_ms']:.1f} ms/event, peak {row['peak_mb']:.0f} MB, trained in {train_s:.0f} s")
        del model
        # after every run, so a comparison cut short keeps (and can --reuse) the runs it finished
        write_json(results_file, {"machine": machine(), "device": str(dev), "rows": rows})

    if retime:
        _retime(rows, [cfg for _, cfg, _ in runs], data_of, dev, repeats, max_timing_events, say)
    write_json(results_file, {"machine": machine(), "device": str(dev), "rows": rows})
    checks = check_orderings(rows)
    for c in checks:
        say(c)
    if doc is not None:
        # --resume changes no result: the recorded command is the one that reproduces the table
        cmd = command or recorded_command("pointformers.bench.hep_comparison", without_bookkeeping(sys.argv[1:]))
        seeded = (f" once per seed ({', '.join(map(str, seeds))}; mean ± std over seeds, claims by the seeds' rule of "
                  "`pointformers.bench.seed_rule`)" if seeds else "")
        trained_on = sorted({r.get("machine") or "not recorded" for r in rows})
        where = (f"Machine: {machine()}; device {dev}." if not retime else
                 f"Timing columns: {machine()}; device {dev}; measured one config after another in one process "
                 f"with freshly initialised weights. Training (accuracy and train s columns): "
                 f"{'; '.join(trained_on)}.")
        text = (f"{where} Data preset `{tag}`; test split; every model trained with "
                f"its config's `train` section{f' for {epochs} epochs' if epochs is not None else ''}{seeded}.\n\n"
                + comparison_table(rows) + ("\n\n" + "\n".join(f"- {c}" for c in checks) if checks else ""))
        _write_doc(doc, f"hep-comparison-{tag}", text, cmd)
        say(f"wrote section hep-comparison-{tag} of {doc}")
    return rows


def _reused_rows(files: Sequence[str | os.PathLike]) -> dict[tuple[str, int], tuple[dict[str, Any], str]]:
    """Rows of earlier ``results-<preset>.json`` files by (config file name, seed) -> (row, file)."""
    import json

    out: dict[tuple[str, int], tuple[dict[str, Any], str]] = {}
    for f in files:
        try:
            rows = json.loads(Path(f).read_text())["rows"]
            for r in rows:
                out[(Path(r["config"]).name, int(r["seed"]))] = (r, str(f))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"reuse: {str(f)!r} is not a readable hep_comparison results JSON ({exc})") from None
    return out


def _matching_row(earlier: Mapping[tuple[str, int], tuple[dict[str, Any], str]], path: str,
                  cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The recorded row of this run (config file name and seed), if its recorded config equals ``cfg``."""
    hit = earlier.get((Path(path).name, int(cfg["train"]["seed"])))
    if hit is None:
        return None
    row, f = hit
    check_recorded_config(row, cfg, f"{Path(path).name} seed {cfg['train']['seed']}", f)
    return dict(row)


def _retime(rows: list[dict[str, Any]], cfgs: Sequence[Mapping[str, Any]], data_of: Callable, device: torch.device,
            repeats: int, max_events: int, say: Callable[[str], None]) -> None:
    """Timing columns of every row measured again in this process, one config (model + data) at a time,
    with freshly initialised weights (seed 0); rows of one config (its seeds) share the measurement."""
    from .. import models

    done: dict[str, dict[str, float]] = {}
    for row, cfg in zip(rows, cfgs):
        key = repr((row["model_name"], row["options"], sorted(cfg["data"].items())))
        if key not in done:
            _, samples, _ = data_of(cfg)
            torch.manual_seed(0)
            model = models.build(row["model_name"], **row["options"]).to(device)
            done[key] = _inference_stats(model, samples["test"], device, repeats, max_events)
            say(f"timed {row['model']} ({Path(row['config']).name}): {done[key]['infer_ms']:.1f} ms/event, "
                f"peak {done[key]['peak_mb']:.0f} MB")
            del model
        row.update(done[key], timing="retimed")


def _write_doc(doc: str, section: str, text: str, command: str) -> None:
    if not os.path.exists(doc):
        Path(doc).parent.mkdir(parents=True, exist_ok=True)
        Path(doc).write_text("# Results\n\nHEPT's comparison reproduced on generated data "
                             "(`python -m pointformers.bench.hep_comparison`).\n")
    write_section(doc, section, text, command)


def _fmt(v: Any, spec: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _by_config(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Rows grouped by config, in first-appearance order, each group in seed order."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(r["config"], []).append(r)
    return [sorted(g, key=lambda r: r.get("seed", 0)) for g in groups.values()]


def comparison_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of :func:`compare_configs` rows: one line per config; with several seeds per
    config, accuracy cells are mean ± std over seeds, times and sizes means (peak memory the largest)."""
    metric = rows[0]["metric"] if rows else "ap@k"
    has_trackml = any("trackml_score" in r for r in rows)
    groups = _by_config(rows)
    seeded = any(len(g) > 1 for g in groups)
    head = ["Model", "Config", "Params", metric.upper() if metric != "ap@k" else "AP@k"]
    if has_trackml:
        head += ["TrackML score", "DBSCAN eps"]
    head += ["Inference ms/event", "Peak MB/event", "Hits/event", "Train s (epochs)"] + (["Seeds"] if seeded else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def stat(g, key: str, spec: str, how=mean_std) -> str:
        vals = [float(r[key]) for r in g if r.get(key) is not None and math.isfinite(float(r[key]))]
        return how(vals, spec) if vals else "n/a"

    mean = lambda v, spec: format(statistics.fmean(v), spec)  # noqa: E731
    for g in groups:
        r = g[0]
        cells = [r["model"], f"`{Path(r['config']).name}`", f"{r['params']:,}", stat(g, r["metric"], ".4f")]
        if has_trackml:
            cells += [stat(g, "trackml_score", ".4f"), stat(g, "dbscan_eps", ".3g", mean)]
        cells += [stat(g, "infer_ms", ".1f", mean), stat(g, "peak_mb", ".0f", lambda v, spec: format(max(v), spec)),
                  stat(g, "hits_per_event", ".0f", mean), f"{stat(g, 'train_s', '.0f', mean)} ({r['epochs']})"]
        if seeded:
            cells.append(", ".join(str(x.get("seed", "")) for x in g))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_orderings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """HEPT's Table 1 and Table 3 orderings checked on measured rows (AP@k); one line each.

    Table 1: HEPT's AP@k above every other efficient transformer (every ``tracking-encoder`` row,
    the LSH ablations included, except ``full`` attention). Table 3: HEPT > OR & AND LSH* >
    OR-only LSH* > each untied variant. Each "above" is decided by :func:`.seed_rule.compare` over
    the models' seeds (beyond the seeds' spread, on at least :data:`.seed_rule.MIN_SEEDS` seeds);
    with fewer seeds the line says UNDECIDED and what the means show. Orderings whose models are
    not all present are reported as skipped. Pile-up rows (metric ``ap``) get the Table 1 line on their AP (the
    paper's Pileup-10k column), not Table 3 (an ablation on tracking); rows of other tasks give no lines.
    """
    # tracking: AP@k; pile-up: the per-event AP on neutrals (Table 1's Pileup-10k column; no Table 3 there)
    metric = next((r["metric"] for r in rows if r.get("metric") in ("ap@k", "ap")), None)
    vals: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r.get("seed", 0)):
        if metric is not None and r.get("metric") == metric and r.get(metric) is not None:
            vals.setdefault(r["model"], []).append(float(r[metric]))
    if not vals:  # another task's rows: the tables' orderings do not apply
        return []
    shown = "AP@k" if metric == "ap@k" else "pile-up AP"
    decided = min(len(v) for v in vals.values()) >= MIN_SEEDS
    fmt = lambda m: mean_std(vals[m], ".4f")  # noqa: E731

    def above(a: str, b: str) -> bool:
        if decided:
            return compare(vals[a], vals[b]) == "holds"
        return statistics.fmean(vals[a]) > statistics.fmean(vals[b])

    def label(ok: bool, detail: str = "") -> str:
        if decided:
            return ("HOLDS" if ok else "DOES NOT HOLD") + detail + "."
        return (f"UNDECIDED (fewer than {MIN_SEEDS} seeds; on the means it "
                + ("holds" if ok else "does not hold") + detail + ").")

    rule = " beyond the seeds' spread" if decided else ""
    out = []
    # every efficient transformer: the LSH variants too (OR-only LSH* is Reformer-like, OR-only LSH
    # SMYRF-like); not full attention (quadratic) and not the GNNs
    others = [m for m in vals if m not in ("HEPT", "full", "DGCNN (EdgeConv)", "GravNet")]
    if "HEPT" not in vals or not others:
        out.append("Table 1 ordering: skipped (needs HEPT and at least one other efficient transformer).")
    else:
        worse = sorted(m for m in others if not above("HEPT", m))
        nums = ", ".join(f"{m} {fmt(m)}" for m in sorted(others, key=lambda m: -statistics.fmean(vals[m])))
        out.append(f"Table 1 ordering (HEPT {shown} {fmt('HEPT')} above every other efficient transformer{rule}: "
                   f"{nums}): " + label(not worse, f" for {', '.join(worse)}" if worse else ""))
    if metric != "ap@k":
        return out
    chain = ["HEPT", "OR & AND LSH*", "OR-only LSH*"]
    untied = ["OR & AND LSH", "OR-only LSH"]
    if not all(m in vals for m in chain + untied):
        missing = [m for m in chain + untied if m not in vals]
        out.append(f"Table 3 ordering: skipped (missing {', '.join(missing)}).")
    else:
        ok = above(chain[0], chain[1]) and above(chain[1], chain[2]) and all(above(chain[2], u) for u in untied)
        nums = ", ".join(f"{m} {fmt(m)}" for m in chain + untied)
        out.append(f"Table 3 ordering (HEPT > OR & AND LSH* > OR-only LSH* > untied variants{rule}; {nums}): "
                   + label(ok))
    return out


# ------------------------------------------------------------------------------ speed
def _speed_event(n_hits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Model inputs of ``n_hits`` hits: one generated event at a pile-up that gives ~15% more hits
    (Tracking-60k's μ = 200 gives ~59k), randomly subsampled to exactly ``n_hits``."""
    from ..data.tracking import generate_event, preset_params
    from ..tasks.tracking import tracking_inputs

    mu = max(0.5, 200.0 * 1.15 * n_hits / 59000.0)
    ev = None
    for attempt in range(8):
        ev = generate_event(preset_params("tracking-60k", mu=mu), seed=seed, event_id=attempt)
        if ev.num_hits >= n_hits:
            break
        mu *= 1.5
    inp = tracking_inputs(ev)
    keep = torch.from_numpy(np.sort(np.random.default_rng(seed).choice(inp.num_hits, n_hits, replace=False)))
    return inp.x[keep], inp.coords[keep]


def speed_comparison(n_hits: int = 60000, configs: Sequence[str] = DEFAULT_SPEED_CONFIGS, repeats: int = 5,
                     device: str = "auto", seed: int = 0, doc: str | None = None, command: str | None = None,
                     log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Inference time of HEPT and the kNN-graph GNNs on one ``n_hits``-hit event, side by side.

    Every model (built from its config's ``model`` section, seeded initial weights: speed does
    not depend on them) runs one warm-up pass, then ``repeats`` timed passes interleaved
    round-robin across models. GNN graphs are built inside each forward pass.

    Returns:
        ``{"n_hits", "device", "machine", "rows": [{config, model, params, median_ms, times_ms,
        peak_mb, vs_hept}], "min_gnn_speedup"}`` where ``vs_hept`` = median_ms / HEPT's median_ms
        and ``min_gnn_speedup`` is the smallest GNN/HEPT ratio (None without HEPT or GNNs).
    """
    from .. import models

    if isinstance(n_hits, bool) or not isinstance(n_hits, int) or n_hits < 1:
        raise ValueError(f"n_hits: must be an integer >= 1, got {n_hits!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: must be an integer >= 1, got {repeats!r}")
    if not configs:
        raise ValueError("configs: need at least one config path")
    say = log or (lambda s: None)
    dev = _device(device)
    x, c = _speed_event(n_hits, seed)
    x, c = x.to(dev), c.to(dev)
    entries = []
    for p in configs:
        if not Path(p).is_file():
            raise ValueError(f"configs: no such file {p!r}")
        cfg = _load(p, ())
        torch.manual_seed(seed)
        m = models.build(cfg["model"]["name"], **cfg["model"]["options"]).to(dev).eval()
        entries.append({"config": str(p), "model": model_label(cfg), "model_name": cfg["model"]["name"],
                        "module": m, "params": _count_params(m), "times": []})
    for e in entries:
        say(f"warm-up {e['model']} on {n_hits} hits")
        _time_forward(e["module"], x, c, dev, 1)
        e["peak_mb"] = _peak_mb(e["module"], x, c, dev)
    for r in range(repeats):
        for e in entries:
            e["times"] += _time_forward(e["module"], x, c, dev, 1)
    rows = []
    for e in entries:
        rows.append({"config": e["config"], "model": e["model"], "model_name": e["model_name"], "params": e["params"],
                     "median_ms": 1e3 * statistics.median(e["times"]), "times_ms": [1e3 * t for t in e["times"]],
                     "peak_mb": e["peak_mb"]})
    hept = next((r["median_ms"] for r in rows if r["model"] == "HEPT"), None)
    for r in rows:
        r["vs_hept"] = r["median_ms"] / hept if hept else None
    gnn = [r["vs_hept"] for r in rows if r["model_name"] in _GNN_MODELS and r["vs_hept"] is not None]
    result = {"n_hits": n_hits, "device": str(dev), "machine": machine(), "repeats": repeats, "rows": rows,
              "min_gnn_speedup": min(gnn) if gnn else None}
    for r in rows:
        say(f"{r['model']:>18}: {r['median_ms']:9.1f} ms, peak {r['peak_mb']:.0f} MB"
            + (f", {r['vs_hept']:.1f}x HEPT's time" if r["vs_hept"] is not None else ""))
    if doc is not None:
        # --resume changes no result: the recorded command is the one that reproduces the table
        cmd = command or recorded_command("pointformers.bench.hep_comparison",
                                          [a for a in sys.argv[1:] if a not in ("--resume", "--overwrite")])
        _write_doc(doc, f"hep-speed-{n_hits}", speed_table(result), cmd)
        say(f"wrote section hep-speed-{n_hits} of {doc}")
    return result


def speed_table(result: Mapping[str, Any]) -> str:
    """Markdown text of a :func:`speed_comparison` result."""
    lines = [f"Machine: {result['machine']}; device {result['device']}. One generated event of "
             f"{result['n_hits']} hits, batch 1, float32, eval mode, median of {result['repeats']} runs "
             "(interleaved across models); GNN kNN graphs are built inside the timed forward pass.", "",
             "| Model | Config | Params | Inference ms | Peak MB | Time / HEPT's |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | `{Path(r['config']).name}` | {r['params']:,} | {r['median_ms']:.1f} | "
                     f"{r['peak_mb']:.0f} | {_fmt(r['vs_hept'], '.1f')}{'x' if r['vs_hept'] is not None else ''} |")
    if result.get("min_gnn_speedup") is not None:
        s = result["min_gnn_speedup"]
        lines += ["", f"HEPT is {s:.1f}x faster than the fastest kNN-graph GNN including graph construction "
                      f"(target: at least 20x; the paper reports 89-203x on GPU): "
                      + ("met." if s >= 20 else "NOT met on this machine.")]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pointformers.bench.hep_comparison",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="train + evaluate + time every config on one preset")
    c.add_argument("--configs", nargs="+", required=True)
    c.add_argument("--preset", default=None)
    c.add_argument("--epochs", type=int, default=None)
    c.add_argument("--out", default="runs/hep-comparison")
    c.add_argument("--device", default="auto")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--timing-events", type=int, default=10)
    c.add_argument("--set", nargs="*", default=[], metavar="SECTION.KEY=VALUE")
    c.add_argument("--write", default=None, metavar="DOC.md")
    c.add_argument("--resume", action="store_true",
                   help="continue the run folders in --out (a comparison stopped part-way, or split over "
                        "processes with disjoint --configs): finished runs are only evaluated")
    c.add_argument("--overwrite", action="store_true", help="replace the runs already in --out")
    c.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="train every config once per seed (default: once, with its train.seed)")
    c.add_argument("--reuse", nargs="+", default=[], metavar="JSON",
                   help="results-<preset>.json of earlier comparisons: runs recorded there with the same config "
                        "are taken, not trained (implies --retime)")
    c.add_argument("--reused-only", action="store_true",
                   help="train nothing: fail unless every run is recorded in the --reuse files")
    c.add_argument("--retime", action="store_true",
                   help="measure every config's inference time and memory again at the end, side by side in "
                        "this process (freshly initialised weights)")
    s = sub.add_parser("speed", help="HEPT vs the kNN-graph GNNs on one large event")
    s.add_argument("--hits", type=int, default=60000)
    s.add_argument("--configs", nargs="+", default=list(DEFAULT_SPEED_CONFIGS))
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--device", default="auto")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--write", default=None, metavar="DOC.md")
    a = p.parse_args(argv)
    try:
        if a.cmd == "compare":
            compare_configs(a.configs, a.preset, a.epochs, a.out, a.device, a.repeats, a.timing_events, a.set,
                            a.write, progress=sys.stderr.isatty(), resume=a.resume, overwrite=a.overwrite,
                            seeds=a.seeds, reuse=a.reuse, retime=a.retime, reused_only=a.reused_only)
        else:
            speed_comparison(a.hits, a.configs, a.repeats, a.device, a.seed, a.write)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

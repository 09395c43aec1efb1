"""The ``pointformers`` command: ``demo``, ``train``, ``evaluate``, ``benchmark``, ``generate``,
``plot``, ``export`` and ``predict`` (TrackML events: :mod:`pointformers.trackml_eval`).

Configs are YAML files with four sections and an output folder (:mod:`pointformers.engine.config`)::

    data:  {preset: small, seed: 0, cache_dir: null}          # the task's data keys
    model: {name: hept-tracking, options: {num_regions: 8}}
    task:  {name: tracking, similarity: l2_rbf, tau: 0.05, ...} # task.name picks the task (default tracking)
    train: {epochs: 8, lr: 0.001, step_size: 4, batch_size: 1, precision: fp32, ...}
    out: runs/tracking-hept-small

Any key can be overridden with ``--set section.key=value`` (values are parsed as YAML).
Unknown keys and bad values stop the command with a one-line error naming the key. Keys a
config file leaves out take the task's defaults (the papers' settings); without
``--config``, ``train`` and ``demo`` start from :data:`DEMO_CONFIG`
(== ``configs/tracking-hept-small.yaml``).

Multi-GPU / multi-node: ``torchrun --nproc_per_node G -m pointformers.cli train --config F``
(every process runs the same command; rank 0 writes the run folder).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from .engine.config import ConfigError, dump_config, resolve_config
from .engine.config import load_config as _load_config

__all__ = ["DEMO_CONFIG", "ConfigError", "load_config", "resolve_config", "main", "format_metrics_table"]


#: The demo's configuration (== configs/tracking-hept-small.yaml), chosen by validation runs on
#: the ``small`` preset (~1.6k hits per cloud) on 2 CPU cores (the closing notes of the demo
#: issue list them):
#: * num_regions G = 8: a validation sweep over G in {4, 8, 15} (the paper tunes G per data set:
#:   10-20 for 6k-hit clouds, 150 for 60k; fewer hits -> fewer regions).
#: * dropout 0 (the authors use 0.1 over 2000 epochs): in a short run dropout only slows
#:   learning (val AP@k 0.80 vs 0.75 after 1800 steps).
#: * lr 3e-3 (1e-2, the authors' value, diverges in short runs without warm-up; 5e-3 is no
#:   better); Adam with a 100-step linear warm-up, then a cosine decay per step to 3e-5 over 8
#:   epochs (issue 20, chosen on validation data, one thread): val AP@k 0.823 after 8 epochs
#:   (960 steps), test 0.813; the former StepLR halving every 6 epochs needed 24 epochs (2880
#:   steps) for val/test 0.80-0.85 and reached val 0.814 after 8; 6 cosine epochs reach val
#:   0.807 (too little margin); a peak lr of 6e-3 with a 200-step warm-up is no better.
DEMO_CONFIG: dict[str, Any] = {
    "data": {"preset": "small", "seed": 0, "cache_dir": None},
    "model": {"name": "hept-tracking", "options": {"num_regions": 8, "block_size": 100, "dropout": 0.0}},
    "task": {"similarity": "l2_rbf", "tau": 0.05, "sigma": 0.75, "random_pairs": 0.2, "pt_min": 0.9,
             "radius": 1.0, "max_num_neighbors": 256},
    "train": {"epochs": 8, "lr": 0.003, "optimizer": "adam", "schedule": "cosine", "schedule_unit": "step",
              "warmup_steps": 100, "min_lr": 0.00003, "weight_decay": 0.0, "seed": 42, "progress": None},
    "out": "runs/tracking-hept-small",
}


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The resolved config: ``base`` -- by default :data:`DEMO_CONFIG` without a file, the task's
    defaults with one -- updated by the YAML file at ``path`` and the ``--set`` items."""
    if base is None and path is None:
        base = DEMO_CONFIG
    return _load_config(path, overrides, base=base)


# ------------------------------------------------------------------------------ helpers
def _spec(cfg: Mapping[str, Any]):
    from .tasks.registry import get_task

    return get_task(cfg["task"]["name"])


def _count_phrase(samples) -> str:
    """How many engine samples, in words: mini-batch tasks count their items too."""
    from .tasks.minibatch import MiniBatch

    if samples and all(isinstance(s, MiniBatch) for s in samples):
        return f"{len(samples)} mini-batches ({sum(len(s) for s in samples)} items)"
    return f"{len(samples)} samples"


def _build_model(cfg: Mapping[str, Any]):
    import torch

    from . import models

    torch.manual_seed(cfg["train"]["seed"])  # the model's initial weights follow the run seed
    try:
        return models.build(cfg["model"]["name"], **cfg["model"]["options"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model.options: {str(exc).splitlines()[0]}") from None


def _fmt(v: float | None) -> str:
    return "  n/a " if v is None or not math.isfinite(v) else f"{v:.4f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows ``{"model", "ap@k", "precision@K", "recall@K"}`` as an aligned text table (the demo's)."""
    w = max([len("model")] + [len(r["model"]) for r in rows])
    lines = [f"{'model':<{w}}  {'AP@k':>7}  {'prec@19':>7}  {'rec@19':>7}", "-" * (w + 29)]
    for r in rows:
        lines.append(f"{r['model']:<{w}}  {_fmt(r.get('ap@k')):>7}  {_fmt(r.get('precision@K')):>7}  "
                     f"{_fmt(r.get('recall@K')):>7}")
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "n/a"
    v = float(v)
    if not math.isfinite(v):
        return "n/a"
    return str(int(v)) if v.is_integer() and abs(v) >= 1000 else f"{v:.4f}"


def format_metrics_table(rows: Sequence[tuple[str, Mapping[str, float]]]) -> str:
    """``[(row name, {metric: value})]`` as an aligned table with one column per metric (in the
    order the metrics first appear)."""
    cols: list[str] = []
    for _, m in rows:
        cols += [k for k in m if k not in cols]
    w = max([len("model")] + [len(name) for name, _ in rows])
    widths = [max(len(c), 7) for c in cols]
    lines = [f"{'model':<{w}}  " + "  ".join(f"{c:>{cw}}" for c, cw in zip(cols, widths)),
             "-" * (w + sum(cw + 2 for cw in widths))]
    for name, m in rows:
        lines.append(f"{name:<{w}}  " + "  ".join(f"{_cell(m.get(c)):>{cw}}" for c, cw in zip(cols, widths)))
    return "\n".join(lines)


def _splits_arg(raw: str) -> list[str]:
    splits = [s.strip() for s in raw.split(",") if s.strip()]
    bad = [s for s in splits if s not in ("train", "val", "test")]
    if not splits or bad:
        raise ValueError(f"--splits: expected a comma-separated subset of train,val,test, got {raw!r}")
    return splits


# ------------------------------------------------------------------------------ train
def cmd_train(args: argparse.Namespace) -> int:
    from .engine import TrainConfig, fit, progress_enabled
    from .engine.distributed import barrier, init_distributed, shutdown_distributed

    cfg = load_config(args.config, args.set)
    out = Path(args.out or cfg["out"])
    cfg["out"] = str(out)
    spec = _spec(cfg)
    overwrite = bool(getattr(args, "overwrite", False))
    if getattr(args, "accept_config_change", False) and not args.resume:
        raise ValueError("--accept-config-change: only used with --resume")
    env = init_distributed(cfg["train"]["device"])
    lock = None
    try:
        if env.is_main:  # one run per folder, and never over a finished one by accident
            lock = _claim_run_folder(out, args.resume, overwrite)
        t0 = time.perf_counter()
        show = env.is_main and progress_enabled(cfg["train"]["progress"])
        if env.distributed and not env.is_main:
            barrier(env)  # rank 0 generates and caches the data first; the others then read the cache
        samples = spec.load(cfg, ("train", "val", "test"), show)
        if env.distributed and env.is_main:
            barrier(env)
        t_data = time.perf_counter() - t0
        if env.is_main:
            print(f"{spec.name}: train {_count_phrase(samples['train'])}, val {_count_phrase(samples['val'])}, "
                  f"test {_count_phrase(samples['test'])} ({t_data:.1f} s); {env.world_size} process(es) on {env.device}")
        model = _build_model(cfg)
        res = fit(model, spec.build(cfg), samples["train"], samples["val"], TrainConfig(**cfg["train"]), out,
                  cfg["model"]["name"], cfg["model"]["options"], test=samples.get("test"), resume=args.resume,
                  extra={"config": cfg}, dist=env,
                  accept_config_change=bool(getattr(args, "accept_config_change", False)),
                  on_start=lambda: _start_run_files(out, cfg, overwrite and not args.resume))
        if env.is_main:
            metric = cfg["train"]["metric"]
            print(f"best epoch {res.best_epoch}: val {metric} {_fmt(res.best_metric)}; "
                  f"test {metric} {_fmt((res.test or {}).get(metric))}")
            print(f"checkpoint: {out / 'best.pt'}  metrics: {out / 'metrics.json'}, {out / 'metrics.csv'}  "
                  f"({res.seconds + t_data:.1f} s)")
    finally:
        if lock is not None:
            lock.release()
        shutdown_distributed(env)
    return 0


def _claim_run_folder(out: Path, resume: bool, overwrite: bool):
    """Lock ``out`` for this run, then refuse it if it holds a run and neither ``resume`` nor
    ``overwrite`` is set (:mod:`pointformers.engine.run_folder`). Returns the held lock."""
    from .engine.run_folder import RunLock, check_run_folder

    check_run_folder(out, resume, overwrite)  # before creating anything
    lock = RunLock(out).acquire()
    try:
        check_run_folder(out, resume, overwrite)  # again under the lock: a run may have started meanwhile
    except BaseException:
        lock.release()
        raise
    return lock


def _start_run_files(out: Path, cfg: Mapping[str, Any], remove_old: bool) -> None:
    """The run is set up (and resumed, if asked): remove an overwritten run's files, then write
    ``config.yaml`` atomically."""
    from .engine.run_folder import remove_run_files
    from .files import atomic_write

    if remove_old:
        remove_run_files(out)
    text = dump_config(cfg).encode()
    atomic_write(out / "config.yaml", lambda f: f.write(text))


# ------------------------------------------------------------------------------ evaluate
def _config_for_checkpoint(args: argparse.Namespace, ckpt: dict[str, Any]) -> dict[str, Any]:
    """The experiment config of a loaded checkpoint with ``--config`` / ``--set`` applied. The model is rebuilt
    from the checkpoint's own ``model_config``, so the ``--set model.options.…`` overrides are copied into it
    here (``ckpt`` is changed in place), e.g. a track-reconstruction model's ``threshold``; its weights must
    still fit (an architecture option that changes them fails to load, by name)."""
    if args.config is not None:
        cfg = load_config(args.config, args.set)
    else:
        stored = (ckpt.get("extra") or {}).get("config")
        run_config = Path(args.checkpoint).parent / "config.yaml"
        if isinstance(stored, Mapping):
            cfg = load_config(None, args.set, base=stored)
        elif run_config.is_file():
            # a checkpoint without the experiment's config (older runs' last.pt): the run folder's config.yaml,
            # never a default data set the model was not trained on
            cfg = load_config(run_config, args.set)
        else:
            raise ConfigError(f"--config: {args.checkpoint} carries no experiment config and its folder has no "
                              "config.yaml; pass --config FILE (the config it was trained with)")
    options = cfg["model"]["options"]
    for item in args.set or ():
        key = item.split("=", 1)[0].strip()
        if key == "model.name" or key == "model":
            raise ConfigError(f"--set {key}: a checkpoint's model is {ckpt['model_name']!r}; it cannot be changed")
        if key == "model.options":
            ckpt["model_config"] = {**ckpt["model_config"], **options}
        elif key.startswith("model.options."):
            name = key[len("model.options."):].split(".", 1)[0]
            ckpt["model_config"] = {**ckpt["model_config"], name: options[name]}
    return cfg


def cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from .engine import load_checkpoint, model_from_checkpoint
    from .engine.distributed import resolve_device
    from .models.hept_tracking import is_reference_checkpoint

    if args.data is not None:
        return cmd_evaluate_data(args)
    for opt, val in (("--detectors", args.detectors), ("--eps", args.eps), ("--eps-data", args.eps_data),
                     ("--sector-hits", args.sector_hits)):
        if val is not None:
            raise ValueError(f"{opt}: only used with --data FOLDER (TrackML events)")
    if is_reference_checkpoint(args.checkpoint):
        raise ValueError(f"--data: {args.checkpoint} is a reference checkpoint with no data split of its own; "
                         "pass --data FOLDER of labelled TrackML events")
    _check_new_file(args.json, "--json", args.force)
    _check_new_file(args.plot, "--plot", args.force)
    if args.plot:
        import matplotlib  # noqa: F401  (before the work: a missing extra is reported first)
    split = args.split or "test"
    ckpt = load_checkpoint(args.checkpoint, required=("model", "model_name", "model_config"))
    cfg = _config_for_checkpoint(args, ckpt)
    spec = _spec(cfg)
    device = resolve_device(args.device or cfg["train"]["device"])
    model = model_from_checkpoint(ckpt, map_location=device)
    task = spec.build(cfg)
    report = hasattr(task, "evaluate_report") and split == "test"
    splits = ("val", "test") if report else (split,)
    samples = spec.load(cfg, splits, False)
    ctx = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if cfg["train"]["precision"] == "bf16"
           else contextlib.nullcontext())
    with ctx:
        metrics = (task.evaluate_report(model, samples["val"], samples["test"]) if report
                   else task.evaluate(model, samples[split]))
    name = f"{ckpt['model_name']} ({Path(args.checkpoint).name}, epoch {ckpt.get('epoch', '?')})"
    rows = [(name, {k: float(v) for k, v in metrics.items()})]
    if spec.baselines is not None:
        rows += list(spec.baselines(cfg, samples[split]).items())
    print(f"{spec.name} / {split}: {_count_phrase(samples[split])}"
          + (" (settings chosen on the validation split)" if report else ""))
    print(format_metrics_table(rows))
    track_report = getattr(task, "track_report", None) if report else None  # tracking: matching tables
    if track_report is not None:
        from .tasks.tracking.metrics import format_track_metrics

        print(format_track_metrics(track_report))
    if args.plot:
        pairs = getattr(task, "param_pairs", None) if report else None
        if pairs is None:
            raise ValueError(f"--plot: the resolution plot is drawn for the track-parameter head of a track-reconstruction "
                             f"checkpoint on --split test, got task {spec.name!r}, split {split!r}")
        if not len(pairs[1]["pt"]):
            raise ValueError("--plot: no test track was matched (double majority) to a selected particle, so there is "
                             "no resolution to plot")
        from .tasks.tracking.resolution_plot import draw_resolutions

        print(f"wrote {draw_resolutions(*pairs, args.plot, title=name, fitted=getattr(task, 'fit_values', None))}")
    if args.json:
        _write_json_file(args.json, {"checkpoint": str(args.checkpoint), "task": spec.name, "split": split,
                                     "rows": {n: m for n, m in rows},
                                     **({"track_metrics": track_report} if track_report is not None else {})})
        print(f"wrote {args.json}")
    return 0


# ------------------------------------------------------------------------------ TrackML folders
def _check_new_file(path: str | None, opt: str, force: bool) -> None:
    """Refuse to overwrite an existing output file without --force (checked before any work)."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{opt}: {p} is a folder, expected a file name")
    if p.exists() and not force:
        raise ValueError(f"{opt}: {p} already exists; pass --force to overwrite it")
    from .trackml_eval import check_writable_folder

    check_writable_folder(p.parent, p)  # "cannot write FILE: reason" now, not after the work


def _write_json_file(path: str, payload: Mapping[str, Any]) -> None:
    """``engine.write_json`` with an unwritable target reported as ``cannot write FILE: reason``."""
    from .engine import write_json

    try:
        write_json(path, payload)
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _one_line_warnings(command: str):
    """Show warnings (e.g. the reader's "no detectors file") as ``pointformers CMD: warning: ...``."""
    old = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"pointformers {command}: warning: {str(message).splitlines()[0]}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = old


def _open_for_data(args: argparse.Namespace):
    """The checkpoint of ``evaluate --data`` / ``predict`` as a TrackingModel."""
    from .models.hept_tracking import is_reference_checkpoint
    from .trackml_eval import open_tracking_checkpoint

    if is_reference_checkpoint(args.checkpoint):
        for opt, val in (("--config", args.config), ("--set", args.set)):
            if val:
                raise ValueError(f"{opt}: a reference checkpoint ({args.checkpoint}) has no run config to change")
    return open_tracking_checkpoint(args.checkpoint, args.device, lambda ckpt: _config_for_checkpoint(args, ckpt))


def _resolve_eps(args: argparse.Namespace, tm) -> tuple[float, str]:
    """DBSCAN's radius and where it came from (see the --eps help)."""
    from .trackml_eval import REFERENCE_EPS, choose_eps_on_folder, choose_eps_on_validation

    raw = args.eps
    if args.eps_data is not None:
        if raw not in (None, "auto"):
            raise ValueError(f"--eps-data: chooses the radius, so it goes with --eps auto, not --eps {raw}")
        raw = "auto"
    if raw is None and tm.reference:
        return REFERENCE_EPS, ("default for reference checkpoints: best TrackML score on a real event "
                               "overlaid to Tracking-60k density, see --help")
    if raw is None:
        raw = "auto"
    if raw == "auto":
        if args.eps_data is not None:
            sel = choose_eps_on_folder(tm, args.eps_data, args.detectors)
            same = Path(args.eps_data).resolve() == Path(getattr(args, "data", "") or "").resolve()
            return sel.eps, (f"chosen on the events in {args.eps_data}, TrackML score {sel.score:.4f}"
                             + ("; these are the evaluated events, so the score is optimistic" if same else ""))
        if tm.reference:
            raise ValueError("--eps: auto needs --eps-data FOLDER of labelled TrackML events for a reference "
                             "checkpoint (it has no validation split)")
        sel = choose_eps_on_validation(tm)
        return sel.eps, f"chosen on the run's validation split, TrackML score {sel.score:.4f}"
    try:
        eps = float(raw)
    except ValueError:
        eps = float("nan")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"--eps: expected a number > 0 or 'auto', got {raw!r}")
    return eps, "given with --eps"


def _model_and_radius(args: argparse.Namespace):
    """The checkpoint opened for ``--data`` and DBSCAN's radius (None for an end-to-end model, whose sector size
    is set instead), announced on stdout."""
    from .trackml_eval import DBSCAN_MIN_SAMPLES, sector_hits_on_validation

    tm = _open_for_data(args)
    if not tm.end_to_end:
        if args.sector_hits is not None:
            raise ValueError("--sector-hits: sectors are an end-to-end (track-reconstruction) model's; "
                             f"{tm.label} builds tracks by DBSCAN")
        with _one_line_warnings(args.command):
            eps, source = _resolve_eps(args, tm)
        print(f"{tm.label} on the TrackML events in {args.data} (one cloud per event, pixel hits) on {tm.device}")
        print(f"DBSCAN eps {eps:.4g}, min_samples {DBSCAN_MIN_SAMPLES} ({source})")
        return tm, eps, source
    for opt, val in (("--eps", args.eps), ("--eps-data", args.eps_data)):
        if val is not None:
            raise ValueError(f"{opt}: DBSCAN's radius; {tm.label} is an end-to-end model that assigns hits to "
                             f"tracks itself (threshold, merging radius and hit gate from its validation, or --set "
                             f"model.options.threshold=... model.options.merge_radius=... "
                             f"model.options.hit_threshold=...)")
    if args.sector_hits is not None:
        if args.sector_hits < 1:
            raise ValueError(f"--sector-hits: expected an integer >= 1 (hits per phi-sector), got {args.sector_hits}")
        tm.model.sector_hits, source = args.sector_hits, "given with --sector-hits"
    elif tm.model.sector_hits:
        source = "the checkpoint's model.options.sector_hits"
    else:
        with _one_line_warnings(args.command):
            tm.model.sector_hits = sector_hits_on_validation(tm)
        source = "the median hits of the run's validation clouds per sector"
    print(f"{tm.label} on the TrackML events in {args.data} (one event at a time, pixel hits) on {tm.device}")
    print(f"end-to-end tracks: assignment threshold {tm.model.threshold:.4g}, merging radius "
          f"{tm.model.merge_radius:.4g}, hit gate {tm.model.hit_threshold:.4g} (the checkpoint's); "
          f"phi-sectors of at most {tm.model.sector_hits} hits "
          f"({source})")
    return tm, None, source


def cmd_evaluate_data(args: argparse.Namespace) -> int:
    from .trackml_eval import DBSCAN_MIN_SAMPLES, check_event_folder, evaluate_folder

    if args.split is not None:
        raise ValueError("--split: not used with --data (every event of the folder is evaluated)")
    if not (math.isfinite(args.match_pt_min) and args.match_pt_min >= 0):
        raise ValueError(f"--match-pt-min: expected a number >= 0 (GeV), got {args.match_pt_min}")
    if not (math.isfinite(args.match_eta_max) and args.match_eta_max > 0):
        raise ValueError(f"--match-eta-max: expected a number > 0, got {args.match_eta_max}")
    _check_new_file(args.json, "--json", args.force)
    check_event_folder(args.data, True, args.detectors)  # before the model and the radius
    tm, eps, source = _model_and_radius(args)
    print(f"AP@k: pt > {tm.pt_min:g} GeV, K = {tm.K}")
    with _one_line_warnings("evaluate"):
        res = evaluate_folder(tm, args.data, eps, args.detectors, log=print, match_pt_min=args.match_pt_min,
                              match_eta_max=args.match_eta_max)
    if args.json:
        tracks = ({"threshold": tm.model.threshold, "merge_radius": tm.model.merge_radius,
                   "hit_threshold": tm.model.hit_threshold, "sector_hits": tm.model.sector_hits, "sector_hits_source": source} if tm.end_to_end else
                  {"dbscan_eps": eps, "dbscan_min_samples": DBSCAN_MIN_SAMPLES, "eps_source": source})
        _write_json_file(args.json, {"checkpoint": str(args.checkpoint), "model": tm.label, "data": str(args.data),
                                     "detectors": args.detectors, **tracks, "pt_min": tm.pt_min, "K": tm.K, **res})
        print(f"wrote {args.json}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from .trackml_eval import check_event_folder, check_outputs, predict_folder

    check_outputs(args.out, check_event_folder(args.data, False, args.detectors), args.force)
    tm, eps, _ = _model_and_radius(args)
    with _one_line_warnings("predict"):
        written = predict_folder(tm, args.data, args.out, eps, args.detectors, args.force, log=print)
    print(f"wrote {len(written)} files to {args.out}")
    return 0


# ------------------------------------------------------------------------------ generate
def cmd_generate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    spec = _spec(cfg)
    splits = _splits_arg(args.splits)
    t0 = time.perf_counter()
    from .data.cache import writes_required

    if spec.generate is not None:
        with writes_required():  # an unwritable cache fails (exit 2), generating is for the cache
            paths = spec.generate(cfg, splits)
    else:  # no cache files of its own: loading is the generation
        samples = spec.load(cfg, splits, False)
        paths = [f"{s}: {len(samples[s])} samples (task {spec.name!r} keeps no cache files)" for s in splits]
    for p in paths:
        print(p)
    print(f"{spec.name}: {', '.join(splits)} ready ({time.perf_counter() - t0:.1f} s)")
    return 0


# ------------------------------------------------------------------------------ plot
def cmd_plot(args: argparse.Namespace) -> int:
    from .engine import load_checkpoint, model_from_checkpoint
    from .engine.plots import draw_learning_curves, read_history

    run = Path(args.run_dir)
    out = Path(args.out) if args.out else run
    history, meta = read_history(run)
    cfg_meta = (meta.get("extra") or {}).get("config") if isinstance(meta.get("extra"), Mapping) else None
    metric = (meta.get("config") or {}).get("metric")
    title = f"{run.name}: {meta.get('model_name', '')}".rstrip(": ")
    written = [draw_learning_curves(history, out / "learning_curves.png", title=title, metric=metric)]
    best = run / "best.pt"
    if not args.no_task_plots and isinstance(cfg_meta, Mapping) and best.is_file():
        cfg = load_config(None, (), base=cfg_meta)
        spec = _spec(cfg)
        if spec.plot is not None:
            ckpt = load_checkpoint(best, required=("model", "model_name", "model_config"))
            model = model_from_checkpoint(ckpt)
            val = spec.load(cfg, ("val",), False)["val"]
            written += [Path(p) for p in spec.plot(cfg, model, val, out)]
    for p in written:
        print(p)
    return 0


# ------------------------------------------------------------------------------ benchmark
def cmd_benchmark_config(args: argparse.Namespace) -> int:
    import json

    from .engine.benchmark import benchmark_task_model
    from .engine.distributed import resolve_device

    cfg = load_config(args.config, args.set)
    spec = _spec(cfg)
    if args.samples < 1 or args.repeats < 1:
        raise ValueError(f"--samples/--repeats: must be >= 1, got {args.samples}, {args.repeats}")
    samples = spec.load(cfg, (args.split,), False)[args.split][: args.samples]
    if args.split != "train" and samples and not _has_training_targets(spec, cfg, samples[0]):
        samples = spec.load(cfg, ("train",), False)["train"][: args.samples]  # loss needs training targets
    device = resolve_device(cfg["train"]["device"])
    model = _build_model(cfg)
    r = benchmark_task_model(model, spec.build(cfg), samples, device, cfg["train"]["precision"],
                             repeats=args.repeats, warmup=args.warmup)
    print(f"{spec.name} / {cfg['model']['name']} ({r['parameters']} parameters) on {r['device']}, {r['precision']}, "
          f"{r['num_samples']} samples, median of {r['repeats']}:")
    print(f"  train step  {r['train_step_ms']:10.2f} ms/sample")
    print(f"  evaluate    {r['evaluate_ms']:10.2f} ms/sample")
    print(f"  memory      {r['peak_memory_mb']:10.1f} MiB ({r['memory_kind']})")
    if args.json:
        from .files import atomic_write

        text = (json.dumps({**r, "config": cfg}, indent=2) + "\n").encode()
        atomic_write(args.json, lambda f: f.write(text))  # FileWriteError names the file
        print(f"wrote {args.json}")
    return 0


def _has_training_targets(spec, cfg, sample) -> bool:
    """Whether ``task.loss`` works on ``sample`` (tracking's evaluation clouds carry no pairs)."""
    return bool(getattr(sample, "has_pairs", True))


def cmd_benchmark(args: argparse.Namespace) -> int:
    from .bench import suite

    suite.main(list(args.args))
    return 0


def _benchmark_config_parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(prog="pointformers benchmark",
                                description="Time a configured model's training step and evaluation per sample.")
    b.add_argument("--config", required=True, help="YAML config of the (task, model) pair")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    b.add_argument("--split", default="train", choices=("train", "val", "test"), help="samples to time (default: train)")
    b.add_argument("--samples", type=int, default=4, help="number of samples (default 4)")
    b.add_argument("--repeats", type=int, default=3, help="timed rounds, the median is reported (default 3)")
    b.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    b.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    b.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    b.set_defaults(func=cmd_benchmark_config, command="benchmark")
    return b


# ------------------------------------------------------------------------------ demo
def _prepare(cfg: Mapping[str, Any], splits: Sequence[str], pairs_for: Sequence[str] = ("train",),
             progress: bool = False, keep_events: bool = False) -> tuple[dict, dict]:
    """Tracking clouds per split, keeping the events for the demo's display. Returns (clouds, timings)."""
    from .tasks.tracking.training import load_tracking_splits, prepare_tracking_clouds

    d, t = cfg["data"], cfg["task"]
    t0 = time.perf_counter()
    events = load_tracking_splits(d["preset"], splits, cache_dir=d["cache_dir"], seed=d["seed"])
    t1 = time.perf_counter()
    clouds = {s: prepare_tracking_clouds(events[s], with_pairs=s in pairs_for, radius=t["radius"],
                                         max_num_neighbors=t["max_num_neighbors"], pt_min=t["pt_min"],
                                         keep_events=keep_events, progress=progress and s in pairs_for,
                                         desc=f"{s} pairs", cache_dir=d["cache_dir"])
              for s in splits}
    return clouds, {"data_s": t1 - t0, "prepare_s": time.perf_counter() - t1}


def run_demo(out: str | os.PathLike = "runs/demo", epochs: int | None = None, preset: str | None = None,
             config: str | None = None, overrides: Sequence[str] = (), log=print,
             overwrite: bool = True) -> dict[str, Any]:
    """Generate data, train HEPT, evaluate against the untrained model and kNN in (η, φ), draw the
    event display. Writes ``results.json``, ``event_display.png``, checkpoints and metrics to
    ``out``; returns the results dict. The demo is a scratch run: by default (``overwrite``) an
    earlier run in ``out`` is replaced; ``out`` is locked against a concurrent run either way."""
    t_all = time.perf_counter()
    extra = list(overrides)
    if epochs is not None:
        extra.append(f"train.epochs={int(epochs)}")
    if preset is not None:
        extra.append(f"data.preset={preset}")
    cfg = load_config(config, extra)
    if cfg["task"]["name"] != "tracking":
        raise ConfigError(f"task.name: the demo runs the tracking task, got {cfg['task']['name']!r} "
                          f"(use pointformers train for other tasks)")
    out = Path(out)
    cfg["out"] = str(out)
    lock = _claim_run_folder(out, False, overwrite)
    try:
        return _run_demo(cfg, out, overwrite, log, t_all)
    finally:
        lock.release()


def _run_demo(cfg: dict[str, Any], out: Path, overwrite: bool, log, t_all: float) -> dict[str, Any]:
    from .engine import TrainConfig, fit, progress_enabled, write_json
    from .tasks.tracking import ap_at_k, cluster_tracks
    from .tasks.tracking.display import choose_eps, draw_event_display
    from .tasks.tracking.training import knn_baseline_metrics

    show = progress_enabled(cfg["train"]["progress"])
    log(f"[1/4] data: preset {cfg['data']['preset']!r} (generated once, then cached)")
    clouds, timing = _prepare(cfg, ("train", "val", "test"), progress=show, keep_events=True)
    n_hits = [c.num_hits for s in clouds for c in clouds[s]]
    log(f"      {len(clouds['train'])}/{len(clouds['val'])}/{len(clouds['test'])} train/val/test clouds, "
        f"{sum(n_hits) / max(len(n_hits), 1):.0f} hits per cloud; data {timing['data_s']:.1f} s, "
        f"pairs {timing['prepare_s']:.1f} s")
    _start_run_files(out, cfg, overwrite)

    task = _spec(cfg).build(cfg)
    untrained = _build_model(cfg)
    t0 = time.perf_counter()
    rows_untrained = task.evaluate(untrained, clouds["test"])
    knn = knn_baseline_metrics(clouds["test"], cfg["task"]["pt_min"])
    timing["baselines_s"] = time.perf_counter() - t0
    del untrained

    tr = cfg["train"]
    schedule = tr.get("schedule", "step")
    schedule = f"StepLR({tr['step_size']}, {tr['gamma']:g})" if schedule == "step" else schedule
    log(f"[2/4] training {cfg['model']['name']} {cfg['model']['options']}: {tr['epochs']} epochs, "
        f"{tr.get('optimizer', 'adam')} lr {tr['lr']:g}, {schedule}")
    t0 = time.perf_counter()
    model = _build_model(cfg)
    res = fit(model, task, clouds["train"], clouds["val"], TrainConfig(**tr), out, cfg["model"]["name"],
              cfg["model"]["options"], test=clouds["test"], extra={"config": cfg}, log=lambda s: log("      " + s))
    timing["train_s"] = time.perf_counter() - t0

    log("[3/4] event display")
    t0 = time.perf_counter()
    val_emb = task.embed(model, clouds["val"])
    eps, eps_scores = choose_eps(val_emb, [c.inputs.particle_id for c in clouds["val"]],
                                 [c.inputs.pt for c in clouds["val"]], [c.inputs.reconstructable for c in clouds["val"]])
    cloud = clouds["test"][0]
    emb = task.embed(model, [cloud])[0]
    labels = cluster_tracks(emb, eps)
    ev = cloud.event
    png = draw_event_display(
        out / "event_display.png", ev.x, ev.y, labels, cloud.inputs.particle_id,
        title=f"HEPT tracking demo - test cloud 0 ({cloud.num_hits} hits), AP@k "
              f"{ap_at_k(emb, cloud.inputs.particle_id, cloud.inputs.pt, cloud.inputs.reconstructable):.3f}",
        pred_note=f"DBSCAN on embeddings, eps={eps:.3g} (best track-match score on val: {eps_scores[eps]:.3f})")
    timing["display_s"] = time.perf_counter() - t0

    rows = [{"model": f"HEPT trained ({len(res.history)} epochs, best val epoch {res.best_epoch})", **(res.test or {})},
            {"model": "HEPT untrained (random init)", **rows_untrained},
            {"model": "kNN in (eta, phi)", **knn}]
    timing["total_s"] = time.perf_counter() - t_all
    results = {"preset": cfg["data"]["preset"], "split": "test", "num_clouds": len(clouds["test"]),
               "rows": [{k: r.get(k) for k in ("model", "ap@k", "precision@K", "recall@K")} for r in rows],
               "best_epoch": res.best_epoch, "best_val_ap@k": res.best_metric, "display": str(png),
               "dbscan_eps": eps, "timing_s": timing, "config": cfg}
    write_json(out / "results.json", results)
    log(f"[4/4] results on the {cfg['data']['preset']!r} test split ({len(clouds['test'])} clouds):")
    log(format_table(results["rows"]))
    log(f"time: data {timing['data_s']:.1f} s, pairs {timing['prepare_s']:.1f} s, baselines {timing['baselines_s']:.1f} s, "
        f"training {timing['train_s']:.1f} s, display {timing['display_s']:.1f} s; total {timing['total_s']:.1f} s")
    log(f"wrote {out / 'results.json'}, {png}, {out / 'best.pt'}, {out / 'metrics.json'}")
    return results


def cmd_demo(args: argparse.Namespace) -> int:
    run_demo(args.out, args.epochs, args.preset, args.config, args.set, overwrite=True)
    return 0


# ------------------------------------------------------------------------------ parser
def _config_args(p: argparse.ArgumentParser, config_help: str) -> None:
    p.add_argument("--config", default=None, help=config_help)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. train.epochs=3 (repeatable)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice; use 1 on a busy shared machine)")


_EPS_HELP = (
    "DBSCAN radius for track building: a number, or 'auto'. Default: for a run checkpoint, auto = chosen on "
    "the run's validation split by the TrackML score (as evaluate --split test does); for a reference "
    "checkpoint {eps} -- the best TrackML score of hept-tracking-60k on a public real TrackML event (548 "
    "particles) overlaid 20 times, rotated in phi, to the density of a Tracking-60k event (55,660 pixel hits; "
    "best 0.53 and 0.56 for two overlays); the best radius shrinks as events get denser (1.0 for the sparse "
    "event alone). auto with a reference checkpoint needs --eps-data. Never chosen on the evaluated events "
    "unless --eps-data names them.")

_EVALUATE_HELP = """Evaluate a checkpoint.

  pointformers evaluate --checkpoint runs/x/best.pt --split test
      every metric of the run's task on its generated split (tracking: DBSCAN radius chosen on val,
      then the track-matching table: double-majority, perfect and LHC efficiencies, fake and
      duplicate rates of the DBSCAN tracks, overall and against pT and eta; cuts task.match_pt_min,
      task.match_eta_max)
  pointformers evaluate --checkpoint hept-tracking-60k --data FOLDER [--json FILE]
      the shipped HEPT model (or --checkpoint PATH: an authors' state_dict, or a run's best.pt) on
      every labelled TrackML event in FOLDER, one cloud per event (pixel volumes 7, 8, 9 only).
      Per event and overall: AP@k, precision@K, recall@K (queries: reconstructable hits with
      pT > task.pt_min, 0.9 GeV for reference checkpoints; K = 19; overall = mean over events with a query hit, as the task averages
      clouds), the TrackML score of DBSCAN track candidates (min_samples 2; official truth
      weights; overall = mean over events, as the challenge averages them), the number of
      tracks and the seconds per event; the track-matching efficiency and fake rate (double
      majority) per event, then the track-matching table of all events (pT >= 0.9 GeV, |eta| < 4).
      --json FILE: the same numbers (null for n/a; the table under "track_metrics").
  pointformers evaluate --checkpoint runs/e2e/best.pt --data FOLDER
      an end-to-end track-reconstruction run on the same events: its own tracks instead of DBSCAN's
      (threshold and merging radius as its validation chose them), each event cut into phi-sectors
      of at most --sector-hits hits; AP@k is that of its InfoNCE hit embedding.
"""

_PREDICT_HELP = """Run a tracking checkpoint on unlabelled TrackML events (hits and cells only).

  pointformers predict --checkpoint hept-tracking-60k --data FOLDER --out OUTDIR

Only pixel hits (volumes 7, 8, 9) are read; each event is one cloud. Per event <name> it writes,
atomically (temporary file, then rename), and refusing to overwrite without --force:
  OUTDIR/<name>-tracks.csv       hit_id,track_id -- one line per pixel hit, in the hits file's
                                 order (TrackML submission columns). Every hit has a track id
                                 >= 1: 1..C are DBSCAN clusters (2+ hits), C+1.. are one-hit
                                 tracks, one per hit DBSCAN left unassigned.
  OUTDIR/<name>-embeddings.npz   hit_id int64 (N,), embedding float32 (N, 12) (HEPT's 12-d
                                 output; (N, d) for other models), track_id int64 (N,) as in
                                 the CSV, dbscan_eps float64 (); same row order.

An end-to-end track-reconstruction checkpoint (a run's best.pt) writes its own tracks: track ids
1..C its tracks, C+1.. one per hit it left without a track; the npz holds its InfoNCE embedding
and threshold, merge_radius, hit_threshold, sector_hits instead of dbscan_eps.
"""


def _data_args(p: argparse.ArgumentParser, data_help: str, required: bool) -> None:
    from .trackml_eval import REFERENCE_EPS

    p.add_argument("--data", default=None, required=required, metavar="FOLDER", help=data_help)
    p.add_argument("--detectors", default=None, metavar="FILE",
                   help="TrackML detectors.csv (default: detectors.csv or .csv.gz in FOLDER, then in its parent; "
                        "without one the cluster features fall back to nominal values, with a warning)")
    p.add_argument("--eps", default=None, metavar="EPS|auto", help=_EPS_HELP.format(eps=REFERENCE_EPS))
    p.add_argument("--eps-data", default=None, metavar="FOLDER",
                   help="labelled TrackML events (not the evaluated ones) to choose --eps auto on")
    p.add_argument("--sector-hits", type=int, default=None, metavar="N",
                   help="end-to-end (track-reconstruction) checkpoints: cut each event into phi-sectors of at most N "
                        "hits (default: the model's sector_hits option, else the median hits of the run's "
                        "validation clouds per sector, the size its slots were trained on)")
    p.add_argument("--device", default=None,
                   help="auto, cpu, cuda or cuda:K (default: auto; a run checkpoint's train.device)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pointformers", description="Efficient transformers for large point clouds.",
                                epilog="--plugin MODULE|FILE.py (any position, repeatable): import a plugin that "
                                       "registers attention mechanisms, models or tasks first "
                                       "(docs/adding-a-mechanism.md); also read from POINTFORMERS_PLUGINS.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="train HEPT on a small synthetic tracking set and compare with baselines (minutes on CPU)")
    d.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo); a scratch run: an earlier "
                   "run there is replaced (its checkpoints and metrics), other files are kept")
    d.add_argument("--epochs", type=int, default=None, help=f"epochs (default: {DEMO_CONFIG['train']['epochs']})")
    d.add_argument("--preset", default=None, help="tracking preset: tiny, small (default), tracking-6k, tracking-60k")
    _config_args(d, "YAML config to start from instead of the built-in one")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", help="train a model from a YAML config (single process or under torchrun)")
    _config_args(t, "YAML config (default: the demo's)")
    t.add_argument("--out", default=None, help="run folder (default: the config's 'out')")
    t.add_argument("--resume", action="store_true",
                   help="continue exactly from OUT/last.pt (from epoch 1, saying so, where no epoch finished "
                        "yet); a config differing from the run's is refused (naming the keys), except a larger "
                        "train.epochs")
    t.add_argument("--accept-config-change", action="store_true",
                   help="with --resume: continue with the new config even where it differs from the run's "
                        "(recorded under config_changes in OUT/metrics.json)")
    t.add_argument("--overwrite", action="store_true",
                   help="start a new run in an OUT that holds one: its last.pt, best.pt and metrics.* are deleted "
                        "and config.yaml rewritten once the new run is set up, other files are kept (without "
                        "--resume or --overwrite an OUT holding a run is refused; one run at a time per OUT, "
                        "locked by OUT/.lock)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on a split, or on a folder of TrackML events",
                       description=_EVALUATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--checkpoint", required=True,
                   help="best.pt / last.pt written by train or demo; with --data also a reference checkpoint: "
                        "hept-tracking-60k (shipped) or a file holding an authors' HEPT state_dict")
    _config_args(e, "YAML config (default: the one stored in the checkpoint)")
    e.add_argument("--split", default=None, choices=("train", "val", "test"),
                   help="generated split of the checkpoint's config to evaluate (default: test; not with --data)")
    _data_args(e, "folder of labelled TrackML events (hits, cells, truth, particles; .csv or .csv.gz): "
                  "AP@k and TrackML score per event and overall", required=False)
    e.add_argument("--match-pt-min", type=float, default=0.9, metavar="GEV",
                   help="with --data: pT cut of the particles the track-matching metrics count (default 0.9 GeV; "
                        "for --split the config's task.match_pt_min)")
    e.add_argument("--match-eta-max", type=float, default=4.0, metavar="ETA",
                   help="with --data: |η| cut of those particles (default 4; for --split task.match_eta_max)")
    e.add_argument("--json", default=None, metavar="FILE", help="also write every number to this JSON file")
    e.add_argument("--plot", default=None, metavar="PNG",
                   help="track-reconstruction checkpoints, --split test: write the track-parameter resolution plot "
                        "(needs matplotlib: the 'plots' extra)")
    e.add_argument("--force", action="store_true", help="overwrite an existing --json or --plot file")
    e.set_defaults(func=cmd_evaluate)

    pr = sub.add_parser("predict", help="run a tracking checkpoint on unlabelled TrackML events: per-hit "
                                        "embeddings and track ids",
                        description=_PREDICT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("--checkpoint", required=True,
                    help="hept-tracking-60k (shipped), an authors' HEPT state_dict file, or a tracking or "
                         "track-reconstruction run's best.pt")
    _config_args(pr, "YAML config of a run checkpoint (default: the one stored in it)")
    _data_args(pr, "folder of TrackML events: <event>-hits.csv and <event>-cells.csv (.csv.gz too); "
                   "truth and particles files are not needed and not read", required=True)
    pr.add_argument("--out", required=True, metavar="OUTDIR",
                    help="folder for <event>-tracks.csv and <event>-embeddings.npz (created if needed)")
    pr.add_argument("--force", action="store_true", help="overwrite existing output files (default: refuse)")
    pr.set_defaults(func=cmd_predict)

    g = sub.add_parser("generate", help="generate (or read) a config's data set and write its caches")
    _config_args(g, "YAML config (default: the demo's)")
    g.add_argument("--splits", default="train,val,test", help="comma-separated splits (default: train,val,test)")
    g.set_defaults(func=cmd_generate)

    pl = sub.add_parser("plot", help="draw a run's learning curves (and the task's figures, e.g. the event display)")
    pl.add_argument("run_dir", metavar="RUN_DIR", help="folder written by pointformers train")
    pl.add_argument("--out", default=None, help="folder for the PNG files (default: RUN_DIR)")
    pl.add_argument("--no-task-plots", action="store_true", help="only the learning curves")
    pl.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    pl.set_defaults(func=cmd_plot)

    b = sub.add_parser("benchmark", add_help=False,
                       help="with --config F: time that model's training step and evaluation; without: the "
                            "speed/memory/FLOPs/approximation suite of docs/benchmarks.md "
                            "(pointformers benchmark --help for its options)")
    b.add_argument("args", nargs=argparse.REMAINDER, help="passed to pointformers.bench.suite")
    b.set_defaults(func=cmd_benchmark, threads=None)

    from .export.cli import add_export_parser

    add_export_parser(sub)  # pointformers export --checkpoint RUN/best.pt --format onnx|torch.export
    return p


def _load_plugin_args(argv: list[str]) -> list[str]:
    """Import the ``--plugin MODULE|FILE.py`` options (anywhere in argv; before the command too) and
    those of the environment's ``POINTFORMERS_PLUGINS``, and add them to that variable so worker
    processes import them too. Returns argv without them."""
    from .registry import PLUGIN_ENV, load_plugins

    rest, plugins, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--plugin":
            if i + 1 >= len(argv):
                raise ValueError("--plugin: expected a module name or a .py file")
            plugins.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--plugin="):
            plugins.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    if plugins:
        known = [s for s in os.environ.get(PLUGIN_ENV, "").split(os.pathsep) if s]
        # absolute paths: workers may run elsewhere
        plugins = [os.path.abspath(p) if p.endswith(".py") else p for p in plugins]
        os.environ[PLUGIN_ENV] = os.pathsep.join(known + [p for p in plugins if p not in known])
    load_plugins()
    return rest


#: Optional dependencies (top-level module -> (pip name, extra in pyproject.toml)): a command that
#: needs a missing one stops with a one-line error naming the extra to install.
OPTIONAL_DEPENDENCIES: dict[str, tuple[str, str]] = {
    "scipy": ("scipy", "tasks"), "sklearn": ("scikit-learn", "tasks"), "yaml": ("PyYAML", "tasks"),
    "tqdm": ("tqdm", "tasks"), "matplotlib": ("matplotlib", "plots"), "onnx": ("onnx", "export"),
    "onnxscript": ("onnxscript", "export"), "onnxruntime": ("onnxruntime", "export"), "h5py": ("h5py", "io"),
    "uproot": ("uproot", "io"), "awkward": ("awkward", "io"), "tensorboard": ("tensorboard", "logging"),
}


def missing_dependency_message(exc: ImportError) -> str | None:
    """The install hint for ``exc`` when it is a missing optional dependency, else None."""
    top = (getattr(exc, "name", None) or "").split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and top in OPTIONAL_DEPENDENCIES:
        pip_name, extra = OPTIONAL_DEPENDENCIES[top]
        return (f"needs the optional package {pip_name}, which is not installed: pip install 'pointformers[{extra}]' "
                "('pointformers[all]' installs what every command needs)")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the exit status: 0 ok, 2 bad arguments/config or a missing optional
    dependency (the message names the extra to install), 130 interrupted."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _load_plugin_args(argv)
    except ValueError as exc:
        print(f"pointformers: error: {exc}", file=sys.stderr)
        return 2
    if argv[:1] == ["benchmark"]:
        rest = argv[1:]
        if any(a == "--config" or a.startswith("--config=") for a in rest):
            args = _benchmark_config_parser().parse_args(rest)
        else:
            # Everything after "benchmark" belongs to the suite's own parser (argparse's REMAINDER
            # would reject a leading option such as --quick).
            args = argparse.Namespace(command="benchmark", args=rest, threads=None, func=cmd_benchmark)
    else:
        args = parser.parse_args(argv)
    import torch

    threads_before = torch.get_num_threads()
    try:
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads: must be >= 1, got {args.threads}")
            # Small clouds gain little from a second thread, while OpenMP threads that
            # spin-wait on a core another process holds slow a step down many times
            # (docs/benchmarks.md, "Notes from measurements").
            torch.set_num_threads(args.threads)
        return int(args.func(args) or 0)
    except ValueError as exc:  # config and input errors: one line, no traceback
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"pointformers {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional dependency of this command is not installed
        msg = missing_dependency_message(exc)
        if msg is None:
            raise
        print(f"pointformers {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\npointformers {args.command}: interrupted; files from completed epochs are intact", file=sys.stderr)
        return 130
    finally:
        torch.set_num_threads(threads_before)  # main() may be called in-process (tests, notebooks)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

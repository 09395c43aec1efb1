"""The ``pointformers`` command: ``demo``, ``train``, ``evaluate``, ``benchmark``, ``generate``,
``plot`` and ``export``.

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
import math
import os
import sys
import time
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
#:   better), StepLR halving every 6 epochs: the paper's schedule shrunk to a 24-epoch run
#:   (20 epochs reach val/test AP@k 0.800/0.797; validation AP still rises at the end).
DEMO_CONFIG: dict[str, Any] = {
    "data": {"preset": "small", "seed": 0, "cache_dir": None},
    "model": {"name": "hept-tracking", "options": {"num_regions": 8, "block_size": 100, "dropout": 0.0}},
    "task": {"similarity": "l2_rbf", "tau": 0.05, "sigma": 0.75, "random_pairs": 0.2, "pt_min": 0.9,
             "radius": 1.0, "max_num_neighbors": 256},
    "train": {"epochs": 24, "lr": 0.003, "step_size": 6, "gamma": 0.5, "weight_decay": 0.0, "seed": 42,
              "progress": None},
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
    env = init_distributed(cfg["train"]["device"])
    try:
        t0 = time.perf_counter()
        show = env.is_main and progress_enabled(cfg["train"]["progress"])
        if env.distributed and not env.is_main:
            barrier(env)  # rank 0 generates and caches the data first; the others then read the cache
        samples = spec.load(cfg, ("train", "val", "test"), show)
        if env.distributed and env.is_main:
            barrier(env)
        t_data = time.perf_counter() - t0
        if env.is_main:
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.yaml").write_text(dump_config(cfg))
            print(f"{spec.name}: train {_count_phrase(samples['train'])}, val {_count_phrase(samples['val'])}, "
                  f"test {_count_phrase(samples['test'])} ({t_data:.1f} s); {env.world_size} process(es) on {env.device}")
        model = _build_model(cfg)
        res = fit(model, spec.build(cfg), samples["train"], samples["val"], TrainConfig(**cfg["train"]), out,
                  cfg["model"]["name"], cfg["model"]["options"], test=samples.get("test"), resume=args.resume,
                  extra={"config": cfg}, dist=env)
        if env.is_main:
            metric = cfg["train"]["metric"]
            print(f"best epoch {res.best_epoch}: val {metric} {_fmt(res.best_metric)}; "
                  f"test {metric} {_fmt((res.test or {}).get(metric))}")
            print(f"checkpoint: {out / 'best.pt'}  metrics: {out / 'metrics.json'}, {out / 'metrics.csv'}  "
                  f"({res.seconds + t_data:.1f} s)")
    finally:
        shutdown_distributed(env)
    return 0


# ------------------------------------------------------------------------------ evaluate
def _config_for_checkpoint(args: argparse.Namespace, ckpt: Mapping[str, Any]) -> dict[str, Any]:
    if args.config is not None:
        return load_config(args.config, args.set)
    stored = (ckpt.get("extra") or {}).get("config")
    return load_config(None, args.set, base=stored if isinstance(stored, Mapping) else DEMO_CONFIG)


def cmd_evaluate(args: argparse.Namespace) -> int:
    import contextlib

    import torch

    from .engine import load_checkpoint, model_from_checkpoint
    from .engine.distributed import resolve_device

    ckpt = load_checkpoint(args.checkpoint, required=("model", "model_name", "model_config"))
    cfg = _config_for_checkpoint(args, ckpt)
    spec = _spec(cfg)
    device = resolve_device(cfg["train"]["device"])
    model = model_from_checkpoint(ckpt, map_location=device)
    task = spec.build(cfg)
    report = hasattr(task, "evaluate_report") and args.split == "test"
    splits = ("val", "test") if report else (args.split,)
    samples = spec.load(cfg, splits, False)
    ctx = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if cfg["train"]["precision"] == "bf16"
           else contextlib.nullcontext())
    with ctx:
        metrics = (task.evaluate_report(model, samples["val"], samples["test"]) if report
                   else task.evaluate(model, samples[args.split]))
    name = f"{ckpt['model_name']} ({Path(args.checkpoint).name}, epoch {ckpt.get('epoch', '?')})"
    rows = [(name, {k: float(v) for k, v in metrics.items()})]
    if spec.baselines is not None:
        rows += list(spec.baselines(cfg, samples[args.split]).items())
    print(f"{spec.name} / {args.split}: {_count_phrase(samples[args.split])}"
          + (" (settings chosen on the validation split)" if report else ""))
    print(format_metrics_table(rows))
    return 0


# ------------------------------------------------------------------------------ generate
def cmd_generate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    spec = _spec(cfg)
    splits = _splits_arg(args.splits)
    t0 = time.perf_counter()
    if spec.generate is not None:
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
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**r, "config": cfg}, indent=2) + "\n")
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
    from .tasks.tracking_training import load_tracking_splits, prepare_tracking_clouds

    d, t = cfg["data"], cfg["task"]
    t0 = time.perf_counter()
    events = load_tracking_splits(d["preset"], splits, cache_dir=d["cache_dir"], seed=d["seed"])
    t1 = time.perf_counter()
    clouds = {s: prepare_tracking_clouds(events[s], with_pairs=s in pairs_for, radius=t["radius"],
                                         max_num_neighbors=t["max_num_neighbors"], pt_min=t["pt_min"],
                                         keep_events=keep_events, progress=progress and s in pairs_for,
                                         desc=f"{s} pairs")
              for s in splits}
    return clouds, {"data_s": t1 - t0, "prepare_s": time.perf_counter() - t1}


def run_demo(out: str | os.PathLike = "runs/demo", epochs: int | None = None, preset: str | None = None,
             config: str | None = None, overrides: Sequence[str] = (), log=print) -> dict[str, Any]:
    """Generate data, train HEPT, evaluate against the untrained model and kNN in (η, φ), draw the
    event display. Writes ``results.json``, ``event_display.png``, checkpoints and metrics to
    ``out``; returns the results dict."""
    from .engine import TrainConfig, fit, progress_enabled, write_json
    from .tasks.tracking import ap_at_k, cluster_tracks
    from .tasks.tracking_display import choose_eps, draw_event_display
    from .tasks.tracking_training import knn_baseline_metrics

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
    show = progress_enabled(cfg["train"]["progress"])
    log(f"[1/4] data: preset {cfg['data']['preset']!r} (generated once, then cached)")
    clouds, timing = _prepare(cfg, ("train", "val", "test"), progress=show, keep_events=True)
    n_hits = [c.num_hits for s in clouds for c in clouds[s]]
    log(f"      {len(clouds['train'])}/{len(clouds['val'])}/{len(clouds['test'])} train/val/test clouds, "
        f"{sum(n_hits) / max(len(n_hits), 1):.0f} hits per cloud; data {timing['data_s']:.1f} s, "
        f"pairs {timing['prepare_s']:.1f} s")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))

    task = _spec(cfg).build(cfg)
    untrained = _build_model(cfg)
    t0 = time.perf_counter()
    rows_untrained = task.evaluate(untrained, clouds["test"])
    knn = knn_baseline_metrics(clouds["test"], cfg["task"]["pt_min"])
    timing["baselines_s"] = time.perf_counter() - t0
    del untrained

    tr = cfg["train"]
    log(f"[2/4] training {cfg['model']['name']} {cfg['model']['options']}: {tr['epochs']} epochs, Adam lr {tr['lr']:g}, "
        f"StepLR({tr['step_size']}, {tr['gamma']:g})")
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
    run_demo(args.out, args.epochs, args.preset, args.config, args.set)
    return 0


# ------------------------------------------------------------------------------ parser
def _config_args(p: argparse.ArgumentParser, config_help: str) -> None:
    p.add_argument("--config", default=None, help=config_help)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. train.epochs=3 (repeatable)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice; use 1 on a busy shared machine)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pointformers", description="Efficient transformers for large point clouds.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="train HEPT on a small synthetic tracking set and compare with baselines (minutes on CPU)")
    d.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    d.add_argument("--epochs", type=int, default=None, help=f"epochs (default: {DEMO_CONFIG['train']['epochs']})")
    d.add_argument("--preset", default=None, help="tracking preset: tiny, small (default), tracking-6k, tracking-60k")
    _config_args(d, "YAML config to start from instead of the built-in one")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", help="train a model from a YAML config (single process or under torchrun)")
    _config_args(t, "YAML config (default: the demo's)")
    t.add_argument("--out", default=None, help="run folder (default: the config's 'out')")
    t.add_argument("--resume", action="store_true", help="continue exactly from OUT/last.pt")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on a split, printing every metric of the task")
    e.add_argument("--checkpoint", required=True, help="best.pt / last.pt written by train or demo")
    _config_args(e, "YAML config (default: the one stored in the checkpoint)")
    e.add_argument("--split", default="test", choices=("train", "val", "test"))
    e.set_defaults(func=cmd_evaluate)

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the exit status: 0 ok, 2 bad arguments/config, 130 interrupted."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
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
            # spin-wait on a core another process holds can slow a step 5-50x.
            torch.set_num_threads(args.threads)
        return int(args.func(args) or 0)
    except ValueError as exc:  # config and input errors: one line, no traceback
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"pointformers {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\npointformers {args.command}: interrupted; files from completed epochs are intact", file=sys.stderr)
        return 130
    finally:
        torch.set_num_threads(threads_before)  # main() may be called in-process (tests, notebooks)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""One task's configs side by side on several seeds: the ``task-<task>`` section of docs/results.md.

Every config is trained once per seed with its own ``train`` section and scored on the test split
at its best validation epoch (:func:`.point_results.train_config`); the table shows each test
metric as mean ± std over seeds. Claims, decided by :mod:`.seed_rule` (at least three seeds; a
difference counts only beyond the seeds' spread):

* the task needs attention: the attention-free baseline (``--baseline``, an MLP with pooling) is
  worse than full attention (``--reference``) beyond the spread -- for a generated stand-in data
  set this is the check that it really asks for long-range mixing;
* each other config against the reference: better, worse or within the spread, with its numbers.

The paper's own numbers for the task (:data:`PAPER_NOTES`) are printed beside the table with what
differs. ``--reuse`` merges the rows of earlier runs (e.g. configs or seeds trained in parallel
processes, sessions or machines) instead of training, refusing a row whose recorded config differs from the
one its config file and ``--set`` give now; ``--resume`` continues interrupted run folders in ``--out`` (a finished
one is only scored again). Neither changes a result, so the section records the command without them.

    python -m pointformers.bench.task_results --configs configs/language-model-{flt,performer,full,mlp}.yaml \\
        --baseline language-model-mlp --reference language-model-full --threads 1 --out RUNS --write docs/results.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .harness import check_recorded_config, machine, recorded_command, without_bookkeeping, write_section
from .seed_rule import MIN_SEEDS, compare, mean_std, spread

__all__ = ["PAPER_NOTES", "run_configs", "task_markdown", "task_claims", "run_task_results", "main"]

#: What each task's paper reports, for the reader to set beside the table (and what differs).
PAPER_NOTES: dict[str, str] = {
    "language-model": (
        "The FLT paper's Table 1 (WikiText-103 validation perplexity; 6 layers of width 512, 150k steps of 64 × 512 "
        "tokens): Performer 31.1, FLT with the Gaussian-mixture RPE 30.3, FLT with the local RPE 30.1 (no softmax "
        "or attention-free row). Here: the generated WikiText-like corpus (200k training tokens, 1,189 words), 2 "
        "layers of width 128, 294 steps of 16 × 256 tokens, test perplexity; the numbers are not comparable with "
        "the paper's, only the order of the rows is."),
    "image-classification": (
        "The FLT paper's Table 2 (ViT top-1 accuracy; 12 layers, 12 heads, trained \"until convergence\" at batch "
        "4096): Performer 75.1 / 55.0 / 91.1 %, CosFormer 76.2 / 55.6 / 91.6 %, FLT 77.4 / 56.0 / 92.1 % on "
        "ImageNet / Places365 / Fashion-MNIST (no softmax or attention-free row). Here: scikit-learn's 8 × 8 digits "
        "(1,078 training images, 16 patches of 2 × 2), 2 layers of width 64, 30 epochs; the numbers are not "
        "comparable with the paper's, and 16 tokens are too few for attention to matter much."),
    "peptides-func": (
        "LRGB Peptides-func, test AP: the SFT paper's Table 3 SFT 0.6674, SFT-RWPE 0.6902, Transformer (LapPE) "
        "0.6326, GPS 0.6535 (600 epochs, width 144, 4 layers); the SAMSA paper's Table 1 SAMSA 0.7142-0.7245 by "
        "sampling size and mode against 0.6326 for its full attention, Table 3 0.7221 ± 0.0042 (4 seeds). Here: "
        "the generated stand-in peptides (2,000 training graphs, labels that are rules over the graph), width 64, "
        "2 layers, 20 epochs; not comparable with the papers' numbers, only the order of the rows and the gap to "
        "the attention-free baseline are."),
    "peptides-struct": (
        "LRGB Peptides-struct, test MAE (lower is better): the SFT paper's Table 3 SFT 0.2661, SFT-RWPE 0.2655, "
        "Transformer (LapPE) 0.2529, GPS 0.2500; the SAMSA paper's Table 1 SAMSA 0.2458-0.2519 against 0.2529 for "
        "its full attention, Table 3 0.2458 ± 0.0013. Here: the "
        "generated stand-in's 11 graph-distance targets (standardised), width 64, 2 layers, 20 epochs; not "
        "comparable with the papers' numbers, only the order of the rows is."),
    "pascalvoc-sp": (
        "LRGB PascalVOC-sp, test macro F1: the SFT paper's Table 3 SFT 0.1961, SFT-RWPE 0.2181, Transformer (LapPE) "
        "0.2694, GPS 0.3748 (the SAMSA paper reports none). Here: the generated superpixel graphs of shape images "
        "(9 classes, ~195 nodes), width 64, 2 layers, 30 epochs; not comparable with the papers' numbers."),
    "lra-retrieval": (
        "LRA Retrieval (AAN), test accuracy: the SFT paper's Table 4 SFT 71.33, Transformer 57.46, Performer 53.82; "
        "the SAMSA paper's Table 1 SAMSA 81.81-82.05 against 79.14 for its full attention. Here: the generated "
        "topic-pair stand-in (4,000 training pairs of ~1k bytes), width 64, 2 layers, 4 epochs; not comparable "
        "with the papers' numbers."),
    "lra-text": (
        "LRA Text (IMDb, bytes), test accuracy: the SFT paper's Table 4 SFT 64.54, Transformer 64.27, Performer 65.40; "
        "the SAMSA paper's Table 1 SAMSA 64.74-65.53 against 65.21 for its full attention (1,024 bytes, 200 and 50 "
        "epochs). Here: the generated reviews (4,000 training reviews of 850-1,000 bytes whose label rests on five "
        "scattered sentiment words, each flipped by a preceding \"not\"), width 64, 2 layers, 4 epochs; not "
        "comparable with the papers' numbers."),
    "lra-image": (
        "LRA Image (grey CIFAR-10), test accuracy: the SFT paper's Table 4 SFT 47.65, Transformer 42.44, Performer "
        "42.77; the SAMSA paper's Table 1 SAMSA 46.75-48.73 against 42.94 for its full attention. Here: scikit-learn's "
        "8 x 8 digits enlarged 2x to 16 x 16 = 256 pixels (LRA's 1,024 trained no model in this CPU budget; 1,078 "
        "training images, 17 grey levels, clean centred strokes), width 64, 2 layers, 30 epochs; much easier than "
        "CIFAR-10 and a quarter of its length, not comparable with the papers' numbers."),
    "lra-pathfinder": (
        "LRA Pathfinder-32, test accuracy: the SFT paper's Table 4 SFT 78.39, Transformer 71.40, Performer 77.05; the "
        "SAMSA paper's Table 1 SAMSA 69.71-81.97 against 71.83 for its full attention (160,000 training images). Here: "
        "the generated stand-in (2,000 training images, contour length 14, two distractor curves), width 64, 2 layers, "
        "8 epochs; not comparable with the papers' numbers."),
}


def _stem(path: str) -> str:
    return Path(path).stem


def run_configs(configs: Sequence[str], seeds: Sequence[int], overrides: Sequence[str] = (),
                out_dir: str | os.PathLike = "runs/task-results",
                log: Callable[[str], None] | None = print, resume: bool = False) -> list[dict[str, Any]]:
    """Train every config once per seed (:func:`.point_results.train_config`); one row each.
    ``resume``: continue (or, finished, only score) the run folders already in ``out_dir``."""
    from .point_results import train_config

    if not configs or not seeds:
        raise ValueError("configs/seeds: need at least one config and one seed")
    tasks = set()
    for c in configs:
        if not Path(c).is_file():
            raise ValueError(f"configs: no such file {c!r}")
        from ..engine.config import load_config

        tasks.add(load_config(c)["task"]["name"])
    if len(tasks) != 1:
        raise ValueError(f"configs: expected configs of one task, got tasks {sorted(tasks)}")
    cache: dict = {}
    return [train_config(c, s, overrides, out_dir, data_cache=cache, log=log, resume=resume)
            for c in configs for s in seeds]


def _groups(rows: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["stem"], []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in out.items()}


def _percent(key: str) -> bool:
    """Metrics shown in % (fractions in the rows)."""
    return "acc" in key or key in ("oa", "macc", "ap", "auc")


def _fmt(key: str, vals: list[float]) -> str:
    if _percent(key):
        return mean_std([100 * v for v in vals], ".1f") + " %"
    return mean_std(vals, ".2f" if key == "perplexity" else ".3f")


def _spread(key: str, a: list[float], b: list[float]) -> str:
    """The seeds' spread of a comparison in the units the table shows."""
    return f"{100 * spread(a, b):.1f} points" if _percent(key) else f"{spread(a, b):.3g}"


def task_markdown(rows: Sequence[dict], seeds: Sequence[int], overrides: Sequence[str], task: str) -> str:
    """The section's table (and the paper's note) from the rows of :func:`run_configs`."""
    groups = _groups(rows)
    metric = rows[0]["metric"]
    keys = [metric] + sorted(k for k in rows[0]["test"] if k != metric)
    lines = [f"Machine: {machine()}; CPU, one process. Seeds: {', '.join(map(str, seeds))} (each config trained once "
             f"per seed with its config's `train` section; test split at the best validation epoch; mean ± std over "
             f"seeds). Training time summed over the runs: {sum(r['train_s'] for r in rows) / 60:.1f} min."
             + (f" Overrides: `{' '.join(overrides)}`." if overrides else ""), "",
             "| config | model | params | " + " | ".join(f"test {k}" for k in keys) + " | train s (mean) | seeds |",
             "|---|---|---|" + "---|" * len(keys) + "---|---|"]
    for stem, g in groups.items():
        cells = [f"`{stem}`", g[0]["model"], str(g[0]["params"])]
        cells += [_fmt(k, [r["test"][k] for r in g]) for k in keys]
        cells += [f"{statistics.fmean(r['train_s'] for r in g):.0f}", ", ".join(str(r["seed"]) for r in g)]
        lines.append("| " + " | ".join(cells) + " |")
    if task in PAPER_NOTES:
        lines += ["", PAPER_NOTES[task]]
    return "\n".join(lines)


def task_claims(rows: Sequence[dict], baseline: str | None, reference: str | None, mode: str) -> list[str]:
    """The claims of the module doc as lines ``"HOLDS: …"`` / ``"DOES NOT HOLD: …"`` / ``"UNDECIDED …"``."""
    groups = _groups(rows)
    metric = rows[0]["metric"]
    vals = {s: [r["test"][metric] for r in g] for s, g in groups.items()}
    better = (lambda a, b: compare(a, b)) if mode == "max" else (lambda a, b: compare(b, a))  # "a better than b"
    out = []

    def show(s: str) -> str:
        return f"{s} {_fmt(metric, vals[s])}"

    if reference is not None and reference not in vals:
        raise ValueError(f"reference: {reference!r} is not among the configs ({', '.join(vals)})")
    if baseline is not None and baseline not in vals:
        raise ValueError(f"baseline: {baseline!r} is not among the configs ({', '.join(vals)})")
    if baseline and reference:
        o = better(vals[reference], vals[baseline])
        label = {"holds": "HOLDS", "undecided": f"UNDECIDED (fewer than {MIN_SEEDS} seeds)"}.get(o, "DOES NOT HOLD")
        out.append(f"{label}: the task needs attention -- {show(reference)} is better than the attention-free "
                   f"{show(baseline)} beyond the seeds' spread ({_spread(metric, vals[reference], vals[baseline])}; "
                   f"test {metric}, {'higher' if mode == 'max' else 'lower'} is better).")
    if reference:
        for s in vals:
            if s in (reference, baseline):
                continue
            up, down = better(vals[s], vals[reference]), better(vals[reference], vals[s])
            if "undecided" in (up, down):
                what = f"undecided (fewer than {MIN_SEEDS} seeds)"
            elif up == "holds":
                what = "better than the reference beyond the spread"
            elif down == "holds":
                what = "worse than the reference beyond the spread"
            else:
                what = "within the seeds' spread of the reference"
            out.append(f"- {show(s)} against {show(reference)}: {what} "
                       f"(spread {_spread(metric, vals[s], vals[reference])}).")
    return out


def run_task_results(configs: Sequence[str], seeds: Sequence[int] = (42, 43, 44), overrides: Sequence[str] = (),
                     baseline: str | None = None, reference: str | None = None,
                     out_dir: str | os.PathLike = "runs/task-results", doc: str | None = None,
                     reuse: Sequence[str | os.PathLike] | None = None, command: str | None = None,
                     log: Callable[[str], None] | None = print, resume: bool = False) -> dict[str, Any]:
    """Train (or ``reuse``), write ``out_dir/task-results-<task>.json`` and optionally the section of ``doc``."""
    from ..engine import write_json
    from ..engine.config import load_config
    from ..tasks.registry import get_task

    say = log or (lambda s: None)
    if reuse:
        merged: dict[tuple, dict] = {}
        source: dict[tuple, str] = {}
        seed_set: list[int] = []
        for f in reuse:
            try:
                earlier = json.loads(Path(f).read_text())
                for r in earlier["rows"]:
                    merged[(r["stem"], r["seed"])] = r
                    source[(r["stem"], r["seed"])] = str(f)
                seed_set += [s for s in earlier["seeds"] if s not in seed_set]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"reuse: {str(f)!r} is not a readable task-results JSON ({exc})") from None
        rows, seeds = list(merged.values()), sorted(seed_set)
        if configs:  # keep the configs named, in their order
            order = [_stem(c) for c in configs]
            rows = sorted((r for r in rows if r["stem"] in order), key=lambda r: (order.index(r["stem"]), r["seed"]))
            for r in rows:  # a row trained with another config than the named one's (with --set) is refused
                cfg = load_config(configs[order.index(r["stem"])],
                                  [*overrides, f"train.seed={int(r['seed'])}", "train.progress=false"])
                check_recorded_config(r, cfg, f"{r['stem']} seed {r['seed']}", source[(r["stem"], r["seed"])])
        if not rows:
            raise ValueError("reuse: no rows of the configs named")
        task = rows[0].get("task") or load_config(rows[0]["config"])["task"]["name"]
    else:
        rows = run_configs(configs, seeds, overrides, out_dir, say, resume)
        task = load_config(configs[0])["task"]["name"]
        for r in rows:
            r["task"] = task
    mode = get_task(task).mode
    md = task_markdown(rows, seeds, overrides, task)
    claims = task_claims(rows, baseline, reference, mode)
    for c in claims:
        say(c)
    if claims:
        md += "\n\n" + "\n".join(claims)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / f"task-results-{task}.json",
               {"machine": machine(), "task": task, "seeds": list(seeds), "rows": rows, "claims": claims})
    if doc is not None:
        cmd = command or recorded_command("pointformers.bench.task_results", without_bookkeeping(sys.argv[1:]))
        if not os.path.exists(doc):
            Path(doc).parent.mkdir(parents=True, exist_ok=True)
            Path(doc).write_text("# Results\n")
        write_section(doc, f"task-{task}", md, cmd)
        say(f"wrote section task-{task} of {doc}")
    return {"task": task, "rows": rows, "claims": claims, "markdown": md}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pointformers.bench.task_results", description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="+", required=True, help="configs of one task")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of every config")
    p.add_argument("--baseline", default=None, help="stem of the attention-free config")
    p.add_argument("--reference", default=None, help="stem of the full-attention config")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="runs/task-results")
    p.add_argument("--write", default=None, metavar="DOC", help="markdown file whose task-<task> section to update")
    p.add_argument("--reuse", nargs="+", default=None, metavar="JSON",
                   help="take the rows from earlier task-results JSON files instead of training")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run folders in --out (finished ones are only scored again)")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    try:
        run_task_results(a.configs, a.seeds, a.set, a.baseline, a.reference, a.out, a.write, a.reuse, resume=a.resume)
    except ValueError as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

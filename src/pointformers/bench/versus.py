"""This tree against an earlier commit, side by side: the HEPT tracking model's forward pass and
its training step, in fresh processes alternated (baseline, this tree, baseline, …).

What is measured, per process (one measurement kind and size per process, so no allocator or
thread-pool state carries over):

* ``forward N`` -- the HEPT authors' published Tracking-60k model
  (``pointformers.models.hept_tracking.from_reference_checkpoint``, float32, eval mode, no grad)
  on the first N hits of a generated Tracking-60k-like event: one warm-up call, then the median of
  ``--calls`` calls; the peak resident memory growth of the timed calls.
* ``train`` -- the demo's model (``hept-tracking`` with the demo's options: 8 regions, blocks of 100,
  dropout 0; seed 42) trained with Adam (lr 3e-3) on the demo's validation clouds (preset
  ``small``, ~1.3-3.5k hits): forward, a contrastive loss on fixed random pairs (defined here, the
  same code for both trees), backward and the optimiser step; three warm-up steps, then clouds
  per second over ``--steps`` steps. The first steps' losses are recorded; this tree's are also
  computed with HEPT's ``implementation="materialized"`` (the plain path: every block's scores
  materialised, autograd's own backward) to show the fast path's losses equal the plain path's.

Both trees read the same input tensors (written once by this tree into a temporary folder) and
the same checkpoint file (this tree's). The baseline is a ``git worktree`` of ``--baseline`` (a
commit of this repository; the checkout must be a git clone) or ``--baseline-src`` (a ``src``
folder of another copy). Ratios are baseline time / this tree's time (> 1: this tree is faster),
per round and as the median over rounds. The section also states the measured FLOP time of the
forward at the machine's oneDNN and MKL GEMM peaks (:mod:`.peak`).

``--scale`` adds the forward's time and peak memory at larger sizes (one cold call per size and
tree, smallest first), to read how each tree grows from the smallest to the largest.

Usage: ``python -m pointformers.bench.versus --baseline cbf824f [--sizes 6000 60000]
[--rounds 5] [--threads 2] [--scale 60000 250000 1000000] [--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .harness import machine, recorded_command, write_section

SECTION = "versus"

#: The worker, run as a script with the tree under test first on ``sys.path``; it may use only
#: what both trees have (the model builders), so it imports nothing of this tree.
WORKER = r'''
import json, resource, statistics, sys, time
src, threads, mode, data, ckpt, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
tag = sys.argv[7] if len(sys.argv) > 7 else ""  # forward: where to save the output; train: "plain"
sys.path.insert(0, src)
import torch
torch.set_num_threads(threads)
import pointformers
from pointformers import models


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_and_rss():
    try:
        with open("/proc/self/status") as f:
            st = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f if l.startswith(("VmHWM", "VmRSS"))}
        return st["VmHWM"], st["VmRSS"]
    except (OSError, KeyError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, 0


res = {"pointformers": pointformers.__file__}
if mode == "forward":
    from pointformers.models.hept_tracking import from_reference_checkpoint
    model = from_reference_checkpoint(ckpt)
    x, c = torch.load(data)
    with torch.no_grad():
        if reps > 0:  # a warm-up call; a negative count: |reps| cold calls (the large sizes of the scale curve)
            y = model(x, c)
        times = []
        _, before = peak_and_rss()
        reset_peak()
        for _ in range(abs(reps)):
            t = time.perf_counter()
            y = model(x, c)
            times.append(time.perf_counter() - t)
        peak, _ = peak_and_rss()
    res.update(seconds=statistics.median(times), calls=times, peak_mb=max(peak - before, 0) / 2**20)
    if tag:
        torch.save(y, f"{data}.{tag}.out")
else:
    torch.manual_seed(42)
    model = models.build("hept-tracking", num_regions=8, block_size=100, dropout=0.0)
    if tag == "plain":
        for m in model.modules():
            if hasattr(m, "implementation"):
                m.implementation = "materialized"
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    clouds = torch.load(data)
    g = torch.Generator().manual_seed(0)
    pairs = [torch.randint(0, x.shape[0], (2, 20 * x.shape[0]), generator=g) for x, _ in clouds]

    def step(i):
        x, c = clouds[i % len(clouds)]
        p = pairs[i % len(clouds)]
        e = model(x, c)
        d = (e[p[0]] - e[p[1]]).pow(2).sum(-1)
        same = p[0] % 7 == p[1] % 7  # fixed labels: a loss with attracting and repelling pairs
        loss = d[same].mean() + torch.relu(1 - d[~same]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.detach())

    losses = [step(i) for i in range(3)]
    t = time.perf_counter()
    losses += [step(3 + i) for i in range(reps)]
    dt = time.perf_counter() - t
    res.update(seconds=dt / reps, clouds_per_s=reps / dt, losses=losses)
print(json.dumps(res))
'''


def _run(python: str, worker: Path, src: str, threads: int, mode: str, data: Path, ckpt: str, reps: int,
         timeout: float, *extra: str) -> dict:
    cmd = [python, str(worker), src, str(threads), mode, str(data), ckpt, str(reps), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    except subprocess.CalledProcessError as e:
        return {"error": " ".join((e.stderr or "").strip().splitlines()[-3:])[:400]}


def baseline_tree(commit: str, where: Path) -> Path:
    """A detached ``git worktree`` of ``commit`` at ``where``; returns its ``src`` folder."""
    repo = Path(__file__).resolve().parents[3]
    if not (repo / ".git").exists():
        raise SystemExit(f"--baseline needs a git clone of pointformers ({repo} is not one); "
                         f"pass --baseline-src PATH/src of a copy of the baseline instead")
    try:
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(where), commit],
                       capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"--baseline {commit}: git worktree failed: {e.stderr.strip()}") from None
    return where / "src"


def _agreement(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-3) -> float:
    rel = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)
    return float((rel <= tol).double().mean())


def compare(baseline_src: str, sizes: list[int], rounds: int, threads: int, calls: int, steps: int,
            timeout: float, work: Path, scale_sizes: list[int] = ()) -> dict:
    """Run every measurement ``rounds`` times, baseline and this tree alternated in fresh processes."""
    from ..models.hept_tracking import reference_checkpoint_path
    from ..tasks.tracking.core import generated_inputs

    ours = str(Path(__file__).resolve().parents[2])
    worker = work / "worker.py"
    worker.write_text(WORKER)
    ckpt = str(reference_checkpoint_path("hept-tracking-60k"))
    inputs = {}
    for n in sizes:
        inputs[n] = work / f"inputs-{n}.pt"
        torch.save(generated_inputs(n, seed=0), inputs[n])
    from ..data.tracking import load_tracking_dataset
    from ..tasks.tracking import tracking_inputs

    clouds = [(i.x.float(), i.coords.float()) for i in
              (tracking_inputs(ev) for ev in load_tracking_dataset("small", "val", cache_dir=work / "cache", seed=0)[:12])]
    demo = work / "demo-clouds.pt"
    torch.save(clouds, demo)
    py = sys.executable
    rows: dict[str, dict[str, list]] = {}
    for r in range(rounds):
        for n in sizes:
            for tree, src in (("baseline", baseline_src), ("this", ours)):
                res = _run(py, worker, src, threads, "forward", inputs[n], ckpt, calls, timeout, tree)
                rows.setdefault(f"forward {n}", {}).setdefault(tree, []).append(res)
        for tree, src in (("baseline", baseline_src), ("this", ours)):
            rows.setdefault("train", {}).setdefault(tree, []).append(
                _run(py, worker, src, threads, "train", demo, ckpt, steps, timeout))
    plain = _run(py, worker, ours, threads, "train", demo, ckpt, steps, timeout, "plain")
    scale: dict[int, dict[str, dict]] = {}
    for n in scale_sizes:  # one cold call per (size, tree), smallest first
        path = work / f"inputs-{n}.pt"
        torch.save(generated_inputs(n, seed=0), path)
        for tree, src in (("baseline", baseline_src), ("this", ours)):
            scale.setdefault(n, {})[tree] = _run(py, worker, src, threads, "forward", path, ckpt, -1, timeout)
        path.unlink()
    agree = {}
    for n in sizes:
        a, b = (Path(f"{inputs[n]}.{t}.out") for t in ("this", "baseline"))
        if a.exists() and b.exists():
            agree[n] = _agreement(torch.load(a), torch.load(b))
    return {"rows": rows, "plain": plain, "agree": agree, "scale": scale}


def _median(vals: list[dict], key: str) -> float:
    ok = [v[key] for v in vals if key in v]
    return statistics.median(ok) if ok else float("nan")


def report(res: dict, baseline: str, threads: int, rounds: int, peaks: dict | None) -> str:
    rows, lines = res["rows"], []
    lines.append(f"Machine: {machine()}; {threads} thread(s) per process (OMP/MKL set), {rounds} rounds, "
                 f"each round one fresh process per (tree, measurement), baseline first.\n")
    lines.append(f"| measurement | baseline `{baseline}` | this tree | ratio (median) | ratio per round | peak MB baseline / this |")
    lines.append("|---|---|---|---|---|---|")
    for name, by_tree in rows.items():
        b, t = by_tree["baseline"], by_tree["this"]
        errs = [v["error"] for v in b + t if "error" in v]
        if errs:
            lines.append(f"| {name} | failed: {errs[0]} | | | | |")
            continue
        per = [x["seconds"] / y["seconds"] for x, y in zip(b, t)]
        if name == "train":
            cell = lambda v: f"{_median(v, 'clouds_per_s'):.2f} clouds/s ({_median(v, 'seconds') * 1e3:.0f} ms/step)"  # noqa: E731
            mem = ""
        else:
            cell = lambda v: f"{_median(v, 'seconds'):.3f} s"  # noqa: E731
            mem = f"{_median(b, 'peak_mb'):.0f} / {_median(t, 'peak_mb'):.0f}"
        lines.append(f"| {name} | {cell(b)} | {cell(t)} | **{statistics.median(per):.2f}×** | "
                     f"{', '.join(f'{p:.2f}' for p in per)} | {mem} |")
    lines.append("")
    plain, ours = res["plain"], rows["train"]["this"][0]
    if "losses" in plain and "losses" in ours:
        rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["losses"], plain["losses"]))
        lines.append(f"- Training losses of this tree's fast path against its plain path (`implementation="
                     f"\"materialized\"`), the same seeded {len(plain['losses'])} steps: largest relative "
                     f"difference {rel:.1e}; the plain path at {plain['clouds_per_s']:.2f} clouds/s.")
    for n, a in res["agree"].items():
        lines.append(f"- Forward at N = {n}: {a:.1%} of points' embeddings agree between the two trees to 1e-3 "
                     f"(float32; a tree whose arithmetic differs from the other's -- region sizes, padding, the "
                     f"sort's tie order -- sends points to other blocks, and HEPT's output follows its blocks).")
    if res.get("scale"):
        sizes = sorted(res["scale"])
        lines.append("")
        lines.append(f"Scale: the forward at N = {', '.join(f'{n:,}' for n in sizes)} hits, one cold call per size and "
                     f"tree in a fresh process (no warm-up: a second call at 1M would double the run), smallest first. "
                     f"`× N₀` = time / time at N₀ = {sizes[0]:,} (linear: N / N₀); peak MB = resident memory growth "
                     f"during the call.\n")
        lines.append(f"| N | N / N₀ | baseline `{baseline}` s | × N₀ | peak MB | this tree s | × N₀ | peak MB | ratio |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        first = res["scale"][sizes[0]]
        for n in sizes:
            b, t = res["scale"][n]["baseline"], res["scale"][n]["this"]

            def cells(v, v0):
                if "error" in v:
                    return f"failed: {v['error'][:80]} | | "
                x0 = v0.get("seconds", float("nan"))
                return f"{v['seconds']:.2f} | {v['seconds'] / x0:.1f} | {v['peak_mb']:.0f} "

            ratio = (f"{b['seconds'] / t['seconds']:.2f}×" if "seconds" in b and "seconds" in t else "")
            lines.append(f"| {n:,} | {n / sizes[0]:.1f} | {cells(b, first['baseline'])}| {cells(t, first['this'])}| {ratio} |")
        lines.append("")
    if peaks:
        from .flops import hept_model_flops

        for n, s in peaks["forward"].items():
            f = hept_model_flops(n).total()
            parts = [f"{f / 1e9:.1f} GFLOP"]
            for key, label in (("onednn_gflops", "oneDNN"), ("gflops", "MKL")):
                if peaks["matmul"].get(key):
                    t = f / (peaks["matmul"][key] * 1e9)
                    parts.append(f"{t:.3f} s at the {label} peak ({peaks['matmul'][key]:.0f} GFLOP/s): measured "
                                 f"{s / t:.1f}× that")
            lines.append(f"- FLOP time of the forward at N = {n} (this tree, {s:.3f} s): " + "; ".join(parts) + ".")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="cbf824f", help="commit of this repository to compare with (git worktree)")
    p.add_argument("--baseline-src", default=None, help="the src folder of a copy of the baseline (instead of --baseline)")
    p.add_argument("--sizes", type=int, nargs="+", default=[6000, 60000])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=3, help="timed forward calls per process (after a warm-up)")
    p.add_argument("--steps", type=int, default=12, help="timed training steps per process (after 3 warm-up)")
    p.add_argument("--scale", type=int, nargs="*", default=[],
                   help="sizes of the scale curve (one cold forward per size and tree), e.g. 60000 250000 1000000")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--write", default=None, help="markdown file whose 'versus' section is replaced")
    p.add_argument("--json", default=None, help="also write the raw measurements to this JSON file")
    args = p.parse_args(argv)
    for name in ("rounds", "threads", "calls", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if any(n < 1 for n in args.sizes + args.scale):
        p.error("--sizes must be positive")
    work = Path(tempfile.mkdtemp(prefix="pointformers-versus-"))
    tree = None
    try:
        if args.baseline_src:
            src = args.baseline_src
            if not (Path(src) / "pointformers").is_dir():
                p.error(f"--baseline-src: no pointformers package in {src}")
            label = args.baseline_src
        else:
            tree = work / "baseline"
            src = str(baseline_tree(args.baseline, tree))
            label = args.baseline
        res = compare(src, args.sizes, args.rounds, args.threads, args.calls, args.steps, args.timeout, work,
                      sorted(args.scale))
        if args.json:
            from ..files import atomic_write

            atomic_write(args.json, lambda f: f.write(json.dumps(res, indent=1).encode()))
        torch.set_num_threads(args.threads)
        from .peak import matmul_peak

        fwd = {n: _median(res["rows"][f"forward {n}"]["this"], "seconds") for n in args.sizes}
        text = report(res, label, args.threads, args.rounds, {"matmul": matmul_peak("cpu"), "forward": fwd})
    finally:
        if tree is not None:
            repo = Path(__file__).resolve().parents[3]
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    if args.write:
        write_section(args.write, SECTION, text, recorded_command("pointformers.bench.versus", argv or sys.argv[1:]))
    return text


if __name__ == "__main__":
    main()

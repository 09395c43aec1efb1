"""Training throughput of the tracking model with every attention mechanism: clouds per second.

One training step is what :meth:`~pointformers.tasks.tracking.training.TrackingTask.loss` and the
trainer do for one cloud: the step's pairs (the cloud's labelled pairs plus fresh random ones,
:meth:`~pointformers.tasks.tracking.training.TrackingCloud.training_pairs`), the model's forward
pass, the InfoNCE loss on the pairs, the backward pass and an Adam step. The model is
``pointformers.models.build("tracking-encoder", attention=name)`` (the HEPT tracking skeleton:
4 layers, width 24, 8 heads of width 24, 6 kernel coordinates; dropout 0, no positional encoding)
with the mechanism's registry benchmark options (those the model does not supply itself), seeded.
The cloud is the first N hits of a generated Tracking-60k-like event
(:func:`~pointformers.data.tracking.event_with_hits`) with its labelled pairs (radius 1 in
(η, φ), 256 neighbours, pT > 0.9 GeV; the demo's), built once and kept in the pair cache.

Each (mechanism, N) runs in a fresh process (:mod:`.harness`): one warm-up step (its peak
resident memory above the memory before it is the step's peak), then ``--repeats`` timed steps;
the table gives the median step and the median of each phase:

* ``data`` -- the cloud's inputs onto the model's device;
* ``loss + pairs`` -- the step's pairs (random draw and layout) and the InfoNCE loss's forward;
* ``forward``, ``backward`` (the loss's and the model's), ``optimiser`` (Adam step, grads reset).

A size is not run, with the reason in its row, when it would not fit in memory (``--mem-limit-gb``,
default 24 GiB, capped at 60 % of this machine's available memory): its peak predicted from the
smaller sizes of the same mechanism (the log-log slope of the last two, between 1 and 2; linear
from one) exceeds the limit; or when its time so predicted exceeds ``--timeout``. A run that
still runs out of memory (the worker's address space is capped at the limit) is reported as not
fitting, not as a crash.

Usage: ``python -m pointformers.bench.training [--sizes 1600 6000 60000] [--mechanisms hept full …]
[--repeats 3] [--threads 1] [--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time

import torch

from .harness import machine, peak_bytes, recorded_command, release_free_memory, reset_peak_rss, rss_bytes, run_isolated, write_section

DEFAULT_SIZES = (1600, 6000, 60000)
#: Phases of a step, in the order they run (``loss`` and ``pairs`` are reported together).
PHASES = ("data", "pairs", "forward", "loss", "backward", "optimiser")
MEMORY_BUDGET_GB = 24.0
#: The demo's pair parameters (radius in (η, φ), neighbours, pT filter of positives).
PAIR_OPTIONS = {"radius": 1.0, "max_num_neighbors": 256, "pt_min": 0.9}
_NO_MEMORY = ("out of memory", "not enough memory", "cannot allocate", "memoryerror", "bad_alloc",
              "killed", "data too large")


def mechanism_names() -> list[str]:
    """Every registered attention mechanism (the registry's order)."""
    from ..attention import available

    return available()


def model_options(name: str) -> dict:
    """Options of ``build("tracking-encoder", attention=name, **options)``: the mechanism's registry
    benchmark options, less those the model supplies itself (head width, coordinate count)."""
    from ..attention import info
    from ..attention.registry import MODEL_SUPPLIED

    opts = {k: v for k, v in dict(info(name).bench).items() if k not in MODEL_SUPPLIED}
    return {"attention": name, "dropout": 0.0, "attention_options": opts}


def build_model(name: str) -> torch.nn.Module:
    from ..models import build

    torch.manual_seed(0)
    return build("tracking-encoder", **model_options(name))


def bench_inputs(n: int, seed: int = 0):
    """:class:`~pointformers.tasks.tracking.core.TrackingInputs` of the first ``n`` hits of a
    generated event with at least ``n`` hits."""
    from dataclasses import fields

    from ..data.tracking import event_with_hits
    from ..tasks.tracking.core import TrackingInputs, tracking_inputs

    event, _ = event_with_hits(n, seed)
    inp = tracking_inputs(event, dtype=torch.float32)
    return TrackingInputs(**{f.name: getattr(inp, f.name)[:n].contiguous() for f in fields(inp)})


def bench_cloud(n: int, cache_dir: str | None = None, seed: int = 0):
    """The benchmark's :class:`~pointformers.tasks.tracking.training.TrackingCloud` of ``n`` hits
    with its pairs (from the pair cache, built on a miss)."""
    from ..tasks.tracking.training import TrackingCloud, cached_half_pairs

    inp = bench_inputs(n, seed)
    ((half_e, half_p),) = cached_half_pairs([inp], cache_dir=cache_dir, **PAIR_OPTIONS)
    return TrackingCloud(inp, half_e, half_p, pt_min=PAIR_OPTIONS["pt_min"])


def _limit_address_space(mem_limit_mb: float) -> None:
    """Cap this process's address space at what it maps now plus ``mem_limit_mb``, so a step that
    needs more fails with an allocation error (reported as not fitting) instead of pushing the
    machine into swap or the kernel's OOM killer."""
    import resource

    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        cap = int(vm + mem_limit_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (OSError, StopIteration, ValueError, AttributeError):
        pass  # not Linux: no cap, the prediction alone guards


def step_phases(model, task, cloud, opt, gen, dev) -> dict[str, float]:
    """One training step on ``cloud``; wall seconds of each of :data:`PHASES`."""
    t = [time.perf_counter()]
    x, coords = cloud.inputs.x.to(dev), cloud.inputs.coords.to(dev)
    t.append(time.perf_counter())
    pairs = cloud.training_pairs(task.random_pairs, gen).to(dev)
    t.append(time.perf_counter())
    emb = model(x, coords)
    t.append(time.perf_counter())
    loss = task.pair_loss(emb, pairs)
    t.append(time.perf_counter())
    loss.backward()
    t.append(time.perf_counter())
    opt.step()
    opt.zero_grad(set_to_none=True)
    t.append(time.perf_counter())
    return {p: b - a for p, a, b in zip(PHASES, t[:-1], t[1:])}


def worker(name: str, n: int, repeats: int, threads: int, cache_dir: str | None) -> dict:
    """One (mechanism, N) measurement in this process (see the module doc): median seconds of a
    step and of each of :data:`PHASES`, the warm-up step's peak MB and the cloud's listed pairs."""
    from ..tasks.tracking.training import TrackingTask

    torch.set_num_threads(threads)
    cloud = bench_cloud(n, cache_dir)
    model = build_model(name).train()
    task = TrackingTask()  # the authors' loss options (l2_rbf, τ 0.05, σ 0.75, 20 % random pairs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    dev = torch.device("cpu")
    release_free_memory()
    reset_peak_rss()
    before = rss_bytes()
    warm = step_phases(model, task, cloud, opt, gen, dev)
    peak = peak_bytes() - before
    steps = [step_phases(model, task, cloud, opt, gen, dev) for _ in range(repeats)]
    totals = [sum(s.values()) for s in steps]
    return {"seconds": statistics.median(totals), "runs": repeats, "warmup_seconds": sum(warm.values()),
            "peak_mb": peak / 2**20, "num_pairs": int(2 * cloud.half_edges.shape[1]),
            **{p: statistics.median(s[p] for s in steps) for p in PHASES}}


def memory_limit_mb(budget_gb: float) -> float:
    """``budget_gb`` in MB, capped at 60 % of this machine's available memory."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: float(line.split()[1]) for line in f}
        avail = 0.6 * info.get("MemAvailable", info["MemTotal"]) / 1024
    except (OSError, KeyError, ValueError):
        avail = math.inf
    return min(budget_gb * 1024, avail)


def _slope(done: list[dict], key: str) -> float:
    """Log-log growth exponent of ``key`` over the last two measured sizes, in [1, 2]; 1 from one."""
    if len(done) < 2 or done[-1][key] <= 0 or done[-2][key] <= 0:
        return 1.0
    a, b = done[-2], done[-1]
    p = math.log(b[key] / a[key]) / math.log(b["n"] / a["n"])
    return min(2.0, max(1.0, p))


def plan(done: list[dict], n: int, repeats: int, timeout: float, mem_limit_mb: float) -> str | None:
    """Why N = n should not be run, from the measured smaller sizes ``done`` of the same mechanism
    (ascending; a failed or skipped size stops the larger ones), or None to run it."""
    if not done:
        return None
    last = done[-1]
    if "error" in last:
        return f"N = {last['n']} failed"
    if "skipped" in last:
        fit = "does not fit" in last["skipped"] or last["skipped"].startswith("as at N")
        return f"as at N = {last['n']}: " + ("does not fit" if fit else "not run")
    mem = last["peak_mb"] * (n / last["n"]) ** _slope(done, "peak_mb")
    if mem > mem_limit_mb:
        return f"does not fit: predicted {mem / 1024:.0f} GB > {mem_limit_mb / 1024:.0f} GB"
    t = last["seconds"] * (n / last["n"]) ** _slope(done, "seconds") * (repeats + 1)
    if t > timeout:
        return f"predicted {t:.0f} s > {timeout:.0f} s limit"
    return None


def run_one(name: str, n: int, repeats: int, threads: int, mem_limit_mb: float, timeout: float,
            cache_dir: str | None) -> dict:
    args = [name, str(n), str(repeats), str(threads), f"{mem_limit_mb:.0f}", cache_dir or ""]
    r = run_isolated("pointformers.bench.training", args, timeout, {"mechanism": name, "n": n})
    if "error" in r and any(s in r["error"].lower() for s in _NO_MEMORY):
        r = {"mechanism": name, "n": n, "skipped": f"does not fit in {mem_limit_mb / 1024:.0f} GB "
                                                   f"({out_of_memory_detail(r['error'])})"}
    return r


def out_of_memory_detail(error: str) -> str:
    """A torch out-of-memory message in words, with the size of the allocation that failed (a small
    one means the memory was used up by earlier ones)."""
    m = re.search(r"allocate (\d+) bytes", error)
    if not m:
        return "ran out of memory"
    size = int(m.group(1))
    return f"ran out of memory: a further {size / 2**30:.1f} GB" if size >= 2**30 else \
        f"ran out of memory: a further {max(1, round(size / 2**20))} MB"


def _ms(s: float) -> str:
    return f"{1e3 * s:.0f}" if s >= 0.0095 else f"{1e3 * s:.1f}"


def report(results: list[dict], repeats: int, mem_limit_mb: float) -> str:
    lines = [f"Machine: {machine()}. CPU, float32, memory limit {mem_limit_mb / 1024:.0f} GB. One cloud per step "
             f"(N hits, its listed pairs; 20 % random pairs are added each step); median of {repeats} timed steps "
             "after a warm-up step; phase times in ms.", "",
             "| N | listed pairs | mechanism | clouds/s | step ms | forward | backward | loss + pairs | optimiser "
             "| data | peak MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    pairs = {r["n"]: r["num_pairs"] for r in results if "num_pairs" in r}
    for r in results:
        head = f"| {r['n']} | {pairs.get(r['n'], '—')} | `{r['mechanism']}` |"
        if "skipped" in r or "error" in r:
            why = f"not run: {r['skipped']}" if "skipped" in r else f"failed: {r['error'][:80]}"
            lines.append(f"{head} {why} | | | | | | | |")
            continue
        lines.append(f"{head} {1 / r['seconds']:.2f} | {_ms(r['seconds'])} | {_ms(r['forward'])} | "
                     f"{_ms(r['backward'])} | {_ms(r['loss'] + r['pairs'])} | {_ms(r['optimiser'])} | "
                     f"{_ms(r['data'])} | {r['peak_mb']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m pointformers.bench.training", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="hits per cloud")
    p.add_argument("--mechanisms", nargs="+", default=None, help="attention mechanisms (default: all registered)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per measurement (median)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--mem-limit-gb", type=float, default=MEMORY_BUDGET_GB,
                   help="memory a step may use (capped at 60%% of the available memory)")
    p.add_argument("--cache-dir", default=None, help="pair cache folder (default: the data cache's)")
    p.add_argument("--write", default=None, help="write the table into this markdown file (section 'training')")
    p.add_argument("--worker", nargs=6, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        name, n, rep, thr, mem, cache = a.worker
        _limit_address_space(float(mem))
        print(json.dumps(worker(name, int(n), int(rep), int(thr), cache or None)))
        return ""
    names = mechanism_names()
    mechs = a.mechanisms or names
    bad = [m for m in mechs if m not in names]
    if bad:
        raise SystemExit(f"--mechanisms: unknown {bad}; registered: {', '.join(names)}")
    if any(n < 2 for n in a.sizes) or a.repeats < 1 or a.threads < 1:
        raise SystemExit("--sizes must be >= 2, --repeats and --threads >= 1")
    torch.set_num_threads(a.threads)  # the machine line reports the measured thread count
    mem_limit = memory_limit_mb(a.mem_limit_gb)
    sizes = sorted(set(a.sizes))
    for n in sizes:  # pairs built once per size here, read back by every worker
        t0 = time.perf_counter()
        c = bench_cloud(n, a.cache_dir)
        print(f"N = {n}: {2 * c.half_edges.shape[1]} pairs ready in {time.perf_counter() - t0:.1f} s", flush=True)
        del c
    results = []
    for n in sizes:
        for m in mechs:
            done = [r for r in results if r["mechanism"] == m]
            why = plan(done, n, a.repeats, a.timeout, mem_limit)
            r = ({"mechanism": m, "n": n, "skipped": why} if why
                 else run_one(m, n, a.repeats, a.threads, mem_limit, a.timeout, a.cache_dir))
            results.append(r)
            print(json.dumps(r), flush=True)
    text = report(results, a.repeats, mem_limit)
    print(text)
    if a.write:
        write_section(a.write, "training", text,
                      recorded_command("pointformers.bench.training", sys.argv[1:] if argv is None else argv,
                                       hide={"--cache-dir": "CACHE"}))
    return text


if __name__ == "__main__":  # pragma: no cover
    main()

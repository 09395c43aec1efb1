"""CPU inference time per event of the HEPT tracking model: PyTorch eager, ``torch.compile``, onnxruntime.

Runtimes (one cloud, float32, eval mode, batch 1):

* ``eager``         — the model's own forward (:class:`~pointformers.models.PointTransformerJK`, the fused
                      training path of HEPT) under ``torch.no_grad``.
* ``eager-static``  — the export-friendly inference path (:class:`pointformers.export.ExportableModel`,
                      one head at a time) run eagerly: the graph that torch.export / ONNX capture.
* ``compile``       — ``torch.compile(ExportableModel, dynamic=True)`` (inductor); its first call, which
                      compiles, is reported separately.
* ``onnxruntime``   — the file written by :func:`pointformers.export.export_model` (``format="onnx"``)
                      in onnxruntime (CPU provider); needs ``pip install 'pointformers[export]'``.

Every (runtime, threads) pair runs in a fresh subprocess (:func:`.harness.run_isolated`) that measures
all sizes in increasing order, so one compilation serves every size and the thread count is set before
any kernel runs. Inputs are the first N hits of a generated tracking event. Ratios are taken between
numbers measured in the same run. The onnxruntime worker also reports the fraction of points whose
embedding agrees with ``eager`` to 1e-3 (relative L2): HEPT's sort makes float32 implementations differ
at near-ties (see README.md, "Using the authors' checkpoint").

Usage: ``python -m pointformers.bench.inference [--sizes 6000 60000] [--threads 1 2] [--quick]
[--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

from .harness import machine, measure, run_isolated, write_section

RUNTIMES = ("eager", "eager-static", "compile", "onnxruntime")
SECTION = "inference"


def build_model(checkpoint: str | None):
    """The tracking model in eval mode: from ``checkpoint`` (see :func:`pointformers.export.load_model`)
    or, without one, ``hept-tracking`` initialised with seed 0 (speed does not depend on the weights)."""
    from ..export import load_model
    from ..models import build

    if checkpoint:
        return load_model(checkpoint, torch.float32)
    torch.manual_seed(0)
    return build("hept-tracking").eval()


def _agreement(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-3) -> float:
    rel = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    return float((rel <= tol).double().mean())


def worker(runtime: str, threads: int, sizes: list[int], repeats: int, checkpoint: str | None,
           onnx_path: str | None) -> list[dict]:
    """Measure ``runtime`` with ``threads`` threads at every size in this process (see module docstring)."""
    from ..tasks.tracking.core import generated_inputs

    torch.set_num_threads(threads)
    model = build_model(checkpoint)
    first_call = None
    if runtime == "eager":
        fn = model
    elif runtime in ("eager-static", "compile"):
        from ..export import ExportableModel

        fn = ExportableModel(model)
        if runtime == "compile":
            fn = torch.compile(fn, dynamic=True)
    elif runtime == "onnxruntime":
        from ..export import OnnxInference

        fn = OnnxInference(onnx_path, threads=threads)
    else:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    results = []
    for n in sorted(sizes):
        x, coords = generated_inputs(n)
        extra = {}
        if runtime == "compile" and first_call is None:  # compile once (dynamic shapes) on the first size
            t0 = time.perf_counter()
            with torch.no_grad():
                fn(x, coords)
            first_call = time.perf_counter() - t0
            extra["first_call_s"] = first_call

        def step():
            with torch.no_grad():
                fn(x, coords)

        res = {"runtime": runtime, "threads": threads, "n": n, **measure(step, repeats), **extra}
        if runtime == "onnxruntime":  # after measuring, so that the eager run does not set the peak
            with torch.no_grad():
                res["agree_1e-3"] = _agreement(fn(x, coords), model(x, coords))
        results.append(res)
    return results


def run_one(runtime: str, threads: int, sizes: list[int], repeats: int, checkpoint: str | None,
            onnx_path: str | None, timeout: float) -> list[dict]:
    args = [runtime, str(threads), ",".join(map(str, sizes)), str(repeats), checkpoint or "-", onnx_path or "-"]
    r = run_isolated("pointformers.bench.inference", args, timeout, {"runtime": runtime, "threads": threads})
    if "error" in r:
        return [{**r, "n": n} for n in sizes]
    return r["results"]


def export_onnx(checkpoint: str | None, directory: str) -> tuple[str | None, str]:
    """Export the benchmark model to ONNX (float32) once; returns (path or None, note)."""
    try:
        import onnxruntime  # noqa: F401

        from ..export import export_model
    except ImportError:
        return None, "onnxruntime not installed (pip install 'pointformers[export]')"
    path = os.path.join(directory, "model.onnx")
    t0 = time.perf_counter()
    export_model(build_model(checkpoint), path, format="onnx")
    return path, f"exported in {time.perf_counter() - t0:.0f} s"


def report(results: list[dict], sizes: list[int], threads: list[int], runtimes: list[str], notes: dict) -> str:
    get = lambda rt, t, n: next((r for r in results if (r["runtime"], r["threads"], r["n"]) == (rt, t, n)), None)
    ok = lambda r: r is not None and "error" not in r

    def cell(r):
        if r is None:
            return "not run"
        if "error" in r:
            return f"failed: {r['error']}"
        return f"{r['seconds']:.3f}" if r["seconds"] < 1 else f"{r['seconds']:.2f}"

    lines = [f"Machine: {machine()}", "",
             "### HEPT tracking model (4 layers, 0.33M parameters), one event, float32, CPU, seconds per event", "",
             "Median of 3 calls (the first, cold one included; for `compile` after compilation); each "
             "(runtime, threads) pair in its own process, sizes in increasing order; peak MB = resident "
             "memory above the level before the first call at that size. "
             "`× eager` = eager time / this runtime's time at the same thread count (> 1: faster).", "",
             "| runtime | threads | " + " | ".join(f"N = {n} s" for n in sizes) + " | "
             + " | ".join(f"× eager at {n}" for n in sizes) + " | peak MB at " + str(max(sizes)) + " |",
             "|" + "---|" * (3 + 2 * len(sizes))]
    for rt in runtimes:
        for t in threads:
            rs = [get(rt, t, n) for n in sizes]
            base = [get("eager", t, n) for n in sizes]
            ratio = [f"{b['seconds'] / r['seconds']:.2f}×" if ok(r) and ok(b) else "—" for r, b in zip(rs, base)]
            peak = f"{rs[-1]['peak_mb']:.0f}" if ok(rs[-1]) else "—"
            lines.append(f"| {rt} | {t} | " + " | ".join(cell(r) for r in rs) + " | " + " | ".join(ratio)
                         + f" | {peak} |")
    extra = []
    for t in threads:
        r = next((r for r in results if r["runtime"] == "compile" and r["threads"] == t and "first_call_s" in r), None)
        if r:
            extra.append(f"`torch.compile` first call (compilation, dynamic shapes) at N = {r['n']}, "
                         f"{t} thread(s): {r['first_call_s']:.0f} s.")
    agree = [f"N = {r['n']}: {100 * r['agree_1e-3']:.1f}%" for r in results
             if r["runtime"] == "onnxruntime" and r["threads"] == threads[0] and ok(r)]
    if agree:
        extra.append("onnxruntime vs eager, points whose embedding agrees to 1e-3 (relative L2; float32, "
                     "HEPT's sort resolves near-ties differently under different rounding): " + ", ".join(agree) + ".")
    if notes.get("onnx"):
        extra.append(f"ONNX file: {notes['onnx']}.")
    if notes.get("model"):
        extra.append(f"Weights: {notes['model']}.")
    if notes.get("load"):
        extra.append(f"System load average (1 min) when the run started: {notes['load']} — other processes "
                     "sharing the cores slow multi-threaded runs most (OpenMP threads wait for each other).")
    return "\n".join(lines + [""] + [f"- {e}" for e in extra])


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m pointformers.bench.inference", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="point counts (default: 6000 60000)")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 2)")
    p.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=RUNTIMES)
    p.add_argument("--repeats", type=int, default=None, help="timed calls per size, the first one included (default 3)")
    p.add_argument("--checkpoint", default=None,
                   help="trained model (RUN/best.pt or an authors' HEPT state_dict); default: random init")
    p.add_argument("--quick", action="store_true",
                   help="small sizes (1000 3000), 1 thread, no torch.compile: checks the machinery in ~1 min")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per (runtime, threads) process")
    p.add_argument("--write", default=None, help=f"write the report as section '{SECTION}' of this markdown file")
    p.add_argument("--worker", nargs=6, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        rt, t, sizes, rep, ckpt, onnx_path = a.worker
        res = worker(rt, int(t), [int(s) for s in sizes.split(",")], int(rep), None if ckpt == "-" else ckpt,
                     None if onnx_path == "-" else onnx_path)
        print(json.dumps({"results": res}))
        return ""
    sizes = a.sizes or ([1000, 3000] if a.quick else [6000, 60000])
    threads = a.threads or ([1] if a.quick else [1, 2])
    repeats = a.repeats or 3
    runtimes = [r for r in a.runtimes if not (a.quick and r == "compile" and a.runtimes == list(RUNTIMES))]
    if any(n < 2 for n in sizes) or any(t < 1 for t in threads) or repeats < 1:
        raise SystemExit("inference benchmark: --sizes must be >= 2, --threads and --repeats >= 1")
    notes = {"model": a.checkpoint or "hept-tracking, random initialisation (seed 0)"}
    if hasattr(os, "getloadavg"):
        notes["load"] = f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} logical cores"
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = None
        if "onnxruntime" in runtimes:
            onnx_path, notes["onnx"] = export_onnx(a.checkpoint, tmp)
            print(f"onnx: {notes['onnx']}", flush=True)
        for rt in runtimes:
            for t in threads:
                if rt == "onnxruntime" and onnx_path is None:
                    results += [{"runtime": rt, "threads": t, "n": n, "error": notes["onnx"]} for n in sizes]
                    continue
                rs = run_one(rt, t, sizes, repeats, a.checkpoint, onnx_path, a.timeout)
                for r in rs:
                    print(json.dumps(r), flush=True)
                results += rs
    text = report(results, sorted(sizes), threads, runtimes, notes)
    print(text)
    if a.write:
        write_section(a.write, SECTION, text,
                      " ".join(["python -m pointformers.bench.inference"] + (argv if argv is not None else sys.argv[1:])))
    return text


if __name__ == "__main__":
    main()

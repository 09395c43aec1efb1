"""Forward time and peak memory of the HEPT tracking model against its baselines, side by side.

Every measurement runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``
minus the resident size before the measured call) is its own. Inputs are generated
tracking events (the first N hits of an event with enough pile-up). Mechanisms:

* ``hept``               — :class:`pointformers.attention.HEPTAttention` (fused, recomputing backward)
* ``hept-materialized``  — the same model and weights computed as the authors' code does
                           (every block's scores materialised: HEPT's ``implementation="materialized"``)
* ``full``               — softmax attention via ``scaled_dot_product_attention``
* ``kernel``             — dense HEPT kernel (the exact target)

Usage: ``pointformers benchmark hept [--sizes 6000 20000 60000] [--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .harness import machine, measure, run_isolated, write_section

#: Quadratic mechanisms are not run above this size (their time and memory grow as N²).
QUADRATIC_MAX_N = 20000


def build_model(mechanism: str):
    from ..models import build

    torch.manual_seed(0)
    if mechanism == "hept-materialized":  # same parameters, HEPT's materialized reference path
        return build("hept-tracking", attention_options={"implementation": "materialized"})
    return build("tracking-encoder", attention=mechanism)


def worker(mechanism: str, n: int, mode: str, repeats: int) -> dict:
    """One measurement in this process: median seconds and peak MB of forward or forward+backward."""
    from ..tasks.tracking.core import generated_inputs

    x, coords = generated_inputs(n)
    step = model_step(build_model(mechanism), x[None], coords[None], mode)
    return {"mechanism": mechanism, "n": n, "mode": mode, **measure(step, repeats)}


def model_step(model: torch.nn.Module, x: torch.Tensor, coords: torch.Tensor, mode: str):
    """A no-argument callable: the model's eval forward without grad (``mode="forward"``) or one
    training forward + backward of a scalar loss (``"train"``); sets the model's mode."""
    if mode == "forward":
        model.eval()

        def step():
            with torch.no_grad():
                model(x, coords)
    else:
        model.train()

        def step():
            model.zero_grad(set_to_none=True)
            model(x, coords).pow(2).mean().backward()
    return step


def skip_reason(prev: dict | None, mechanism: str, n: int, repeats: int, timeout: float) -> str | None:
    """Why the forward of ``mechanism`` at n should not be run, from its previous (smaller) size:
    that one failed, or its time scaled by (n / n_prev)^p (p = 2 for the quadratic ``full`` and
    ``kernel``, 1 otherwise) × ``repeats`` exceeds ``timeout``. None = run it."""
    if prev is None:
        return None
    if "skipped" in prev:
        return prev["skipped"]
    if "error" in prev:
        return f"N = {prev['n']} failed"
    p = 2 if mechanism in ("full", "kernel") else 1
    t = prev["seconds"] * (n / prev["n"]) ** p * repeats
    return f"predicted {t:.0f} s > {timeout:.0f} s limit" if t > timeout else None


def run_one(mechanism: str, n: int, mode: str, repeats: int, timeout: float) -> dict:
    return run_isolated("pointformers.bench.speed", [mechanism, str(n), mode, str(repeats)], timeout,
                        {"mechanism": mechanism, "n": n, "mode": mode})


def _fmt(r: dict | None, key: str, unit: str = "") -> str:
    if r is None:
        return "not run (quadratic)"
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    if "error" in r:
        return f"failed: {r['error']}"
    return f"{r[key]:.2f}{unit}" if key == "seconds" else f"{r[key]:.0f}{unit}"


def report(results: list[dict], sizes: list[int], train_n: int) -> str:
    get = lambda m, n, mode: next((r for r in results if (r["mechanism"], r["n"], r["mode"]) == (m, n, mode)), None)
    mechs = ["hept", "hept-materialized", "full", "kernel"]
    lines = [f"Machine: {machine()}", "",
             "### HEPT tracking model (4 layers), forward, batch 1, float32, eval mode", "",
             "| N | " + " | ".join(f"{m} s" for m in mechs) + " | "
             + " | ".join(f"{m} peak MB" for m in mechs) + " | materialized / hept | full / hept |",
             "|" + "---|" * (2 * len(mechs) + 3)]
    for n in sizes:
        rs = [get(m, n, "forward") for m in mechs]
        ok = lambda r: r is not None and "error" not in r and "skipped" not in r
        ratio = lambda r: f"{r['seconds'] / rs[0]['seconds']:.1f}×" if ok(r) and ok(rs[0]) else "—"
        lines.append(f"| {n} | " + " | ".join(_fmt(r, "seconds") for r in rs) + " | "
                     + " | ".join(_fmt(r, "peak_mb") for r in rs) + f" | {ratio(rs[1])} | {ratio(rs[2])} |")
    lines += ["", f"### Training step (forward + backward) at N = {train_n}", "",
              "| mechanism | seconds | peak MB | peak / full |", "|---|---|---|---|"]
    full = get("full", train_n, "train")
    for m in ("hept", "hept-materialized", "full"):
        r = get(m, train_n, "train")
        good = lambda r: r is not None and "error" not in r and "skipped" not in r
        rel = f"{r['peak_mb'] / full['peak_mb']:.2f}" if good(r) and good(full) and full["peak_mb"] > 0 else "—"
        lines.append(f"| {m} | {_fmt(r, 'seconds')} | {_fmt(r, 'peak_mb')} | {rel} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="pointformers benchmark hept", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[6000, 20000, 60000])
    p.add_argument("--train-n", type=int, default=10000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    p.add_argument("--quadratic-max", type=int, default=QUADRATIC_MAX_N,
                   help="largest N for the quadratic full and kernel attention")
    p.add_argument("--write", default=None, help="write the report into this markdown file")
    p.add_argument("--worker", nargs=4, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        m, n, mode, rep = a.worker
        print(json.dumps(worker(m, int(n), mode, int(rep))))
        return ""
    if any(n < 1 for n in a.sizes) or a.train_n < 1:
        raise SystemExit("pointformers benchmark: --sizes and --train-n must be positive")
    results, prev = [], {}
    for n in sorted(a.sizes):
        for m in ("hept", "hept-materialized", "full", "kernel"):
            if m in ("full", "kernel") and n > a.quadratic_max:
                continue
            rep = 1 if (m != "hept" and n > 10000) else a.repeats
            why = skip_reason(prev.get(m), m, n, rep, a.timeout)
            r = ({"mechanism": m, "n": n, "mode": "forward", "skipped": why} if why
                 else run_one(m, n, "forward", rep, a.timeout))
            results.append(r)
            prev[m] = r
            print(json.dumps(r), flush=True)
    for m in ("hept", "hept-materialized", "full"):
        results.append(run_one(m, a.train_n, "train", 1, a.timeout))
        print(json.dumps(results[-1]), flush=True)
    text = report(results, a.sizes, a.train_n)
    print(text)
    if a.write:
        write_section(a.write, "speed", text, " ".join(["pointformers benchmark hept"] + (argv or sys.argv[1:])))
    return text


if __name__ == "__main__":
    main()

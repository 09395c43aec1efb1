"""Every attention mechanism side by side: forward time and peak memory vs N, as ratios to ``full``.

Layer-level measurement (one attention module, width 64, 4 heads, batch 1, float32, eval,
no grad) on uniform points in the unit cube (``pos`` = xyz), N from 1k to 64k. Each
measurement is isolated in a subprocess (:mod:`.harness`). Near-linear mechanisms should show
time(64k)/time(8k) ≈ 8 (≤ 10 is the project's bar) and memory growing linearly.

Also the SFT paper's CPU protocol (Table 6): one thread, a batch of 4 × 1024 tokens, width
256, one SFT layer with its MLP for k ∈ {32, …, 512} against ``torch.nn.TransformerEncoderLayer``.

Usage: ``pointformers benchmark mechanisms [--sizes …] [--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .harness import machine, measure, run_isolated, write_section

DIM, HEADS = 64, 4
#: Realistic options per mechanism (papers' defaults where they exist).
OPTIONS = {
    "full": {},
    "kernel": {"coord_dim": 3},
    "hept": {"coord_dim": 3, "block_size": 100, "n_hashes": 3, "num_regions": 150},
    "lsh_or": {"coord_dim": 3, "block_size": 100, "n_hashes": 3},
    "performer": {"nb_features": 256},
    "flt": {"nb_features": 256, "num_rpe_features": 32, "rpe_type": "gaussian_basis"},
    "sft": {"k": 256},
    "samsa": {"k": 256},
    "sampled": {},
    "knn": {"k": 16, "coord_dim": 3},
    "serialized": {"patch_size": 1024, "coord_dim": 3},
}
#: Quadratic mechanisms stop here (their cost grows as N²; full's is the reference column).
QUADRATIC = {"kernel": 16384, "knn": 32768}


def layer_worker(name: str, n: int, repeats: int) -> dict:
    from ..attention import build

    torch.manual_seed(0)
    attn = build(name, dim=DIM, heads=HEADS, **OPTIONS[name]).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, n, DIM, generator=g)
    pos = torch.rand(1, n, 3, generator=g)

    def step():
        with torch.no_grad():
            attn(x, pos)

    if n <= 16384:
        step()  # warm-up (lazy initialisation, allocator); large N are measured cold, once
    return measure(step, repeats)


def sft_worker(k: int, repeats: int) -> dict:
    """Table 6 protocol; k = 0 means the built-in TransformerEncoderLayer."""
    from ..attention.sft import SFTBlock

    torch.set_num_threads(1)
    torch.manual_seed(0)
    d = 256
    layer = (torch.nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True) if k == 0
             else SFTBlock(d, heads=8, k=k, ffn_mult=4)).eval()
    x = torch.randn(4, 1024, d)

    def step():
        with torch.no_grad():
            layer(x)

    step()  # warm-up
    return measure(step, repeats)


def report(layer: list[dict], sizes: list[int], sft: list[dict]) -> str:
    names = sorted({r["mechanism"] for r in layer}, key=lambda m: list(OPTIONS).index(m))
    get = lambda m, n: next((r for r in layer if r["mechanism"] == m and r["n"] == n), None)
    ok = lambda r: r is not None and "error" not in r
    lines = [f"Machine: {machine()}", "",
             f"### One attention layer, forward, width {DIM}, {HEADS} heads, batch 1, float32", "",
             "Time in ms (ratio to `full` at the same N); — = not run (quadratic beyond its limit) or failed.", "",
             "| mechanism | " + " | ".join(f"N={n}" for n in sizes) + " | time 64k/8k |",
             "|---|" + "---|" * (len(sizes) + 1)]
    for m in names:
        cells = []
        for n in sizes:
            r, f = get(m, n), get("full", n)
            if not ok(r):
                cells.append("—" if r is None else f"failed ({r['error'][:40]})")
                continue
            ratio = f" ({r['seconds'] / f['seconds']:.2f})" if ok(f) else ""
            cells.append(f"{1000 * r['seconds']:.0f}{ratio}")
        a, b = get(m, 65536), get(m, 8192)
        growth = f"{a['seconds'] / b['seconds']:.1f}" if ok(a) and ok(b) else "—"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {growth} |")
    lines += ["", "Peak memory above the inputs, MB (ratio to `full`):", "",
              "| mechanism | " + " | ".join(f"N={n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for m in names:
        cells = []
        for n in sizes:
            r, f = get(m, n), get("full", n)
            if not ok(r):
                cells.append("—")
                continue
            ratio = f" ({r['peak_mb'] / f['peak_mb']:.2f})" if ok(f) and f["peak_mb"] > 0 else ""
            cells.append(f"{r['peak_mb']:.0f}{ratio}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if sft:
        base = next((r for r in sft if r["k"] == 0 and "error" not in r), None)
        lines += ["", "### SFT paper's CPU protocol (Table 6): 1 thread, batch 4 × 1024 tokens, width 256, layer + MLP",
                  "", "| layer | seconds | speed-up vs built-in |", "|---|---|---|"]
        for r in sft:
            label = "nn.TransformerEncoderLayer" if r["k"] == 0 else f"SFT k = {r['k']}"
            if "error" in r:
                lines.append(f"| {label} | failed | — |")
                continue
            sp = f"{base['seconds'] / r['seconds']:.2f}×" if base else "—"
            lines.append(f"| {label} | {r['seconds']:.3f} | {sp} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="pointformers benchmark mechanisms", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    p.add_argument("--mechanisms", nargs="+", default=None, help="registry keys (default: all)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    p.add_argument("--no-sft-protocol", action="store_true")
    p.add_argument("--write", default=None, help="write the report into this markdown file")
    p.add_argument("--worker", nargs="+", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        if a.worker[0] == "sft":
            print(json.dumps(sft_worker(int(a.worker[1]), int(a.worker[2]))))
        else:
            print(json.dumps(layer_worker(a.worker[0], int(a.worker[1]), int(a.worker[2]))))
        return ""
    from ..attention import available

    names = a.mechanisms or [m for m in OPTIONS if m in available()]
    unknown = set(names) - set(OPTIONS)
    if unknown:
        raise SystemExit(f"pointformers benchmark mechanisms: unknown mechanism(s) {sorted(unknown)}; "
                         f"choose from {sorted(OPTIONS)}")
    layer = []
    for n in a.sizes:
        for m in names:
            if n > QUADRATIC.get(m, n):
                continue
            rep = a.repeats if n <= 16384 else 1
            layer.append(run_isolated("pointformers.bench.mechanisms", [m, str(n), str(rep)], a.timeout,
                                      {"mechanism": m, "n": n}))
            print(json.dumps(layer[-1]), flush=True)
    sft = []
    if not a.no_sft_protocol and "sft" in available():
        for k in (0, 32, 64, 128, 256, 512):
            sft.append(run_isolated("pointformers.bench.mechanisms", ["sft", str(k), "10"], a.timeout, {"k": k}))
            print(json.dumps(sft[-1]), flush=True)
    text = report(layer, a.sizes, sft)
    print(text)
    if a.write:
        write_section(a.write, "mechanisms", text,
                      " ".join(["pointformers benchmark mechanisms"] + (argv if argv is not None else sys.argv[1:])))
    return text


if __name__ == "__main__":
    main()

"""Every attention mechanism side by side: time, peak memory and FLOP rate vs N, as ratios to ``full``.

Layer-level measurement: one attention module (width 64, 4 heads, batch 1, float32) on uniform
points in the unit cube (``pos`` = xyz), N from 1k to 256k, in two modes:

* ``forward`` — ``eval()``, no grad;
* ``train`` — ``train()``, forward + backward of ``y.pow(2).mean()`` with x requiring grad
  (the layer's share of a training step).

Each measurement runs in a fresh subprocess (:mod:`.harness`), with its own time limit
(``--timeout``). Every measurement makes one warm-up call first, then times ``--repeats`` calls
(one above 16k points) and reports the median. Peak memory is tensor memory: on the CPU the
peak of the bytes torch's allocator handed out during the warm-up call, above what was allocated
before it (:func:`.harness.tensor_peak_bytes`, from the profiler's memory events; the process's
resident size is not used because the C allocator's reuse of freed memory makes it read near
zero on a warm call at small N and not at large N); on CUDA ``torch.cuda.max_memory_allocated``
above the memory held before the first timed call.
A size is skipped, with the reason stated in the table, when the previous size of the same
mechanism and mode failed or timed out, or when its time predicted from that previous size
(scaled by the analytic FLOP ratio, :mod:`.flops`) exceeds the limit, or its predicted memory
(scaled linearly in N: every implementation here is linear in memory) exceeds ``--mem-limit``.

FLOPs are analytic (:func:`.flops.attention_flops`); achieved GFLOP/s = FLOPs / time is
compared with the device's measured float32 matmul peak (:mod:`.peak`). The scaling exponent α
is the least-squares slope of log time on log N over N ≥ 4096: ≈ 1 is linear, 2 quadratic.

Also the SFT paper's CPU protocol (Table 6): one thread, a batch of 4 × 1024 tokens, width
256, one SFT layer with its MLP for k ∈ {32, …, 512} against ``torch.nn.TransformerEncoderLayer``.

Usage: ``pointformers benchmark mechanisms [--sizes …] [--modes forward train] [--device cpu|cuda]
[--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

from .flops import attention_flops, gflops
from .harness import machine, measure, measure_warm, run_isolated, write_section
from .peak import peak_sentence

DIM, HEADS = 64, 4


def bench_options(name: str) -> dict:
    """The benchmark options of mechanism ``name``: its registry entry's ``bench`` defaults
    (papers' values where they exist)."""
    from ..attention import info

    return dict(info(name).bench)


def mechanism_names() -> list[str]:
    """Every registered mechanism, in the registry's order (sorted)."""
    from ..attention import available

    return available()


DEFAULT_SIZES = [1024, 4096, 8192, 16384, 65536, 262144]
#: The near-linearity check of the mechanisms issue: time(64k) / time(8k) ≤ 10 (N grows 8×).
RATIO_SIZES, RATIO_LIMIT = (8192, 65536), 10.0
MODES = ("forward", "train")
#: Sizes up to this many points get ``--repeats`` timed calls, larger ones one (every size gets a
#: warm-up call first, so the 8k and 64k times of the near-linearity check are both warm).
REPEAT_MAX_N = 16384


def measure_cuda(step, repeats: int, device: torch.device) -> dict:
    """CUDA counterpart of :func:`.harness.measure`: synchronised median seconds and the first
    call's peak allocated MB above what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        if i == 0:
            peak = torch.cuda.max_memory_allocated(device) - before
    return {"seconds": statistics.median(times), "runs": len(times), "peak_mb": peak / 2**20}


def layer_worker(name: str, n: int, mode: str, repeats: int, device: str = "cpu") -> dict:
    """One measurement in this process: one layer of ``name`` on n points, forward or train."""
    from ..attention import build

    dev = torch.device(device)
    torch.manual_seed(0)
    attn = build(name, dim=DIM, heads=HEADS, **bench_options(name)).to(dev)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, n, DIM, generator=g).to(dev)
    pos = torch.rand(1, n, 3, generator=g).to(dev)
    if mode == "forward":
        attn.eval()

        def step():
            with torch.no_grad():
                attn(x, pos)
    elif mode == "train":
        attn.train()
        x.requires_grad_(True)

        def step():
            attn.zero_grad(set_to_none=True)
            x.grad = None
            attn(x, pos).pow(2).mean().backward()
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    if dev.type == "cuda":
        step()  # warm-up (lazy initialisation, allocator, kernel selection)
        return measure_cuda(step, repeats, dev)
    return measure_warm(step, repeats)  # warm-up call (tensor peak measured on it), then timed calls


def sft_worker(k: int, repeats: int, gemm: str = "auto") -> dict:
    """Table 6 protocol; k = 0 means the built-in TransformerEncoderLayer.

    ``gemm="plain"`` switches off the oneDNN linear kernels of :mod:`pointformers.nn.fast_linear`,
    so SFT's GEMMs go through the same ``addmm`` (MKL) as the built-in layer's.
    """
    from ..attention.sft import SFTBlock
    from ..nn import fast_linear

    if gemm not in ("auto", "plain"):
        raise ValueError(f"gemm: expected 'auto' or 'plain', got {gemm!r}")
    fast_linear.set_enabled(gemm == "auto")

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


def layer_flops(name: str, n: int, mode: str) -> int:
    return attention_flops(name, n, DIM, HEADS, **bench_options(name)).total(mode)


def available_memory_mb(device: str) -> float:
    """Memory a measurement may use: 60 % of the available RAM (CPU) or of the GPU's total."""
    if device == "cuda":
        return 0.6 * torch.cuda.get_device_properties(0).total_memory / 2**20
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: float(line.split()[1]) for line in f}
        return 0.6 * info.get("MemAvailable", info["MemTotal"]) / 1024
    except (OSError, KeyError, ValueError):
        return math.inf


def ok(r: dict | None) -> bool:
    return r is not None and "error" not in r and "skipped" not in r


def predicted_seconds(prev: dict, name: str, n: int, mode: str, repeats: int) -> float:
    """Wall time of (name, n, mode) predicted from the measured previous size: its time per call
    scaled by the analytic FLOP ratio, × the calls (timed ``repeats`` + the warm-up)."""
    ratio = layer_flops(name, n, mode) / max(1, layer_flops(name, prev["n"], mode))
    return prev["seconds"] * ratio * (repeats + 1)


def plan(prev: dict | None, name: str, n: int, mode: str, repeats: int, timeout: float, mem_limit: float) -> str | None:
    """Why (name, n, mode) should not be run given the previous size's result, or None to run it."""
    if prev is None:
        return None
    if "error" in prev:
        return f"N = {prev['n']} failed ({prev['error'][:40]})"
    if "skipped" in prev:
        return prev["skipped"]
    t_pred = predicted_seconds(prev, name, n, mode, repeats)
    if t_pred > timeout:
        return f"predicted {t_pred:.0f} s > {timeout:.0f} s limit"
    m_pred = prev["peak_mb"] * n / prev["n"]
    if m_pred > mem_limit:
        return f"predicted {m_pred / 1024:.1f} GB > {mem_limit / 1024:.1f} GB"
    return None


def run_all(names: list[str], sizes: list[int], modes: list[str], repeats: int, timeout: float, device: str,
            mem_limit: float, log=print, budget: float = math.inf) -> list[dict]:
    """Every (mechanism, mode, N), each isolated; skipped ones carry ``skipped`` with the reason.

    Sizes are the outer loop (smallest first), so when the total ``budget`` (seconds) runs short
    it is the largest sizes of every mechanism that go, evenly, not whole mechanisms. A run is
    also skipped when its predicted time (:func:`plan`) exceeds what is left of the budget.
    """
    results, prev = [], {}
    t_start = time.perf_counter()
    for n in sorted(sizes):
        for name in names:
            for mode in modes:
                rep = repeats if n <= REPEAT_MAX_N else 1
                tag = {"mechanism": name, "n": n, "mode": mode, "device": device,
                       "flops": layer_flops(name, n, mode)}
                left = budget - (time.perf_counter() - t_start)
                p = prev.get((name, mode))
                why = plan(p, name, n, mode, rep, timeout, mem_limit)
                if why is None and left <= 0:
                    why = "the run's time budget was spent"
                elif why is None and ok(p) and (t := predicted_seconds(p, name, n, mode, rep)) > left:
                    why = f"predicted {t:.0f} s > {left:.0f} s left of the run's time budget"
                if why:
                    r = {**tag, "skipped": why}
                else:
                    r = run_isolated("pointformers.bench.mechanisms", [name, str(n), mode, str(rep), device],
                                     min(timeout, max(left, 1.0)), tag)
                    if ok(r):
                        r["gflops"] = gflops(r["flops"], r["seconds"])
                results.append(r)
                log(json.dumps(r))
                prev[(name, mode)] = r
    return results


def scaling_exponent(results: list[dict], name: str, mode: str, min_n: int = 4096) -> float:
    """Least-squares slope of log seconds on log N over measured N ≥ ``min_n`` (nan below 2 points)."""
    pts = [(math.log(r["n"]), math.log(r["seconds"])) for r in results
           if r["mechanism"] == name and r["mode"] == mode and ok(r) and r["n"] >= min_n]
    if len(pts) < 2:
        return math.nan
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def growth(results: list[dict], name: str, mode: str, key: str) -> float:
    """``key`` (seconds or peak_mb) at 64k over the same at 8k (nan unless both were measured)."""
    lo, hi = (_get(results, name, n, mode) for n in RATIO_SIZES)
    if not (ok(lo) and ok(hi)) or lo[key] <= 0:
        return math.nan
    return hi[key] / lo[key]


def _get(results, m, n, mode):
    return next((r for r in results if r["mechanism"] == m and r["n"] == n and r["mode"] == mode), None)


def _cell(r: dict | None, full: dict | None, key: str, scale: float) -> str:
    if r is None:
        return "—"
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    if "error" in r:
        return f"failed: {r['error'][:50]}"
    ratio = f" ({r[key] / full[key]:.2f})" if ok(full) and full[key] > 0 else ""
    v = r[key] * scale
    return f"{v:.0f}{ratio}" if v >= 100 else f"{v:.1f}{ratio}" if v >= 10 else f"{v:.2f}{ratio}"


def report(layer: list[dict], sizes: list[int], modes: list[str], sft: list[dict], device: str,
           peak: dict | None, plot: str | None = None) -> str:
    names = [m for m in mechanism_names() if any(r["mechanism"] == m for r in layer)]
    sizes = sorted(sizes)
    dev_line = (f"Device: **{device}**" + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
                + f". Machine: {machine()}.")
    lines = [dev_line, ""]
    if peak:
        lines += [peak_sentence(peak), ""]
    lines += [f"One attention layer, width {DIM}, {HEADS} heads, batch 1, float32, uniform points in the unit cube. "
              "Options: " + "; ".join(f"`{m}` {bench_options(m) or 'defaults'}" for m in names) + ". "
              "`kernel`, `hept` and `lsh_or` use head width = model width (64, as HEPT's code); the others 64/4 = 16: "
              "the FLOPs columns make that difference explicit. Ratios in parentheses are to `full` at the same N. "
              "α = fitted exponent of time ∝ N^α over N ≥ 4096. 64k/8k = time (or peak memory) at N = 65536 over "
              f"N = 8192, an 8× growth in N: near-linear means the time ratio is at most {RATIO_LIMIT:g} "
              "(quadratic attention would give 64); where either size is missing, α ≤ 1.3.", ""]
    for mode in modes:
        title = "Forward (eval, no grad)" if mode == "forward" else "Forward + backward (train)"
        lines += [f"### {title}: time in ms", "",
                  "| mechanism | " + " | ".join(f"N={n}" for n in sizes) + " | α | 64k/8k | near-linear |",
                  "|---|" + "---|" * (len(sizes) + 3)]
        for m in names:
            cells = [_cell(_get(layer, m, n, mode), _get(layer, "full", n, mode), "seconds", 1000)
                     for n in sizes]
            a, g = scaling_exponent(layer, m, mode), growth(layer, m, mode, "seconds")
            # the 64k/8k growth decides; without both sizes, the fitted exponent (α ≤ 1.3)
            verdict = ("yes" if g <= RATIO_LIMIT else "no") if math.isfinite(g) else \
                ("yes" if a <= 1.3 else "no") if math.isfinite(a) else "—"
            lines.append(f"| {m} | " + " | ".join(cells) + (f" | {a:.2f}" if math.isfinite(a) else " | —")
                         + (f" | {g:.1f}" if math.isfinite(g) else " | —") + f" | {verdict} |")
        lines += ["", f"### {title}: peak memory above the inputs, MB", "",
                  "| mechanism | " + " | ".join(f"N={n}" for n in sizes) + " | 64k/8k |",
                  "|---|" + "---|" * (len(sizes) + 1)]
        for m in names:
            cells = []
            for n in sizes:
                r = _get(layer, m, n, mode)
                cells.append(_cell(r, _get(layer, "full", n, mode), "peak_mb", 1) if ok(r) else "—")
            g = growth(layer, m, mode, "peak_mb")
            lines.append(f"| {m} | " + " | ".join(cells) + (f" | {g:.1f} |" if math.isfinite(g) else " | — |"))
        lines += ["", f"### {title}: analytic GFLOPs / achieved GFLOP/s"
                  + (f" (% of the {peak['matmul']['gflops']:.0f} GFLOP/s peak)" if peak else ""), "",
                  "| mechanism | " + " | ".join(f"N={n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for m in names:
            cells = []
            for n in sizes:
                r = _get(layer, m, n, mode)
                if r is None:
                    cells.append("—")
                    continue
                c = f"{r['flops'] / 1e9:.3g}"
                if ok(r):
                    c += f" / {r['gflops']:.1f}"
                    if peak:
                        c += f" ({100 * r['gflops'] / peak['matmul']['gflops']:.0f} %)"
                cells.append(c)
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    if plot:
        lines += [f"![time, memory and GFLOP/s vs N]({plot})", ""]
    if sft:
        base = next((r for r in sft if r["k"] == 0 and "error" not in r), None)
        lines += ["### SFT paper's CPU protocol (Table 6): 1 thread, batch 4 × 1024 tokens, width 256, layer + MLP",
                  "", "| layer | seconds | speed-up vs built-in |", "|---|---|---|"]
        for r in sft:
            label = "nn.TransformerEncoderLayer" if r["k"] == 0 else f"SFT k = {r['k']}"
            if r["k"] and r.get("gemm") == "plain":
                label += " (oneDNN off: MKL GEMMs as the built-in layer)"
            if "error" in r:
                lines.append(f"| {label} | failed | — |")
                continue
            sp = f"{base['seconds'] / r['seconds']:.2f}×" if base else "—"
            lines.append(f"| {label} | {r['seconds']:.3f} | {sp} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pointformers benchmark mechanisms", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--mechanisms", nargs="+", default=None, help="registry keys (default: all)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=3, help=f"timed calls for N ≤ {REPEAT_MAX_N} (larger: 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per measurement")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for all layer measurements together (default: unlimited); once short, "
                        "the largest sizes are skipped and say so")
    p.add_argument("--mem-limit", type=float, default=None, help="MB per measurement (default 60%% of free memory)")
    p.add_argument("--no-sft-protocol", action="store_true")
    p.add_argument("--peak", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the device's matmul peak for the GFLOP/s columns")
    p.add_argument("--plots", default="docs", help="folder for the PNG ('' for none)")
    p.add_argument("--write", default=None, help="write the report into this markdown file")
    p.add_argument("--worker", nargs="+", default=None, help=argparse.SUPPRESS)
    return p


def run(a: argparse.Namespace, peak: dict | None = None, log=None) -> dict:
    """Run the benchmark for parsed arguments ``a``; returns {"text", "results", "sft", "peak", "plot"}.

    ``peak``: an already measured :mod:`.peak` result to reuse (else measured here if ``a.peak``).
    """
    from ..attention import available

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pointformers benchmark mechanisms: --device cuda but no CUDA device is available")
    if any(n < 1 for n in a.sizes):
        raise SystemExit("pointformers benchmark mechanisms: --sizes must be positive")
    names = a.mechanisms or available()
    unknown = set(names) - set(available())
    if unknown:
        raise SystemExit(f"pointformers benchmark mechanisms: unknown mechanism(s) {sorted(unknown)}; "
                         f"choose from {available()}")
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    if peak is None and a.peak:
        from .peak import block_gemm_rate, matmul_peak
        peak = {"matmul": matmul_peak(a.device), "block_gemm": block_gemm_rate(a.device)}
        log(json.dumps(peak))
    mem_limit = a.mem_limit or available_memory_mb(a.device)
    layer = run_all(names, a.sizes, a.modes, a.repeats, a.timeout, a.device, mem_limit, log,
                    a.budget if a.budget else math.inf)
    sft = []
    if not a.no_sft_protocol and "sft" in names and a.device == "cpu":
        for k, gemm in [(0, "auto")] + [(k, "auto") for k in (32, 64, 128, 256, 512)] + [(32, "plain")]:
            sft.append(run_isolated("pointformers.bench.mechanisms", ["sft-protocol", str(k), "10", gemm], a.timeout,
                                    {"k": k, "gemm": gemm}))
            log(json.dumps(sft[-1]))
    plot = None
    if a.plots:
        from .plots import plot_mechanisms
        path = plot_mechanisms(layer, a.plots, a.device, peak["matmul"]["gflops"] if peak else None,
                               f"One attention layer (width {DIM}, {HEADS} heads), device {a.device}")
        plot = os.path.relpath(path, os.path.dirname(os.path.abspath(a.write))) if a.write else path
    text = report(layer, a.sizes, a.modes, sft, a.device, peak, plot)
    return {"text": text, "results": layer, "sft": sft, "peak": peak, "plot": plot}


def main(argv: list[str] | None = None) -> str:
    from ..registry import load_plugins

    load_plugins()  # mechanisms registered by plugins (POINTFORMERS_PLUGINS), in workers too
    a = parser().parse_args(argv)
    if a.worker:
        if a.worker[0] == "sft-protocol":
            print(json.dumps(sft_worker(int(a.worker[1]), int(a.worker[2]), *a.worker[3:4])))
        else:
            name, n, mode, rep, device = a.worker
            print(json.dumps(layer_worker(name, int(n), mode, int(rep), device)))
        return ""
    out = run(a)
    print(out["text"])
    if a.write:
        write_section(a.write, "mechanisms", out["text"],
                      " ".join(["pointformers benchmark mechanisms"] + (argv if argv is not None else sys.argv[1:])))
    return out["text"]


if __name__ == "__main__":
    main()

"""The device's measured matmul peak: float32 GFLOP/s of a large square GEMM.

This is the roofline the benchmarks compare against: a mechanism whose time is T for F FLOPs
runs at F/T GFLOP/s, and F / peak is the time its FLOPs would take if all of them ran as one
large GEMM does. Also measured, for reference, the rate of the batched small GEMMs that HEPT's
block kernel issues ((c, 100, 32) × (c, 32, 100)) — the ceiling a block-sparse kernel can reach on
this device without fusing, usually well below the large-GEMM peak.

Timing: the best of ``repeats`` calls after a warm-up (best, not median: the peak is what the
device can do, and the machine may be shared). float32; on CUDA TF32 is left off
(``torch.backends.cuda.matmul.allow_tf32`` as the process has it, False by default), so the peak
is the float32 one the benchmarks run at.

Usage: ``python -m pointformers.bench.peak [--device cpu|cuda]``.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (library initialisation, allocator, kernel selection)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_peak(device: str | torch.device = "cpu", size: int | None = None, repeats: int = 5) -> dict:
    """Float32 square GEMM (size × size)·(size × size): GFLOP/s = 2·size³ / best seconds.

    ``size`` defaults to 2048 on CPU and 8192 on CUDA (large enough to saturate either).
    Returns {"device", "size", "seconds", "gflops"}.
    """
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 2048)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g).to(device)
    b = torch.randn(size, size, generator=g).to(device)
    out = torch.empty(size, size, device=device)
    s = _best_seconds(lambda: torch.mm(a, b, out=out), device, repeats)
    res = {"device": str(device), "size": size, "seconds": s, "gflops": 2 * size ** 3 / s / 1e9, "onednn_gflops": None}
    from ..nn import fast_linear

    if device.type == "cpu" and fast_linear.enabled():
        lin = torch.nn.Linear(size, size, bias=False)
        with torch.no_grad():
            lin.weight.copy_(b.t())
            s1 = _best_seconds(lambda: fast_linear.linear(lin, a), device, repeats)
        res["onednn_gflops"] = 2 * size ** 3 / s1 / 1e9
    return res


def peak_sentence(peak: dict) -> str:
    """One markdown sentence stating the measured peaks of a {"matmul", "block_gemm"} result."""
    mm, bg = peak["matmul"], peak["block_gemm"]
    onednn = (f"; the same GEMM through oneDNN's prepacked linear (`pointformers.nn.fast_linear`, used by "
              f"SFT, the MLPs and HEPT's projections in CPU inference): {mm['onednn_gflops']:.0f} GFLOP/s"
              if mm.get("onednn_gflops") else "")
    return (f"Measured float32 matmul peak: **{mm['gflops']:.0f} GFLOP/s** (`torch.mm`, {mm['size']}² GEMM, best of 5"
            f"{onednn}); HEPT-shaped batched block GEMM {tuple(bg['shape'])}: {bg['gflops']:.0f} GFLOP/s.")


def block_gemm_rate(device: str | torch.device = "cpu", block: int = 100, width: int = 32, blocks: int = 2048,
                    repeats: int = 5) -> dict:
    """Batched (blocks, block, width)·(blocks, width, block) GEMM rate, HEPT's block shape.

    Returns {"device", "shape", "seconds", "gflops"}.
    """
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(blocks, block, width, generator=g).to(device)
    k = torch.randn(blocks, width, block, generator=g).to(device)
    out = torch.empty(blocks, block, block, device=device)
    s = _best_seconds(lambda: torch.bmm(q, k, out=out), device, repeats)
    return {"device": str(device), "shape": [blocks, block, width], "seconds": s,
            "gflops": 2 * blocks * block * block * width / s / 1e9}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m pointformers.bench.peak", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--size", type=int, default=None)
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    out = {"matmul": matmul_peak(a.device, a.size), "block_gemm": block_gemm_rate(a.device),
           "threads": torch.get_num_threads()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

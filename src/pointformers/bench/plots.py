"""PNG plots of the benchmarks (matplotlib, Agg backend: no display needed).

* :func:`plot_mechanisms` — time, memory and achieved GFLOP/s vs N for every mechanism;
* :func:`plot_approximation` — error vs FLOPs (kernel, weights, output) with the theorems' lines;
* :func:`plot_scaling` — relative kernel error vs F/(n·(d+c)) at two n (Thms 3.4/3.5's scaling).

Each function writes one PNG into ``folder`` and returns its path.
"""
from __future__ import annotations

import math
import os

try:
    import matplotlib
except ModuleNotFoundError as exc:  # optional dependency: the 'plots' extra
    raise ModuleNotFoundError("pointformers.bench.plots needs matplotlib: pip install 'pointformers[plots]'",
                              name=exc.name) from exc

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"rff": "tab:orange", "rff_trig": "tab:brown", "or": "tab:blue", "or_and_plain": "tab:purple",
          "or_and": "tab:green"}
LABELS = {"rff": "RFF (Performer FAVOR+)", "rff_trig": "RFF (trigonometric, Thm 3.3)", "or": "OR-only E2LSH",
          "or_and_plain": "OR & AND, no coord. codes", "or_and": "OR & AND + coord. codes (HEPT)"}


def _save(fig, folder: str, name: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_approximation(st: dict, folder: str, trig_variance) -> str:
    """Three log-log panels of error vs FLOPs per head for one study (see :mod:`.approximation`)."""
    from .harness import front

    cloud, exact, results, eps0 = st["cloud"], st["exact"], st["results"], st["eps0"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    for ax, metric, title in zip(axes, ("kernel", "weights", "output"),
                                 ("kernel MSE (theorems' ε)", "attention-weight MSE", "output MSE")):
        for m in COLORS:
            pts = [r for r in results if r["method"] == m and math.isfinite(r[metric]) and r[metric] > 0]
            if not pts:
                continue
            ax.scatter([r["flops"] for r in pts], [r[metric] for r in pts], s=10, alpha=0.3, color=COLORS[m])
            fr = front(pts, m, metric)
            ax.plot([r["flops"] for r in fr], [r[metric] for r in fr], "o-", ms=3.5, color=COLORS[m], label=LABELS[m])
        ax.axhline(eps0[metric], color="grey", ls=":", lw=1.2, label="ε₀ (predict 0) ~ Θ̃(1/n)")
        ax.axvline(exact.flops, color="black", ls="--", lw=0.8, label="exact kernel FLOPs")
        if metric == "kernel":
            trig = sorted((r for r in results if r["method"] == "rff_trig"), key=lambda r: r["flops"])
            if trig:
                ax.plot([r["flops"] for r in trig], [trig_variance(exact, r["config"]["m"]) for r in trig], "--",
                        color=COLORS["rff_trig"], lw=1.5, label="Thm 3.3: (1/m)E[1+k(2Δ)−2k²] (slope −1)")
            for m, (a, c) in st["rates"].items():
                if m == "or_and_plain" or not math.isfinite(c):
                    continue
                fr = front(results, m, "kernel")
                lo, hi = fr[0]["flops"], fr[-1]["flops"]
                xs = [lo * (hi / lo) ** (i / 40) for i in range(41)]
                ys = [a * math.exp(-c * x / (cloud.n * cloud.width)) for x in xs]
                thm = "3.5" if m == "or_and" else "3.4"
                ax.plot(xs, ys, "--", color=COLORS[m], lw=1.3, label=f"Thm {thm} form a·e^(−cF/(n(d+c))), c={c:.4f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo = min((r[metric] for r in results if math.isfinite(r[metric]) and r[metric] > 0), default=1e-12)
        ax.set_ylim(max(lo / 2, eps0[metric] * 1e-6), eps0[metric] * 30)
        ax.set_xlabel("FLOPs per head (attention core)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.25)
    axes[0].set_ylabel("mean squared error")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{cloud.name}, n = {cloud.n}: error vs FLOPs (Pareto fronts; faint dots = all configurations)")
    return _save(fig, folder, f"approximation_{cloud.name}.png")


def plot_scaling(studies: list[dict], folder: str) -> str:
    """ε/ε₀ of the kernel (Pareto fronts) vs F/(n·(d+c)) for the LSH variants at each n."""
    from .harness import front

    fig, ax = plt.subplots(figsize=(7.5, 5))
    styles = ["--", "-"]
    for st, ls in zip(studies, styles[-len(studies):]):
        c, eps0 = st["cloud"], st["eps0"]["kernel"]
        for m in ("or", "or_and_plain", "or_and"):
            fr = front(st["results"], m, "kernel")
            if fr:
                ax.plot([r["flops"] / (c.n * c.width) for r in fr], [r["kernel"] / eps0 for r in fr], ls, marker="o",
                        ms=3, color=COLORS[m], label=f"{LABELS[m]}, n = {c.n}")
    ax.set_yscale("log")
    ax.set_xscale("log")
    ax.set_xlabel("F / (n·(d+c))  (FLOPs per point per coordinate)")
    ax.set_ylabel("kernel MSE / ε₀")
    ax.set_title("Thm 3.5: OR & AND curves should coincide across n;\nThm 3.4: OR-only should move right as n grows")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    return _save(fig, folder, "approximation_scaling.png")


def plot_mechanisms(results: list[dict], folder: str, tag: str, peak_gflops: float | None, title: str) -> str:
    """2×2 log-log panels vs N: forward time, forward+backward time, peak memory (forward and train),
    achieved GFLOP/s (forward) with the measured matmul peak. ``results`` rows as in :mod:`.mechanisms`."""
    names = list(dict.fromkeys(r["mechanism"] for r in results))
    cmap = plt.get_cmap("tab10")
    color = {m: cmap(i) if i < 10 else "black" for i, m in enumerate(names)}
    marker = {m: "os^vD<>phX*"[i % 11] for i, m in enumerate(names)}
    ok = lambda r: "error" not in r and "skipped" not in r and r.get("seconds")
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    panels = [(axes[0, 0], "forward", "seconds", "forward time (s)"),
              (axes[0, 1], "train", "seconds", "forward + backward time (s)"),
              (axes[1, 0], None, "peak_mb", "peak memory above inputs (MB); solid forward, dashed train"),
              (axes[1, 1], "forward", "gflops", "achieved GFLOP/s (forward, analytic FLOPs)")]
    for ax, mode, key, label in panels:
        for m in names:
            for md, ls in ((("forward", "-"), ("train", "--")) if mode is None else ((mode, "-"),)):
                pts = sorted((r for r in results if r["mechanism"] == m and r["mode"] == md and ok(r)
                              and r.get(key) and r[key] > 0), key=lambda r: r["n"])
                if pts:
                    ax.plot([r["n"] for r in pts], [r[key] for r in pts], ls, marker=marker[m], ms=4, color=color[m],
                            label=m if ls == "-" else None)
        if key == "seconds":
            pts = [r for r in results if r["mode"] == mode and ok(r)]
            if pts:
                n0 = min(r["n"] for r in pts)
                t0 = min(r["seconds"] for r in pts if r["n"] == n0)
                ns = sorted({r["n"] for r in pts})
                ax.plot(ns, [t0 * n / n0 for n in ns], ":", color="black", lw=1, label="∝ N")
                ax.plot(ns, [t0 * (n / n0) ** 2 for n in ns], "-.", color="black", lw=1, label="∝ N²")
        if key == "gflops" and peak_gflops:
            ax.axhline(peak_gflops, color="red", ls="--", lw=1.2, label=f"matmul peak {peak_gflops:.0f}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N points")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.25)
    axes[0, 0].legend(fontsize=7, ncol=2)
    axes[1, 1].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    return _save(fig, folder, f"mechanisms_{tag}.png")


def plot_roofline(points: list[dict], folder: str, tag: str, peak_gflops: float, title: str) -> str:
    """Time vs FLOPs per measurement with the peak line t = F / peak (and 4× it)."""
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for p in points:
        ax.scatter(p["flops"], p["seconds"], s=18)
        ax.annotate(p["label"], (p["flops"], p["seconds"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if points:
        lo = min(p["flops"] for p in points) / 2
        hi = max(p["flops"] for p in points) * 2
        ax.plot([lo, hi], [lo / peak_gflops / 1e9, hi / peak_gflops / 1e9], "r--", label="F / matmul peak")
        ax.plot([lo, hi], [4 * lo / peak_gflops / 1e9, 4 * hi / peak_gflops / 1e9], "r:", label="4 × F / peak")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("analytic FLOPs")
    ax.set_ylabel("measured seconds")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return _save(fig, folder, f"roofline_{tag}.png")

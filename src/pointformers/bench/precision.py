"""Mixed-precision error of every mechanism against float32: bf16 autocast and float16 modules.

One layer per mechanism (width 64, 4 heads, the registry's benchmark options), eval mode, on
uniform points in the unit cube (two clouds of 1,000 and 700 points, the second padded): the
largest and the mean absolute difference of the output from the float32 output, relative to the
float32 output's largest magnitude, at real points. bf16: ``torch.autocast("cpu", bfloat16)``
with float32 inputs; fp16: the module and its inputs in float16.

Usage: ``python -m pointformers.bench.precision [--write docs/benchmarks.md]``.
"""
from __future__ import annotations

import argparse
import sys

import torch

from .harness import machine, recorded_command, write_section

DIM, HEADS, SIZES = 64, 4, (1000, 700)


def errors(name: str, seed: int = 0) -> dict:
    """{"bf16": (max, mean), "fp16": (max, mean)} relative errors of mechanism ``name`` (see module doc)."""
    from ..attention import build, info

    torch.manual_seed(seed)
    attn = build(name, dim=DIM, heads=HEADS, **dict(info(name).bench)).eval()
    g = torch.Generator().manual_seed(seed)
    n = max(SIZES)
    x, pos = torch.randn(len(SIZES), n, DIM, generator=g), torch.rand(len(SIZES), n, 3, generator=g)
    mask = torch.arange(n)[None, :] < torch.tensor(SIZES)[:, None]
    with torch.no_grad():
        ref = attn(x, pos, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = attn(x, pos, mask).float()
        fp16 = attn.half()(x.half(), pos.half(), mask).float()
    scale = ref[mask].abs().max()
    out = {}
    for key, y in (("bf16", bf16), ("fp16", fp16)):
        d = (y - ref)[mask].abs()
        out[key] = (float(d.max() / scale), float(d.mean() / scale)) if bool(torch.isfinite(y[mask]).all()) \
            else (float("nan"), float("nan"))
    return out


def report(rows: dict) -> str:
    lines = [f"Machine: {machine()}. One layer (width {DIM}, {HEADS} heads, the registry's benchmark options), "
             f"eval, clouds of {SIZES[0]} and {SIZES[1]} points; error = |y − y_fp32| / max|y_fp32| at real points. "
             "`kernel`, `hept` and `lsh_or` compute their scores in float32 in both modes (their logits are "
             "differences of large terms), so their error is the projections' rounding only. A large *max* with a "
             "small *mean* (float16: `hept`, `lsh_or`, `knn`) is a discrete decision that rounding moved — a point "
             "sorted into another block or a different k-th neighbour — not an error of the arithmetic.", "",
             "| Mechanism | bf16 autocast max | bf16 mean | float16 max | float16 mean |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| `{name}` | {r['bf16'][0]:.2e} | {r['bf16'][1]:.2e} | {r['fp16'][0]:.2e} | {r['fp16'][1]:.2e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    from ..attention import available

    p = argparse.ArgumentParser(prog="python -m pointformers.bench.precision", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", default=None, help="write the table into this markdown file (section 'precision')")
    a = p.parse_args(argv)
    text = report({name: errors(name) for name in available()})
    print(text)
    if a.write:
        write_section(a.write, "precision", text,
                      recorded_command("pointformers.bench.precision", sys.argv[1:] if argv is None else argv))
    return text


if __name__ == "__main__":  # pragma: no cover
    main()

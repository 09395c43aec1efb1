"""``pointformers export``: write a trained model as ONNX or ``torch.export`` for deployment.

    pointformers export --checkpoint RUN/best.pt --format onnx [--out RUN/best.onnx]
                        [--dtype float32|float64] [--opset N] [--check [N]] [--check-min-agree F]

``--checkpoint`` takes a training checkpoint (``best.pt`` / ``last.pt``) or an authors' HEPT
``state_dict`` (e.g. ``hept-tracking-60k.pt``). ``--check`` runs the exported file and the
PyTorch model on one generated event (tracking models) or random points and prints how many
points agree; it exits 1 when fewer than ``--check-min-agree`` of them do (:func:`check_failure`).
Wiring into the main command: ``add_export_parser(subparsers)`` registers the
``export`` subcommand; :func:`run` is its handler (``args.func``), returning 0 and raising
ValueError with a one-line message on a bad argument or an unsupported mechanism.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["add_export_parser", "add_arguments", "run", "main", "check_export", "check_failure", "CHECK_MIN_AGREE"]

_SUFFIX = {"onnx": ".onnx", "torch.export": ".pt2"}

#: ``--check``'s pass rule per dtype: (agreement key of :func:`check_export`, minimum fraction of points).
#: float64 graphs agree with PyTorch to ~1e-9; in float32 HEPT's sort resolves near-ties differently
#: under any change of rounding (the authors' checkpoint: ~99 % of points to 1e-1), so judge loosely.
CHECK_MIN_AGREE = {"float64": ("agree_1e-5", 0.999), "float32": ("agree_1e-1", 0.95)}


def check_failure(result: dict, dtype: str, min_agree: float | None = None) -> str | None:
    """Why ``--check``'s ``result`` (from :func:`check_export`) fails for ``dtype``, or None if it passes.

    ``min_agree`` overrides the default minimum fraction of :data:`CHECK_MIN_AGREE`.
    """
    key, default = CHECK_MIN_AGREE[dtype]
    need = default if min_agree is None else min_agree
    got = result[key]
    if not got >= need:  # also fails on NaN
        return (f"check failed: {100 * got:.2f}% of points agree with PyTorch to {key.split('_')[1]} "
                f"(relative), below the required {100 * need:.2f}% ({dtype})")
    return None


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``export`` options to ``p`` (a subparser or a standalone parser) and set ``func``."""
    p.add_argument("--checkpoint", required=True,
                   help="training checkpoint (RUN/best.pt), an authors' HEPT state_dict (.pt), or the shipped "
                        "'hept-tracking-60k' (needs --out)")
    p.add_argument("--format", default="onnx", choices=("onnx", "torch.export"),
                   help="onnx (run with onnxruntime) or torch.export (.pt2) (default: onnx)")
    p.add_argument("--out", default=None, help="output file (default: the checkpoint's path with .onnx / .pt2)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="weights, inputs and output dtype (default: float32)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument("--group-chunk", type=int, default=None,
                   help="HEPT: heads per block-attention chunk (memory/speed knob; default: all heads "
                        "for onnx, 1 for torch.export)")
    p.add_argument("--check", nargs="?", type=int, const=6000, default=None, metavar="N",
                   help="after exporting, compare the file with PyTorch on N points (default 6000)")
    p.add_argument("--check-min-agree", type=float, default=None, metavar="FRACTION",
                   help="--check fails (exit 1) when fewer points than this agree: to 1e-5 in float64 "
                        f"(default {CHECK_MIN_AGREE['float64'][1]}), to 1e-1 in float32 "
                        f"(default {CHECK_MIN_AGREE['float32'][1]})")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch/onnxruntime")
    p.set_defaults(func=run)
    return p


def add_export_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Register the ``export`` subcommand on ``subparsers`` (from ``parser.add_subparsers()``).

    Returns the new subparser; its ``func`` default is :func:`run` (call ``args.func(args)``).
    """
    p = subparsers.add_parser("export", help="export a trained model to ONNX or torch.export for inference",
                              description="Export a trained model (ONNX or torch.export) for inference on one "
                                          "event of any size.")
    return add_arguments(p)


def check_inputs(model, n: int, seed: int = 0):
    """(x (n, F), coords (n, c)) float64: a generated tracking event when the model takes tracking
    inputs (15 features, 6 coordinates), otherwise random points."""
    import torch

    if (model.in_dim, model.coord_dim) == (15, 6):
        from ..tasks.tracking.core import generated_inputs

        x, c = generated_inputs(n, seed)
        return x.double(), c.double()
    from .onnx_export import example_inputs

    return example_inputs(model, n, torch.float64, seed)


def check_export(path: str | Path, model, n: int = 6000, threads: int | None = None) -> dict:
    """Run the exported file and ``model`` on the same ``n`` points.

    Returns ``{"n", "max_abs", "agree_1e-5", "agree_1e-3", "agree_1e-1", "seconds"}``: the fraction of points
    whose embedding agrees to a relative L2 tolerance (HEPT's sort makes its output
    discontinuous; in float32 judge by this fraction, see README.md, "Using the authors' checkpoint").
    """
    import torch

    from .runtime import load_exported

    run = load_exported(path, threads)
    dtype = torch.float64 if run.np_dtype == "float64" else torch.float32
    x, c = check_inputs(model, n)
    x, c = x.to(dtype), c.to(dtype)
    with torch.no_grad():
        ref = model.to(dtype).eval()(x, c)
    t0 = time.perf_counter()
    out = run(x, c)
    seconds = time.perf_counter() - t0
    rel = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    return {"n": n, "max_abs": float((out - ref).abs().max()), "agree_1e-5": float((rel <= 1e-5).double().mean()),
            "agree_1e-3": float((rel <= 1e-3).double().mean()), "agree_1e-1": float((rel <= 1e-1).double().mean()),
            "seconds": seconds}


def run(args: argparse.Namespace) -> int:
    """Handler of ``pointformers export``. Errors are ValueErrors with a one-line message."""
    import torch

    from .onnx_export import export_model, load_model

    from ..models.hept_tracking import REFERENCE_CHECKPOINTS, reference_checkpoint_path

    shipped = args.checkpoint in REFERENCE_CHECKPOINTS
    src = reference_checkpoint_path(args.checkpoint) if shipped else Path(args.checkpoint)
    if shipped and not args.out:
        raise ValueError(f"--out: needed with the shipped checkpoint {args.checkpoint!r} (the package folder is not for outputs)")
    out = Path(args.out) if args.out else src.with_suffix(_SUFFIX[args.format])
    if out.resolve() == src.resolve():
        raise ValueError(f"--out: would overwrite the checkpoint {str(src)!r}")
    min_agree = getattr(args, "check_min_agree", None)
    if min_agree is not None and not 0.0 <= min_agree <= 1.0:
        raise ValueError(f"--check-min-agree: expected a fraction in [0, 1], got {min_agree}")
    if args.check is not None and args.check < 2:
        raise ValueError(f"--check: needs at least 2 points, got {args.check}")
    if args.group_chunk is not None and args.group_chunk < 1:
        raise ValueError(f"--group-chunk: must be >= 1, got {args.group_chunk}")
    if getattr(args, "threads", None) is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    model = load_model(src, dtype)
    t0 = time.perf_counter()
    try:
        export_model(model, out, format=args.format, dtype=dtype, opset=args.opset,
                     group_chunk=args.group_chunk or "auto")
    except ImportError as exc:  # missing optional extra: a usage error, not a crash
        raise ValueError(str(exc)) from exc
    from .runtime import read_metadata

    meta = read_metadata(out)
    print(f"wrote {out} ({args.format}, {meta['dtype']}, mechanism {meta['mechanism']}, "
          f"{meta['n_layers']} layers, inputs x (N, {meta['in_dim']}) and coords (N, {meta['coord_dim']}), "
          f"N >= {meta['min_points']}{', opset ' + str(meta['opset']) if meta.get('opset') else ''}) "
          f"in {time.perf_counter() - t0:.1f} s")
    if args.check:
        r = check_export(out, model, args.check, getattr(args, "threads", None))
        print(f"check on {r['n']} points: {100 * r['agree_1e-5']:.2f}% of embeddings agree with PyTorch to 1e-5 "
              f"(relative), {100 * r['agree_1e-3']:.2f}% to 1e-3, {100 * r['agree_1e-1']:.2f}% to 1e-1; "
              f"max |diff| {r['max_abs']:.3g}; "
              f"exported run {r['seconds']:.2f} s")
        if meta["dtype"] == "float32" and r["agree_1e-5"] < 0.99:
            print("note: in float32 a model whose attention sorts points (HEPT) or whose logits are differences of "
                  "large terms differs at near-ties under any change of rounding, as float32 and float64 PyTorch do; "
                  "export with --dtype float64 to check the graph itself (it should agree to ~1e-9)")
        failure = check_failure(r, meta["dtype"], getattr(args, "check_min_agree", None))
        if failure:
            print(f"pointformers export: {failure}", file=sys.stderr)
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m pointformers.export.cli``). Returns 0, or 2 on a bad argument."""
    parser = add_arguments(argparse.ArgumentParser(prog="pointformers export",
                                                   description="Export a trained model (ONNX or torch.export)."))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"pointformers export: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

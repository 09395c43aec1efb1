"""Export your own model with a pointformers mechanism to ONNX, then run it without PyTorch.

    python examples/export_onnx_cpp/export_and_run.py     # needs the `export` extra

1. ``MyPointModel`` below is a user's model (not one of the package's): an MLP embedding, one
   residual HEPT attention layer (:func:`pointformers.attention.build`) and a linear head.
2. :func:`pointformers.export.export_model` writes it to ONNX with a dynamic point count.
3. ``run_onnx.py`` runs the file in a separate process that imports only numpy and onnxruntime
   (it asserts that torch was never imported) on a cloud of another size than the one traced.
4. The outputs are compared with the PyTorch model's.
5. ``main.cpp`` does step 3 with the onnxruntime C++ API. It is built (CMake) and run here too
   when ONNX Runtime's C/C++ headers are found: set ``ONNXRUNTIME_ROOT`` to an unpacked release
   (``include/`` and ``lib/``), or ``ONNXRUNTIME_INCLUDE_DIR`` to the headers' folder (the
   library then defaults to the one in the ``onnxruntime`` wheel). No Python package ships the
   headers, so without them this step is skipped and says so; see README.md beside this file.

About 15 s on one CPU thread, deterministic; exits with status 1 if an output disagrees.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

import pointformers
from pointformers.export import export_model, read_metadata

HERE = Path(__file__).resolve().parent


class MyPointModel(nn.Module):
    """A user's model: per-point features x and coordinates in, an embedding per point out.

    What export needs from a model (:func:`pointformers.export.check_exportable`): ``forward(x,
    coords)`` on batches, x (B, N, in_dim) and coords (B, N, coord_dim) -> (B, N, ...); the
    attribute ``export_inputs = ("x", "coords")``; and ``in_dim`` / ``coord_dim`` (recorded in
    the file's metadata). ``attention`` (optional) names the mechanism in the metadata.
    """

    export_inputs = ("x", "coords")

    def __init__(self, in_dim: int = 3, coord_dim: int = 2, dim: int = 32, heads: int = 4, out_dim: int = 8):
        super().__init__()
        self.in_dim, self.coord_dim, self.attention = in_dim, coord_dim, "hept"
        self.embed = nn.Sequential(nn.Linear(in_dim + coord_dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.norm = nn.LayerNorm(dim)
        # HEPT: LSH blocks of 32 points; its regions hash the first two coordinates (η, φ).
        self.attn = pointformers.attention.build("hept", dim=dim, heads=heads, coord_dim=coord_dim,
                                                 block_size=32, num_regions=8)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, out_dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(torch.cat([x, coords], -1))
        h = h + self.attn(self.norm(h), pos=coords, mask=mask)
        return self.head(h)


def point_cloud(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x (n, 3) features and coords (n, 2) = (η in [-4, 4], φ in [-π, π]), float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    coords = np.stack([rng.uniform(-4, 4, n), rng.uniform(-np.pi, np.pi, n)], 1)
    return x.astype(np.float32), coords.astype(np.float32)


def agreement(out: np.ndarray, ref: np.ndarray) -> float:
    """Fraction of points whose whole output row matches PyTorch's to float32 rounding."""
    return float(np.isclose(out, ref, rtol=1e-4, atol=1e-5).all(axis=1).mean())


def onnxruntime_headers() -> tuple[str, str] | None:
    """(include folder, library) of ONNX Runtime's C/C++ API, or None if the headers are not found."""
    root = os.environ.get("ONNXRUNTIME_ROOT")
    include = os.environ.get("ONNXRUNTIME_INCLUDE_DIR") or (root and os.path.join(root, "include"))
    if not include or not os.path.isfile(os.path.join(include, "onnxruntime_cxx_api.h")):
        return None
    libs = glob.glob(os.path.join(root, "lib", "libonnxruntime.so*")) if root else []
    if not libs:  # the library inside the onnxruntime wheel
        ort = importlib.util.find_spec("onnxruntime")
        libs = glob.glob(os.path.join(os.path.dirname(ort.origin), "capi", "libonnxruntime.so*")) if ort else []
    return (include, sorted(libs)[0]) if libs else None


def run_cpp(model_path: Path, x: np.ndarray, coords: np.ndarray, tmp: Path) -> np.ndarray | None:
    """Build main.cpp with CMake and run it on (x, coords); None (with the reason) if it cannot be built."""
    found = onnxruntime_headers()
    if found is None or shutil.which("cmake") is None or shutil.which("c++") is None:
        print("C++: skipped (needs cmake, a C++17 compiler and ONNX Runtime's headers: set ONNXRUNTIME_ROOT "
              "to an unpacked release; see examples/export_onnx_cpp/README.md)")
        return None
    include, library = found
    build = tmp / "build"
    quiet = dict(check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "-S", str(HERE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    f"-DONNXRUNTIME_INCLUDE_DIR={include}", f"-DONNXRUNTIME_LIBRARY={library}"], **quiet)
    subprocess.run(["cmake", "--build", str(build)], **quiet)
    x.tofile(tmp / "x.f32")
    coords.tofile(tmp / "coords.f32")
    subprocess.run([str(build / "pointformers_infer"), str(model_path), str(tmp / "x.f32"), str(tmp / "coords.f32"),
                    str(tmp / "out_cpp.f32")], check=True)
    return np.fromfile(tmp / "out_cpp.f32", dtype=np.float32).reshape(x.shape[0], -1)


def main() -> int:
    torch.set_num_threads(1)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the exporter's notices about torchvision ops
    torch.manual_seed(0)
    model = MyPointModel().eval()  # (train it first in real use; export_model also takes a checkpoint)

    with tempfile.TemporaryDirectory(prefix="pointformers-onnx-") as tmp_name:
        tmp = Path(tmp_name)
        # Export: float32, dynamic point count (traced on a random cloud of ~1,000 points).
        model_path = export_model(model, tmp / "my_model.onnx")
        meta = read_metadata(model_path)
        print(f"exported {model_path.name}: {meta['mechanism']} ({meta['mixer']}), {meta['dtype']}, inputs "
              f"{meta['inputs']}, at least {meta['min_points']} points, {model_path.stat().st_size / 1e3:.0f} kB")

        # A cloud of another size, and PyTorch's output for it.
        x, coords = point_cloud(700)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)[None], torch.from_numpy(coords)[None])[0].numpy()

        # onnxruntime in a separate process that never imports torch.
        np.savez(tmp / "inputs.npz", x=x, coords=coords)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, str(HERE / "run_onnx.py"), str(model_path), str(tmp / "inputs.npz"),
                        str(tmp / "out.npy")], check=True, env=env)
        out = np.load(tmp / "out.npy")

        # HEPT sorts points into blocks, so a near-tie in a sort key can put one point in another
        # block in float32 (the package's docs: compare exported float32 models point by point);
        # on this cloud every point agrees.
        results = {"python onnxruntime": out}
        cpp = run_cpp(model_path, x, coords, tmp)
        if cpp is not None:
            results["C++ onnxruntime"] = cpp
        failed = False
        for name, got in results.items():
            share = agreement(got, ref) if got.shape == ref.shape else 0.0
            print(f"{name} vs PyTorch: shape {got.shape}, {100 * share:.1f} % of points agree, "
                  f"max |difference| {np.abs(got - ref).max() if got.shape == ref.shape else float('nan'):.2e}")
            failed |= share < 0.99
    if failed:
        print("FAILED: the exported model's output differs from PyTorch's")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

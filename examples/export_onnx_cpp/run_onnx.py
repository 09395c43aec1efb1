"""Run an exported pointformers ONNX file with numpy and onnxruntime only: no torch, no pointformers.

    python run_onnx.py MODEL.onnx INPUTS.npz OUTPUT.npy

INPUTS.npz holds ``x`` (N, F) and ``coords`` (N, c) of one point cloud in the file's dtype; the
output (N, out_dim) is saved to OUTPUT.npy. This is all a deployment needs besides the .onnx
file: ``pip install onnxruntime numpy``. ``export_and_run.py`` beside it calls this script in a
separate process and compares the result with PyTorch's; ``main.cpp`` is the same in C++.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import onnxruntime as ort


def main(model_path: str, inputs_path: str, output_path: str) -> int:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1                       # deterministic and gentle on shared machines
    options.log_severity_level = 3                         # errors only (no constant-folding notices)
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])

    # export_model stores its metadata as JSON under the key "pointformers": the mechanism, the
    # dtype, the input widths and the smallest point count the graph accepts.
    meta = json.loads(session.get_modelmeta().custom_metadata_map["pointformers"])
    inputs = np.load(inputs_path)
    feeds = {"x": inputs["x"], "coords": inputs["coords"]}  # the graph's input names
    n = feeds["x"].shape[0]
    assert n >= meta["min_points"], f"the graph needs at least {meta['min_points']} points, got {n}"

    output_name = session.get_outputs()[0].name            # one output, (N, out_dim)
    (out,) = session.run([output_name], feeds)
    np.save(output_path, out)
    print(f"onnxruntime {ort.__version__}: {meta['mechanism']} model, {n} points -> {output_name} {out.shape}")

    # The point of this script: the exported file runs without PyTorch.
    assert sys.modules.get("torch") is None and sys.modules.get("pointformers") is None, "torch was imported"
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))

"""examples/export_onnx_cpp: an exported user's model runs in a process where torch cannot be imported.

`make examples` (a step of .ci/run) runs every example script whole; this test pins the claim of
the C++ example's fallback: the ONNX file needs only numpy and onnxruntime.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "export_onnx_cpp"

# run_onnx.py with torch (and pointformers) made unimportable: `import torch` raises ImportError
NO_TORCH = ("import runpy, sys; sys.modules['torch'] = sys.modules['pointformers'] = None; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def _example_module():
    spec = importlib.util.spec_from_file_location("export_and_run", EXAMPLE / "export_and_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exported_user_model_runs_without_torch(tmp_path):
    from pointformers.export import export_model

    example = _example_module()
    torch.manual_seed(0)
    model = example.MyPointModel().eval()
    path = export_model(model, tmp_path / "m.onnx")
    x, coords = example.point_cloud(301, seed=1)
    np.savez(tmp_path / "in.npz", x=x, coords=coords)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, str(EXAMPLE / "run_onnx.py"), str(path),
                           str(tmp_path / "in.npz"), str(tmp_path / "out.npy")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "hept model, 301 points" in proc.stdout
    with torch.no_grad():
        ref = model(torch.from_numpy(x)[None], torch.from_numpy(coords)[None])[0].numpy()
    assert example.agreement(np.load(tmp_path / "out.npy"), ref) >= 0.99

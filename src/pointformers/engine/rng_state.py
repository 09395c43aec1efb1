"""Capture and restore every global random-number generator a training step may use.

Exact resume needs the torch CPU generator (dropout, ``torch.rand`` without a generator),
the CUDA generators, numpy's legacy global generator (``np.random.*``) and Python's
``random``. Checkpoints are loaded with ``torch.load(weights_only=True)``, which refuses
numpy arrays, so the states are stored as tensors, ints, floats and lists only.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The current states of the torch (CPU and CUDA), numpy and Python global generators."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(py_version), "state": [int(v) for v in py_state], "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (parts missing from ``state`` are left as they are).

    Raises:
        ValueError if a part has the wrong form.
    """
    try:
        if "torch" in state:
            torch.set_rng_state(state["torch"].cpu() if isinstance(state["torch"], torch.Tensor) else state["torch"])
        if "numpy" in state:
            n = state["numpy"]
            keys = n["keys"].numpy() if isinstance(n["keys"], torch.Tensor) else np.asarray(n["keys"])
            np.random.set_state((n["kind"], keys.astype(np.uint32), int(n["pos"]), int(n["has_gauss"]),
                                 float(n["gauss"])))
        if "python" in state:
            p = state["python"]
            random.setstate((int(p["version"]), tuple(int(v) for v in p["state"]), p["gauss"]))
        if "cuda" in state and torch.cuda.is_available():
            saved = list(state["cuda"])
            if len(saved) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(saved)
    except (KeyError, TypeError, RuntimeError) as exc:
        raise ValueError(f"rng state: malformed entry in the checkpoint ({type(exc).__name__}: {exc})") from None

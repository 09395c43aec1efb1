"""HEPT for charged-particle tracking, and loading the authors' trained checkpoints."""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import torch

from .point_encoder import PointTransformerJK
from .registry import register_model

#: The configuration of the HEPT authors' tracking models (their published Tracking-60k checkpoint and
#: configs; HEPT paper, App. C.1).
TRACKING_DEFAULTS = dict(in_dim=15, coord_dim=6, dim=24, heads=8, head_dim=24, n_layers=4, out_dim=12,
                         mlp_hidden=256, mlp_layers=5, block_size=100, n_hashes=3, num_regions=150)


@register_model("hept-tracking", export=None)
def hept_tracking(**options) -> PointTransformerJK:
    """The paper's tracking model (0.33M parameters); any option of :class:`PointTransformerJK` overrides."""
    return PointTransformerJK(**{**TRACKING_DEFAULTS, **options})


@register_model("tracking-encoder", export=None)
def tracking_encoder(attention: str = "hept", **options) -> PointTransformerJK:
    """The tracking skeleton around any attention mechanism (HEPT's baselines share it)."""
    return PointTransformerJK(**{**TRACKING_DEFAULTS, "attention": attention, **options})


def _omega_from_w_rpe(w: torch.Tensor, heads: int, head_dim: int, num_w_per_dist: int) -> torch.Tensor:
    """The authors' ω: reshape (h·d, r·k) -> (h, d, r, k), Σ_d, clamp 50, exp, Σ_k -> (h, r); returns log ω."""
    w = w.double().reshape(heads, head_dim, -1, num_w_per_dist)
    return w.sum(1).clamp_max(50.0).exp().sum(-1).log()


def convert_reference_state_dict(ref: "OrderedDict[str, torch.Tensor]", n_layers: int = 4, heads: int = 8,
                                 head_dim: int = 24, num_w_per_dist: int = 10) -> "OrderedDict[str, torch.Tensor]":
    """Map the HEPT authors' checkpoint keys (their code's module names) onto :class:`PointTransformerJK`'s.

    Raises ValueError listing missing or unexpected keys. The unused ``w_rpe.bias`` is dropped
    after its presence is checked; ``w_rpe.weight`` becomes ``log_omega`` = log ω′ exactly.
    """
    expected = {"regions", "W.weight"}
    expected |= {f"feat_encoder.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
    for i in range(n_layers):
        a = f"attns.{i}."
        expected |= {a + s for s in ("w_q.weight", "w_k.weight", "w_v.weight", "attn.out_linear.weight",
                                     "attn.out_linear.bias", "attn.e2lsh.alpha", "w_rpe.weight", "w_rpe.bias",
                                     "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                                     "ff.0.weight", "ff.0.bias", "ff.2.weight", "ff.2.bias")}
    mlp_keys = {k for k in ref if k.startswith("mlp_out.")}
    missing = sorted(expected - set(ref))
    unexpected = sorted(set(ref) - expected - mlp_keys)
    if missing or unexpected or not mlp_keys:
        raise ValueError(f"not a HEPT tracking checkpoint with {n_layers} layers: missing keys {missing[:8]}"
                         f"{' (mlp_out.*)' if not mlp_keys else ''}, unexpected keys {unexpected[:8]}")
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    out["shared.regions"] = ref["regions"]
    for k in ("feat_encoder.0.weight", "feat_encoder.0.bias", "feat_encoder.2.weight", "feat_encoder.2.bias",
              "W.weight"):
        out[k] = ref[k]
    for i in range(n_layers):
        a, b = f"attns.{i}.", f"blocks.{i}."
        for s in ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "ff.0.weight", "ff.0.bias",
                  "ff.2.weight", "ff.2.bias"):
            out[b + s] = ref[a + s]
        for s in ("w_q.weight", "w_k.weight", "w_v.weight"):
            out[b + "mixer." + s] = ref[a + s]
        out[b + "mixer.out_linear.weight"] = ref[a + "attn.out_linear.weight"]
        out[b + "mixer.out_linear.bias"] = ref[a + "attn.out_linear.bias"]
        out[b + "mixer.alpha"] = ref[a + "attn.e2lsh.alpha"]
        w = ref[a + "w_rpe.weight"]
        if w.shape[0] != heads * head_dim or w.shape[1] % num_w_per_dist:
            raise ValueError(f"{a}w_rpe.weight has shape {tuple(w.shape)}, expected ({heads * head_dim}, "
                             f"{num_w_per_dist}·(c−1))")
        out[b + "mixer.log_omega"] = _omega_from_w_rpe(w, heads, head_dim, num_w_per_dist).to(w.dtype)
    for k in sorted(mlp_keys):
        out[k] = ref[k]
    return out


#: Weights shipped inside the package (``models/weights/``, with their licence and source).
REFERENCE_CHECKPOINTS = {"hept-tracking-60k": "hept-tracking-60k.pt"}

#: sha256 of each shipped file: the authors' state_dict format carries no hash of its own, so a
#: damaged installation is caught by this fixed one.
REFERENCE_SHA256 = {"hept-tracking-60k": "d72e734bdc7f234dd9906cc9d8ec82824181e8894026a608225e2ea0fa0a8d22"}


def _verify_shipped(name: str, path: Path) -> None:
    import hashlib

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != REFERENCE_SHA256[name]:
        raise ValueError(f"{path!s}: the shipped checkpoint {name!r} is damaged (sha256 {digest[:16]}…, expected "
                         f"{REFERENCE_SHA256[name][:16]}…); reinstall the package")


def reference_checkpoint_path(name_or_path: str | os.PathLike) -> Path:
    """The file of a shipped checkpoint name (:data:`REFERENCE_CHECKPOINTS`), or ``name_or_path``
    itself when it is an existing file. Raises ValueError naming both choices otherwise."""
    if isinstance(name_or_path, str) and name_or_path in REFERENCE_CHECKPOINTS:
        return Path(__file__).parent / "weights" / REFERENCE_CHECKPOINTS[name_or_path]
    p = Path(name_or_path)
    if not p.is_file():
        raise ValueError(f"path: no checkpoint file at {p!s}, and not the name of a shipped checkpoint "
                         f"({', '.join(sorted(REFERENCE_CHECKPOINTS))})")
    return p


def is_reference_state_dict(obj: object) -> bool:
    """True for a loaded authors' HEPT ``state_dict`` (keys ``regions`` and ``feat_encoder.0.weight``)."""
    return isinstance(obj, dict) and "regions" in obj and "feat_encoder.0.weight" in obj


def is_reference_checkpoint(name_or_path: str | os.PathLike) -> bool:
    """True for a shipped checkpoint name or a file holding an authors' HEPT ``state_dict``."""
    if isinstance(name_or_path, str) and name_or_path in REFERENCE_CHECKPOINTS:
        return True
    try:
        sd = torch.load(reference_checkpoint_path(name_or_path), map_location="cpu", weights_only=True)
    except Exception:
        return False
    return is_reference_state_dict(sd)


def from_reference_checkpoint(path: str | os.PathLike = "hept-tracking-60k", dtype: torch.dtype = torch.float32,
                              **options) -> PointTransformerJK:
    """Load an authors' HEPT tracking ``state_dict`` strictly, in the authors' forward semantics.

    ``path``: a shipped checkpoint's name (``"hept-tracking-60k"``, the authors' published
    Tracking-60k model, see ``models/weights/README.md``) or a file saved by their code.
    The architecture is inferred from the file (input features, coordinates, heads, layers,
    head width, tables); ``options`` override the rest (e.g. ``block_size``). Every key and
    shape must match: a missing/unexpected key or a shape mismatch raises ValueError.
    ``dtype``: the model's dtype; the conversion (ω from ``w_rpe``) and the region arithmetic
    run in it, so a float64 model reproduces the authors' float64 computation.
    The model pads clouds by duplicating points (``padding="duplicate"``), as the authors'
    code does, so that its output equals theirs at any number of points; pass
    ``padding="mask"`` for this project's masked padding.
    """
    name = path if isinstance(path, str) and path in REFERENCE_CHECKPOINTS else None
    path = reference_checkpoint_path(path)
    if not Path(path).is_file():
        raise ValueError(f"{path!s}: no such file (expected an authors' HEPT state_dict)")
    if name is not None:
        _verify_shipped(name, Path(path))
    try:
        ref = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated zip, EOF, pickle refusals: all name the file
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"{path!s}: cannot be read (truncated or corrupted?): {type(exc).__name__}: {first}") from None
    if not is_reference_state_dict(ref):
        raise ValueError(f"{path!s}: not an authors' HEPT state_dict (expected keys 'regions', 'feat_encoder.0.weight')")
    n_hashes, _, heads = ref["regions"].shape
    dim, in_dim = ref["feat_encoder.0.weight"].shape
    n_layers = len({k.split(".")[1] for k in ref if k.startswith("attns.")})
    head_dim = ref["attns.0.w_q.weight"].shape[0] // heads
    coord_dim = ref["attns.0.attn.e2lsh.alpha"].shape[1] - head_dim
    num_w = options.pop("num_w_per_dist", 10)
    out_dim = ref["W.weight"].shape[0]
    mlp_hidden = ref["mlp_out.lins.0.weight"].shape[0]
    mlp_layers = len({k.split(".")[2] for k in ref if k.startswith("mlp_out.lins.")})
    cfg = dict(in_dim=in_dim, coord_dim=coord_dim, dim=dim, heads=heads, head_dim=head_dim, n_layers=n_layers,
               out_dim=out_dim, mlp_hidden=mlp_hidden, mlp_layers=mlp_layers, n_hashes=n_hashes,
               # G only seeds the random region counts, which the file overrides
               num_regions=float(ref["regions"][:, 0].mul(ref["regions"][:, 1]).mean()),
               padding="duplicate")
    cfg.update(options)
    model = PointTransformerJK(**cfg).to(dtype)
    ref = OrderedDict((k, v.to(dtype) if k != "regions" else v) for k, v in ref.items())
    sd = convert_reference_state_dict(ref, n_layers, heads, head_dim, num_w)
    own = model.state_dict()
    bad = [f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}" for k, v in sd.items()
           if k in own and own[k].shape != v.shape]
    if bad:
        raise ValueError(f"{path!s}: shape mismatch: {'; '.join(bad[:5])}")
    model.load_state_dict(sd, strict=True)
    return model.eval()

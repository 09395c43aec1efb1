"""The authors' trained HEPT tracking checkpoint: strict loading, the reference forward
semantics (shared/reference/README.md) and a pinned output on a fixed generated event."""
import json
import os
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

import pointformers
from pointformers.data.tracking import GENERATOR_VERSION, generate_event, preset_params
from pointformers.models import convert_reference_state_dict, from_reference_checkpoint
from pointformers.tasks.tracking import tracking_inputs
from reference_hept import reference_forward

HERE = Path(__file__).parent
CKPT = Path(os.environ.get("POINTFORMERS_REFERENCE",
                           HERE.parent.parent / "shared" / "reference" / "hept-tracking-60k.pt"))
PIN = HERE / "data" / "hept_reference_pin.json"
pytestmark = pytest.mark.skipif(not CKPT.is_file(), reason=f"reference checkpoint not found at {CKPT} "
                                "(set POINTFORMERS_REFERENCE)")


def pin_event():
    """The fixed generated event: μ = 21 pile-up, seed 7, its first 6000 hits (6000 = 60 blocks)."""
    ev = generate_event(preset_params("tracking-60k", mu=21), seed=7)
    inp = tracking_inputs(ev, dtype=torch.float64)
    return inp.x[:6000], inp.coords[:6000]


def pin_numbers(emb: torch.Tensor) -> dict:
    return {"mean": emb.mean(0).tolist(), "std": emb.std(0).tolist(),
            "rows": emb[[0, 1234, 2999, 4567, 5999]].tolist()}


@pytest.fixture(scope="module")
def ref_sd():
    return torch.load(CKPT, map_location="cpu", weights_only=True)


def test_strict_load_and_parameter_count(ref_sd):
    model = from_reference_checkpoint(CKPT)
    assert sum(v.numel() for v in ref_sd.values()) == 329_364
    n_w_rpe = sum(v.numel() for k, v in ref_sd.items() if "w_rpe" in k)
    ours = sum(p.numel() for p in model.state_dict().values())
    assert ours == 329_364 - n_w_rpe + 4 * 8 * 5  # w_rpe -> log ω (8 heads × 5 per layer)
    torch.testing.assert_close(model.region_hash.regions, ref_sd["regions"], rtol=0, atol=0)
    torch.testing.assert_close(model.blocks[2].mixer.alpha, ref_sd["attns.2.attn.e2lsh.alpha"], rtol=0, atol=0)


def test_missing_unexpected_and_misshaped_keys_are_rejected(ref_sd, tmp_path):
    sd = OrderedDict(ref_sd)
    del sd["attns.1.w_k.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['attns.1.w_k.weight'\]"):
        convert_reference_state_dict(sd)
    sd = OrderedDict(ref_sd)
    sd["attns.0.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected keys"):
        convert_reference_state_dict(sd)
    sd = OrderedDict(ref_sd)
    sd["W.weight"] = torch.zeros(12, 100)
    path = tmp_path / "bad.pt"
    torch.save(sd, path)
    with pytest.raises(ValueError, match="shape mismatch: W.weight"):
        from_reference_checkpoint(path)
    with pytest.raises(ValueError, match="no checkpoint file"):
        from_reference_checkpoint(tmp_path / "nope.pt")


def test_feature_count_mismatch_is_a_clear_error():
    model = from_reference_checkpoint(CKPT)
    with pytest.raises(ValueError, match="expected \\(B, N, 15\\) features"):
        model(torch.randn(1, 100, 14), torch.randn(1, 100, 6))
    with pytest.raises(ValueError, match="coords: expected \\(B, N, 6\\)"):
        model(torch.randn(1, 100, 15), torch.randn(1, 100, 2))


def test_follows_reference_forward_semantics_in_float64(ref_sd):
    x, coords = pin_event()
    x, coords = x[:3000], coords[:3000]
    model = from_reference_checkpoint(CKPT, dtype=torch.float64)
    with torch.no_grad():
        ours = model(x, coords)
    ref = reference_forward(ref_sd, x, coords)
    rel = (ours - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert rel.max() < 1e-7, f"max relative difference {rel.max():.3g}"


def test_float32_is_as_faithful_as_the_reference_in_float32(ref_sd):
    """In float32, near-ties of sort keys flip points across block boundaries (reference README:
    its own float32 and float64 runs differ). Judge by the fraction of points that agree with
    the float64 reference: ours in float32 must do as well as the reference's own float32."""
    x, coords = pin_event()
    x, coords = x[:3000], coords[:3000]
    ref64 = reference_forward(ref_sd, x, coords)
    ref32 = reference_forward(ref_sd, x.float(), coords.float()).double()
    with torch.no_grad():
        ours32 = from_reference_checkpoint(CKPT)(x.float(), coords.float()).double()
    frac = lambda a, tol: float((((a - ref64).norm(dim=-1) / ref64.norm(dim=-1)) < tol).float().mean())
    for tol in (1e-3, 1e-1):
        assert frac(ours32, tol) >= frac(ref32, tol) - 0.03, (tol, frac(ours32, tol), frac(ref32, tol))
    assert frac(ours32, 1e-1) > 0.95


def test_pinned_output_on_fixed_generated_event():
    pin = json.loads(PIN.read_text())
    assert pin["generator_version"] == GENERATOR_VERSION, (
        "the tracking generator changed: regenerate tests/data/hept_reference_pin.json with "
        "`python tests/test_reference_checkpoint.py --write-pin` after checking the change")
    x, coords = pin_event()
    with torch.no_grad():
        emb = from_reference_checkpoint(CKPT, dtype=torch.float64)(x, coords)
    got = pin_numbers(emb)
    for key in ("mean", "std", "rows"):
        torch.testing.assert_close(torch.tensor(got[key]), torch.tensor(pin[key]), rtol=1e-6, atol=1e-6)


if __name__ == "__main__":
    import sys

    if "--write-pin" in sys.argv:
        x, coords = pin_event()
        with torch.no_grad():
            emb = from_reference_checkpoint(CKPT, dtype=torch.float64)(x, coords)
        PIN.write_text(json.dumps({"generator_version": GENERATOR_VERSION, "n_points": 6000,
                                   "dtype": "float64", **pin_numbers(emb)}, indent=1))
        print(f"wrote {PIN}")

"""Every registered model takes PyG-style flat input: ``model(a (N, ·), …, batch=b)`` (or ``ptr=p``)
gives exactly the padded call ``model(a (B, n, ·), …, mask)``: per-cloud outputs as they are,
per-point outputs row for row in the flat input's order."""
from __future__ import annotations

import pytest
import torch

from pointformers.data.batch import accepts_flat_inputs, pad_clouds
from pointformers.models import MODELS, build
from test_flat_batch import POINT_MODELS, SIZES

SMALL_SFT = dict(k=8, dim=16, depth=1, heads=2)
TRACKING = dict(mlp_hidden=16, mlp_layers=2, dropout=0.0)
GNN = dict(k=8, n_layers=2, **TRACKING)
#: registry name -> options of a small instance (point models: tests/test_flat_batch.py's)
OPTIONS = {
    **{name: options for name, (options, _) in POINT_MODELS.items()},
    "full-3d-reg": {}, "full-partseg": {}, "sampled-hier-cls": {},
    "sft-ri-cls": SMALL_SFT, "sft-ri-partseg": SMALL_SFT,
    "hept-tracking": dict(heads=2, n_layers=2, block_size=16, num_regions=4, **TRACKING),
    "tracking-encoder": dict(attention="performer", heads=2, n_layers=1, pe="learned", **TRACKING),
    "hept-pileup": dict(heads=2, n_layers=1, block_size=16, num_regions=4, **TRACKING),
    "pileup-encoder": dict(attention="full", heads=2, n_layers=1, **TRACKING),
    "tracking-edgeconv": GNN, "tracking-gravnet": GNN,
    "flt-seq": {}, "full-seq": {}, "mlp-seq": {}, "samsa-seq": {},
    "flt-vit": {}, "performer-vit": {}, "full-vit": {}, "mlp-vit": {},
    "flt-lm": {"chunk_size": 4}, "performer-lm": {"chunk_size": 4}, "full-lm": {}, "mlp-lm": {},
    "mlp-set": {}, "set-isab-pma": {}, "set-isab-pma-sampled": {}, "set-sab-pma": {},
    "point-mae-cls": {"attention": "sampled"},
    "track-reconstruction": dict(dim=16, heads=2, n_layers=1, num_slots=6, block_size=16, num_regions=4,
                                 decoder_heads=2, threshold=0.0),
}
#: The package's own models (tests register models of their own, e.g. engine_toy_task's "toy-mlp").
#: "point-mae" is a pre-training objective (forward returns its loss), not a model to run on data; its
#: fine-tuning model "point-mae-cls" is tested.
#: Graph models take PyG's flat batch only (a graph's edge_index has no padded form; their batched vs
#: one-graph-at-a-time equality is tests/test_graph_models.py's), and the dual encoder takes pairs of
#: padded documents (its encoder, a sequence model, is tested here).
NOT_PADDED = {"sft-graph", "samsa-graph", "full-graph", "performer-graph", "mlp-graph", "dual-encoder"}
PACKAGE_MODELS = [n for n in MODELS if MODELS.get(n).factory.__module__.startswith("pointformers.")
                  and n != "point-mae" and n not in NOT_PADDED]
SEQUENCES = {"flt-seq", "full-seq", "mlp-seq", "samsa-seq"}
LANGUAGE = {"flt-lm", "performer-lm", "full-lm", "mlp-lm"}  # per-token next-word logits
SETS = {"mlp-set", "set-isab-pma", "set-isab-pma-sampled", "set-sab-pma"}
HITS = {"hept-tracking", "track-reconstruction", "tracking-encoder", "tracking-edgeconv", "tracking-gravnet", "hept-pileup", "pileup-encoder"}
VOCAB = 12


def _model(name):
    if name not in OPTIONS:
        pytest.fail(f"{name}: no input factory in tests/test_flat_models.py; add its options and inputs")
    torch.manual_seed(0)
    kw = dict(vocab_size=VOCAB, num_classes=4) if name in SEQUENCES else dict(vocab_size=VOCAB) if name in LANGUAGE else {}
    return build(name, **kw, **OPTIONS[name]).double().eval()


def _inputs(name, model, sizes=SIZES, seed=0):
    """Per-cloud inputs (forward's order, None for an absent one), a padding value per input that
    is not what the flat path pads with (0), and whether the output is per point."""
    g = torch.Generator().manual_seed(seed)

    def rand(n, d):
        return torch.randn(n, d, generator=g, dtype=torch.float64)

    if name in SEQUENCES or name in LANGUAGE:
        return [(torch.randint(0, VOCAB, (n,), generator=g),) for n in sizes], (VOCAB - 1,), name in LANGUAGE
    if name in SETS:
        return [(rand(n, model.in_dim),) for n in sizes], (0.5,), False
    if name in HITS:
        clouds = [(rand(n, model.in_dim), rand(n, model.coord_dim)) for n in sizes]
        if "pileup" in name:  # the last column is the PID category
            for x, _ in clouds:
                x[:, -1] = torch.randint(0, 7, (x.shape[0],), generator=g).double()
        return clouds, (0.5, 0.5), True
    in_dim = getattr(model, "in_dim", None)
    if in_dim is None:
        in_dim = model.encoder.in_dim
    pos_dim = getattr(model, "coord_dim", 3) if name.endswith("-vit") else 3   # image patches: their index
    clouds = [(rand(n, in_dim) if in_dim else None, torch.rand(n, pos_dim, generator=g, dtype=torch.float64))
              for n in sizes]
    return clouds, (0.5, 0.5), "partseg" in name


def _padded_and_flat(clouds, pad_values):
    padded, flat, mask = [], [], None
    for i, fill in enumerate(pad_values):
        parts = [c[i] for c in clouds]
        if parts[0] is None:
            padded.append(None)
            flat.append(None)
            continue
        t, mask = pad_clouds(parts, pad_value=fill)
        padded.append(t)
        flat.append(torch.cat(parts))
    return padded, flat, mask


def _index(sizes):
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    return batch, torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])


@pytest.mark.parametrize("name", PACKAGE_MODELS)
def test_flat_equals_padded(name):
    model = _model(name)
    clouds, pad_values, per_point = _inputs(name, model)
    padded, flat, mask = _padded_and_flat(clouds, pad_values)
    batch, ptr = _index(SIZES)
    with torch.no_grad():
        ref = model(*padded, mask)
        by_batch, by_ptr = model(*flat, batch=batch), model(*flat, ptr=ptr)
    if per_point:
        ref = ref[mask]
        assert by_batch.shape[0] == sum(SIZES)
    torch.testing.assert_close(by_batch, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(by_ptr, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", PACKAGE_MODELS)
def test_flat_input_refuses_a_mask_and_an_unsorted_batch(name):
    model = _model(name)
    clouds, pad_values, _ = _inputs(name, model, sizes=(5, 4))
    _, flat, _ = _padded_and_flat(clouds, pad_values)
    batch, _ = _index((5, 4))
    with pytest.raises(ValueError, match="^mask: flat input"):
        model(*flat, torch.ones(9, dtype=torch.bool), batch=batch)
    with pytest.raises(ValueError, match="^batch: .*sorted"):
        model(*flat, batch=batch.flip(0))


def test_flat_input_names_a_wrong_shape():
    seq, gnn = _model("mlp-seq"), _model("tracking-gravnet")
    b = torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match=r"^tokens: with batch= or ptr= expected a flat 1-D tensor"):
        seq(torch.zeros(1, 3, dtype=torch.long), batch=b)
    with pytest.raises(ValueError, match=r"^coords: with flat x of 3 rows expected \(3, ·\), got \(4, 6\)"):
        gnn(torch.randn(3, 15, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64), batch=b)


def test_gnn_flat_input_without_coords():
    gnn = _model("tracking-edgeconv")
    clouds, pad_values, _ = _inputs("tracking-edgeconv", gnn)
    (x, _), (xf, _), mask = _padded_and_flat(clouds, pad_values)
    with torch.no_grad():
        torch.testing.assert_close(gnn(xf, batch=_index(SIZES)[0]), gnn(x, mask=mask)[mask], rtol=0, atol=0)


def test_decorator_refuses_a_forward_without_mask_after_its_inputs():
    with pytest.raises(TypeError, match=r"must take 2 input\(s\) then mask"):
        accepts_flat_inputs(2, 2)(lambda self, x, mask=None: x)


@pytest.mark.parametrize("precision", ["bf16-autocast", "float16"])
@pytest.mark.parametrize("name", PACKAGE_MODELS)
def test_reduced_precision_with_flat_input(name, precision):
    """PyG-style flat input of float32 tensors under CPU bf16 autocast, or a ``.half()`` model on float16
    input: runs, finite, near float32 (bf16 keeps 8 bits of mantissa: a relative L2 error of a few 1e-2
    at most through a few layers)."""
    model = _model(name).float()
    clouds, pad_values, _ = _inputs(name, model)
    _, flat, _ = _padded_and_flat(clouds, pad_values)
    batch, _ = _index(SIZES)

    def cast(dtype):
        return [t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in flat]

    with torch.no_grad():
        ref = model(*cast(torch.float32), batch=batch)
        if precision == "float16":
            out = model.half()(*cast(torch.float16), batch=batch)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(*cast(torch.float32), batch=batch)
    refs, outs = ((ref,), (out,)) if isinstance(ref, torch.Tensor) else (tuple(ref), tuple(out))
    for r, o in zip(refs, outs):
        if not r.is_floating_point():   # labels (track-reconstruction): valid, and assigned where float32 assigns
            assert o.dtype == r.dtype and o.shape == r.shape and torch.equal(o >= 0, r >= 0)
            continue
        assert bool(torch.isfinite(o.float()).all())
        assert float((o.float() - r).norm() / r.norm().clamp_min(1e-6)) < 0.15

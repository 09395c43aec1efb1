"""A user's own module containing any exportable mechanism exports with the public API alone:
``pointformers.attention.set_exportable`` then ``torch.export.export`` (and ``torch.onnx.export``
with ``pointformers.export.onnx_translation_table()``), for a dynamic point count."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import pointformers
from pointformers.attention import set_exportable
from pointformers.export import onnx_translation_table, supported_mechanisms

OPTIONS = {"kernel": {"coord_dim": 3}, "hept": {"coord_dim": 3, "block_size": 16, "num_regions": 4},
           "lsh_or": {"coord_dim": 3, "block_size": 16}, "coord_lsh": {"coord_dim": 3, "block_size": 16, "num_regions": 4},
           "performer": {"nb_features": 16},
           "flt": {"nb_features": 16, "coord_dim": 3}, "sft": {"k": 8}, "samsa": {"k": 4},
           "serialized": {"patch_size": 16, "coord_dim": 3}}


class MyModel(nn.Module):
    """What a user writes: their own layers around a pointformers mechanism."""

    def __init__(self, name: str):
        super().__init__()
        self.inp = nn.Linear(5, 32)
        self.attn = pointformers.attention.build(name, dim=32, heads=4, **OPTIONS.get(name, {}))
        self.out = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # (1, N, 5), (1, N, 3)
        h = self.inp(x)
        return self.out(h + self.attn(h, pos))


def _inputs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, 5, generator=g, dtype=torch.float64), torch.rand(1, n, 3, generator=g, dtype=torch.float64)


@functools.cache  # one export per mechanism, shared by the torch.export and the ONNX test
def _exported(name: str):
    torch.manual_seed(0)
    model = MyModel(name).double().eval()
    eager = MyModel(name).double().eval()
    eager.load_state_dict(model.state_dict())
    set_exportable(model)
    n = torch.export.Dim("n", min=24, max=100000)
    prog = torch.export.export(model, _inputs(60, 0), dynamic_shapes={"x": {1: n}, "pos": {1: n}}, strict=False)
    return eager, prog


@pytest.mark.heavy
@pytest.mark.parametrize("name", supported_mechanisms())
def test_torch_export_of_a_users_module(name):
    eager, prog = _exported(name)
    for n, seed in ((37, 1), (211, 2)):
        x, pos = _inputs(n, seed)
        with torch.no_grad():
            torch.testing.assert_close(prog.module()(x, pos), eager(x, pos), rtol=1e-9, atol=1e-9)


#: ONNX of the user's module in ``make test-heavy`` for HEPT (the translation table's stable sort, its
#: softplus and gelu); every other mechanism is a release check (``make test-release``): minutes each on a slow VM.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.heavy if n == "hept" else pytest.mark.release)
                                  for n in supported_mechanisms()])
def test_onnx_export_of_a_users_module(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    eager, prog = _exported(name)
    onnx_program = torch.onnx.export(prog, _inputs(60, 0), dynamo=True, input_names=["x", "pos"],
                                     custom_translation_table=onnx_translation_table())
    onnx_program.save(str(tmp_path / "m.onnx"))
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x, pos = _inputs(137, 3)
    out = sess.run(None, {"x": x.numpy(), "pos": pos.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), eager(x, pos), rtol=1e-6, atol=1e-6)

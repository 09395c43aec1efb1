"""A user's own ``torch.export`` of every registered model (one cloud, padded, export mode through
``set_exportable``) gives the eager result; a model that cannot be exported says why, by name.

Release check (``make test-release``): one ``torch.export`` per model (a minute or two in all on a fast 2-core
machine, several on a slow VM); ``make test`` exports the small models of every mechanism."""
from __future__ import annotations

import copy

import pytest
import torch

from pointformers.attention import UnsupportedExportError, set_exportable
from test_flat_models import PACKAGE_MODELS, _inputs, _model


def _float(t):
    return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


@pytest.mark.release
@pytest.mark.parametrize("name", PACKAGE_MODELS)
def test_users_torch_export_of_every_model(name):
    model = _model(name).float()
    clouds, pads, _ = _inputs(name, model)
    one = tuple(None if t is None else _float(t)[None] for t in clouds[0])  # the first cloud, (1, n, ·)
    exportable = copy.deepcopy(model)
    try:
        set_exportable(exportable)
    except UnsupportedExportError as e:  # a mechanism without an exportable path: named, with the reason
        assert e.reason and e.mechanism in str(e)
        return
    program = torch.export.export(exportable, (*one, None))
    with torch.no_grad():
        ref, out = model(*one, None), program.module()(*one, None)
    refs, outs = (ref, out) if isinstance(ref, torch.Tensor) else (tuple(ref), tuple(out))
    torch.testing.assert_close(outs, refs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,module", [("tracking-edgeconv", "tracking-edgeconv"), ("tracking-gravnet", "tracking-gravnet"),
                                         ("set-isab-pma-sampled", "MAB")])
def test_a_model_without_export_path_is_refused_by_name(name, module):
    with pytest.raises(UnsupportedExportError, match=f"cannot export module '{module}': "):
        set_exportable(_model(name))

"""HEPT inside a PyTorch-Geometric-style model: flat points of several events and a ``batch`` vector.

A PyG user's model sees a mini-batch as one flat tensor of points ``x (N, F)``, their coordinates
``pos (N, P)`` and ``batch (N,)``, the sorted index of the event each point belongs to. Every
pointformers mechanism takes that directly (``attn(x, pos, batch=batch)``; ``ptr=`` offsets work
too), so it slots between message-passing layers without any conversion. This script builds such
a model (an MLP encoder, two HEPT layers sharing their region codes through one forward context,
a per-point head), trains it for a few steps on a toy "which points belong together" objective,
and checks that the flat call equals the padded one event by event. Runs in seconds on one CPU.
"""
from __future__ import annotations

import torch
from torch import nn

import pointformers
from pointformers.attention import ForwardContext


class PyGStyleHEPT(nn.Module):
    """x (N, F), pos (N, 2) with η, φ, batch (N,) -> per-point embeddings (N, out)."""

    def __init__(self, in_dim: int = 4, dim: int = 32, out: int = 8, layers: int = 2):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(in_dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        # one HEPT layer per depth; they share one set of region counts (as the authors' model)
        first = pointformers.attention.build("hept", dim=dim, heads=4, head_dim=8, coord_dim=2, block_size=32,
                                             num_regions=8)
        rest = [pointformers.attention.build("hept", dim=dim, heads=4, head_dim=8, coord_dim=2, block_size=32,
                                             shared=first.regions_module) for _ in range(layers - 1)]
        self.attn = nn.ModuleList([first, *rest])
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.head = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        for norm, attn in zip(self.norms, self.attn):
            h = h + attn(norm(h), pos, batch=batch)  # flat in, flat out
        return self.head(h)


def toy_batch(sizes=(300, 520, 180), seed: int = 0):
    """Flat points of len(sizes) events: clusters ("tracks") of points close in (η, φ)."""
    g = torch.Generator().manual_seed(seed)
    xs, ps, labels = [], [], []
    for n in sizes:
        centres = torch.rand(n // 10, 2, generator=g) * torch.tensor([8.0, 6.28]) - torch.tensor([4.0, 3.14])
        lab = torch.randint(0, len(centres), (n,), generator=g)
        ps.append(centres[lab] + 0.02 * torch.randn(n, 2, generator=g))
        xs.append(torch.randn(n, 4, generator=g))
        labels.append(lab)
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    return torch.cat(xs), torch.cat(ps), batch, labels


def contrastive_loss(emb: torch.Tensor, batch: torch.Tensor, labels: list[torch.Tensor]) -> torch.Tensor:
    """Points of one cluster close, others apart (per event; a toy stand-in for HEPT's InfoNCE)."""
    loss, start = 0.0, 0
    for lab in labels:
        e = emb[start:start + len(lab)]
        start += len(lab)
        d = torch.cdist(e, e)
        same = (lab[:, None] == lab[None, :]).float()
        loss = loss + (same * d.pow(2)).mean() + ((1 - same) * torch.relu(1.0 - d).pow(2)).mean()
    return loss / len(labels)


def main() -> None:
    torch.manual_seed(0)
    model = PyGStyleHEPT()
    x, pos, batch, labels = toy_batch()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for step in range(30):
        loss = contrastive_loss(model(x, pos, batch), batch, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = float(loss.detach()) if first is None else first
    print(f"toy contrastive loss: {first:.4f} -> {float(loss.detach()):.4f} after 30 steps")
    assert float(loss.detach()) < first, "training did not reduce the loss"

    # the flat call equals the padded call of each layer, event by event
    model.eval()
    from pointformers.data.batch import flat_layout

    layout = flat_layout(len(batch), batch=batch)
    with torch.no_grad():
        h = model.enc(x)
        flat = model.attn[0](model.norms[0](h), pos, batch=batch)
        padded = model.attn[0](layout.pad(model.norms[0](h)), layout.pad(pos), layout.mask())
    torch.testing.assert_close(flat, layout.unpad(padded))
    # a forward context shares the region codes between the layers of a padded call
    ctx = ForwardContext(layout.pad(pos), layout.mask())
    with torch.no_grad():
        for attn in model.attn:
            attn(layout.pad(h), layout.pad(pos), layout.mask(), context=ctx)
    assert len(ctx) == 1, "layers sharing region counts prepare them once"
    print("flat (PyG-style) and padded calls agree; the layers shared one prepared context")


if __name__ == "__main__":
    main()

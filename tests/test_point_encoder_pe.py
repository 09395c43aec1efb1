"""PointTransformerJK's learned positional encoding (HEPT's transformer baselines, HEPT paper Sec. 6.2)."""
import pytest
import torch

from pointformers.models import build


def test_learned_pe_is_the_only_way_coordinates_reach_full_attention():
    torch.manual_seed(0)
    x, c = torch.randn(1, 30, 15), torch.randn(1, 30, 6)
    c2 = c + torch.randn_like(c)
    plain = build("tracking-encoder", attention="full", pe="none", dropout=0.0).eval()
    with_pe = build("tracking-encoder", attention="full", pe="learned", dropout=0.0).eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(x, c), plain(x, c2))  # `full` ignores pos
        assert (with_pe(x, c) - with_pe(x, c2)).abs().max() > 1e-3
    extra = sum(p.numel() for p in with_pe.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 6 * 24 + 24 + 2 * 24 + 24 * 24 + 24  # Linear(6,24), LayerNorm(24), Linear(24,24)


def test_learned_pe_keeps_padding_invariance():
    torch.manual_seed(1)
    m = build("tracking-encoder", attention="full", pe="learned", dropout=0.0).eval()
    x, c = torch.randn(1, 20, 15), torch.randn(1, 20, 6)
    xp = torch.cat([x, torch.randn(1, 7, 15)], 1)
    cp = torch.cat([c, torch.randn(1, 7, 6)], 1)
    mask = torch.arange(27)[None] < 20
    with torch.no_grad():
        torch.testing.assert_close(m(xp, cp, mask)[:, :20], m(x, c), atol=1e-5, rtol=1e-5)
        assert m(xp, cp, mask)[:, 20:].abs().max() == 0


def test_bad_pe_is_a_clear_error():
    with pytest.raises(ValueError, match="pe: expected"):
        build("tracking-encoder", attention="full", pe="sinusoid")

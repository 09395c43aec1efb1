"""Keeping freed memory during large CPU forward passes (pointformers.nn.allocator)."""
import platform
import resource

import pytest
import torch

from pointformers.nn import allocator

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the setting applies to glibc's allocator only")


def _faults_of_second_fill(mb: int = 96) -> int:
    torch.empty(mb << 18).fill_(1.0)  # allocate, touch and free once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(mb << 18).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@glibc
def test_freed_blocks_are_reused_inside_and_returned_after():
    pages = (96 << 20) // 4096
    assert _faults_of_second_fill() > pages // 2  # outside: a fresh mapping, faulted in page by page
    with allocator.keep_freed_memory() as kept:
        assert kept
        assert _faults_of_second_fill() < pages // 10  # inside: the freed block is reused
    assert allocator._depth == 0
    assert _faults_of_second_fill() > pages // 2  # after: glibc's behaviour is back


@glibc
def test_nested_blocks_restore_once_and_switches():
    with allocator.keep_freed_memory():
        with allocator.keep_freed_memory() as inner:
            assert inner and allocator._depth == 2
        assert allocator._depth == 1
    assert allocator._depth == 0
    with allocator.keep_freed_memory(active=False) as kept:
        assert not kept and allocator._depth == 0


def test_disabled_and_size_test(monkeypatch):
    monkeypatch.setattr(allocator, "ENABLED", False)
    with allocator.keep_freed_memory() as kept:
        assert not kept
    assert not allocator.large_cpu_input(torch.empty(1, 10, 3))
    assert allocator.large_cpu_input(torch.empty(2, 10, 3), rows=allocator.LARGE_ROWS)
    assert not allocator.large_cpu_input(torch.empty(2, 10, 3, device="meta"), rows=allocator.LARGE_ROWS)


def test_large_forward_equals_plain_forward(monkeypatch):
    """The model's output does not depend on the setting (it only changes where memory comes from)."""
    from pointformers.models import from_reference_checkpoint

    model = from_reference_checkpoint()
    g = torch.Generator().manual_seed(0)
    x, c = torch.randn(700, 15, generator=g), torch.randn(700, 6, generator=g)
    monkeypatch.setattr(allocator, "LARGE_ROWS", 100)
    with torch.no_grad():
        kept = model(x, c)
        monkeypatch.setattr(allocator, "ENABLED", False)
        plain = model(x, c)
    assert torch.equal(kept, plain) and allocator._depth == 0

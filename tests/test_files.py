"""pointformers.files: atomic writes that leave files with the user's umask."""
from __future__ import annotations

import os
import stat
import threading

import numpy as np
import pytest

from pointformers.files import atomic_write, current_umask, default_file_mode

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test, restoring it afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda m: os.umask(m)
    os.umask(old)


def test_current_umask_reads_without_changing_it(umask):
    for m in (0o022, 0o077, 0o002, 0o027):
        umask(m)
        assert current_umask() == m
        assert current_umask() == m  # reading did not change it
        assert default_file_mode() == 0o666 & ~m


@posix_only
@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664), (0o027, 0o640)])
def test_new_file_gets_the_umask_mode(tmp_path, umask, mask, expected):
    umask(mask)
    out = atomic_write(tmp_path / "sub" / "metrics.json", lambda f: f.write(b"{}"))
    assert out == tmp_path / "sub" / "metrics.json"
    assert _mode(out) == expected
    # the same as what open() gives a new file under this umask
    with open(tmp_path / "plain", "wb"):
        pass
    assert _mode(tmp_path / "plain") == expected


@posix_only
def test_replacing_an_existing_file(tmp_path, umask):
    umask(0o077)
    path = atomic_write(tmp_path / "last.pt", lambda f: f.write(b"old"))
    assert _mode(path) == 0o600
    inode = os.stat(path).st_ino
    umask(0o022)
    atomic_write(path, lambda f: f.write(b"new content"))
    assert path.read_bytes() == b"new content"
    assert _mode(path) == 0o644  # the mode of a new file now, not the old file's
    assert os.stat(path).st_ino != inode  # replaced by rename, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary left


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = atomic_write(tmp_path / "best.pt", lambda f: f.write(b"good"))

    def broken(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == b"good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


@posix_only
def test_concurrent_reads_of_the_umask_do_not_change_it(umask):
    umask(0o027)
    seen: list[int] = []

    def work():
        for _ in range(200):
            seen.append(current_umask())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen) == {0o027} and current_umask() == 0o027


@posix_only
def test_checkpoints_and_cache_entries_follow_the_umask(tmp_path, umask):
    import torch

    from pointformers.data.cache import load_arrays, save_arrays
    from pointformers.engine import save_checkpoint

    umask(0o022)
    ckpt = tmp_path / "run" / "last.pt"
    save_checkpoint(ckpt, {"model": {"w": torch.zeros(3)}, "epoch": 1})
    assert _mode(ckpt) == 0o644
    entry = tmp_path / "cache" / "x.npz"
    save_arrays(entry, {"v": 1}, {"a": np.arange(4)})
    assert _mode(entry) == 0o644
    assert np.array_equal(load_arrays(entry, {"v": 1})["a"], np.arange(4))
    umask(0o077)
    save_arrays(entry, {"v": 2}, {"a": np.arange(5)})
    assert _mode(entry) == 0o600 and load_arrays(entry, {"v": 1}) is None

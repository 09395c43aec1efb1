"""Strict readers of small text formats used by the real-data readers.

Every malformed input raises ``ValueError("<file>:<line>: <what was expected>, got ...")``
so a user can open the file at the offending line.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["read_numeric_table", "read_name_list"]


def read_numeric_table(path: str | os.PathLike, ncols: int, delimiter: str | None, what: str) -> np.ndarray:
    """All non-blank lines of ``path`` as a float64 array (rows, ``ncols``).

    ``delimiter``: ``","`` or ``None`` (any whitespace). ``what`` describes a line for error
    messages (e.g. ``"x,y,z,nx,ny,nz"``). Non-numeric, non-finite values and lines with the
    wrong number of columns raise ValueError naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ValueError(f"file {path}: not UTF-8 text (line {line}; expected {what} lines)") from None
    lines = text.splitlines()
    flat = text.replace(",", " ") if delimiter == "," else text
    # Fast path: parse everything at once and check the count; any surprise falls back to the
    # line-by-line scan that names the bad line.
    try:
        values = np.array(flat.split(), dtype=np.float64)
    except ValueError:
        values = None
    n_rows = sum(1 for ln in lines if ln.strip())
    if n_rows == 0:
        raise ValueError(f"{path}: empty file, expected lines of {what}")
    if values is not None and values.size == n_rows * ncols and np.isfinite(values).all():
        if delimiter == "," and any(ln.count(",") != ncols - 1 for ln in lines if ln.strip()):
            pass  # e.g. "1 2,3,..." with a missing comma: find it below
        else:
            return values.reshape(n_rows, ncols)
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            continue
        fields = ln.split(",") if delimiter == "," else ln.split()
        if len(fields) != ncols:
            raise ValueError(f"{path}:{i}: expected {ncols} {'comma-separated ' if delimiter == ',' else ''}"
                             f"values ({what}), got {len(fields)}: {ln.strip()[:80]!r}")
        try:
            row = [float(f) for f in fields]
        except ValueError:
            raise ValueError(f"{path}:{i}: expected numbers ({what}), got {ln.strip()[:80]!r}") from None
        if not all(np.isfinite(row)):
            raise ValueError(f"{path}:{i}: expected finite numbers ({what}), got {ln.strip()[:80]!r}")
    if n_rows == 0:
        raise ValueError(f"{path}: empty file, expected lines of {what}")
    raise ValueError(f"{path}: could not parse lines of {what}")  # pragma: no cover - scan above finds it


def read_name_list(path: str | os.PathLike, what: str) -> list[str]:
    """Non-blank stripped lines of ``path``; a line with inner whitespace is rejected."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found (expected {what})")
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ValueError(f"file {path}: not UTF-8 text (line {line})") from None
    out = []
    for i, ln in enumerate(text.splitlines(), start=1):
        s = ln.strip()
        if not s:
            continue
        if len(s.split()) != 1:
            raise ValueError(f"{path}:{i}: expected one {what} per line, got {s[:80]!r}")
        out.append(s)
    if not out:
        raise ValueError(f"{path}: empty file, expected one {what} per line")
    return out

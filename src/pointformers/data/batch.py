"""Padded batches of variable-size point clouds.

A batch is a set of padded ``(B, N, ·)`` tensors plus a ``(B, N)`` bool mask (True = real
point). Nothing assumes equal cloud sizes; large HEP events are usually batch size 1.
"""
from __future__ import annotations

from typing import Sequence

import torch


def pad_clouds(clouds: Sequence[torch.Tensor], pad_value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack clouds of shapes ``(n_i, F)`` into ``(B, max n_i, F)`` plus a ``(B, max n_i)`` mask."""
    if len(clouds) == 0:
        raise ValueError("clouds: expected at least one cloud, got an empty sequence")
    feat = clouds[0].shape[1:]
    for i, c in enumerate(clouds):
        if c.dim() < 1 or c.shape[1:] != feat:
            raise ValueError(f"clouds[{i}]: expected shape (n, {tuple(feat)}), got {tuple(c.shape)}")
    n_max = max(int(c.shape[0]) for c in clouds)
    out = clouds[0].new_full((len(clouds), n_max, *feat), pad_value)
    mask = torch.zeros(len(clouds), n_max, dtype=torch.bool, device=clouds[0].device)
    for i, c in enumerate(clouds):
        out[i, : c.shape[0]] = c
        mask[i, : c.shape[0]] = True
    return out, mask


def unpad_clouds(padded: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of :func:`pad_clouds`: ``(B, N, ·)`` + ``(B, N)`` mask -> list of ``(n_i, ·)``."""
    return [padded[i][mask[i]] for i in range(padded.shape[0])]


class FlatLayout:
    """Where each point of a flat ``(N, ·)`` batch sits in the padded ``(B, n_max, ·)`` layout.

    Built by :func:`flat_layout` from PyG's ``batch`` (sorted cloud index per point) or ``ptr``
    (offsets, ``ptr[b]`` = first point of cloud b). ``cloud``/``slot`` (N,) index the padded rows.
    """

    def __init__(self, cloud: torch.Tensor, slot: torch.Tensor, n_clouds: int, n_max: int):
        self.cloud, self.slot, self.n_clouds, self.n_max = cloud, slot, n_clouds, n_max

    def pad(self, t: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N, ·) -> (B, n_max, ·)."""
        out = t.new_full((self.n_clouds, self.n_max, *t.shape[1:]), fill)
        out[self.cloud, self.slot] = t
        return out

    def mask(self) -> torch.Tensor:
        """(B, n_max) bool, True at real points."""
        m = torch.zeros(self.n_clouds, self.n_max, dtype=torch.bool, device=self.cloud.device)
        m[self.cloud, self.slot] = True
        return m

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, n_max, ·) -> (N, ·), in the flat input's order."""
        return padded[self.cloud, self.slot]


def flat_layout(n: int, batch: torch.Tensor | None = None, ptr: torch.Tensor | None = None,
                device: torch.device | None = None) -> FlatLayout:
    """The padded layout of ``n`` flat points grouped by ``batch`` (N,) sorted cloud indices 0..B−1
    (PyTorch Geometric's convention) or ``ptr`` (B+1,) offsets; neither: one cloud.

    Raises ValueError naming the argument: wrong shape or dtype, unsorted ``batch``, an empty cloud
    (a cloud index with no point), ``ptr`` not starting at 0 / not ending at N / decreasing.
    """
    if batch is not None and ptr is not None:
        raise ValueError("batch, ptr: give one of them, not both")
    if batch is None and ptr is None:
        cloud = torch.zeros(n, dtype=torch.int64, device=device)
        return FlatLayout(cloud, torch.arange(n, device=device), 1, n)
    if ptr is not None:
        if not isinstance(ptr, torch.Tensor) or ptr.dim() != 1 or ptr.dtype not in (torch.int32, torch.int64) \
                or ptr.numel() < 2:
            raise ValueError(f"ptr: expected a 1-D integer tensor of B + 1 offsets, got "
                             f"{getattr(ptr, 'dtype', type(ptr).__name__)} {tuple(getattr(ptr, 'shape', ()))}")
        ptr = ptr.long()
        if int(ptr[0]) != 0 or int(ptr[-1]) != n:
            raise ValueError(f"ptr: must start at 0 and end at the point count {n}, got {int(ptr[0])} … {int(ptr[-1])}")
        counts = ptr[1:] - ptr[:-1]
        if bool((counts < 0).any()):
            raise ValueError("ptr: offsets must not decrease")
        cloud = torch.repeat_interleave(torch.arange(len(counts), device=ptr.device), counts)
    else:
        if not isinstance(batch, torch.Tensor) or batch.dim() != 1 or batch.shape[0] != n \
                or batch.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"batch: expected a 1-D integer tensor of {n} cloud indices, got "
                             f"{getattr(batch, 'dtype', type(batch).__name__)} {tuple(getattr(batch, 'shape', ()))}")
        cloud = batch.long()
        if n and (int(cloud[0]) < 0 or bool((cloud[1:] < cloud[:-1]).any())):
            raise ValueError("batch: cloud indices must be >= 0 and sorted (points of one cloud together, "
                             "as PyTorch Geometric batches them)")
        counts = torch.bincount(cloud) if n else cloud.new_zeros(0)
        ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    if bool((counts == 0).any()):
        raise ValueError(f"{'ptr' if batch is None else 'batch'}: cloud(s) "
                         f"{(counts == 0).nonzero().flatten().tolist()} have no points; every cloud needs one")
    slot = torch.arange(n, device=cloud.device) - ptr[cloud]
    return FlatLayout(cloud, slot, int(counts.numel()), int(counts.max()) if n else 0)


class PackedLayout:
    """Clouds of a flat ``(N, ·)`` batch laid end to end in ONE padded row ``(1, P, ·)``, each cloud
    padded only to a multiple of ``multiple`` (HEPT's block size), instead of every cloud to the
    largest one: P = Σ ceil(n_b / multiple)·multiple.

    Built by :func:`packed_layout`. ``row`` (N,) is each point's position in the packed row;
    ``segments`` the (start, end) rows of each cloud (python ints, end − start a multiple of
    ``multiple``; real points first, then padding). Only a mechanism that keeps clouds apart inside
    a row (``packs_clouds``, e.g. HEPT, whose sorts and blocks stay within a segment) may be given it.
    """

    def __init__(self, row: torch.Tensor, segments: tuple[tuple[int, int], ...], n_packed: int):
        self.row, self.segments, self.n_packed = row, segments, n_packed
        self.n_clouds = len(segments)

    def pad(self, t: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N, ·) -> (1, P, ·)."""
        out = t.new_full((1, self.n_packed, *t.shape[1:]), fill)
        out[0, self.row] = t
        return out

    def mask(self) -> torch.Tensor:
        """(1, P) bool, True at real points."""
        m = torch.zeros(1, self.n_packed, dtype=torch.bool, device=self.row.device)
        m[0, self.row] = True
        return m

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(1, P, ·) -> (N, ·), in the flat input's order."""
        return padded[0, self.row]


def packed_layout(n: int, batch: torch.Tensor | None = None, ptr: torch.Tensor | None = None,
                  multiple: int = 1, device: torch.device | None = None) -> PackedLayout:
    """The :class:`PackedLayout` of ``n`` flat points grouped by ``batch`` or ``ptr`` (validated as
    in :func:`flat_layout`), each cloud padded to a multiple of ``multiple`` rows."""
    if not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"multiple: expected a positive int, got {multiple!r}")
    flat = flat_layout(n, batch, ptr, device=device)
    counts = torch.bincount(flat.cloud, minlength=flat.n_clouds)
    lengths = (counts + multiple - 1) // multiple * multiple
    starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    bounds = starts.tolist()
    segments = tuple((bounds[b], bounds[b + 1]) for b in range(flat.n_clouds))
    return PackedLayout(starts[flat.cloud] + flat.slot, segments, bounds[-1])


def run_flat(fn, x: torch.Tensor, pos: torch.Tensor, batch: torch.Tensor | None = None,
             ptr: torch.Tensor | None = None) -> torch.Tensor:
    """``fn(x (B, n, F), pos (B, n, P), mask (B, n)) -> (B, n, ·)`` called on flat inputs x (N, F),
    pos (N, P) grouped by ``batch`` or ``ptr`` (see :func:`flat_layout`); returns (N, ·) in the
    input's order. What a model's ``forward(x, pos, batch=...)`` does with PyG-style input."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: with batch= or ptr= expected flat (N, F) features, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(pos, torch.Tensor) or pos.dim() != 2 or pos.shape[0] != x.shape[0]:
        raise ValueError(f"pos: with flat x ({x.shape[0]}, F) expected ({x.shape[0]}, P) coordinates, got "
                         f"{tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__}")
    return run_flat_inputs(fn, {"x": x, "pos": pos}, batch, ptr, per_point=True)


def run_flat_points(fn, x: torch.Tensor | None, pos: torch.Tensor, batch: torch.Tensor | None = None,
                    ptr: torch.Tensor | None = None, per_point: bool = False, **kwargs):
    """A point model's ``fn(x (B, n, F) | None, pos (B, n, P), mask (B, n), **kwargs)`` on flat inputs
    x (N, F) | None, pos (N, P) grouped by ``batch``/``ptr``. Per-cloud outputs (B, ·) come back as
    they are (clouds in index order); ``per_point=True`` outputs (B, n, ·) come back as (N, ·)."""
    if not isinstance(pos, torch.Tensor) or pos.dim() != 2:
        raise ValueError(f"pos: with batch= or ptr= expected flat (N, P) coordinates, got "
                         f"{tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__}")
    if x is not None and (not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != pos.shape[0]):
        raise ValueError(f"x: with flat pos ({pos.shape[0]}, P) expected ({pos.shape[0]}, F) features, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    return run_flat_inputs(fn, {"x": x, "pos": pos}, batch, ptr, per_point, **kwargs)


def accepts_flat_batch(per_point: bool = False):
    """Decorator for a point model's ``forward(self, x, pos, mask=None, ...)``: it also takes PyG-style
    flat input, ``forward(x (N, F) | None, pos (N, P), batch=b | ptr=p, ...)`` (no mask), run as the
    padded call (:func:`run_flat_points`): per-cloud outputs stay (B, ·), ``per_point`` outputs
    come back as (N, ·). Further arguments (e.g. a segmenter's per-cloud ``category``) pass through."""
    import functools

    def deco(forward):
        @functools.wraps(forward)
        def wrapper(self, x, pos, mask=None, *args, batch=None, ptr=None, **kwargs):
            if batch is None and ptr is None:
                return forward(self, x, pos, mask, *args, **kwargs)
            if mask is not None:
                raise ValueError("mask: flat input (batch= or ptr=) has no padding; give no mask")
            return run_flat_points(lambda xx, pp, mm, **kw: forward(self, xx, pp, mm, *args, **kw), x, pos, batch,
                                   ptr, per_point, **kwargs)

        return wrapper

    return deco


def run_flat_inputs(fn, inputs: dict, batch: torch.Tensor | None = None, ptr: torch.Tensor | None = None,
                    per_point: bool = False, pad_value: float = 0.0, **kwargs):
    """``fn(*padded, mask (B, n), **kwargs)`` on the flat tensors ``inputs`` (name -> (N, ·) or None,
    in ``fn``'s order; None passes through) grouped by ``batch``/``ptr`` (see :func:`flat_layout`),
    padded with ``pad_value``. Per-cloud outputs (B, ·) come back as they are (clouds in index order);
    ``per_point=True`` outputs (B, n, ·) come back as (N, ·) in the input's order. The one code path
    of every model's flat input (:func:`run_flat_points`, :func:`accepts_flat_inputs`)."""
    given = [(name, t) for name, t in inputs.items() if t is not None]
    if not given:
        raise ValueError(f"{', '.join(inputs)}: flat input (batch= or ptr=) needs at least one tensor")
    first, ref = given[0]
    for name, t in given:
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != ref.shape[0]:
            raise ValueError(f"{name}: with flat {first} of {ref.shape[0]} rows expected ({ref.shape[0]}, ·), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    layout = flat_layout(ref.shape[0], batch, ptr, device=ref.device)
    out = fn(*(None if t is None else layout.pad(t, pad_value) for t in inputs.values()), layout.mask(), **kwargs)
    return layout.unpad(out) if per_point else out


def accepts_flat_inputs(*flat_dims: int, per_point: bool = False, pad_value: float = 0.0):
    """Decorator for a ``forward(self, a, …, mask=None, ...)`` whose first ``len(flat_dims)``
    arguments are padded per-point tensors ``(B, n, ·)`` followed by ``mask`` (B, n): it also takes
    PyG-style flat input, ``forward(a (N, ·), …, batch=b | ptr=p, ...)`` (keyword-only, no mask),
    where argument i is a ``flat_dims[i]``-D tensor or None — e.g. a sequence model's
    ``forward(tokens, mask)`` with ``accepts_flat_inputs(1)`` takes concatenated token ids (N,),
    each sequence's tokens in order; a set model's ``forward(x, mask)`` with
    ``accepts_flat_inputs(2)`` takes points (N, d). Run as the padded call (:func:`run_flat_inputs`,
    padding ``pad_value``, which the mask must exclude): per-cloud outputs stay (B, ·),
    ``per_point`` outputs (B, n, ·) come back as (N, ·). Further arguments pass through.
    """
    import functools
    import inspect

    def deco(forward):
        sig = inspect.signature(forward)
        params = list(sig.parameters)
        names = params[1:1 + len(flat_dims)]
        if len(params) <= len(flat_dims) + 1 or params[1 + len(flat_dims)] != "mask":
            raise TypeError(f"accepts_flat_inputs: {forward.__qualname__} must take {len(flat_dims)} input(s) "
                            f"then mask, got ({', '.join(params)})")

        @functools.wraps(forward)
        def wrapper(self, *args, batch=None, ptr=None, **kwargs):
            if batch is None and ptr is None:
                return forward(self, *args, **kwargs)
            call = sig.bind(self, *args, **kwargs)
            call.apply_defaults()
            if call.arguments["mask"] is not None:
                raise ValueError("mask: flat input (batch= or ptr=) has no padding; give no mask")
            for name, dim in zip(names, flat_dims):
                t = call.arguments[name]
                if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != dim):
                    raise ValueError(f"{name}: with batch= or ptr= expected a flat {dim}-D tensor (N first), got "
                                     f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")

            def padded(*tensors):   # the padded inputs, then the mask
                for name, t in zip([*names, "mask"], tensors):
                    call.arguments[name] = t
                return forward(*call.args, **call.kwargs)

            return run_flat_inputs(padded, {n: call.arguments[n] for n in names}, batch, ptr, per_point, pad_value)

        return wrapper

    return deco

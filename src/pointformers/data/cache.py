"""On-disk caching of generated arrays, keyed by the generator parameters.

A cache entry is one ``.npz`` file (no pickle) whose name carries a hash of the parameters
and which also stores the canonical JSON of those parameters, so a changed parameter (or
generator version) gives a different file and a hash collision is still detected. Writes
are atomic (temporary file in the same folder, then :func:`os.replace`), so readers never
see a partial file; a corrupted or truncated file is treated as a miss and regenerated.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..files import atomic_write

_PARAMS_KEY = "__cache_params__"


def default_cache_dir() -> Path:
    """``$POINTFORMERS_CACHE`` if set, else ``~/.cache/pointformers``."""
    env = os.environ.get("POINTFORMERS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pointformers"


def canonical_json(params: Mapping[str, Any]) -> str:
    """Deterministic JSON of a parameter mapping (sorted keys, tuples as lists)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"params: value of type {type(o).__name__} is not JSON-serialisable")


def params_hash(params: Mapping[str, Any]) -> str:
    """Hex SHA-256 of :func:`canonical_json` of ``params``."""
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()


def cache_path(cache_dir: str | os.PathLike, prefix: str, params: Mapping[str, Any]) -> Path:
    """The file a cache entry for ``params`` lives in: ``<dir>/<prefix>-<hash16>.npz``."""
    return Path(cache_dir) / f"{prefix}-{params_hash(params)[:16]}.npz"


def load_arrays(path: str | os.PathLike, params: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The arrays stored at ``path`` if it is a complete entry for ``params``, else ``None``."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if _PARAMS_KEY not in z.files or str(z[_PARAMS_KEY]) != canonical_json(params):
                return None
            # Reading every member validates the whole file (CRC checks catch truncation).
            return {k: z[k] for k in z.files if k != _PARAMS_KEY}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None


class CacheWriteError(OSError, ValueError):
    """A cache file could not be written: ``"cannot write FILE: reason"``. An OSError (callers that
    only cache opportunistically ignore it) and a ValueError (the CLI reports it in one line)."""


@contextlib.contextmanager
def writes_required() -> Iterator[None]:
    """Within the block, :func:`cached_arrays` raises :class:`CacheWriteError` when it cannot
    store an entry instead of silently going on uncached (``pointformers generate``: writing the
    cache is the point)."""
    token = _WRITES_REQUIRED.set(True)
    try:
        yield
    finally:
        _WRITES_REQUIRED.reset(token)


_WRITES_REQUIRED: contextvars.ContextVar[bool] = contextvars.ContextVar("pointformers_cache_writes_required",
                                                                        default=False)


def save_arrays(path: str | os.PathLike, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Atomically write ``arrays`` plus the parameters to ``path``.

    Raises :class:`CacheWriteError` (``"cannot write FILE: reason"``) when the file or its folder
    cannot be written.
    """
    path = Path(path)
    if _PARAMS_KEY in arrays:
        raise ValueError(f"arrays: the key {_PARAMS_KEY!r} is reserved")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # atomic, and with the user's umask (a cache shared by a group stays readable)
        atomic_write(path, lambda f: np.savez(f, **{_PARAMS_KEY: np.array(canonical_json(params))}, **arrays))
    except CacheWriteError:
        raise
    except OSError as exc:
        raise CacheWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


def cached_arrays(
    cache_dir: str | os.PathLike,
    prefix: str,
    params: Mapping[str, Any],
    build: Callable[[], Mapping[str, np.ndarray]],
    validate: Callable[[Mapping[str, np.ndarray]], None] | None = None,
) -> dict[str, np.ndarray]:
    """Load the entry for ``params`` from ``cache_dir``, or ``build()`` it and store it.

    Args:
        cache_dir: folder of the cache (created when missing).
        prefix: human-readable file-name prefix (not part of the key).
        params: everything the output depends on (JSON-serialisable); include a version.
        build: makes the arrays on a miss (dict of name -> array; no object arrays).
        validate: checks a loaded entry's content and raises ValueError when it is inconsistent
            (a well-formed file with wrong content); such an entry is rebuilt and overwritten.
    """
    path = cache_path(cache_dir, prefix, params)
    hit = load_arrays(path, params)
    if hit is not None:
        try:
            if validate is not None:
                validate(hit)
            return hit
        except ValueError:
            pass  # inconsistent content: treated as a miss
    arrays = {k: np.asarray(v) for k, v in build().items()}
    try:
        save_arrays(path, params, arrays)
    except OSError:
        if _WRITES_REQUIRED.get():
            raise
        # a read-only or full disk must not stop loading; we just do not cache
    return dict(arrays)


def param_error(params: Any, name: str, why: str) -> None:
    """Raise the one-line ValueError of a bad generator parameter: ``name: why, got value``."""
    raise ValueError(f"{name}: {why}, got {getattr(params, name)!r}")


def finite_param(params: Any, name: str) -> float:
    """Field ``name`` of ``params`` as a float; :func:`param_error` unless it is a finite real number."""
    v = getattr(params, name)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        param_error(params, name, "expected a finite number")
    return float(v)


def params_from_preset(cls: type, presets: Mapping[str, Mapping[str, Any]], kind: str, name: str, **overrides: Any):
    """``cls(**presets[name]).replace(**overrides)`` for a generator-parameter dataclass ``cls``;
    ValueError naming the valid presets of ``kind`` (e.g. "tracking") for an unknown name."""
    if name not in presets:
        raise ValueError(f"preset: unknown {kind} preset {name!r}; valid presets: {sorted(presets)}")
    return cls(**presets[name]).replace(**overrides)


def resolve_generator_params(cls: type, presets: Mapping[str, Mapping[str, Any]], kind: str, preset_or_params: Any):
    """A ``cls`` instance from a preset name, an instance (returned as is) or a mapping of field values."""
    if isinstance(preset_or_params, cls):
        return preset_or_params
    if isinstance(preset_or_params, str):
        return params_from_preset(cls, presets, kind, preset_or_params)
    if isinstance(preset_or_params, Mapping):
        return cls().replace(**dict(preset_or_params))
    raise ValueError(f"preset_or_params: expected a preset name, {cls.__name__} or mapping, "
                     f"got {type(preset_or_params).__name__}")

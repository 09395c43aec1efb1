"""One registry type for everything built by name: attention mechanisms, models and tasks.

An entry is a factory (a class or a function returning an ``nn.Module`` or a task spec) and its
metadata, a frozen object of the registry's own info type (``MechanismInfo`` for mechanisms,
``ModelInfo`` for models; tasks carry theirs in ``TaskSpec``). Lookups of an unknown name raise
a ``ValueError`` listing the valid names, so configs and the CLI get one kind of error.

>>> from pointformers.registry import Registry
>>> shapes = Registry("shape")
>>> @shapes.register("square", sides=4)
... def square(size=1.0):
...     return size * size
>>> shapes.build("square", size=2.0), shapes.info("square")["sides"]
(4.0, 4)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

__all__ = ["Registry", "Entry"]

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered name: its factory and its metadata (``info``)."""

    name: str
    factory: Callable[..., T]
    info: Any

    def signature(self) -> inspect.Signature:
        """The factory's constructor signature (a class's ``__init__`` without ``self``)."""
        return inspect.signature(self.factory)

    def accepts(self, option: str) -> bool:
        """Whether the factory takes a keyword ``option`` by name."""
        return option in self.signature().parameters


class Registry(Generic[T]):
    """Name -> (factory, metadata).

    Args:
        kind: what the entries are, for messages ("attention mechanism", "model", ...).
        info_type: called as ``info_type(**metadata)`` at registration (default: a plain dict),
            so a registry can require and default its metadata fields.
        on_register: optional ``hook(entry)`` run after a registration (e.g. to tag a class).
    """

    def __init__(self, kind: str, info_type: Callable[..., Any] = dict,
                 on_register: Callable[[Entry], None] | None = None):
        self.kind = kind
        self._info_type = info_type
        self._on_register = on_register
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, factory: Callable[..., T] | None = None, **metadata):
        """Register ``factory`` under ``name`` with ``metadata``; without a factory, a decorator."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def add(fn: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            info = self._info_type(**metadata)
            entry = Entry(name, fn, info)
            self._entries[name] = entry
            if self._on_register is not None:
                self._on_register(entry)
            return fn

        return add if factory is None else add(factory)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and plugins that register temporarily)."""
        self.get(name)
        del self._entries[name]

    def available(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> Entry[T]:
        """The entry of ``name``; ValueError listing the valid names otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; available: {', '.join(self.available())}") from None

    def info(self, name: str) -> Any:
        """The metadata of ``name``."""
        return self.get(name).info

    def build(self, name: str, **options) -> T:
        """Instantiate ``name`` with ``options``."""
        return self.get(name).factory(**options)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.available())

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> Mapping[str, Entry[T]]:
        """A read-only view name -> entry."""
        return dict(self._entries)


# ------------------------------------------------------------------------------ plugins
#: Environment variable naming plugins to import: module names or ``.py`` files, separated by
#: ``os.pathsep``. Subprocesses (benchmark workers, torchrun ranks) inherit it, so a mechanism a
#: plugin registers is known in every process of a run.
PLUGIN_ENV = "POINTFORMERS_PLUGINS"


def load_plugins(specs: "list[str] | tuple[str, ...] | None" = None) -> list:
    """Import plugins that register mechanisms, models or tasks; returns the modules.

    ``specs``: module names (``my_package.my_attention``) or paths of ``.py`` files; default: the
    entries of :data:`PLUGIN_ENV`. Each is imported once per process (a file under a module name
    derived from its resolved path). Raises ValueError naming the plugin when it cannot be imported.
    """
    import hashlib
    import importlib
    import importlib.util
    import os
    import sys

    if specs is None:
        specs = [s for s in os.environ.get(PLUGIN_ENV, "").split(os.pathsep) if s]
    modules = []
    for spec in specs:
        try:
            if spec.endswith(".py"):
                path = os.path.realpath(spec)
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"no such file {spec!r}")
                name = "pointformers_plugin_" + hashlib.sha1(path.encode()).hexdigest()[:12]
                if name not in sys.modules:
                    loader_spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(loader_spec)
                    sys.modules[name] = module
                    try:
                        loader_spec.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
                modules.append(sys.modules[name])
            else:
                modules.append(importlib.import_module(spec))
        except Exception as exc:  # noqa: BLE001 - report any failure the same way
            raise ValueError(f"plugin {spec!r}: cannot be imported ({type(exc).__name__}: {exc})") from exc
    return modules

"""Tasks by name: what the CLI and the engine need to train and evaluate any (task, model) pair.

A task registers one :class:`TaskSpec`. A config names it with ``task.name``; the spec
declares the keys its ``data:`` and ``task:`` sections accept (with defaults), loads the
prepared samples of each split, and builds the object the engine trains with
(:class:`pointformers.engine.Task`: ``loss(model, sample, generator)`` and
``evaluate(model, samples) -> dict``).

Schema convention (shared with :mod:`pointformers.cli`): ``key -> tuple of accepted types``
where ``None`` in the tuple allows YAML null, ``float`` also accepts ints and numeric
strings, ``dict``/``list`` accept mappings/sequences.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..registry import Registry

__all__ = ["TaskSpec", "TASKS", "register_task", "get_task", "available_tasks", "config_section", "check_data_seed"]


@dataclass(frozen=True)
class TaskSpec:
    """One task's description for configs, the CLI and the engine.

    Attributes:
        name: the value of ``task.name`` in a config (e.g. ``"tracking"``, ``"pileup"``).
        description: one line for ``--help`` and error messages.
        data_schema, data_defaults: keys of the ``data:`` section and their default values
            (every schema key must have a default; ``None`` allowed when the schema allows it).
        task_schema, task_defaults: the same for the ``task:`` section (without ``name``).
        load: ``load(cfg, splits, progress) -> {split: [sample, ...]}`` -- generate or read the
            data (cached on disk where that helps) and prepare model inputs and targets.
        build: ``build(cfg) -> task object`` with ``loss`` and ``evaluate`` (see module doc).
        metric, mode: the validation metric key that selects ``best.pt`` and "max"/"min".
        validate: optional ``validate(cfg)``: extra range checks of a resolved config; raise
            ``ValueError("section.key: what was expected, got ...")`` (one line).
        generate: optional ``generate(cfg, splits) -> list[str]``: write the data set's cache
            files for ``pointformers generate``; returns the paths written.
        default_model: the model name a config of this task uses when it names none.
        extra: free-form metadata.
        baselines: optional ``baselines(cfg, samples) -> {row name: metrics}``: reference
            methods that need no training (e.g. tracking's kNN in (eta, phi)), printed by
            ``pointformers evaluate`` beside the model.
        plot: optional ``plot(cfg, model, samples, out_dir) -> list[Path]``: task-specific
            figures of a trained model on validation samples (e.g. tracking's event display),
            drawn by ``pointformers plot``.
        moved_keys: ``{task key: model option}`` of keys that moved from the ``task:`` section to
            ``model.options``: a config (file, ``--set`` or a checkpoint's) that still has one loads with
            a warning, its value moved (unless the model options set it already).
    """

    name: str
    description: str
    data_schema: Mapping[str, tuple]
    data_defaults: Mapping[str, Any]
    task_schema: Mapping[str, tuple]
    task_defaults: Mapping[str, Any]
    load: Callable[[Mapping[str, Any], Sequence[str], bool], dict[str, list]]
    build: Callable[[Mapping[str, Any]], Any]
    metric: str
    mode: str = "max"
    validate: Callable[[Mapping[str, Any]], None] | None = None
    generate: Callable[[Mapping[str, Any], Sequence[str]], list[str]] | None = None
    default_model: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    baselines: Callable[[Mapping[str, Any], Sequence[Any]], dict[str, dict[str, float]]] | None = None
    plot: Callable[[Mapping[str, Any], Any, Sequence[Any], Any], list] | None = None
    moved_keys: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            raise ValueError(f"TaskSpec {self.name!r}: mode must be 'max' or 'min', got {self.mode!r}")
        for section, schema, defaults in (("data", self.data_schema, self.data_defaults),
                                          ("task", self.task_schema, self.task_defaults)):
            missing = sorted(set(schema) - set(defaults))
            unknown = sorted(set(defaults) - set(schema))
            if missing or unknown:
                raise ValueError(f"TaskSpec {self.name!r}: {section} defaults must cover exactly the schema keys "
                                 f"(missing {missing}, unknown {unknown})")
        if set(self.moved_keys) & set(self.task_schema):
            raise ValueError(f"TaskSpec {self.name!r}: moved_keys {sorted(set(self.moved_keys) & set(self.task_schema))} "
                             f"are still task keys")


def _spec_info(spec: TaskSpec) -> TaskSpec:
    return spec


#: The registry of tasks (the package's one registry type): factory = the spec's ``build``,
#: metadata = the :class:`TaskSpec` itself.
TASKS: Registry = Registry("task", _spec_info)


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` under ``spec.name`` (a second registration of the same name is an error)."""
    if spec.name in TASKS:
        if TASKS.info(spec.name) is spec:
            return spec
        raise ValueError(f"task {spec.name!r} is already registered")
    TASKS.register(spec.name, spec.build, spec=spec)
    return spec


def _load_builtin() -> None:
    # Task modules register themselves on import; importing them here keeps the registry
    # complete for the CLI without the lower layers importing the CLI.
    import importlib

    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)


#: Modules that define the built-in tasks (each calls :func:`register_task` at import).
_BUILTIN_MODULES: list[str] = ["pointformers.tasks.tracking.spec", "pointformers.tasks.pileup",
                               "pointformers.tasks.shapes", "pointformers.tasks.listops",
                               "pointformers.tasks.clustering", "pointformers.tasks.potential",
                               "pointformers.tasks.point_mae", "pointformers.tasks.language_model",
                               "pointformers.tasks.images", "pointformers.tasks.lra_text",
                               "pointformers.tasks.graphs", "pointformers.tasks.lra_retrieval",
                               "pointformers.tasks.lra_image"]


def available_tasks() -> list[str]:
    """Sorted names of the registered tasks."""
    _load_builtin()
    return TASKS.available()


def get_task(name: str) -> TaskSpec:
    """The :class:`TaskSpec` named ``name``; ValueError listing the valid names otherwise."""
    _load_builtin()
    if name not in TASKS:
        raise ValueError(f"task.name: unknown task {name!r} (valid: {', '.join(TASKS.available())})")
    return TASKS.info(name)


def config_section(cfg: Mapping[str, Any], name: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Section ``name`` of a config over the task's ``defaults`` (``task.name`` dropped); ValueError if not a mapping."""
    sec = cfg.get(name) or {}
    if not isinstance(sec, Mapping):
        raise ValueError(f"{name}: expected a mapping, got {type(sec).__name__}")
    return {**defaults, **{k: v for k, v in sec.items() if k != "name"}}


def check_data_seed(data: Mapping[str, Any]) -> None:
    """``data.seed`` must be an integer >= 0 (one-line ValueError naming the key)."""
    seed = data["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"data.seed: must be an integer >= 0, got {seed!r}")

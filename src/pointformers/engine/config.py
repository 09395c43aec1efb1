"""Experiment configs: YAML files with ``--set key=value`` overrides, validated against the task's schema.

A config has four sections and an output folder::

    data:  {...}                      # keys of the task's TaskSpec.data_schema
    model: {name: hept-tracking, options: {num_regions: 8}}
    task:  {name: tracking, ...}      # task.name selects the TaskSpec (default "tracking")
    train: {epochs: 8, lr: 0.001, batch_size: 1, precision: fp32, ...}   # TrainConfig fields
    out: runs/tracking-hept-small

Layers, later ones winning: a *base* (the task's defaults -- its TaskSpec defaults, the
TrainConfig defaults with the task's metric/mode, its default model -- or a full config
such as the demo's), the YAML file, then the ``--set`` items (values parsed as YAML). When
a layer switches ``task.name`` the base becomes the new task's defaults; when it switches
``model.name`` the model options collected so far are dropped.

Validation: an unknown key, a wrong type or a bad value raises :class:`ConfigError` whose
message is one line starting with the dotted key (``train.lr: expected a number, got
'fast'``). ``model.options`` are checked against the model constructor's signature where
it can be inspected (a factory ``def f(**options) -> SomeModule`` is checked against
``SomeModule.__init__``).
"""
from __future__ import annotations

import copy
import inspect
import os
import typing
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from torch import nn

from .trainer import PRECISIONS, TrainConfig

__all__ = ["ConfigError", "TRAIN_SCHEMA", "DEFAULT_TASK", "config_schema", "task_default_config", "parse_set",
           "merge_layer", "load_config", "resolve_config", "coerce_value", "model_option_names", "read_yaml_config",
           "dump_config"]

DEFAULT_TASK = "tracking"


class ConfigError(ValueError):
    """A bad config key or value; the message is one line starting with the dotted key."""


#: Accepted types of the ``train:`` keys (:class:`TrainConfig` fields). ``None`` = YAML null allowed.
TRAIN_SCHEMA: dict[str, tuple] = {
    "epochs": (int,), "lr": (float,), "step_size": (int,), "gamma": (float,), "weight_decay": (float,),
    "optimizer": (str,), "betas": (list,), "eps": (float,), "momentum": (float,), "nesterov": (bool,),
    "decay_exempt": (bool,), "schedule": (str,), "schedule_unit": (str,), "min_lr": (float,),
    "warmup": (str, None), "warmup_steps": (int,), "patience": (int,),
    "plateau_metric": (str, None), "plateau_mode": (str, None), "grad_clip": (float, None),
    "seed": (int,), "metric": (str,), "mode": (str,), "progress": (bool, None),
    "batch_size": (int,), "precision": (str,), "compile": (bool, str), "tensorboard": (bool, None),
    "device": (str,), "find_unused_parameters": (bool,),
}
assert set(TRAIN_SCHEMA) == set(TrainConfig.field_names()), "TRAIN_SCHEMA must list every TrainConfig field"

_MODEL_SCHEMA: dict[str, tuple] = {"name": (str, None), "options": (dict, None)}


# ----------------------------------------------------------------------------- values
def _describe(types: tuple) -> str:
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
             list: "a list"}
    parts = [words.get(t, getattr(t, "__name__", str(t))) for t in types if t is not None]
    return " or ".join(parts) + (" or null" if None in types else "")


def coerce_value(key: str, value: Any, types: tuple) -> Any:
    """``value`` as the schema type ``types`` (a tuple; ``None`` = null allowed; ``float`` also takes
    ints and numeric strings such as PyYAML's "1e-3"; ``int`` takes integral floats).

    Raises:
        ConfigError naming ``key`` and what was expected.
    """
    if value is None:
        if None in types:
            return None
        raise ConfigError(f"{key}: must not be null (expected {_describe(types)})")
    if bool in types and isinstance(value, bool):
        return value
    if int in types and not isinstance(value, bool):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    if float in types and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    if str in types and isinstance(value, str):
        return value
    if dict in types and isinstance(value, Mapping):
        return dict(value)
    if list in types and isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"{key}: expected {_describe(types)}, got {value!r}")


# ----------------------------------------------------------------------------- schema
def _spec(name: Any):
    from ..tasks.registry import get_task

    if not isinstance(name, str):
        raise ConfigError(f"task.name: expected a string, got {name!r}")
    try:
        return get_task(name)
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


def config_schema(task_name: str = DEFAULT_TASK) -> dict[str, Any]:
    """The schema of a config of task ``task_name``: section -> {key: types}, ``out`` -> types."""
    spec = _spec(task_name)
    return {"data": dict(spec.data_schema), "model": dict(_MODEL_SCHEMA),
            "task": {"name": (str,), **dict(spec.task_schema)}, "train": dict(TRAIN_SCHEMA), "out": (str,)}


def task_default_config(task_name: str = DEFAULT_TASK) -> dict[str, Any]:
    """Every key of a config of ``task_name`` at its default (the TaskSpec's defaults, TrainConfig's
    defaults with the task's metric and mode, the task's default model with no options)."""
    spec = _spec(task_name)
    return {"data": copy.deepcopy(dict(spec.data_defaults)),
            "model": {"name": spec.default_model, "options": {}},
            "task": {"name": spec.name, **copy.deepcopy(dict(spec.task_defaults))},
            "train": {**asdict(TrainConfig()), "metric": spec.metric, "mode": spec.mode},
            "out": f"runs/{spec.name}"}


def _unknown(key: str, where: str, valid: Sequence[str]) -> ConfigError:
    return ConfigError(f"unknown config key {key!r} (valid keys{' in ' + repr(where) if where else ''}: "
                       f"{', '.join(sorted(valid))})")


def merge_layer(cfg: Mapping[str, Any], layer: Mapping[str, Any], schema: Mapping[str, Any],
                source: str = "") -> dict[str, Any]:
    """``cfg`` updated by ``layer`` (nested; keys checked against ``schema``, values not yet coerced).

    ``model.options`` is free-form here (checked in :func:`resolve_config`); a layer that
    changes ``model.name`` starts from empty options.
    """
    if not isinstance(layer, Mapping):
        raise ConfigError(f"{source or 'config'}: expected a mapping at the top level, got {layer!r}")
    out = copy.deepcopy(dict(cfg))
    for section, value in layer.items():
        if section not in schema:
            raise _unknown(str(section), "", list(schema))
        sub = schema[section]
        if not isinstance(sub, dict):
            out[section] = value
            continue
        if value is None:
            continue  # "train:" with nothing under it
        if not isinstance(value, Mapping):
            raise ConfigError(f"{section}: expected a section (mapping), got {value!r}")
        node = dict(out.get(section) or {})
        if section == "model" and "name" in value and value["name"] != node.get("name"):
            node["options"] = {}
        for k, v in value.items():
            if k not in sub:
                raise _unknown(f"{section}.{k}", section, list(sub))
            if section == "model" and k == "options":
                if v is None:
                    v = {}
                if not isinstance(v, Mapping):
                    raise ConfigError(f"model.options: expected a mapping, got {v!r}")
                node["options"] = {**dict(node.get("options") or {}), **dict(v)}
            else:
                node[k] = v
        out[section] = node
    return out


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``["train.epochs=3", "model.options.num_regions=4"]`` -> nested dict (values parsed as YAML).

    Keys are checked later against the task's schema (:func:`merge_layer`)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if not key or any(not p for p in parts):
            raise ConfigError(f"--set {item!r}: expected a dotted key such as train.epochs")
        if len(parts) > 3 or (len(parts) == 3 and parts[:2] != ["model", "options"]):
            raise ConfigError(f"unknown config key {key!r} (only model.options.* goes three levels deep)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {p!r} was already set to a value")
            node = nxt
        node[parts[-1]] = value
    return out


def _task_name_of(layer: Mapping[str, Any] | None) -> Any:
    if isinstance(layer, Mapping) and isinstance(layer.get("task"), Mapping):
        return layer["task"].get("name")
    return None


def read_yaml_config(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in YAML file ``path``; ConfigError naming the file (and line) otherwise."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {str(p)!r}: no such file")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--config {str(p)!r}:{where} invalid YAML ({str(exc).splitlines()[0]})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {str(p)!r}: cannot be read ({exc})") from None
    if loaded is None:  # an empty file (or comments only), e.g. one cut short: not "all defaults"
        raise ConfigError(f"--config {str(p)!r}: the file holds no settings (empty); give a mapping of sections")
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"--config {str(p)!r}: expected a mapping at the top level")
    return dict(loaded)


def _move_keys(layer: Mapping[str, Any] | None, spec: Any, source: str) -> Mapping[str, Any] | None:
    """``layer`` with the task keys that moved to ``model.options`` (``spec.moved_keys``) moved there, with a
    warning naming ``source``; a value the layer's model options already set wins."""
    task = layer.get("task") if isinstance(layer, Mapping) else None
    moved = [k for k in spec.moved_keys if isinstance(task, Mapping) and k in task]
    if not moved:
        return layer
    out = copy.deepcopy(dict(layer))
    model = dict(out.get("model") or {})
    options = dict(model.get("options") or {})
    for key in moved:
        value = out["task"].pop(key)
        options.setdefault(spec.moved_keys[key], value)
        warnings.warn(f"{source or 'config'}: task.{key} is now model.options.{spec.moved_keys[key]}; "
                      f"read as that (update the config)", UserWarning, stacklevel=3)
    model["options"] = options
    out["model"] = model
    return out


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (default: the task's defaults) updated by the YAML file at ``path`` and the ``--set``
    items, then validated by :func:`resolve_config`. Returns the full, normalised config."""
    loaded = read_yaml_config(path) if path is not None else {}
    sets = parse_set(overrides)
    base_name = _task_name_of(base) or DEFAULT_TASK if base is not None else None
    name = _task_name_of(sets) or _task_name_of(loaded) or base_name or DEFAULT_TASK
    spec = _spec(name)
    base = _move_keys(base, spec, "the saved config")
    loaded = _move_keys(loaded, spec, f"--config {str(path)!r}")
    sets = _move_keys(sets, spec, "--set")
    cfg = copy.deepcopy(dict(base)) if base is not None and base_name == name else task_default_config(name)
    schema = config_schema(name)
    cfg = merge_layer(cfg, loaded, schema, f"--config {str(path)!r}" if path is not None else "")
    cfg = merge_layer(cfg, sets, schema, "--set")
    if path is None:
        return resolve_config(cfg)
    try:
        return resolve_config(cfg)
    except ValueError as exc:  # a value the file (or --set) gave: say which file the key is from
        where = f"--config {str(path)!r}" + (" with --set" if sets else "")
        raise ConfigError(f"{exc} (from {where})") from None


# ----------------------------------------------------------------------------- resolution
def _factory(name: str):
    from ..models import MODELS

    return MODELS.get(name).factory if name in MODELS else None


def model_option_names(name: str) -> set[str] | None:
    """Option names model ``name``'s constructor accepts, or None where that cannot be inspected
    (a ``**kwargs`` factory without a return annotation naming an ``nn.Module`` class)."""
    factory = _factory(name)
    return None if factory is None else _accepted_names(factory, depth=0)


def _accepted_names(fn: Any, depth: int) -> set[str] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return names
    if depth > 0 or inspect.isclass(fn):
        return None
    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references
        return None
    if inspect.isclass(ret) and issubclass(ret, nn.Module):
        inner = _accepted_names(ret, depth + 1)
        return None if inner is None else names | inner
    return None


def _check_model(model: Mapping[str, Any]) -> None:
    from ..models import available

    name = model["name"]
    if name is None:
        raise ConfigError("model.name: missing (this task has no default model; set model.name)")
    if name not in available():
        raise ConfigError(f"model.name: unknown model {name!r} (valid: {', '.join(available())})")
    valid = model_option_names(name)
    if valid is not None:
        for k in model["options"]:
            if k not in valid:
                raise ConfigError(f"unknown config key 'model.options.{k}' (valid: {', '.join(sorted(valid))})")


def resolve_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Fill missing keys with the task's defaults, type-check every key, check value ranges
    (TrainConfig, the TaskSpec's ``validate``, the model's option names). Returns a normalised
    copy. Raises ConfigError (one line, naming the key)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"config: expected a mapping, got {type(cfg).__name__}")
    name = _task_name_of(cfg) or DEFAULT_TASK
    spec = _spec(name)
    schema = config_schema(name)
    full = merge_layer(task_default_config(name), cfg, schema)
    out: dict[str, Any] = {}
    for section, sub in schema.items():
        if not isinstance(sub, dict):
            out[section] = coerce_value(section, full.get(section), sub)
            continue
        out[section] = {k: coerce_value(f"{section}.{k}", full[section].get(k), types) for k, types in sub.items()}
    out["model"]["options"] = dict(out["model"]["options"] or {})
    _check_model(out["model"])
    tr = out["train"]
    tr["betas"] = [coerce_value(f"train.betas[{i}]", b, (float,)) for i, b in enumerate(tr["betas"])]
    if tr["precision"] not in PRECISIONS:
        raise ConfigError(f"train.precision: expected one of {', '.join(PRECISIONS)}, got {tr['precision']!r}")
    try:
        TrainConfig(**tr).validate()
    except ValueError as exc:
        raise ConfigError(f"train.{str(exc).splitlines()[0]}") from None
    if spec.validate is not None:
        try:
            spec.validate(out)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None
    return out


def dump_config(cfg: Mapping[str, Any]) -> str:
    """YAML text of a config (section order kept)."""
    import yaml

    return yaml.safe_dump(dict(cfg), sort_keys=False)

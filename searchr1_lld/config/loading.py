"""Loading configs: YAML (with ``_base_`` chains) + ``key=value`` dotted overrides -> typed, validated dataclasses.

Rules
- Unknown keys (in YAML or overrides) are errors that name the key and list the known ones.
- Values are type-checked against the dataclass annotations (``int`` accepts no floats, ``float`` accepts ints,
  ``Literal`` choices are enforced, ``Optional`` accepts ``null``/``None``).
- ``Config.validate()`` rejects impossible values (lambda < 0, mini-batch larger than batch, ...) with the key's name.
- A YAML file may start with ``_base_: other.yaml`` (path relative to the file); the file's keys override the base's.
- ``algorithm.method: NAME`` fills in the settings the named method pins (config/methods.py); a pinned key written
  with another value, in any file of the chain or an override, is an error. ``algorithm.rollout_correction.preset``
  does the same for a rollout-correction preset (config/correction_presets.py), and fills in its thresholds.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from searchr1_lld.config.correction_presets import CORRECTION_PRESETS
from searchr1_lld.config.methods import METHODS
from searchr1_lld.config.root import Config
from searchr1_lld.config.sections import RENAMED_KEYS, AlgorithmConfig
from searchr1_lld.config.validation import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


class _ConfigLoader(yaml.SafeLoader):
    """YAML loader for configs: only ``true``/``false`` are booleans.

    PyYAML follows YAML 1.1, where ``on/off/yes/no`` are booleans too, so ``ma: off`` would silently become False;
    here they stay strings and the field's type decides.
    """


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _yaml_load(text: Any) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return the (possibly converted) value or raise ConfigError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: unexpected value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)} (got {value!r})")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list (got {value!r})")
        (item_tp,) = args or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {sorted(f.name for f in dataclasses.fields(tp))} (got {value!r})")
        return build_dataclass(tp, value, key)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false (got {value!r})")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer (got {value!r})")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number (got {value!r})")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string (got {value!r})")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def build_dataclass(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        if f"{where}{unknown[0]}" in RENAMED_KEYS:
            raise ConfigError(f"{where}{unknown[0]} is now {RENAMED_KEYS[where + unknown[0]]}: write it there "
                              f"(a settings section of its own)")
        raise ConfigError(f"unknown key {where}{unknown[0]!s}; known keys here: {sorted(names)}")
    base = cls()
    kwargs = {}
    for name in names:
        key = f"{prefix}.{name}" if prefix else name
        if name in values:
            current = getattr(base, name)
            if dataclasses.is_dataclass(current) and isinstance(values[name], dict):
                merged = {**dataclasses.asdict(current), **values[name]}
                kwargs[name] = build_dataclass(type(current), merged, key)
            else:
                kwargs[name] = _coerce(values[name], hints[name], key)
    return dataclasses.replace(base, **kwargs)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config YAML, resolving ``_base_`` chains (relative to the file)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"_base_ cycle through {path}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with open(path) as f:
        raw = _yaml_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    base_ref = raw.pop("_base_", None)
    if base_ref is None:
        return raw
    base = read_yaml(path.parent / base_ref, _seen + (path,))
    return _deep_merge(base, raw)


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b.c=value"`` -> ``("a.b.c", yaml-parsed value)``."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    value = _yaml_load(raw) if raw.strip() != "" else ""
    return key, value


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    values = dict(values)
    for text in overrides:
        key, value = parse_override(text)
        node = values
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
            node[part] = dict(child)
            node = node[part]
        node[parts[-1]] = value
    return values


def config_from_dict(values: dict[str, Any]) -> Config:
    """A validated :class:`~searchr1_lld.config.Config` from a nested dict (unknown keys and bad types: errors), its
    ``algorithm.rollout_correction.preset`` and ``algorithm.method`` expanded (:func:`expand_correction_preset`,
    :func:`expand_method`)."""
    return build_dataclass(Config, expand_method(expand_correction_preset(values))).validate()


def expand_method(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the settings that its ``algorithm.method`` pins (config/methods.py) filled in. A pinned key
    that ``values`` sets to another value is a ConfigError naming the key, the method and both values; an unknown
    method lists the known ones; no method (or '') returns ``values`` unchanged."""
    alg = values.get("algorithm")
    name = alg.get("method", "") if isinstance(alg, dict) else ""
    if not name:
        return values
    if name not in METHODS:
        raise ConfigError(f"algorithm.method: unknown method {name!r}; known: {list(METHODS)} (or '' for none)")
    return _pin(values, METHODS[name].settings, f"algorithm.method={name}",
                "remove the key, or set algorithm.method='' and write the method's switches yourself")


def expand_correction_preset(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with what its ``algorithm.rollout_correction.preset`` (config/correction_presets.py) pins and, where
    ``values`` does not write them, its thresholds. Errors as :func:`expand_method`'s, and a key that the method pins
    to another value is one too."""
    alg = values.get("algorithm")
    rc = alg.get("rollout_correction") if isinstance(alg, dict) else None
    name = rc.get("preset", "") if isinstance(rc, dict) else ""
    if not name:
        return values
    if name not in CORRECTION_PRESETS:
        raise ConfigError(f"algorithm.rollout_correction.preset: unknown preset {name!r}; known: "
                          f"{list(CORRECTION_PRESETS)} (or '' for none)")
    preset, method = CORRECTION_PRESETS[name], alg.get("method", "")
    for key in sorted(preset.pins.keys() & (METHODS[method].settings if method in METHODS else {}).keys()):
        if preset.pins[key] != METHODS[method].settings[key]:
            raise ConfigError(f"algorithm.{key}: algorithm.method={method} pins it to "
                              f"{METHODS[method].settings[key]!r} and algorithm.rollout_correction.preset={name} to "
                              f"{preset.pins[key]!r}; drop one of the two")
    out = _pin(values, preset.pins, f"algorithm.rollout_correction.preset={name}",
               "remove the key, or set algorithm.rollout_correction.preset='' and write the settings yourself")
    for dotted, value in preset.thresholds.items():
        node, leaf = _node(out, dotted)
        node.setdefault(leaf, value)
    return out


def _node(values: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    """(the dict that holds ``algorithm.<dotted>`` in ``values``, its leaf name), the dicts on the way copied."""
    *path, leaf = dotted.split(".")
    node = values["algorithm"] = dict(values["algorithm"])
    for part in path:
        node[part] = dict(node.get(part) or {})
        node = node[part]
    return node, leaf


def _pin(values: dict[str, Any], settings: dict[str, Any], owner: str, advice: str) -> dict[str, Any]:
    """``values`` with every ``algorithm.<dotted>: value`` of ``settings`` set; one that ``values`` sets to another
    value is a ConfigError naming the key, the ``owner`` that pins it, both values and the ``advice``."""
    out = _deep_merge(values, {})
    for dotted, pinned in settings.items():
        node, leaf = _node(out, dotted)
        if leaf in node:
            given = _coerce(node[leaf], _field_type(AlgorithmConfig, dotted), f"algorithm.{dotted}")
            if given != pinned:
                raise ConfigError(f"algorithm.{dotted}: {owner} pins it to {pinned!r}, but the config sets "
                                  f"{given!r}; {advice}")
        node[leaf] = pinned
    return out


def _field_type(cls: type, dotted: str) -> Any:
    """The annotation of the field ``dotted`` (``"llds.enabled"``) of the dataclass ``cls``."""
    head, _, rest = dotted.partition(".")
    tp = typing.get_type_hints(cls)[head]
    return _field_type(tp, rest) if rest else tp


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from an optional YAML file and ``key=value`` overrides."""
    values = read_yaml(path) if path else {}
    values = apply_overrides(values, list(overrides or []))
    return config_from_dict(values)


def flatten_dict(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> ``{"dotted.key": value}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: Config | dict[str, Any], new: Config | dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old value, new value)}`` for every key whose value differs (a key missing on one side counts,
    with value None). Accepts Configs or their ``to_dict()`` / YAML dicts."""
    fa = flatten_dict(old if isinstance(old, dict) else old.to_dict())
    fb = flatten_dict(new if isinstance(new, dict) else new.to_dict())
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def save_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML (its fields in declaration order), readable by :func:`load_config`."""
    with open(path, "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)


def resolve_repo_path(path: str | Path) -> Path:
    """A config-file path named inside a config: absolute as is, relative to the repository root otherwise."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path

"""``python train.py --help-config``: every config field with its type, default and help, grouped by section."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator

from retriever.modes import MODES
from searchr1_lld.config.correction_presets import format_correction_presets
from searchr1_lld.config.methods import format_presets
from searchr1_lld.config.root import Config
from searchr1_lld.config.validation import registered_names


def _type_text(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union,) or type(tp).__name__ == "UnionType":
        return " or ".join("null" if a is type(None) else _type_text(a) for a in args)
    if origin is list:
        return f"list[{_type_text(args[0])}]" if args else "list"
    return getattr(tp, "__name__", str(tp))


def iter_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any, Any]]:
    """(dotted key, field, type, default) of every leaf field of the dataclass ``cls``, depth first."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            yield from iter_fields(type(value), key + ".")
        else:
            yield key, f, hints[f.name], value


def format_help(cls: type = Config, prefix: str = "") -> str:
    """The config reference: one block per section (its help), one line per field: key, type, default, help. A field
    that names a registered function shows the names registered now (a name registered by a user's module too)."""
    lines: list[str] = []
    section = None
    registered = {f"algorithm.{k}": names for k, names in registered_names().items()} if cls is Config else {}
    registered.update({"retriever.mode": list(MODES)} if cls is Config else {})
    for key, f, tp, default in iter_fields(cls, prefix):
        head = key.rsplit(".", 1)[0] if "." in key else ""
        if head != section:
            section = head
            doc = _section_help(cls, head[len(prefix):]) if head != prefix.rstrip(".") else (cls.__doc__ or "")
            lines += ["", f"[{head or 'top level'}]" + (f"  {doc}" if doc else "")]
        kind = "|".join(registered[key]) if key in registered else _type_text(tp)
        lines.append(f"  {key} ({kind}, default {default!r}): {f.metadata.get('help', '')}")
    text = "\n".join(lines).lstrip("\n") + "\n"
    return text + "\n" + format_presets() + "\n" + format_correction_presets() if cls is Config else text


def _section_help(cls: type, dotted: str) -> str:
    node: Any = cls
    field_help = ""
    for part in [p for p in dotted.split(".") if p]:
        f = {f.name: f for f in dataclasses.fields(node)}[part]
        field_help = f.metadata.get("help", "")
        node = typing.get_type_hints(node)[part]
    return field_help

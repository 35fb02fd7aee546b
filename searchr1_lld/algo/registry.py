"""Registries by name: a table of functions keyed by the name a config gives them (policy losses, KL estimators, the
terms of the objective). A name is registered once; looking up an unknown name lists the registered ones.

The table is passed at every call (not captured), so a module's table can be swapped (a test's copy) and its
``register_*`` / lookup functions follow it.
"""

from __future__ import annotations

from typing import Callable, Mapping, TypeVar

F = TypeVar("F", bound=Callable)


def register(table: dict[str, F], kind: str, *names: str) -> Callable[[F], F]:
    """Decorator: register ``fn`` in ``table`` under each of ``names`` (``kind`` names the table in errors)."""

    def decorate(fn: F) -> F:
        for name in names:
            if name in table:
                raise ValueError(f"{kind} {name!r} is already registered ({table[name].__name__})")
            table[name] = fn
        return fn

    return decorate


def lookup(table: Mapping[str, F], kind: str, name: str) -> F:
    """The function registered in ``table`` as ``name``; a ValueError listing the registered names otherwise."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; registered: {sorted(table)}")
    return table[name]

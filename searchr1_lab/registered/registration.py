"""A registered study's registration: which arms run at which learning rates with which seeds, fixed in one JSON
file (``docs/lab/stepsize/registration.json``, the default; the trust-region study's and the frontier's are built
the same way) before any of its grid runs, and read by the grid driver
(``python -m searchr1_lab grid --registration FILE``) and the analysis.

An arm is a method preset (``algorithm.method``, config/methods.py) plus the overrides that make it a control (a
larger ``algorithm.kl_coef``, another ``algorithm.llds.lam``); its learning rates are its own, so a control matched by
learning rate runs at the rate the pilot chose. The file's keys (:func:`validate` checks them)::

    {"registration": {"status": "draft" | "registered" | "exploratory", "title", "config", "runs_dir", "train_dir",
                      "report_dir", "analysis_code": [...], "analysis_commit", "grid_command"},
     "world": {"config", "hash"},
     "seeds": [0, 1, ...],
     "arms": {NAME: {"method": PRESET, "label": TEXT, "overrides": ["key=value", ...], "lrs": [LR, ...],
                     "seeds": [...] (optional: this arm's own seeds instead of the registration's)}, ...},
     ... the analysis's own keys (label, hypotheses, sensitivity, alarms; :mod:`.analysis`)}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from searchr1_lld.config import ConfigError, apply_overrides, config_from_dict
from searchr1_lab.methods import ARMS, REPO_ROOT, Method, read_lab_config

STEPSIZE_FILE = "docs/lab/stepsize/registration.json"
REGISTERED = "registered"
# an exploratory plan (a calibration: outside any confirmatory analysis), committed before its runs like a registration
EXPLORATORY = "exploratory"


def load_registration(path: str | Path = REPO_ROOT / STEPSIZE_FILE) -> dict[str, Any]:
    """The registration file, checked (:func:`validate`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no registration at {path}")
    reg = json.loads(path.read_text())
    validate(reg, path)
    return reg


def validate(reg: Mapping[str, Any], path: str | Path = STEPSIZE_FILE) -> None:
    """ConfigError naming what is wrong: missing keys, an arm whose method is not a preset, an override the config
    does not have, learning rates that are not positive, seeds that repeat."""
    block = reg.get("registration") or {}
    missing = [k for k in ("status", "config", "runs_dir", "train_dir") if k not in block]
    missing += [k for k in ("seeds", "arms") if k not in reg]
    if missing:
        raise ConfigError(f"{path}: missing {missing}")
    seeds = reg["seeds"]
    if not seeds or len(set(seeds)) != len(seeds) or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ConfigError(f"{path}: seeds must be distinct non-negative integers, got {seeds}")
    values, _, _ = read_lab_config(block["config"], [])
    for name, arm in reg["arms"].items():
        own = arm_seeds(reg, arm)
        if not own or len(set(own)) != len(own) or any(not isinstance(s, int) or s < 0 for s in own):
            raise ConfigError(f"{path}: arm {name!r}: seeds must be distinct non-negative integers, got {own}")
        if arm.get("method") not in ARMS:
            raise ConfigError(f"{path}: arm {name!r} has method {arm.get('method')!r}, not one of {list(ARMS)}")
        lrs = arm.get("lrs") or []
        if not lrs or any(not isinstance(lr, (int, float)) or lr <= 0 for lr in lrs):
            raise ConfigError(f"{path}: arm {name!r} needs positive learning rates, got {lrs}")
        try:
            config_from_dict(apply_overrides(values, list(arm_method(name, arm).overrides)))
        except (ConfigError, KeyError, ValueError, TypeError) as e:
            raise ConfigError(f"{path}: arm {name!r}: {e}") from None


def arm_method(name: str, arm: Mapping[str, Any]) -> Method:
    """The lab arm of a registered arm: its preset's switch, then its own overrides."""
    return Method(name, arm.get("label") or ARMS[arm["method"]].label,
                  (*ARMS[arm["method"]].overrides, *arm.get("overrides", ())))


def arm_seeds(reg: Mapping[str, Any], arm: Mapping[str, Any]) -> list[int]:
    """An arm's seeds: its own ``seeds`` when it names them, else the registration's."""
    return list(arm.get("seeds", reg["seeds"]))


def cells(reg: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """Every (arm, learning rate, seed), seed by seed (an unfinished grid has whole seeds), arms in file order."""
    seeds = sorted({s for arm in reg["arms"].values() for s in arm_seeds(reg, arm)})
    return [(name, float(lr), seed) for seed in seeds for name, arm in reg["arms"].items()
            for lr in arm["lrs"] if seed in arm_seeds(reg, arm)]


def registration_of(compact_dir: str | Path, path: str | Path = REPO_ROOT / STEPSIZE_FILE) -> dict[str, Any] | None:
    """The registration at ``path`` when ``compact_dir`` is its runs dir, else None (also when there is none)."""
    if not Path(path).is_file():
        return None
    reg = json.loads(Path(path).read_text())
    runs_dir = (reg.get("registration") or {}).get("runs_dir")
    return reg if runs_dir and Path(compact_dir).resolve() == (REPO_ROOT / runs_dir).resolve() else None


def check_registered(reg: Mapping[str, Any], path: str | Path = STEPSIZE_FILE) -> None:
    """Refuse (ConfigError) a grid of a registration whose status is neither ``registered`` nor ``exploratory``: a
    run of a draft could not count as registered, nor as part of a committed exploratory plan."""
    status = reg["registration"].get("status")
    if status not in (REGISTERED, EXPLORATORY):
        raise ConfigError(f"{path} has status {status!r}: register it (status {REGISTERED!r}, or {EXPLORATORY!r} for "
                          f"an exploratory plan; committed) before its grid runs")

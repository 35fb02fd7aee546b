"""The paper's death-spiral signature in one run (pure: per-step arrays in, a verdict with its evidence out).

The paper (arXiv 2512.04220) describes GRPO failing in three phases: early stagnation (the reward rises, the
likelihood of correct responses stays flat), steady decay (the reward still rises, that likelihood falls) and
accelerated collapse (gradient norm and entropy explode, the reward drops). A run shows the signature when all three
parts below hold, in this order; each part is also reported on its own, with the numbers that decided it. The
values of ``N``, ``X``, ``k``, ``M`` and the windows are fixed in ``docs/lab/spiral/signature.json`` (their basis:
``docs/lab/spiral/signature.md``).

Notation. ``w``: the warm-up's end (the first step at the run's peak learning rate). A per-step series ``x`` is
smoothed by a trailing mean over its values at steps ``(t - W, t]`` and ``>= w`` (``x̄(t)``, needs one value;
``W = window`` for the training reward and the probe set, ``W = held_out_window`` for held-out EM, which is logged
every few steps). ``s = w + window - 1``: the first step whose reward window lies wholly after the warm-up.

(a) learning phase: ``p`` is the first step ``>= s`` at which the smoothed reward ``R̄`` is largest. The phase is
    ``[s, p]``; it is present when ``p - s >= N`` (``min_learning_steps``), ``R̄(p) - R̄(s) >= reward_gain`` and the
    smoothed held-out EM ``Ē(p) - Ē(s) >= held_out_gain``.
(b) LLD inside the phase: the largest drop ``L̄(t1) - L̄(t2)`` of the smoothed probe-set log-likelihood per token over
    steps ``s <= t1 < t2 <= p`` with ``R̄(t2) > R̄(t1)`` (the reward higher at the end of the fall than at its start:
    it still rises; among equal drops the latest ``t1``, then the earliest ``t2``); present when that drop is
    ``>= X`` (``lld_drop``). A fall after the reward's peak is outside
    the phase and never counts.
(c) sustained explosion: entropy and gradient norm both at least ``k`` (``explosion_ratio``) times their
    learning-phase level (the median over steps ``[w, max(p, s)]``) on at least ``M`` (``explosion_steps``)
    consecutive logged steps after ``s``, raw, not smoothed (a smoothed spike would look sustained); a step missing
    either value ends a stretch. The evidence also gives each series' longest stretch above its threshold alone.
Signature: (a), (b) and a stretch of (c) that starts after the likelihood began to fall (``t1`` of (b)).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

SIGNATURE_FILE = "docs/lab/spiral/signature.json"


@dataclass(frozen=True)
class SignatureParams:
    """The signature's free choices (units: steps, training-reward EM, held-out EM, nats per token, ratios)."""

    window: int  # W: steps in the trailing mean of the training reward and the probe set
    held_out_window: int  # steps in the trailing mean of held-out EM (logged every few steps)
    min_learning_steps: int  # N: the learning phase's length, at least
    reward_gain: float  # the smoothed training reward's rise over the phase, at least
    held_out_gain: float  # the smoothed held-out EM's rise over the phase, at least
    lld_drop: float  # X: the smoothed probe log-likelihood's fall while the reward rises, at least (nats/token)
    explosion_ratio: float  # k: entropy and gradient norm over their learning-phase level, at least
    explosion_steps: int  # M: consecutive steps of the explosion, at least

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SignatureParams":
        """The parameters from a dict holding exactly the fields (a missing or unknown key is a ValueError)."""
        names = {f.name for f in fields(cls)}
        if set(values) != names:
            raise ValueError(f"signature parameters: missing {sorted(names - set(values))}, "
                             f"unknown {sorted(set(values) - names)}")
        return cls(**values)


def load_params(path: str | Path) -> SignatureParams:
    """The registered parameters: the ``params`` block of a signature file (``docs/lab/spiral/signature.json``)."""
    return SignatureParams.from_dict(json.loads(Path(path).read_text())["params"])


@dataclass(frozen=True)
class RunSeries:
    """One run's logged series. ``steps`` [T] ascending training steps, each with ``reward`` [T]
    (``reward/em_mean``), ``entropy`` [T] (``actor/entropy``) and ``grad_norm`` [T] (``actor/grad_norm``), NaN where
    not logged; ``held_out_steps`` [E] / ``held_out`` [E] (``eval/val_sub_em``); ``probe_steps`` [P] / ``probe`` [P]
    (``probe/logp_per_token``); ``warmup_end``: the first step at the peak learning rate."""

    steps: np.ndarray
    reward: np.ndarray
    entropy: np.ndarray
    grad_norm: np.ndarray
    held_out_steps: np.ndarray
    held_out: np.ndarray
    probe_steps: np.ndarray
    probe: np.ndarray
    warmup_end: int


@dataclass
class Part:
    """One part of the signature: whether it holds and the numbers that decided it."""

    present: bool
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Signature:
    """The three parts and whether they make the signature together (in order)."""

    learning: Part
    lld: Part
    explosion: Part
    present: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trailing_mean(at: np.ndarray, steps: np.ndarray, values: np.ndarray, window: int, start: int) -> np.ndarray:
    """[len(at)]: for each step ``t`` of ``at``, the mean of the finite ``values`` [n] at ``steps`` [n] in
    ``(t - window, t]`` and ``>= start``; NaN where there is none."""
    ok = np.isfinite(values) & (steps >= start)
    s, v = steps[ok], values[ok]
    out = np.full(len(at), np.nan)
    for i, t in enumerate(at):
        sel = (s > t - window) & (s <= t)
        if sel.any():
            out[i] = v[sel].mean()
    return out


def _value(x: float) -> float | None:
    """A float for the evidence (None for NaN)."""
    return float(x) if math.isfinite(x) else None


def learning_phase(run: RunSeries, p: SignatureParams) -> tuple[Part, int, int]:
    """(a) and the phase's bounds ``(s, peak)`` (``peak == s`` when no step after ``s`` has a smoothed reward)."""
    s = run.warmup_end + p.window - 1
    after = run.steps >= s
    reward_bar = trailing_mean(run.steps, run.steps, run.reward, p.window, run.warmup_end)
    cand = after & np.isfinite(reward_bar)
    if not cand.any():
        return Part(False, {"start": s, "peak": None, "reason": "no training step after the warm-up's window"}), s, s
    idx = np.flatnonzero(cand)
    peak = int(run.steps[idx[int(np.argmax(reward_bar[idx]))]])
    ends = np.array([s, peak])
    r0, r1 = trailing_mean(ends, run.steps, run.reward, p.window, run.warmup_end)
    e0, e1 = trailing_mean(ends, run.held_out_steps, run.held_out, p.held_out_window, run.warmup_end)
    length, reward_gain, held_out_gain = peak - s, r1 - r0, e1 - e0
    present = bool(length >= p.min_learning_steps and reward_gain >= p.reward_gain
                   and math.isfinite(held_out_gain) and held_out_gain >= p.held_out_gain)
    return Part(present, {"start": s, "peak": peak, "steps": length, "reward_start": _value(r0),
                          "reward_peak": _value(r1), "reward_gain": _value(reward_gain),
                          "held_out_start": _value(e0), "held_out_peak": _value(e1),
                          "held_out_gain": _value(held_out_gain)}), s, peak


def lld_in_phase(run: RunSeries, p: SignatureParams, start: int, peak: int) -> Part:
    """(b): the largest fall of the smoothed probe likelihood between two steps of ``[start, peak]`` over which the
    smoothed reward rose."""
    at = run.steps[(run.steps >= start) & (run.steps <= peak)]
    reward_bar = trailing_mean(at, run.steps, run.reward, p.window, run.warmup_end)  # [n]
    probe_bar = trailing_mean(at, run.probe_steps, run.probe, p.window, run.warmup_end)  # [n]
    drop = probe_bar[:, None] - probe_bar[None, :]  # [n, n]: L̄(t1) - L̄(t2), t1 rows, t2 columns
    rises = reward_bar[None, :] > reward_bar[:, None]
    later = np.triu(np.ones((len(at), len(at)), dtype=bool), k=1)
    ok = later & rises & np.isfinite(drop)
    if not ok.any():
        return Part(False, {"drop": None, "from_step": None, "to_step": None,
                            "reason": "no two steps of the phase with the reward rising between them"})
    best = np.where(ok, drop, -np.inf)
    # ties (a flat stretch before the fall): the latest start and then the earliest end, where the fall happens
    rows, cols = np.nonzero(best >= best.max() - 1e-12)
    i = int(rows.max())
    j = int(cols[rows == i].min())
    return Part(bool(drop[i, j] >= p.lld_drop),
                {"drop": float(drop[i, j]), "from_step": int(at[i]), "to_step": int(at[j]),
                 "probe_from": float(probe_bar[i]), "probe_to": float(probe_bar[j]),
                 "reward_from": float(reward_bar[i]), "reward_to": float(reward_bar[j])})


def stretches(mask: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs of True in ``mask`` [n] as ``(first index, length)``, in order."""
    out, begin = [], None
    for i, m in enumerate(list(mask) + [False]):
        if m and begin is None:
            begin = i
        elif not m and begin is not None:
            out.append((begin, i - begin))
            begin = None
    return out


def explosion(run: RunSeries, p: SignatureParams, start: int, peak: int) -> tuple[Part, list[int]]:
    """(c) and the first step of every qualifying stretch (at least ``explosion_steps`` long, after ``start``)."""
    ref = (run.steps >= run.warmup_end) & (run.steps <= max(peak, start))
    levels = {name: float(np.nanmedian(x[ref])) if np.isfinite(x[ref]).any() else math.nan
              for name, x in (("entropy", run.entropy), ("grad_norm", run.grad_norm))}
    evidence: dict[str, Any] = {"entropy_level": _value(levels["entropy"]),
                                "grad_norm_level": _value(levels["grad_norm"])}
    if not all(math.isfinite(v) and v > 0 for v in levels.values()):
        return Part(False, {**evidence, "reason": "no positive learning-phase level"}), []
    with np.errstate(invalid="ignore"):
        alone = {name: (x >= p.explosion_ratio * levels[name]) & (run.steps > start)
                 for name, x in (("entropy", run.entropy), ("grad_norm", run.grad_norm))}
    runs = stretches(alone["entropy"] & alone["grad_norm"])
    qualifying = [int(run.steps[i]) for i, n in runs if n >= p.explosion_steps]
    longest = max(runs, key=lambda r: r[1], default=None)
    evidence.update({"longest_steps": longest[1] if longest else 0,
                     "longest_from": int(run.steps[longest[0]]) if longest else None,
                     "first_from": qualifying[0] if qualifying else None,
                     # each series alone: an explosion of one without the other (e.g. entropy high while the reward
                     # is zero everywhere, so no advantage and no gradient) is not the paper's, but worth seeing
                     **{f"{name}_alone_steps": max((n for _, n in stretches(mask)), default=0)
                        for name, mask in alone.items()}})
    return Part(bool(qualifying), evidence), qualifying


def signature(run: RunSeries, p: SignatureParams) -> Signature:
    """The three parts of the paper's signature in ``run`` and whether they hold together, in order (module
    docstring)."""
    learning, start, peak = learning_phase(run, p)
    lld = lld_in_phase(run, p, start, peak)
    burst, starts = explosion(run, p, start, peak)
    onset = lld.evidence.get("from_step")
    ordered = onset is not None and any(b > onset for b in starts)
    return Signature(learning, lld, burst, bool(learning.present and lld.present and burst.present and ordered))


def warmup_end(records: list[dict[str, Any]]) -> int:
    """The first training step whose logged learning rate (``actor/lr``, the rate of its last update) is the run's
    peak: where the warm-up ended. ValueError for a run that logged none."""
    lrs = [(int(r["step"]), float(r["actor/lr"])) for r in records
           if isinstance(r.get("actor/lr"), (int, float)) and math.isfinite(r["actor/lr"])]
    if not lrs:
        raise ValueError("the run logged no actor/lr: its warm-up's end is unknown")
    top = max(lr for _, lr in lrs)
    return min(step for step, lr in lrs if lr >= top * (1 - 1e-9))


def run_series(records: list[dict[str, Any]]) -> RunSeries:
    """A run's :class:`RunSeries` from its per-step records (a compact run file's ``records``: one dict per step with
    ``step`` and the metrics it logged; step 0 holds only the evaluations before training)."""

    def column(rows: list[dict[str, Any]], key: str) -> np.ndarray:
        return np.array([float(r[key]) if isinstance(r.get(key), (int, float)) else np.nan for r in rows])

    def logged(key: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [r for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return np.array([int(r["step"]) for r in rows], dtype=int), column(rows, key)

    trained = sorted((r for r in records if int(r["step"]) >= 1), key=lambda r: int(r["step"]))
    held_steps, held = logged("eval/val_sub_em")
    probe_steps, probe = logged("probe/logp_per_token")
    return RunSeries(steps=np.array([int(r["step"]) for r in trained], dtype=int),
                     reward=column(trained, "reward/em_mean"), entropy=column(trained, "actor/entropy"),
                     grad_norm=column(trained, "actor/grad_norm"), held_out_steps=held_steps, held_out=held,
                     probe_steps=probe_steps, probe=probe, warmup_end=warmup_end(trained))

"""Alarms over a run's per-step records, one registry (pure: records in, numbers out).

An alarm kind is a SCORE computed at step ``t`` from the records of steps ``<= t`` only (no look-ahead), registered by
name (:data:`ALARM_KINDS`, :func:`register_alarm`); the larger the score, the nearer the run is taken to be to a
collapse. An :class:`Alarm` is a kind with its settings and a threshold (:func:`make_alarm` builds one from a spec);
it fires at the first step whose score reaches the threshold (``score >= threshold``; a NaN score never fires). Three
users share the kinds: the trainer's phase detector (its drawdown alarm, :class:`.phases.PhaseDetector`), the
pre-registered comparison (thresholds fixed in its registration) and the step-size studies (thresholds matched to a
false-alarm rate on the runs that did not collapse, :mod:`searchr1_lab.stepsize.alarms`).

Kinds (settings in brackets; ``early`` median over the steps ``early_first..early_last`` of a :class:`ScoreWindow`,
NaN until a record of step ``early_last`` is in; ``trailing`` mean of the last ``trailing`` finite values):

- ``reward_drop`` [window]: ``early median(reward/em_mean) - trailing mean(reward/em_mean)``;
- ``probe_drop`` [window]: ``probe/initial_logp_per_token - probe/logp_per_token`` (latest; positive: the probe
  set's likelihood fell);
- ``correct_logp_drop`` [window]: ``early median - trailing mean`` of ``lld/correct_logp_old_per_token``;
- ``step_kl_rise`` [window]: ``trailing mean(lld/step_kl) / early median(lld/step_kl)`` (NaN when the early median is
  <= 0);
- ``drop_below_start`` [key, start_points = 1, reference_key]: the latest value of ``key`` below its start, the first
  value of ``reference_key`` when given, else the mean of the first ``start_points`` values (NaN until a later value
  exists); a spec names its threshold ``drop``;
- ``ratio_over_early`` [key, early_steps]: the latest value of ``key`` over the median of its first ``early_steps``
  values (NaN until a later value exists, or when that median is <= 0); a spec names its threshold ``ratio``;
- ``drop_from_best`` [key]: the best value of ``key`` so far minus its latest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

NAN = float("nan")
Records = Sequence[Mapping[str, Any]]


def finite(x: Any) -> bool:
    """A real, finite number (not None, not a bool, not NaN or infinite)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when there are none)."""
    if not values:
        return NAN
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def median_of_first(vals: Sequence[float], n: int) -> float:
    """The median of the first ``n`` of ``vals``, once a later value exists (NaN before)."""
    return median(vals[:n]) if len(vals) > n else NAN


def series(records: Records, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of the finite values of ``key``, in the records' order."""
    return [(int(r["step"]), float(r[key])) for r in records if finite(r.get(key))]


def values(records: Records, key: str) -> list[float]:
    """The finite values of ``key``, in the records' order (records without a ``step`` too)."""
    return [float(r[key]) for r in records if finite(r.get(key))]


@dataclass(frozen=True)
class ScoreWindow:
    """The steps an early median reads (``early_first..early_last``, inclusive) and the number of latest values a
    trailing mean averages."""

    early_first: int = 1
    early_last: int = 5
    trailing: int = 3


def early_median(records: Records, key: str, window: ScoreWindow) -> float:
    """Median of ``key`` over steps ``early_first..early_last``; NaN until a record of step ``early_last`` is in (the
    window is complete) or when the window holds no value."""
    if not any(int(r["step"]) >= window.early_last for r in records):
        return NAN
    return median([v for s, v in series(records, key) if window.early_first <= s <= window.early_last])


def trailing_mean(records: Records, key: str, window: ScoreWindow) -> float:
    """Mean of the last ``trailing`` finite values of ``key`` (fewer when fewer are logged; NaN when none)."""
    vals = values(records, key)[-window.trailing:]
    return sum(vals) / len(vals) if vals else NAN


@dataclass(frozen=True)
class AlarmKind:
    """A registered kind: ``score(records, **settings)``, ``reads(**settings)`` (the series keys it reads) and the
    name a spec gives its threshold."""

    score: Callable[..., float]
    reads: Callable[..., frozenset[str]]
    threshold_name: str = "threshold"


ALARM_KINDS: dict[str, AlarmKind] = {}


def register_alarm(name: str, reads: Callable[..., frozenset[str]], threshold_name: str = "threshold"
                   ) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register the decorated score function as the alarm kind ``name``."""
    def wrap(score: Callable[..., float]) -> Callable[..., float]:
        if name in ALARM_KINDS:
            raise ValueError(f"alarm kind {name!r} is registered twice")
        ALARM_KINDS[name] = AlarmKind(score, reads, threshold_name)
        return score
    return wrap


def _fixed(*keys: str) -> Callable[..., frozenset[str]]:
    return lambda **_: frozenset(keys)


def _keyed(key: str, reference_key: str | None = None, **_: Any) -> frozenset[str]:
    return frozenset({key} | ({reference_key} if reference_key else set()))


@register_alarm("reward_drop", _fixed("reward/em_mean"))
def reward_drop(records: Records, window: ScoreWindow = ScoreWindow()) -> float:
    return early_median(records, "reward/em_mean", window) - trailing_mean(records, "reward/em_mean", window)


@register_alarm("probe_drop", _fixed("probe/initial_logp_per_token", "probe/logp_per_token"))
def probe_drop(records: Records, window: ScoreWindow = ScoreWindow()) -> float:
    initial = values(records, "probe/initial_logp_per_token")
    now = values(records, "probe/logp_per_token")
    return initial[0] - now[-1] if initial and now else NAN


@register_alarm("correct_logp_drop", _fixed("lld/correct_logp_old_per_token"))
def correct_logp_drop(records: Records, window: ScoreWindow = ScoreWindow()) -> float:
    key = "lld/correct_logp_old_per_token"
    return early_median(records, key, window) - trailing_mean(records, key, window)


@register_alarm("step_kl_rise", _fixed("lld/step_kl"))
def step_kl_rise(records: Records, window: ScoreWindow = ScoreWindow()) -> float:
    base = early_median(records, "lld/step_kl", window)
    return trailing_mean(records, "lld/step_kl", window) / base if finite(base) and base > 0 else NAN


@register_alarm("drop_below_start", _keyed, threshold_name="drop")
def drop_below_start(records: Records, key: str, start_points: int = 1, reference_key: str | None = None) -> float:
    vals = values(records, key)
    if reference_key is not None:
        ref = values(records, reference_key)
        return ref[0] - vals[-1] if ref and vals else NAN
    if len(vals) <= start_points:
        return NAN
    return sum(vals[:start_points]) / start_points - vals[-1]


@register_alarm("ratio_over_early", _keyed, threshold_name="ratio")
def ratio_over_early(records: Records, key: str, early_steps: int) -> float:
    vals = values(records, key)
    base = median_of_first(vals, early_steps)
    return vals[-1] / base if finite(base) and base > 0 else NAN


@register_alarm("drop_from_best", _keyed)
def drop_from_best(records: Records, key: str) -> float:
    vals = values(records, key)
    return max(vals) - vals[-1] if vals else NAN


@dataclass(frozen=True)
class Alarm:
    """A kind of :data:`ALARM_KINDS` with its ``settings`` and ``threshold``: it fires where its score reaches the
    threshold."""

    name: str
    kind: str
    threshold: float
    settings: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ALARM_KINDS:
            raise ValueError(f"alarm {self.name!r}: unknown kind {self.kind!r} (known: {sorted(ALARM_KINDS)})")

    @property
    def reads(self) -> frozenset[str]:
        """The series keys the alarm reads."""
        return ALARM_KINDS[self.kind].reads(**self.settings)

    def score(self, records: Records) -> float:
        """The score after the last of ``records``."""
        return ALARM_KINDS[self.kind].score(records, **self.settings)

    def fires(self, records: Records) -> bool:
        score = self.score(records)
        return finite(score) and score >= self.threshold

    def first_step(self, records: Records) -> int | None:
        """The first step (in the records' order) at which the alarm fires, reading the records up to it only."""
        return next((int(records[i]["step"]) for i in range(len(records)) if self.fires(records[: i + 1])), None)


def make_alarm(spec: Mapping[str, Any]) -> Alarm:
    """An :class:`Alarm` from a spec: ``{"name", "kind", <its threshold name>: value, "description"?, ...settings}``
    (``{"name": "probe", "kind": "drop_below_start", "key": "probe/logp_per_token", "drop": 0.5}``)."""
    if spec.get("kind") not in ALARM_KINDS:
        raise ValueError(f"alarm {spec.get('name')!r}: unknown kind {spec.get('kind')!r} (known: {sorted(ALARM_KINDS)})")
    kind = ALARM_KINDS[spec["kind"]]
    if kind.threshold_name not in spec:
        raise ValueError(f"alarm {spec.get('name')!r} of kind {spec['kind']!r} needs {kind.threshold_name!r}")
    settings = {k: v for k, v in spec.items() if k not in ("name", "kind", "description", kind.threshold_name)}
    return Alarm(spec["name"], spec["kind"], float(spec[kind.threshold_name]), settings, spec.get("description", ""))


def score_series(records: Records, kind: str, **settings: Any) -> list[tuple[int, float]]:
    """``[(t, score_t)]`` of the kind ``kind`` for every step ``t >= 1`` of the run, ``score_t`` computed from the
    records of steps ``<= t`` only."""
    score = ALARM_KINDS[kind].score
    ordered = sorted(records, key=lambda r: int(r["step"]))
    return [(int(r["step"]), score(ordered[: i + 1], **settings)) for i, r in enumerate(ordered) if int(r["step"]) >= 1]

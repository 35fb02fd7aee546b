"""The phase detector of the LLD monitor: names the phase of a run from its logged series (``healthy`` /
``early_stagnation`` / ``steady_decay`` / ``accelerated_collapse``), the early warning, and the accounting of warnings
against the reward collapse (the measurements themselves: monitor.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from searchr1_lld.instruments.alarms import Alarm, median

PHASES = ("healthy", "early_stagnation", "steady_decay", "accelerated_collapse")
PHASE_ID = {name: i for i, name in enumerate(PHASES)}

NAN = float("nan")


def _nanmean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else NAN

# --------------------------------------------------------------------------------------------------------------------
# Phase detector
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class PhaseThresholds:
    """Thresholds of the phase detector (units: the metric's own units per step for slopes)."""

    window: int = 6  # steps used for trends
    min_points: int = 3  # fewer finite points -> no trend claimed
    flat_logp_slope: float = 0.01  # |slope| of correct log-likelihood per token (nats/step) below this = flat
    rising_reward_slope: float = 0.002  # reward slope (EM/step) above this = rising
    collapse_logp_drop: float = 1.0  # nats/token below the series' peak = "likelihood below threshold"
    collapse_grad_ratio: float = 5.0  # grad norm over its early baseline (median of the first `window` steps)
    collapse_entropy_ratio: float = 2.0  # entropy over its early baseline
    collapse_reward_ratio: float = 0.3  # reward at or below this share of its peak = crashed
    min_peak_reward: float = 0.05  # a peak below this is too small to crash from
    # collapse alarm: the probe set's log-likelihood this many nats/token below its best measurement. Scored on the
    # committed comparison (docs/lab/summary.json: 18 runs, 9 reward collapses) it preceded 1 of the 9 collapses and
    # stayed quiet on 8 of the 9 other runs (docs/lab.md, "The detector, measured")
    drawdown_alarm_logp: float = 0.75
    # evidence proportional to the run: a phase (and the early warning) is reported only once its condition has held
    # on `persistence()` consecutive steps; a short run cannot be called collapsed on one noisy step
    persist: int = 2  # consecutive steps, at least
    persist_frac: float = 0.1  # ... and at least this share of the run (run_steps) when the run length is known
    run_steps: int = 0  # planned steps of the run (0 = unknown: `persist` alone)

    def persistence(self) -> int:
        """Consecutive steps a condition must hold: ``max(persist, ceil(persist_frac * run_steps))``."""
        return max(self.persist, math.ceil(self.persist_frac * self.run_steps))


@dataclass
class PhaseReport:
    phase: str
    evidence: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    warning: str | None = None
    drawdown_alarm: str | None = None

    @property
    def phase_id(self) -> int:
        return PHASE_ID[self.phase]


def linear_slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against 0..n-1 (finite values only, keeping their positions); NaN if < 2."""
    pts = [(float(i), float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if len(pts) < 2:
        return NAN
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return NAN
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]


class PhaseDetector:
    """Names the death-spiral phase from the logged series.

    Series read (metric names): ``reward/em_mean``, ``lld/correct_logp_old_per_token`` (likelihood of the correct
    responses under the policy that sampled them), ``actor/grad_norm``, ``actor/entropy``.

    Also read when present: ``probe/logp_per_token`` (the fixed probe set of correct responses, re-measured every
    ``probe_every`` steps). It keeps measuring likelihood after the policy stops sampling correct responses, when the
    correct-response series has no new points, and it is the one likelihood series that sampling cannot confound: as
    entropy falls the policy samples its own most likely responses, so the sampled correct responses' likelihood
    rises even while the same responses' likelihood falls (measured on the default world: GRPO at lr 2e-3, probe
    -0.11 -> -0.77 nats/token in 25 steps while the sampled series rose). Its trend (``probe_slope``: least-squares
    slope per step over its last ``min_points`` measurements, at their steps) therefore takes part in the trend rules.

    Rules, evaluated on the last ``window`` steps, most severe first:
    - accelerated_collapse: correct likelihood (the correct-response series or the probe series) at least
      ``collapse_logp_drop`` nats/token below its peak AND (grad norm or entropy exploded vs their early baseline, or
      reward crashed to <= ``collapse_reward_ratio`` x its peak); or explosion and reward crash together; or reward
      still crashed after an explosion seen at any earlier step (collapse is sticky until reward recovers); or reward
      crashed while correct likelihood is still falling (the decay ran into the crash without an explosion: measured
      on the default world, GRPO at lr 2e-3 sharpened, entropy 1.0 -> 0.15, while the probe set fell 7x);
    - steady_decay: correct likelihood falling (slope < -flat: the sampled correct responses' or the probe set's)
      while reward has not crashed;
    - early_stagnation: correct likelihood flat (|slope| <= flat; the probe set's slope when it has one, else the
      sampled correct responses') while reward rises;
    - healthy: otherwise (likelihood of correct responses rising, or too little data to claim a trend).
    Early warning: correct likelihood falling (as in steady_decay) while reward slope > rising (the steady-decay
    signature). It names LLD, which nearly every run of the labs showed, collapsed or not.
    Drawdown alarm (the collapse alarm): the probe set's latest log-likelihood per token at least
    ``drawdown_alarm_logp`` below its best measurement so far, ``probe_best - probe_now >= drawdown_alarm_logp``. It
    is scored against the reward collapse in docs/lab.md, "The detector, measured".

    Evidence proportional to the run: the rules above give a *raw* phase per step; the reported phase is the least
    severe raw phase of the last ``thresholds.persistence()`` steps (a phase must hold that long before it is
    reported), and the warning fires only when its condition held on all of those steps. Before that many steps,
    everything is ``healthy``. The drawdown alarm obeys the same persistence.
    """

    REWARD = "reward/em_mean"
    CORRECT_LOGP = "lld/correct_logp_old_per_token"
    GRAD_NORM = "actor/grad_norm"
    ENTROPY = "actor/entropy"
    PROBE_LOGP = "probe/logp_per_token"

    def __init__(self, thresholds: PhaseThresholds | None = None):
        self.t = thresholds or PhaseThresholds()

    @property
    def drawdown(self) -> Alarm:
        """The collapse alarm, a kind of the one alarm registry (:mod:`.alarms`) at ``drawdown_alarm_logp``."""
        return Alarm("drawdown", "drop_from_best", self.t.drawdown_alarm_logp, {"key": self.PROBE_LOGP},
                     "the probe set's log-likelihood per token below its best measurement so far")

    def detect(self, history: Sequence[dict[str, Any]]) -> PhaseReport:
        """The reported phase after ``history`` (persistence applied; see the class docstring)."""
        k = self.t.persistence()
        if len(history) < k:
            now = self.raw(history) if history else PhaseReport("healthy")
            return PhaseReport("healthy", now.evidence,
                               [f"{len(history)} step(s) < {k} needed before a phase is claimed"], None)
        raws = [self.raw(history[: len(history) - j]) for j in range(k)]  # raws[0] = now
        phase = min((r.phase for r in raws), key=PHASE_ID.__getitem__)
        now = raws[0]
        reasons = list(now.reasons) if phase == now.phase else (
            [f"raw phase {now.phase} not yet held for {k} steps"] + now.reasons)
        warning = now.warning if all(r.warning for r in raws) else None
        drawdown = now.drawdown_alarm if all(r.drawdown_alarm for r in raws) else None
        return PhaseReport(phase, now.evidence, reasons, warning, drawdown)

    def raw(self, history: Sequence[dict[str, Any]]) -> PhaseReport:
        """The phase the rules name for the last step of ``history``, without persistence."""
        keys = (self.REWARD, self.CORRECT_LOGP, self.GRAD_NORM, self.ENTROPY, self.PROBE_LOGP)
        series = {k: [h.get(k) for h in history] for k in keys}
        win = {k: v[-self.t.window:] for k, v in series.items()}
        ev = {**self._trend_evidence(win), **self._level_evidence(series, win), **self._probe_evidence(series, history),
              **self._explosion_evidence(series, win)}
        sig = _Signals.of(ev, self.t)
        phase, reasons = _phase_and_reasons(ev, sig, self.t)
        return PhaseReport(phase=phase, evidence=ev, reasons=reasons, warning=_early_warning(ev, sig),
                           drawdown_alarm=self._drawdown_alarm(history, ev))

    def _trend_evidence(self, win: dict[str, list[Any]]) -> dict[str, float]:
        """Least-squares slopes over the window of the correct responses' log-likelihood and of the reward (NaN
        with fewer than ``min_points`` finite points)."""
        def slope(key: str) -> float:
            return linear_slope(win[key]) if len(_finite(win[key])) >= self.t.min_points else NAN

        return {"logp_slope": slope(self.CORRECT_LOGP), "reward_slope": slope(self.REWARD)}

    def _level_evidence(self, series: dict[str, list[Any]], win: dict[str, list[Any]]) -> dict[str, float]:
        """The correct responses' log-likelihood and the reward now (mean of the window's last two finite values)
        against their peaks over the whole run."""
        logp_all = _finite(series[self.CORRECT_LOGP])
        reward_all = _finite(series[self.REWARD])
        logp_now = _nanmean(_finite(win[self.CORRECT_LOGP])[-2:])
        logp_peak = max(logp_all) if logp_all else NAN
        return {"logp_now": logp_now, "logp_peak": logp_peak,
                "logp_drop_from_peak": logp_peak - logp_now if logp_all else NAN,
                "reward_now": _nanmean(_finite(win[self.REWARD])[-2:]),
                "reward_peak": max(reward_all) if reward_all else NAN}

    def _probe_evidence(self, series: dict[str, list[Any]], history: Sequence[dict[str, Any]]) -> dict[str, float]:
        """The probe set's latest log-likelihood, its drop below its best, and its slope per step over its last
        ``min_points`` measurements (at their steps)."""
        probe = series[self.PROBE_LOGP]
        probe_all = _finite(probe)
        probe_at = [i for i, v in enumerate(probe) if v is not None and math.isfinite(v)]
        return {"probe_logp_now": probe_all[-1] if probe_all else NAN,
                "probe_drop_from_peak": self.drawdown.score(history),
                "probe_slope": (linear_slope(probe[probe_at[-self.t.min_points]:])
                                if len(probe_at) >= self.t.min_points else NAN)}

    def _drawdown_alarm(self, history: Sequence[dict[str, Any]], ev: dict[str, float]) -> str | None:
        """The collapse alarm (:attr:`drawdown`) as a sentence; None when it does not fire."""
        if not self.drawdown.fires(history):
            return None
        return (f"collapse alarm: probe-set log-likelihood {ev['probe_drop_from_peak']:.3f} nats/token below its "
                f"best (alarm at {self.t.drawdown_alarm_logp})")

    def _explosion_evidence(self, series: dict[str, list[Any]], win: dict[str, list[Any]]) -> dict[str, float]:
        """Grad norm and entropy: their early baseline (median of the first ``window`` steps), now, now over the
        baseline, and their largest value over the baseline."""
        ev: dict[str, float] = {}
        for key, name in ((self.GRAD_NORM, "grad_norm"), (self.ENTROPY, "entropy")):
            base = median(_finite(series[key][: self.t.window]))
            now = _nanmean(_finite(win[key])[-2:])
            valid_base = bool(base) and math.isfinite(base) and base > 0
            ev[f"{name}_baseline"] = base
            ev[f"{name}_now"] = now
            ev[f"{name}_ratio"] = now / base if valid_base and math.isfinite(now) else NAN
            ev[f"{name}_max_ratio"] = max(_finite(series[key]), default=NAN) / base if valid_base else NAN
        return ev


def _ok(x: float) -> bool:
    return x is not None and math.isfinite(x)


@dataclass
class _Signals:
    """The conditions the phase rules combine, read from one step's evidence (see :class:`PhaseDetector`)."""

    correct_low: bool  # the correct responses' log-likelihood far below its peak
    probe_low: bool  # the probe set's far below its best
    grad_blowup: bool
    entropy_blowup: bool
    exploded_before: bool  # grad norm or entropy exploded at some step so far
    reward_crash: bool
    falling: dict[str, bool]  # "correct" / "probe": that log-likelihood trends down
    trend_slope: float  # the probe set's slope when it has one, else the correct responses'
    logp_flat: bool
    reward_rising: bool

    @property
    def logp_low(self) -> bool:
        return self.correct_low or self.probe_low

    @property
    def explosion(self) -> bool:
        return self.grad_blowup or self.entropy_blowup

    @property
    def logp_falling(self) -> bool:
        return self.falling["correct"] or self.falling["probe"]

    @classmethod
    def of(cls, ev: dict[str, float], t: PhaseThresholds) -> _Signals:
        falling = {name: _ok(ev[key]) and ev[key] < -t.flat_logp_slope
                   for name, key in (("correct", "logp_slope"), ("probe", "probe_slope"))}
        trend_slope = ev["probe_slope"] if _ok(ev["probe_slope"]) else ev["logp_slope"]
        return cls(
            correct_low=_ok(ev["logp_drop_from_peak"]) and ev["logp_drop_from_peak"] >= t.collapse_logp_drop,
            probe_low=_ok(ev["probe_drop_from_peak"]) and ev["probe_drop_from_peak"] >= t.collapse_logp_drop,
            grad_blowup=_ok(ev["grad_norm_ratio"]) and ev["grad_norm_ratio"] >= t.collapse_grad_ratio,
            entropy_blowup=_ok(ev["entropy_ratio"]) and ev["entropy_ratio"] >= t.collapse_entropy_ratio,
            exploded_before=(_ok(ev["grad_norm_max_ratio"]) and ev["grad_norm_max_ratio"] >= t.collapse_grad_ratio)
            or (_ok(ev["entropy_max_ratio"]) and ev["entropy_max_ratio"] >= t.collapse_entropy_ratio),
            reward_crash=(_ok(ev["reward_peak"]) and ev["reward_peak"] >= t.min_peak_reward and _ok(ev["reward_now"])
                          and ev["reward_now"] <= t.collapse_reward_ratio * ev["reward_peak"]),
            falling=falling, trend_slope=trend_slope,
            logp_flat=(not (falling["correct"] or falling["probe"]) and _ok(trend_slope)
                       and abs(trend_slope) <= t.flat_logp_slope),
            reward_rising=_ok(ev["reward_slope"]) and ev["reward_slope"] > t.rising_reward_slope)


def _collapse_reasons(ev: dict[str, float], sig: _Signals) -> list[str]:
    """What supports an accelerated_collapse, one sentence each."""
    reasons: list[str] = []
    if sig.logp_falling and not (sig.logp_low or sig.explosion or sig.exploded_before):
        reasons.append("correct log-likelihood still falling ("
                       + ", ".join(f"{name} {ev[key]:.4f} nats/token/step" for name, key in
                                   (("sampled", "logp_slope"), ("probe set", "probe_slope")) if _ok(ev[key]))
                       + ")")
    if sig.correct_low:
        reasons.append(f"correct log-likelihood {ev['logp_drop_from_peak']:.3f} nats/token below its peak")
    if sig.probe_low:
        reasons.append(f"probe-set log-likelihood {ev['probe_drop_from_peak']:.3f} nats/token below its peak")
    if sig.exploded_before and not sig.explosion:
        reasons.append(f"grad norm / entropy exploded earlier (max x{ev['grad_norm_max_ratio']:.1f} / "
                       f"x{ev['entropy_max_ratio']:.1f} their baselines) and reward has not recovered")
    if sig.grad_blowup:
        reasons.append(f"grad norm x{ev['grad_norm_ratio']:.1f} its baseline")
    if sig.entropy_blowup:
        reasons.append(f"entropy x{ev['entropy_ratio']:.1f} its baseline")
    if sig.reward_crash:
        reasons.append(f"reward {ev['reward_now']:.3f} vs peak {ev['reward_peak']:.3f}")
    return reasons


def _phase_and_reasons(ev: dict[str, float], sig: _Signals, t: PhaseThresholds) -> tuple[str, list[str]]:
    """The rules of :class:`PhaseDetector`, most severe first: the raw phase and what supports it."""
    if (sig.logp_low and (sig.explosion or sig.reward_crash)) or (
            sig.reward_crash and (sig.explosion or sig.exploded_before or sig.logp_falling)):
        return "accelerated_collapse", _collapse_reasons(ev, sig)
    if sig.logp_falling and not sig.reward_crash:
        reasons = []
        if sig.falling["correct"]:
            reasons.append(f"correct log-likelihood falling {ev['logp_slope']:.4f} nats/token/step")
        if sig.falling["probe"]:
            reasons.append(f"probe-set log-likelihood falling {ev['probe_slope']:.4f} nats/token/step")
        return "steady_decay", reasons
    if sig.logp_flat and sig.reward_rising:
        which = "probe-set" if _ok(ev["probe_slope"]) else "correct"
        return "early_stagnation", [
            f"reward rising {ev['reward_slope']:.4f}/step while {which} log-likelihood is flat "
            f"({sig.trend_slope:.4f} nats/token/step)"]
    if not _ok(ev["logp_slope"]):
        return "healthy", [f"fewer than {t.min_points} steps with correct responses: no trend claimed"]
    return "healthy", [f"correct log-likelihood slope {ev['logp_slope']:.4f} nats/token/step"]


def _early_warning(ev: dict[str, float], sig: _Signals) -> str | None:
    """The early warning: correct likelihood falling while reward still rises (None when it does not hold)."""
    if not (sig.logp_falling and sig.reward_rising):
        return None
    slope = ev["logp_slope"] if sig.falling["correct"] else ev["probe_slope"]
    return (f"early warning: correct-response likelihood trends down ({slope:.4f} nats/token/step) "
            f"while reward still rises ({ev['reward_slope']:.4f}/step) - the LLD death spiral's precursor")


# --------------------------------------------------------------------------------------------------------------------
# Early-warning accounting
# --------------------------------------------------------------------------------------------------------------------


def reward_collapse_step(rewards: Sequence[float], *, ratio: float = 0.3, min_peak: float = 0.05,
                         persist: int = 2) -> int | None:
    """Index (0-based) where the reward collapsed for good, judged from the reward alone (no detector involved).

    r_s = mean of rewards[t-1], rewards[t] (two-step smoothing); peak_t = max r_s for s <= t. The run collapsed at the
    first t from which r_s <= ratio * peak_s holds for every s >= t up to the end, provided that stretch is at least
    ``persist`` steps long and peak_t >= ``min_peak``. None when the reward never collapses that way.
    """
    vals = [float(v) if v is not None and math.isfinite(v) else NAN for v in rewards]
    smooth = [_nanmean(vals[max(0, i - 1): i + 1]) for i in range(len(vals))]
    peak, crashed = NAN, []
    for r in smooth:
        if math.isfinite(r):
            peak = r if not math.isfinite(peak) else max(peak, r)
        crashed.append(math.isfinite(r) and math.isfinite(peak) and peak >= min_peak and r <= ratio * peak)
    start = None
    for i in range(len(crashed) - 1, -1, -1):
        if not crashed[i]:
            break
        start = i
    if start is None or len(crashed) - start < persist:
        return None
    return start


ALARM_PHASES = ("steady_decay", "accelerated_collapse")  # reported phases that count as an alarm


def alarm_steps(steps: Sequence[int], phases: Sequence[str], warning_steps: Sequence[int]) -> list[int]:
    """Steps at which the detector raised an alarm: its early warning fired, or it reported steady_decay or
    accelerated_collapse."""
    return sorted(set(int(s) for s in warning_steps)
                  | {int(s) for s, ph in zip(steps, phases) if ph in ALARM_PHASES})


def warning_accounting(steps: Sequence[int], rewards: Sequence[float], alarms: Sequence[int],
                       thresholds: PhaseThresholds | None = None) -> dict[str, Any]:
    """Did the detector's alarm (:func:`alarm_steps`) come before the reward collapsed, and by how many steps?

    ``collapse_step``: the step where the reward collapsed for good (:func:`reward_collapse_step`, with the
    detector's reward-crash thresholds and persistence); ``first_alarm_step``: first alarm;
    ``lead_steps`` = collapse_step - first_alarm_step when the alarm came before the collapse (None otherwise);
    ``outcome``: ``warned`` (collapse, alarm before it), ``late`` (alarm only at or after the collapse), ``missed``
    (collapse, no alarm), ``false_alarm`` (no collapse, alarm raised), ``quiet`` (no collapse, no alarm).
    """
    t = thresholds or PhaseThresholds()
    idx = reward_collapse_step(rewards, ratio=t.collapse_reward_ratio, min_peak=t.min_peak_reward,
                               persist=t.persistence())
    collapse = int(steps[idx]) if idx is not None else None
    first = int(min(alarms)) if alarms else None
    if collapse is None:
        outcome = "false_alarm" if first is not None else "quiet"
    elif first is None:
        outcome = "missed"
    else:
        outcome = "warned" if first < collapse else "late"
    return {"collapse_step": collapse, "first_alarm_step": first,
            "lead_steps": collapse - first if outcome == "warned" else None, "outcome": outcome}

"""The step-size study's labels and hypotheses (pure: compact run records and the registration in, numbers out).

A run (as :func:`searchr1_lab.compact.read_runs` returns it) is labelled by :func:`collapse_time`: it collapsed
at the first evaluation after which ``persist`` consecutive evaluations of its held-out EM (``eval/val_sub_em``) all
score at most ``ratio`` times its own step-0 value; otherwise it is censored at the horizon. A cell is one arm at one
learning rate; the cells' survival is compared by the log-rank test and the difference of restricted mean survival
times (:mod:`.survival`).

The registration (a dict; every key below is read):

    {"label": {"ratio": 0.3, "persist": 2, "horizon": 75},      # the primary collapse label
     "alpha": 0.05,                                              # one-sided log-rank level
     "lrs": {"collapse": 0.002, "below": 0.001},                 # named learning rates
     "arms": {"grpo": {"lrs": [0.001, 0.002]},                   # the learning rates each arm ran at
              "grpo_lr_matched": {"lrs": [0.0012]}, ...},
     "hypotheses": {
        "H1":  {"treatment": "llds_action", "control": "grpo", "lr": "collapse"},
        "H1b": {"treatment": "llds_ma", "control": "grpo", "lr": "collapse"},
        "H2":  {"treatment": "llds_action", "baseline": "grpo", "lr": "collapse",
                "controls": ["grpo_lr_matched", "grpo_kl_matched", "nll_anchor"]},
        "H3":  {"lr": "collapse", "false_alarm_rate": 0.2, "reference": "reward_drop",
                "alarms": ["probe_drop", "correct_logp_drop", "step_kl_rise"]}},
     "sensitivity": {"ratio": [0.3, 0.5], "persist": [1, 2, 3]}}

A hypothesis's kind is read from its keys, once (:data:`HYPOTHESIS_KINDS`): ``control`` (one comparison),
``controls`` (mechanism against the step-size-matched controls; ``baseline`` defaults to ``grpo``), ``alarms``
(alarms at a matched false-alarm rate, :mod:`.alarms`; optional ``reference``, default ``reward_drop``; ``arms``, the
arms whose runs are pooled, default every run at that rate; ``window``, the :class:`.alarms.ScoreWindow` fields
``early_first``, ``early_last``, ``trailing``, default 1, 5, 3), ``matched_control`` (against a control held to the
treatment's step size: :func:`hypothesis_matched`), ``endpoint`` (``treatment`` against ``control`` on a registered
endpoint other than survival, e.g. whole-validation EM after a step: :mod:`.endpoint_comparison`). An ``lr`` is a
name of ``lrs`` or a number. The treatment runs at ``lr``; a control runs at the same rate when its ``arms`` entry
lists it, else at the one rate it ran at (:func:`control_lr`), so a control run at a single rate needs no naming. An
arm absent from ``arms`` is taken at the rates its runs have. ``sensitivity``: the labels :func:`sensitivity_table`
re-tests the comparisons under.

A comparison is supported when the one-sided log-rank p (treatment survives longer) is below ``alpha`` AND the
interval of ``RMST_treatment - RMST_control`` lies above 0. H2's verdict: ``mechanism`` when the treatment beats the
baseline and every matched control; ``smaller steps suffice`` when it beats the baseline but not every control;
``inconclusive`` when it does not beat the baseline.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from searchr1_lab.analysis import finite
from searchr1_lab.stats.bootstrap import BOOT_SEED, N_BOOT
from searchr1_lab.stepsize.alarms import HELD_OUT, LabelledRun, ScoreWindow, alarm_study
from searchr1_lab.stats.smallsample import (equivalent, holm, permutation_test, restricted_times,
                                               welch_difference)
from searchr1_lab.stats.survival import kaplan_meier, logrank, rmst, rmst_difference
from searchr1_lab.stepsize.endpoint_comparison import adjust_endpoint_families, arm_gains, endpoint_difference
from searchr1_lab.stepsize.utility import run_utility

Run = Mapping[str, Any]


def run_name(run: Run) -> str:
    return f"{run.get('method')}-lr{run.get('lr'):g}-seed{run.get('seed')}"


def collapse_time(records: Sequence[Mapping[str, Any]], *, ratio: float, persist: int, horizon: int,
                  key: str = HELD_OUT, name: str = "run") -> tuple[int, int]:
    """``(time, event)`` of one run: ``(s, 1)`` when it collapsed at step ``s``, ``(horizon, 0)`` when censored.

    Reference ``v_0``: the run's own value of ``key`` at step 0. Evaluated points: the finite ``(step, value)`` with
    ``0 < step <= horizon``, in step order, ``(s_1, v_1), (s_2, v_2), ...``. The run collapses at the first ``s_i``
    such that ``v_i, ..., v_{i + persist - 1}`` all exist and are ``<= ratio * v_0``; a drop that begins too near
    the end to hold ``persist`` points is censored. ValueError (naming ``key`` and ``name``) when the step-0 value is
    missing or not above 0 (nothing to collapse from).
    """
    ref = [float(r[key]) for r in records if int(r["step"]) == 0 and finite(r.get(key))]
    if not ref or ref[0] <= 0:
        raise ValueError(f"{name}: no positive step-0 value of {key!r} (got {ref or 'none'}) to define a collapse")
    bound = ratio * ref[0]
    points = sorted((int(r["step"]), float(r[key])) for r in records
                    if 0 < int(r["step"]) <= horizon and finite(r.get(key)))
    for i in range(len(points) - persist + 1):
        if all(v <= bound for _, v in points[i: i + persist]):
            return points[i][0], 1
    return int(horizon), 0


def step_size(records: Sequence[Mapping[str, Any]], first: int = 1, last: int = 20) -> float:
    """The run's measured step size: the mean of ``lld/step_kl`` (the KL between the policy before and after each
    update) over the steps ``first..last`` inclusive; NaN when none is logged there."""
    vals = [float(r["lld/step_kl"]) for r in records
            if first <= int(r["step"]) <= last and finite(r.get("lld/step_kl"))]
    return sum(vals) / len(vals) if vals else float("nan")


def same_lr(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9)


def cell_runs(runs: Sequence[Run], arm: str, lr: float) -> list[Run]:
    """The runs of one cell (arm at learning rate ``lr``), in seed order."""
    return sorted((r for r in runs if r["method"] == arm and same_lr(r["lr"], lr)), key=lambda r: r["seed"])


def labels(runs: Sequence[Run], label: Mapping[str, Any]) -> list[tuple[int, int]]:
    """:func:`collapse_time` of each run under ``label`` (``{"ratio", "persist", "horizon"}``)."""
    return [collapse_time(r["records"], ratio=label["ratio"], persist=label["persist"], horizon=label["horizon"],
                          name=run_name(r)) for r in runs]


def cell_survival(runs: Sequence[Run], arm: str, lr: float, label: Mapping[str, Any]) -> dict[str, Any]:
    """One cell's survival: per run (seed order) its collapse ``times`` and ``events``, ``count`` (``"k/n"`` runs
    collapsed), the Kaplan-Meier curve and the RMST up to the horizon (None without runs)."""
    mine = cell_runs(runs, arm, lr)
    te = labels(mine, label)
    times, events = [t for t, _ in te], [e for _, e in te]
    value = rmst(times, events, label["horizon"]) if mine else None
    return {"arm": arm, "lr": lr, "seeds": [r["seed"] for r in mine], "times": times, "events": events,
            "collapsed": sum(events), "runs": len(mine), "count": f"{sum(events)}/{len(mine)}",
            "km": kaplan_meier(times, events), "rmst": value}


def compare_arms(runs: Sequence[Run], arm_a: str, arm_b: str, lr: float, label: Mapping[str, Any],
                 lr_b: float | None = None, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict[str, Any]:
    """Does ``arm_a`` at ``lr`` survive longer than ``arm_b`` at ``lr_b`` (default ``lr``)? The log-rank test
    (``p_one_sided``: the alternative that a survives longer) and ``RMST_a - RMST_b`` with its bootstrap interval,
    and each cell's collapse count ``k/n``."""
    a = cell_survival(runs, arm_a, lr, label)
    b = cell_survival(runs, arm_b, lr if lr_b is None else lr_b, label)
    keep = ("arm", "lr", "count", "rmst")
    return {"a": {k: a[k] for k in keep}, "b": {k: b[k] for k in keep},
            "logrank": logrank(a["times"], a["events"], b["times"], b["events"]),
            "rmst_difference": rmst_difference(a["times"], a["events"], b["times"], b["events"], label["horizon"],
                                               n_boot=n_boot, seed=seed),
            **small_sample(a, b, label["horizon"])}


def small_sample(a: Mapping[str, Any], b: Mapping[str, Any], horizon: float) -> dict[str, Any]:
    """Tests of the RMST difference that hold at a handful of runs, on the per-run restricted survival times (their
    mean is the RMST: runs are censored only at the horizon): ``welch`` (the 95 % Welch interval), ``welch90`` (the
    90 % one, for equivalence) and ``permutation`` (the exact permutation test; None unless each cell has 2 runs).
    Empty when a cell has no run."""
    if not a["times"] or not b["times"]:
        return {"welch": None, "welch90": None, "permutation": None}
    ra = restricted_times(a["times"], a["events"], horizon)
    rb = restricted_times(b["times"], b["events"], horizon)
    return {"welch": welch_difference(ra, rb, 0.95), "welch90": welch_difference(ra, rb, 0.90),
            "permutation": permutation_test(ra, rb) if min(len(ra), len(rb)) >= 2 else None}


def supported(comparison: Mapping[str, Any], alpha: float) -> bool:
    """One-sided log-rank ``p < alpha`` and the RMST difference's interval above 0 (the step-size study's rule)."""
    diff = comparison["rmst_difference"]
    return comparison["logrank"]["p_one_sided"] < alpha and diff["low"] is not None and diff["low"] > 0


def supported_holm(comparison: Mapping[str, Any], alpha: float) -> bool:
    """The corrected rule (a registration with ``"multiplicity": "holm"``): the one-sided log-rank p, Holm-adjusted
    over the confirmatory family (``p_holm``), below ``alpha``, and the 95 % Welch interval of the RMST difference
    above 0."""
    welch = comparison.get("welch") or {}
    return comparison["p_holm"] < alpha and welch.get("low") is not None and welch["low"] > 0


def resolve_lr(registration: Mapping[str, Any], lr: str | float) -> float:
    """A hypothesis's ``lr``: a name of the registration's ``lrs`` or a number."""
    return float(registration["lrs"][lr]) if isinstance(lr, str) else float(lr)


def arm_lrs(registration: Mapping[str, Any], runs: Sequence[Run], arm: str) -> list[float]:
    """The learning rates ``arm`` ran at: its ``arms`` entry, else the rates of its runs."""
    entry = registration.get("arms", {}).get(arm)
    if entry is not None:
        return [float(x) for x in entry["lrs"]]
    return sorted({float(r["lr"]) for r in runs if r["method"] == arm})


def control_lr(registration: Mapping[str, Any], runs: Sequence[Run], arm: str, lr: float) -> float:
    """The rate a control is compared at against a treatment at ``lr``: ``lr`` itself when the control ran at it,
    else the one rate it ran at; ValueError when it ran at several rates, none of them ``lr``, or at none."""
    rates = arm_lrs(registration, runs, arm)
    if any(same_lr(x, lr) for x in rates):
        return lr
    if len(rates) == 1:
        return rates[0]
    raise ValueError(f"control {arm!r} ran at {rates or 'no rate'}, not at {lr:g}: name the rate to compare at")


def comparison_against(runs: Sequence[Run], registration: Mapping[str, Any], treatment: str, control: str,
                       lr: float, label: Mapping[str, Any]) -> dict[str, Any]:
    """``treatment`` at ``lr`` against ``control`` at :func:`control_lr`, and whether it is :func:`supported`."""
    c_lr = control_lr(registration, runs, control, lr)
    comp = compare_arms(runs, treatment, control, lr, label, lr_b=c_lr)
    return {"treatment": treatment, "control": control, "lr": lr, "control_lr": c_lr, "comparison": comp,
            "supported": supported(comp, registration["alpha"])}


def hypothesis_beats(runs: Sequence[Run], registration: Mapping[str, Any], spec: Mapping[str, Any],
               label: Mapping[str, Any]) -> dict[str, Any]:
    """A one-comparison hypothesis: ``treatment`` survives longer than ``control``."""
    lr = resolve_lr(registration, spec["lr"])
    return comparison_against(runs, registration, spec["treatment"], spec["control"], lr, label)


def h2_verdict(beats_baseline: bool, beats_controls: Sequence[bool]) -> str:
    """``inconclusive`` unless the treatment beats the baseline; then ``mechanism`` when it beats every matched
    control, else ``smaller steps suffice``."""
    if not beats_baseline:
        return "inconclusive"
    return "mechanism" if all(beats_controls) else "smaller steps suffice"


def hypothesis_mechanism(runs: Sequence[Run], registration: Mapping[str, Any], spec: Mapping[str, Any],
                   label: Mapping[str, Any]) -> dict[str, Any]:
    """The treatment against its ``baseline`` (default ``grpo``) and against each step-size-matched control (each at
    the rate it ran at), and the verdict (:func:`h2_verdict`)."""
    lr = resolve_lr(registration, spec["lr"])
    base = comparison_against(runs, registration, spec["treatment"], spec.get("baseline", "grpo"), lr, label)
    controls = {c: comparison_against(runs, registration, spec["treatment"], c, lr, label) for c in spec["controls"]}
    verdict = h2_verdict(base["supported"], [c["supported"] for c in controls.values()])
    return {"treatment": spec["treatment"], "lr": lr, "baseline": base, "controls": controls, "verdict": verdict}


def hypothesis_alarms(runs: Sequence[Run], registration: Mapping[str, Any], spec: Mapping[str, Any],
                label: Mapping[str, Any], rule: str = "calm_runs") -> dict[str, Any]:
    """The alarms at a matched false-alarm rate over the runs at one rate (:func:`.alarms.alarm_study`, its
    false-alarm ``rule``), labelled with ``label``."""
    lr = resolve_lr(registration, spec["lr"])
    mine = [r for r in runs if same_lr(r["lr"], lr) and ("arms" not in spec or r["method"] in spec["arms"])]
    labelled = [LabelledRun(run_name(r), r["records"], t, e) for r, (t, e) in zip(mine, labels(mine, label))]
    window = ScoreWindow(**spec.get("window", {}))
    return {"lr": lr, **alarm_study(labelled, spec["alarms"], spec["false_alarm_rate"],
                                    spec.get("reference", "reward_drop"), window, rule=rule)}


def cell_utility(runs: Sequence[Run], horizon: float) -> dict[str, Any]:
    """Held-out utility of a cell's runs (:func:`.utility.run_utility` each, up to ``horizon``): per run (seed order)
    ``peak_gain`` and ``gain_area``, and their means."""
    each = [run_utility(r["records"], horizon) for r in runs]
    peaks = [u["peak_gain"] for u in each if u["peak_gain"] is not None]
    areas = [u["gain_area"] for u in each if u["gain_area"] is not None]
    return {"peak_gain": peaks, "gain_area": areas, "mean_peak_gain": sum(peaks) / len(peaks) if peaks else None,
            "mean_gain_area": sum(areas) / len(areas) if areas else None}


def utility_comparison(runs_a: Sequence[Run], runs_b: Sequence[Run], horizon: float) -> dict[str, Any]:
    """Utility of a against b: each cell's :func:`cell_utility` and the 95 % Welch intervals of the differences
    (a - b) of the peak gain and of the gain area."""
    a, b = cell_utility(runs_a, horizon), cell_utility(runs_b, horizon)
    return {"a": a, "b": b, "peak_gain": welch_difference(a["peak_gain"], b["peak_gain"]),
            "gain_area": welch_difference(a["gain_area"], b["gain_area"])}


def values_by_step(runs: Sequence[Run], key: str, first: int = 1, last: int | None = None,
                   until: Callable[[Run], int | None] = lambda run: None) -> dict[int, list[float]]:
    """Per step ``t`` in ``first..last`` (``last`` None: every step), in step order: the finite values of ``key`` the
    runs logged at ``t``; a run counts up to the step ``until(run)`` (None: all its steps). Steps without a value are
    absent."""
    out: dict[int, list[float]] = {}
    for r in runs:
        stop = until(r)
        for x in r["records"]:
            t = int(x["step"])
            if first <= t and (last is None or t <= last) and (stop is None or t <= stop) and finite(x.get(key)):
                out.setdefault(t, []).append(float(x[key]))
    return dict(sorted(out.items()))


def alive_step_kl(runs: Sequence[Run], label: Mapping[str, Any], first: int, last: int) -> dict[int, float]:
    """Per step ``t`` in ``first..last``: the mean ``lld/step_kl`` over the runs still alive at ``t`` (not collapsed
    under ``label`` at or before ``t``: a run's steps up to its collapse step count, its dead state after does not)
    that logged it; steps without such a run are absent."""
    def collapse_step(run: Run) -> int | None:
        end, event = collapse_time(run["records"], ratio=label["ratio"], persist=label["persist"],
                                   horizon=label["horizon"], name=run_name(run))
        return end if event else None
    return {t: sum(v) / len(v) for t, v in values_by_step(runs, "lld/step_kl", first, last, collapse_step).items()}


def step_size_match(runs_a: Sequence[Run], runs_b: Sequence[Run], label: Mapping[str, Any], first: int, last: int,
                    tolerance: float) -> dict[str, Any]:
    """How closely b's step size matched a's over the steps ``first..last`` where both had runs alive (matched where
    the outcome happens: a run's dead state after its collapse does not count): the per-step means of the alive runs
    (:func:`alive_step_kl`), ``mean_a`` and ``mean_b`` over the ``steps`` both cover, ``ratio = mean_b / mean_a``
    (the sums over the same steps), and ``matched`` when ``1 / (1 + tolerance) <= ratio <= 1 + tolerance``."""
    ka, kb = alive_step_kl(runs_a, label, first, last), alive_step_kl(runs_b, label, first, last)
    steps = [t for t in ka if t in kb]
    ma = sum(ka[t] for t in steps) / len(steps) if steps else float("nan")
    mb = sum(kb[t] for t in steps) / len(steps) if steps else float("nan")
    ratio = mb / ma if finite(ma) and finite(mb) and ma > 0 else float("nan")
    return {"first": first, "last": last, "steps": len(steps), "last_step": max(steps, default=None),
            "per_step_a": [ka[t] for t in steps], "per_step_b": [kb[t] for t in steps], "mean_a": ma, "mean_b": mb,
            "ratio": ratio, "tolerance": tolerance,
            "matched": finite(ratio) and 1 / (1 + tolerance) <= ratio <= 1 + tolerance}


def matched_verdict(matched: bool, outlives: bool, utility_ok: bool, equivalent_survival: bool) -> str:
    """The verdict of the matched-control test: ``mechanism`` when the control matched the treatment's step size and
    the treatment outlived it at no worse utility; ``smaller steps suffice`` when the control matched and the two
    survived equivalently (within the registered margin); ``inconclusive`` otherwise (a control that did not match,
    or survival neither different nor shown equivalent)."""
    if matched and outlives and utility_ok:
        return "mechanism"
    if matched and equivalent_survival:
        return "smaller steps suffice"
    return "inconclusive"


def hypothesis_matched(runs: Sequence[Run], registration: Mapping[str, Any], spec: Mapping[str, Any],
                       label: Mapping[str, Any]) -> dict[str, Any]:
    """The treatment against a control held to its step size after the warm-up (``matched_control``): survival
    (:func:`comparison_against`), the step sizes over the registered window's steps where both had runs alive
    (:func:`step_size_match`, within ``match_tolerance``), utility (:func:`utility_comparison`: the 95 % Welch interval of the peak-gain difference
    above ``-utility_margin`` is "no worse"), equivalence (the 90 % Welch interval of the RMST difference inside
    ``+-equivalence_margin`` steps) and the verdict (:func:`matched_verdict`; outliving is :func:`supported_holm`,
    so the verdict is final once the family's Holm adjustment is in: :func:`adjust_for_multiplicity`)."""
    lr = resolve_lr(registration, spec["lr"])
    comp = comparison_against(runs, registration, spec["treatment"], spec["matched_control"], lr, label)
    window = registration["step_size"]
    ta, tb = cell_runs(runs, spec["treatment"], lr), cell_runs(runs, spec["matched_control"], comp["control_lr"])
    match = step_size_match(ta, tb, label, window["first"], window["last"], spec["match_tolerance"])
    utility = utility_comparison(ta, tb, label["horizon"])
    low = utility["peak_gain"].get("low")
    welch90 = comp["comparison"].get("welch90") or {}
    return {**comp, "step_size": match, "utility": utility,
            "utility_ok": low is not None and low > -spec["utility_margin"],
            "equivalent": equivalent(welch90.get("low"), welch90.get("high"), spec["equivalence_margin"]),
            "verdict": None}


def hypothesis_endpoint(runs: Sequence[Run], registration: Mapping[str, Any], spec: Mapping[str, Any],
                        label: Mapping[str, Any]) -> dict[str, Any]:
    """``treatment`` against ``control`` (at :func:`control_lr`) on a registered endpoint (the registration's
    ``endpoints[spec["endpoint"]]``: a key's gain over the run's step 0 after a named step;
    :func:`.endpoint_comparison.endpoint_difference`, with ``equivalence_margin``), and the step sizes from the
    registered window's first step to the endpoint's step where both had runs alive (:func:`step_size_match`, within
    ``match_tolerance``). Its ``family`` (default: its endpoint's name) is Holm-adjusted and judged in
    :func:`adjust_for_multiplicity`."""
    name = spec["endpoint"]
    endpoint = (registration.get("endpoints") or {}).get(name)
    if endpoint is None:
        raise ValueError(f"endpoint {name!r} is not one of the registration's endpoints "
                         f"{sorted(registration.get('endpoints') or {})}")
    lr = resolve_lr(registration, spec["lr"])
    c_lr = control_lr(registration, runs, spec["control"], lr)
    ta, tb = cell_runs(runs, spec["treatment"], lr), cell_runs(runs, spec["control"], c_lr)
    match = step_size_match(ta, tb, label, int(registration["step_size"]["first"]), int(endpoint["step"]),
                            spec["match_tolerance"])
    return {"treatment": spec["treatment"], "control": spec["control"], "lr": lr, "control_lr": c_lr,
            "endpoint": name, "key": endpoint["key"], "step": int(endpoint["step"]),
            "family": spec.get("family", name),
            **endpoint_difference(arm_gains(ta, endpoint), arm_gains(tb, endpoint), spec["equivalence_margin"],
                                  registration["alpha"]),
            "step_size": match, "verdict": None}


def family(results: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The survival comparisons of the tested hypotheses, by name, each (treatment, control, rates) once: a
    one-comparison or matched-control hypothesis under its own name, a mechanism hypothesis's controls as
    ``"H2 vs <control>"`` and its baseline when no other member makes the same comparison."""
    out: dict[str, Mapping[str, Any]] = {}
    seen = set()
    entries = []
    for name, res in results.items():
        if "comparison" in res:
            entries.append((name, res))
        if "controls" in res:
            entries += [(f"{name} vs {c}", comp) for c, comp in res["controls"].items()]
            entries.append((f"{name} vs {res['baseline']['control']}", res["baseline"]))
    for name, res in entries:
        key = (res["treatment"], res["control"], res["lr"], res["control_lr"])
        if key not in seen:
            seen.add(key)
            out[name] = res
    return out


def adjust_for_multiplicity(results: dict[str, Any], registration: Mapping[str, Any]) -> dict[str, Any]:
    """Holm's adjustment of the one-sided log-rank p over the :func:`family` of ``results`` (``p_holm`` on each
    comparison); a registration with ``"multiplicity": "holm"`` then judges each comparison by
    :func:`supported_holm` (else the registered :func:`supported` stands); each matched-control hypothesis gets its
    verdict; the endpoint hypotheses are Holm-adjusted within their own families and judged
    (:func:`.endpoint_comparison.adjust_endpoint_families`). Returns ``results``."""
    members = family(results)
    adjusted = holm({n: c["comparison"]["logrank"]["p_one_sided"] for n, c in members.items()}) if members else {}
    for name, comp in members.items():
        comp["comparison"]["p_holm"] = adjusted[name]
    holm_rule = registration.get("multiplicity") == "holm"
    if holm_rule:
        for comp in members.values():
            comp["supported"] = supported_holm(comp["comparison"], registration["alpha"])
    for res in results.values():
        if "utility_ok" in res:  # a matched-control hypothesis
            res["verdict"] = matched_verdict(res["step_size"]["matched"], res["supported"], res["utility_ok"],
                                             res["equivalent"])
        elif "controls" in res and holm_rule:  # a mechanism hypothesis, its comparisons judged anew
            res["verdict"] = h2_verdict(res["baseline"]["supported"], [c["supported"] for c in res["controls"].values()])
    adjust_endpoint_families(results, registration["alpha"])
    return results


# a hypothesis's kind, by the key that marks it (an endpoint hypothesis names its arms as a survival comparison
# does, ``treatment`` and ``control``: its ``endpoint`` marks it)
HYPOTHESIS_KINDS: dict[str, Callable[..., dict[str, Any]]] = {
    "control": hypothesis_beats, "controls": hypothesis_mechanism, "alarms": hypothesis_alarms,
    "matched_control": hypothesis_matched, "endpoint": hypothesis_endpoint}


def hypothesis_kind(name: str, spec: Mapping[str, Any]) -> Callable[..., dict[str, Any]]:
    kinds = ["endpoint"] if "endpoint" in spec else [k for k in HYPOTHESIS_KINDS if k in spec]
    if len(kinds) != 1:
        raise ValueError(f"hypothesis {name!r} must hold exactly one of {sorted(HYPOTHESIS_KINDS)}, has {kinds}")
    return HYPOTHESIS_KINDS[kinds[0]]


def hypotheses(runs: Sequence[Run], registration: Mapping[str, Any],
               label: Mapping[str, Any] | None = None, kinds: Sequence[str] = tuple(HYPOTHESIS_KINDS)
               ) -> dict[str, Any]:
    """Every registered hypothesis (of the ``kinds`` asked for) tested under ``label`` (default: the registered
    primary label), each by its kind (:data:`HYPOTHESIS_KINDS`)."""
    label = label or registration["label"]
    out = {}
    for name, spec in registration["hypotheses"].items():
        test = hypothesis_kind(name, spec)
        if any(HYPOTHESIS_KINDS[k] is test for k in kinds):
            out[name] = test(runs, registration, spec, label)
    return adjust_for_multiplicity(out, registration)


def exploratory_alarms(runs: Sequence[Run], registration: Mapping[str, Any]) -> dict[str, Any]:
    """Not registered: every alarm hypothesis re-tested under the primary label with the ``healthy_stretch``
    false-alarm rule (:mod:`.alarms`), which needs no run that stayed calm."""
    return {name: hypothesis_alarms(runs, registration, spec, registration["label"], rule="healthy_stretch")
            for name, spec in registration["hypotheses"].items() if hypothesis_kind(name, spec) is hypothesis_alarms}


def cell_counts(runs: Sequence[Run], label: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per arm and learning rate present in ``runs``: the collapse count ``k/n`` under ``label``."""
    cells = sorted({(r["method"], float(r["lr"])) for r in runs})
    return [{"arm": arm, "lr": lr, "count": cell_survival(runs, arm, lr, label)["count"]} for arm, lr in cells]


def sensitivity_table(runs: Sequence[Run], registration: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per label of the grid ``sensitivity`` (``ratio`` x ``persist``, the registered horizon): the cells'
    collapse counts and the verdicts of the comparison hypotheses under that label (``verdicts``: a one-comparison
    hypothesis's ``supported``, a mechanism hypothesis's verdict; ``controls``: per mechanism hypothesis, whether the
    treatment outlived each matched control); ``primary`` marks the registered label."""
    primary = registration["label"]
    rows = []
    for ratio in registration["sensitivity"]["ratio"]:
        for persist in registration["sensitivity"]["persist"]:
            label = {"ratio": ratio, "persist": persist, "horizon": primary["horizon"]}
            tested = hypotheses(runs, registration, label,
                                kinds=("control", "controls", "matched_control", "endpoint"))
            verdicts = {h: res.get("verdict", res.get("supported")) for h, res in tested.items()}
            controls = {h: {c: comp["supported"] for c, comp in res["controls"].items()}
                        for h, res in tested.items() if "controls" in res}
            rows.append({"ratio": ratio, "persist": persist,
                         "primary": ratio == primary["ratio"] and persist == primary["persist"],
                         "cells": cell_counts(runs, label), "verdicts": verdicts, "controls": controls})
    return rows


def final_value(records: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The value of ``key`` at the last step that logged it after step 0, or None."""
    vals = sorted((int(r["step"]), float(r[key])) for r in records if int(r["step"]) > 0 and finite(r.get(key)))
    return vals[-1][1] if vals else None


def run_points(runs: Sequence[Run], label: Mapping[str, Any], step_window: tuple[int, int] = (1, 20)
               ) -> list[dict[str, Any]]:
    """One point per run, for collapse against measured step size: arm, lr, seed, :func:`step_size` over the steps
    ``step_window`` (first, last), the collapse label (:func:`collapse_time`), the final whole-split validation EM and
    the test EM."""
    out = []
    for run, (time, event) in zip(runs, labels(runs, label)):
        out.append({"arm": run["method"], "lr": run["lr"], "seed": run["seed"],
                    "step_size": step_size(run["records"], *step_window),
                    "collapse_time": time, "event": event, "final_val_em": final_value(run["records"], "eval/val_em"),
                    "test_em": (run.get("test") or {}).get("em")})
    return out

"""Seeded bootstrap intervals: of a mean or a difference of two means (:func:`bootstrap_mean`, the values resampled),
and of held-out EM resampling subjects, not questions (:func:`clustered_bootstrap`).

Questions about one subject (an entity of the world: a person, a company, a city) share its passages and its name, so
a policy tends to get them right or wrong together; the questions are not independent draws, their subjects are.
:func:`clustered_bootstrap` therefore resamples subjects (clusters) with replacement and takes every question of each
subject drawn; with one question per subject it is the question-level bootstrap. A difference of two policies (or
two methods) is paired: both sides are scored on the same draw of subjects.

Pure: outcomes in, numbers out (numpy only).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

N_BOOT = 2000  # bootstrap replicates
BOOT_SEED = 0  # one seed for every interval, so that a report rebuilt from the same results is the same
LEVEL = 0.95  # the intervals' coverage
CLUSTER_UNIT = "subject"  # what the bootstrap resamples (the report names it)


def bootstrap_mean(values: Sequence[float], n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                   level: float = LEVEL, other: Sequence[float] | None = None) -> dict[str, Any]:
    """Mean of ``values`` with its seeded percentile bootstrap interval (values resampled with replacement); with
    ``other``, the difference ``mean(values) - mean(other)``, each group resampled within itself (unpaired). None
    fields without values (in either group)."""
    if not values or (other is not None and not other):
        return {"estimate": None, "low": None, "high": None}
    rng = np.random.default_rng(seed)
    x = np.asarray(values, dtype=float)  # [n]
    reps = x[rng.integers(0, len(x), (n_boot, len(x)))].mean(axis=1)  # [n_boot]
    estimate = x.mean()
    if other is not None:
        y = np.asarray(other, dtype=float)  # [m]
        reps = reps - y[rng.integers(0, len(y), (n_boot, len(y)))].mean(axis=1)
        estimate = estimate - y.mean()
    low, high = np.percentile(reps, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return {"estimate": float(estimate), "low": float(low), "high": float(high)}


def _cluster_sums(per_run: Sequence[Mapping[str, float]], ids: Sequence[str], cluster_of: Sequence[int],
                  k: int) -> np.ndarray:
    """``[R, K]``: per run, the sum of the outcomes of each cluster's questions."""
    outcomes = np.array([[float(run[i]) for i in ids] for run in per_run])  # [R, Q]
    sums = np.zeros((len(per_run), k))
    np.add.at(sums.T, np.asarray(cluster_of), outcomes.T)
    return sums


def clustered_bootstrap(per_run: Sequence[Mapping[str, float]], ids: Sequence[str], clusters: Mapping[str, str],
                        other: Sequence[Mapping[str, float]] | None = None, n: int = N_BOOT,
                        seed: int = BOOT_SEED) -> dict[str, Any]:
    """Mean EM over runs x questions ``ids``, or with ``other`` the difference mean(per_run) - mean(other), and its
    95 % percentile interval.

    ``per_run``: one mapping question id -> outcome (0/1) per run (seed); ``clusters``: question id -> its subject.
    Each replicate draws the subjects with replacement (one draw shared by both sides of a difference: paired), every
    question of a drawn subject counted once per draw, and each side's runs with replacement; the replicate's value
    is the mean over the drawn runs of the mean over the drawn questions. ValueError when a question has no subject.
    """
    empty = {"mean": None, "lo": None, "hi": None, "runs": len(per_run), "questions": len(ids), "clusters": 0}
    if not per_run or not ids or (other is not None and not other):
        return empty
    missing = [i for i in ids if i not in clusters]
    if missing:
        raise ValueError(f"{len(missing)} questions have no {CLUSTER_UNIT} to cluster on, e.g. {missing[0]!r}")
    names = sorted({clusters[i] for i in ids})
    index = {c: j for j, c in enumerate(names)}
    cluster_of = [index[clusters[i]] for i in ids]
    sizes = np.bincount(cluster_of, minlength=len(names)).astype(float)  # [K]
    a = _cluster_sums(per_run, ids, cluster_of, len(names))  # [R, K]
    b = _cluster_sums(other, ids, cluster_of, len(names)) if other is not None else None
    rng = np.random.default_rng(seed)
    k = len(names)
    drawn = rng.integers(0, k, (n, k)) + k * np.arange(n)[:, None]  # [n, K] subjects drawn, one row per replicate
    weight = np.bincount(drawn.ravel(), minlength=n * k).reshape(n, k)  # [n, K] times each subject is drawn
    counted = weight @ sizes  # [n] questions counted per replicate
    stats = (a[rng.integers(0, len(a), (n, len(a)))].mean(1) * weight).sum(1) / counted  # [n]
    if b is not None:
        stats -= (b[rng.integers(0, len(b), (n, len(b)))].mean(1) * weight).sum(1) / counted
    point = a.sum(1).mean() / len(ids) - (b.sum(1).mean() / len(ids) if b is not None else 0.0)
    lo, hi = np.percentile(stats, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return {"mean": float(point), "lo": float(lo), "hi": float(hi), "runs": len(per_run), "questions": len(ids),
            "clusters": len(names)}


def excludes_zero(interval: Mapping[str, Any]) -> bool:
    """Whether an interval of :func:`clustered_bootstrap` lies wholly above or wholly below 0 (False when empty)."""
    return interval.get("lo") is not None and (interval["lo"] > 0 or interval["hi"] < 0)


def format_interval(interval: Mapping[str, Any] | None, digits: int = 2) -> str:
    """``mean [lo, hi]`` of an interval, or ``-`` when there is none."""
    if not interval or interval.get("mean") is None:
        return "-"
    return f"{interval['mean']:.{digits}f} [{interval['lo']:.{digits}f}, {interval['hi']:.{digits}f}]"

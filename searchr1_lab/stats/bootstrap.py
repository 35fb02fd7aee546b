"""Seeded bootstrap intervals: of a mean or a difference of two means (:func:`bootstrap_mean`, the values resampled),
and of held-out EM resampling subjects, not questions (:func:`clustered_bootstrap`).

Questions about one subject (an entity of the world: a person, a company, a city) share its passages and its name, so
a policy tends to get them right or wrong together; the questions are not independent draws, their subjects are.
:func:`clustered_bootstrap` therefore resamples subjects (clusters) with replacement and takes every question of each
subject drawn; with one question per subject it is the question-level bootstrap. A difference of two policies (or
two methods) is paired: both sides are scored on the same draw of subjects.

The registered intervals are percentile intervals. With 5-10 values a group those are too narrow (few distinct
resamples, about ``(n - 1) / n`` of the variance), so up to :data:`BCA_MAX_N` values a group the bias-corrected and
accelerated (BCa) interval from the same replicates is reported beside them, as not registered.

Pure: outcomes in, numbers out (``scipy.stats.bootstrap`` resamples; the clustered bootstrap is its own).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy import stats

N_BOOT = 2000  # bootstrap replicates
BOOT_SEED = 0  # one seed for every interval, so that a report rebuilt from the same results is the same
LEVEL = 0.95  # the intervals' coverage
CLUSTER_UNIT = "subject"  # what the bootstrap resamples (the report names it)
BCA_MAX_N = 10  # up to this many values a group, a BCa interval is reported beside the percentile one


def _fixed(group: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A group of one value as a resample of the shape of ``like`` (``[..., n]`` -> ``[..., 1]``): every resample of
    one value is that value."""
    return np.broadcast_to(group, (*like.shape[:-1], 1))


def resampled_interval(groups: Sequence[np.ndarray], statistic: Callable[..., np.ndarray], n_boot: int = N_BOOT,
                       seed: int = BOOT_SEED, level: float = LEVEL) -> dict[str, Any]:
    """The seeded bootstrap interval of ``statistic(*groups)``, each group resampled with replacement within itself
    (unpaired; ``scipy.stats.bootstrap``, ``rng = default_rng(seed)``, the groups drawn in order).

    ``groups``: non-empty ``[n_g]`` arrays; ``statistic(*samples, axis=-1)`` is vectorized: ``[..., n_g]`` samples in,
    ``[...]`` out. ``low``, ``high``: the percentile interval at ``level`` (the registered one: the ``(1 - level) / 2``
    and ``(1 + level) / 2`` quantiles of the replicates, ``numpy.percentile``); ``bca``: the bias-corrected and
    accelerated interval ``{"low", "high"}`` from the same replicates, not registered, when no group has more than
    :data:`BCA_MAX_N` values (None otherwise, or where it is undefined: every replicate equal). A group of one value
    is held fixed (SciPy resamples groups of two or more); with every group fixed the interval is the point.
    """
    varying = [i for i, g in enumerate(groups) if len(g) > 1]
    if not varying:
        point = float(statistic(*groups, axis=-1))
        return {"low": point, "high": point, "bca": None}

    def resampled(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        drawn = dict(zip(varying, samples))
        return statistic(*[drawn[i] if i in drawn else _fixed(g, samples[0]) for i, g in enumerate(groups)],
                         axis=axis)

    data = [groups[i] for i in varying]
    result = stats.bootstrap(data, resampled, n_resamples=n_boot, vectorized=True, confidence_level=level,
                             method="percentile", rng=np.random.default_rng(seed))
    # the registered ends: numpy's linear percentiles of the replicates (SciPy's quantile of the same replicates can
    # differ in the last bit, and an end that falls on a half of the summary's last digit would then change)
    low, high = np.percentile(result.bootstrap_distribution, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    out = {"low": float(low), "high": float(high), "bca": None}
    if max(len(g) for g in groups) <= BCA_MAX_N:
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            bca = stats.bootstrap(data, resampled, n_resamples=0, vectorized=True, confidence_level=level,
                                  method="BCa", bootstrap_result=result).confidence_interval
        if np.isfinite(bca.low) and np.isfinite(bca.high):
            out["bca"] = {"low": float(bca.low), "high": float(bca.high)}
    return out


def mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """``mean(x) - mean(y)`` along ``axis`` (``[...]``: one value per resample or relabelling)."""
    return x.mean(axis=axis) - y.mean(axis=axis)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return x.mean(axis=axis)


def bootstrap_mean(values: Sequence[float], n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                   level: float = LEVEL, other: Sequence[float] | None = None) -> dict[str, Any]:
    """Mean of ``values`` with its seeded percentile bootstrap interval (values resampled with replacement) and the
    BCa interval beside it (:func:`resampled_interval`); with ``other``, the difference ``mean(values) -
    mean(other)``, each group resampled within itself (unpaired). None fields without values (in either group)."""
    if not values or (other is not None and not other):
        return {"estimate": None, "low": None, "high": None, "bca": None}
    x = np.asarray(values, dtype=float)  # [n]
    if other is None:
        return {"estimate": float(x.mean()), **resampled_interval([x], _mean, n_boot, seed, level)}
    y = np.asarray(other, dtype=float)  # [m]
    return {"estimate": float(x.mean() - y.mean()),
            **resampled_interval([x, y], mean_difference, n_boot, seed, level)}


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
    replicates = (a[rng.integers(0, len(a), (n, len(a)))].mean(1) * weight).sum(1) / counted  # [n]
    if b is not None:
        replicates -= (b[rng.integers(0, len(b), (n, len(b)))].mean(1) * weight).sum(1) / counted
    point = a.sum(1).mean() / len(ids) - (b.sum(1).mean() / len(ids) if b is not None else 0.0)
    lo, hi = np.percentile(replicates, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
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

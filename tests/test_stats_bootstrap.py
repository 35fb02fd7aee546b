"""The bootstrap of a mean or a difference of means, and the subject-clustered paired bootstrap on hand-made
outcomes: what it resamples, that clusters of identical outcomes widen the interval against the question-level
bootstrap, that a difference is paired, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from searchr1_lab.baselines import question_table, subject_of, subjects
from searchr1_lab.stats.bootstrap import bootstrap_mean, clustered_bootstrap, excludes_zero, format_interval


def _singletons(ids):
    return {i: i for i in ids}


def test_two_subjects_by_hand():
    """Subject A: one question, right; subject B: three questions, wrong. A replicate draws two subjects: AA scores
    1, AB or BA 1/4, BB 0; the 97.5th percentile is 1. Drawing the four questions on their own (each its own
    subject) the count right is Binomial(4, 1/4): P(4 right) = 0.004 < 0.025 < P(3 or 4) = 0.051, so it is 0.75."""
    ids = ["a1", "b1", "b2", "b3"]
    outcome = {"a1": 1, "b1": 0, "b2": 0, "b3": 0}
    clustered = clustered_bootstrap([outcome], ids, {"a1": "A", "b1": "B", "b2": "B", "b3": "B"})
    assert clustered["mean"] == 0.25 and clustered["clusters"] == 2 and clustered["questions"] == 4
    assert (clustered["lo"], clustered["hi"]) == (0.0, 1.0)
    by_question = clustered_bootstrap([outcome], ids, _singletons(ids))
    assert by_question["mean"] == 0.25 and (by_question["lo"], by_question["hi"]) == (0.0, 0.75)


def test_clusters_of_identical_outcomes_widen_the_interval():
    """20 questions over 4 subjects of 5 questions each, every subject's questions all right or all wrong: 4
    independent outcomes, not 20; the question-level bootstrap treats them as 20 and is narrower."""
    ids = [f"q{k}" for k in range(20)]
    outcome = {q: int(k // 5 in (0, 2)) for k, q in enumerate(ids)}  # subjects 0 and 2 right, 1 and 3 wrong
    clusters = {q: f"s{k // 5}" for k, q in enumerate(ids)}
    clustered = clustered_bootstrap([outcome], ids, clusters)
    by_question = clustered_bootstrap([outcome], ids, _singletons(ids))
    assert clustered["mean"] == by_question["mean"] == 0.5
    assert clustered["hi"] - clustered["lo"] > 1.5 * (by_question["hi"] - by_question["lo"])
    assert (clustered["lo"], clustered["hi"]) == (0.0, 1.0)  # 4 draws of a fair coin: all-wrong and all-right happen


def test_one_question_per_subject_is_the_question_level_bootstrap():
    """With singleton subjects the replicate is the mean over a draw of questions (the same generator, the same
    draws: a direct question-level bootstrap written out here, one replicate at a time, agrees)."""
    rng = np.random.default_rng(3)
    ids = [f"q{k:02d}" for k in range(12)]  # sorted as listed: subject k is question k
    runs = [{q: int(rng.random() < p) for q in ids} for p in (0.3, 0.6, 0.8)]
    got = clustered_bootstrap(runs, ids, _singletons(ids), n=300, seed=7)
    a = np.array([[r[q] for q in ids] for r in runs], dtype=float)
    draw = np.random.default_rng(7)
    questions = draw.integers(0, len(ids), (300, len(ids)))  # every replicate's questions, then its runs
    runs = draw.integers(0, len(a), (300, len(a)))
    stats = [a[r][:, q].mean() for q, r in zip(questions, runs)]
    assert got["mean"] == pytest.approx(a.mean())
    assert (got["lo"], got["hi"]) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])))


def test_the_difference_is_paired_on_one_draw_of_subjects():
    ids = [f"q{k}" for k in range(10)]
    clusters = {q: f"s{k // 2}" for k, q in enumerate(ids)}
    policy = {q: int(k < 5) for k, q in enumerate(ids)}
    same = clustered_bootstrap([policy], ids, clusters, other=[policy])
    assert (same["mean"], same["lo"], same["hi"]) == (0.0, 0.0, 0.0)  # unpaired draws would scatter around 0
    better = {q: 1 for q in ids}  # right wherever the other is, and on five more
    diff = clustered_bootstrap([better], ids, clusters, other=[policy])
    assert diff["mean"] == 0.5 and diff["lo"] > 0 and excludes_zero(diff)
    assert excludes_zero(clustered_bootstrap([policy], ids, clusters, other=[better]))  # and below 0 the other way


def test_runs_are_resampled_and_the_interval_is_reproducible():
    ids = ["q0", "q1"]
    right, wrong = {i: 1 for i in ids}, {i: 0 for i in ids}
    b = clustered_bootstrap([right, wrong], ids, _singletons(ids))
    assert b["mean"] == 0.5 and 0.0 <= b["lo"] < 0.5 < b["hi"] <= 1.0 and b["runs"] == 2
    assert clustered_bootstrap([right, wrong], ids, _singletons(ids)) == b  # a fixed generator
    assert clustered_bootstrap([], ids, {})["mean"] is None and format_interval(clustered_bootstrap([], ids, {})) == "-"
    assert format_interval({"mean": 0.5, "lo": 0.25, "hi": 0.75}) == "0.50 [0.25, 0.75]"
    assert not excludes_zero({"mean": None, "lo": None, "hi": None})


def test_a_question_without_a_subject_is_an_error():
    with pytest.raises(ValueError, match="no subject"):
        clustered_bootstrap([{"q0": 1, "q1": 0}], ["q0", "q1"], {"q0": "s"})


def test_rows_name_their_subject_through_one_accessor():
    row = {"id": "x", "metadata": {"hops": 2, "family": "hq_river", "subject": "Roxfapum Company", "train_answer": 1}}
    assert subject_of(row) == "Roxfapum Company"
    table = question_table([row])
    assert table == [{"id": "x", "hops": 2, "family": "hq_river", "subject": "Roxfapum Company", "train_answer": True}]
    assert subjects(table) == {"x": "Roxfapum Company"}
    with pytest.raises(KeyError, match="subject"):
        subject_of({"id": "y", "metadata": {"hops": 1}})


def test_bootstrap_mean_of_a_difference_resamples_each_group_within_itself():
    d = bootstrap_mean([1.0, 2.0, 3.0], other=[1.0, 1.0, 1.0])
    # the control never varies, so every replicate is a resampled mean of 1, 2, 3 minus 1: within [0, 2]
    assert d["estimate"] == pytest.approx(1.0) and 0.0 <= d["low"] < 1.0 < d["high"] <= 2.0
    assert bootstrap_mean([1.0], other=[]) == {"estimate": None, "low": None, "high": None, "bca": None}
    # a group of one value is held fixed; identical values leave every replicate at the point, and no BCa
    assert bootstrap_mean([5.0, 5.0], other=[2.0]) == {"estimate": 3.0, "low": 3.0, "high": 3.0, "bca": None}
    assert bootstrap_mean([2.0], other=[1.0]) == {"estimate": 1.0, "low": 1.0, "high": 1.0, "bca": None}


def test_bca_beside_the_percentile_interval_follows_the_skew():
    """Right-skewed values (one large): the resampled means pile up low with a long right tail; BCa's bias correction
    and acceleration move its upper end right of the percentile one. Not reported above ten values a group."""
    skewed = bootstrap_mean([1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 20.0])
    assert skewed["bca"]["low"] >= skewed["low"] and skewed["bca"]["high"] > skewed["high"] + 2  # 12.1 against 9.3
    assert bootstrap_mean([float(i) for i in range(11)])["bca"] is None
    assert bootstrap_mean([float(i) for i in range(10)])["bca"] is not None

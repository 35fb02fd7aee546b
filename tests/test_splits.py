"""The validation split held out of the training rows and the fixed stratified sample (searchr1_lld/data/splits.py)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from searchr1_lld.data.splits import fixed_subsample, hold_out, question_key

from conftest import REPO_ROOT


def _rows(nq: int = 20, hotpotqa: int = 30) -> list[dict]:
    return ([{"id": f"nq-{i}", "question": f"Who is person {i}?", "golden_answers": ["a"], "data_source": "nq"}
             for i in range(nq)]
            + [{"id": f"hp-{i}", "question": f"Where is place {i}?", "golden_answers": ["b"],
                "data_source": "hotpotqa"} for i in range(hotpotqa)])


def test_the_hold_out_takes_its_size_from_each_source():
    train, val = hold_out(_rows(), 4, seed=0)
    assert Counter(r["data_source"] for r in val) == {"nq": 4, "hotpotqa": 4}
    assert Counter(r["data_source"] for r in train) == {"nq": 16, "hotpotqa": 26}
    assert [r["id"] for r in train] == [r["id"] for r in _rows() if r not in val]  # the rows' order kept


def test_the_hold_out_is_the_smallest_sha256_of_seed_and_id_in_each_source():
    """The rule the config's help states, computed here from hashlib directly."""
    rows = _rows()
    for seed in (0, 7):
        expected = set()
        for source in ("nq", "hotpotqa"):
            ids = [r["id"] for r in rows if r["data_source"] == source]
            expected |= set(sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())[:3])
        assert {r["id"] for r in hold_out(rows, 3, seed)[1]} == expected


def test_the_hold_out_is_fixed_by_its_seed_not_by_the_row_order():
    rows = _rows()
    val = {r["id"] for r in hold_out(rows, 5, seed=0)[1]}
    assert {r["id"] for r in hold_out(random.Random(3).sample(rows, len(rows)), 5, seed=0)[1]} == val
    assert {r["id"] for r in hold_out(rows, 5, seed=1)[1]} != val


def test_the_hold_out_is_the_same_in_another_process():
    """Stable across runs: nothing depends on Python's per-process string hashing."""
    code = ("import json; from searchr1_lld.data.splits import hold_out; from test_splits import _rows; "
            "print(json.dumps(sorted(r['id'] for r in hold_out(_rows(), 5, seed=0)[1])))")
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])}
        outs.append(json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                              check=True).stdout))
    assert outs[0] == outs[1] == sorted(r["id"] for r in hold_out(_rows(), 5, seed=0)[1])


def test_no_held_out_question_is_trained_on_even_asked_again_by_another_row():
    """A training row asking a validation question again (another id, case, punctuation or source) leaves the
    training rows; the rest stay."""
    rows = _rows(6, 6)
    rows += [{**r, "id": f"again-{r['id']}", "question": r["question"].upper().rstrip("?"), "data_source": "nq"}
             for r in rows if r["data_source"] == "hotpotqa"]
    dropped_any = False
    for seed in range(10):
        train, val = hold_out(rows, 2, seed)
        held = {question_key(r["question"]) for r in val}
        assert not {r["id"] for r in train} & {r["id"] for r in val}
        assert not {question_key(r["question"]) for r in train} & held
        left_out = [r for r in rows if r not in train and r not in val]
        assert all(question_key(r["question"]) in held for r in left_out)  # dropped only as a validation question
        dropped_any |= bool(left_out)
    assert dropped_any


def test_a_hold_out_that_would_empty_a_source_is_refused_and_zero_holds_out_nothing():
    with pytest.raises(ValueError, match=r"data.val_holdout.size=20 .*'nq': 20"):
        hold_out(_rows(20, 30), 20, seed=0)
    assert hold_out(_rows(), 0, seed=0) == (_rows(), [])


def test_the_fixed_sample_is_stratified_by_benchmark():
    """6 nq and 4 hotpotqa rows, a sample of 5: 3 and 2; of 7: quotas 4.2 and 2.8, the larger remainder (hotpotqa)
    gets the seventh."""
    rows = _rows(6, 4)
    assert Counter(r["data_source"] for r in fixed_subsample(rows, 5)) == {"nq": 3, "hotpotqa": 2}
    assert Counter(r["data_source"] for r in fixed_subsample(rows, 7)) == {"nq": 4, "hotpotqa": 3}
    # strata are (source, hops): 4 nq one-hop, 4 hotpotqa two-hop, 2 hotpotqa one-hop; a sample of 5: 2, 2, 1
    mixed = [{**r, "metadata": {"hops": 2 if r["data_source"] == "hotpotqa" and i < 8 else 1}}
             for i, r in enumerate(_rows(4, 6))]
    sample = fixed_subsample(mixed, 5)
    assert Counter((r["data_source"], r["metadata"]["hops"]) for r in sample) == {
        ("nq", 1): 2, ("hotpotqa", 2): 2, ("hotpotqa", 1): 1}


def test_the_fixed_sample_is_deterministic_and_its_size_configurable():
    rows = _rows()
    for size in (1, 10, 25):
        sample = fixed_subsample(rows, size)
        assert len(sample) == size and fixed_subsample(rows, size) == sample
        shuffled = random.Random(size).sample(rows, len(rows))
        assert {r["id"] for r in fixed_subsample(shuffled, size)} == {r["id"] for r in sample}  # not by position

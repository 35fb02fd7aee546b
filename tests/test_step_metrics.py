"""Terms own their metrics: each metric a term returns carries how the step reduces it (algo/step_metrics.py), and
the step logs every one without a list of names. By hand on two micro-batches, and end to end: a term registered in
a test appears in metrics.jsonl with nothing else edited."""

from __future__ import annotations

import json

import pytest
import torch

from searchr1_lld.algo import terms
from searchr1_lld.algo.step_metrics import Last, Max, PerUpdate, Sum, TokenMean, add_micro_batch, reduce_step
from searchr1_lld.config import load_config


def test_each_reduction_by_hand():
    acc: dict = {}
    # micro-batch 1: 2 response tokens; micro-batch 2: 6
    add_micro_batch(acc, {"pg_loss": 1.0, "g/per_update": PerUpdate(0.5), "g/count": Sum(3.0), "g/coef": Last(0.1),
                          "g/peak": Max(4.0), "g/share": TokenMean(0.5, weight=4.0)}, tokens=2.0)
    add_micro_batch(acc, {"pg_loss": 3.0, "g/per_update": PerUpdate(0.25), "g/count": Sum(1.0), "g/coef": Last(0.2),
                          "g/peak": Max(2.0), "g/share": TokenMean(1.0, weight=0.0)}, tokens=6.0)
    out = reduce_step(acc, updates=2)
    assert out == {"actor/pg_loss": pytest.approx((1 * 2 + 3 * 6) / 8),  # bare names are the actor's
                   "g/per_update": pytest.approx(0.75 / 2), "g/count": 4.0, "g/coef": 0.2, "g/peak": 4.0,
                   "g/share": 0.5}
    add_micro_batch(acc, {"g/empty": TokenMean(1.0, weight=0.0)}, tokens=1.0)
    assert reduce_step(acc, updates=2)["g/empty"] == 0.0  # a mean over nothing
    with pytest.raises(ValueError, match="metric g/count is reduced as Sum and as TokenMean"):
        add_micro_batch(acc, {"g/count": 1.0}, tokens=1.0)
    assert TokenMean(0.5) == 0.5 and isinstance(Sum(2.0), float)  # the types are numbers


def test_a_term_registered_in_a_test_reaches_metrics_jsonl(tmp_path, tiny_world, monkeypatch):
    """A toy term (no loss of its own) returns a token mean, a count and a per-step value; the run's metrics.jsonl
    holds all three after each step, reduced as declared, with no edit to the step or the objective."""
    from conftest import on_world
    from searchr1_lld.learner.trainer import Trainer
    from test_trainer import SMALL

    calls = []

    def toy(batch, alg):
        tokens = float((batch.response_mask != 0).sum())
        calls.append(tokens)
        return None, {"toy_ones": 1.0, "toy/tokens": Sum(tokens), "toy/last_tokens": Last(tokens)}

    monkeypatch.setattr(terms, "OBJECTIVE_TERMS", dict(terms.OBJECTIVE_TERMS))
    terms.register_term("toy")(toy)
    cfg = on_world(load_config(None, [*SMALL, "trainer.total_steps=1", f"trainer.output_dir={tmp_path}",
                                      "trainer.run_name=toy", "trainer.save_every=0"]), tiny_world)
    Trainer(cfg).run(evaluate=False)
    (record,) = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()
                 if '"actor/updates"' in line]
    assert record["actor/toy_ones"] == 1.0
    assert record["toy/tokens"] == pytest.approx(sum(calls)) and record["toy/last_tokens"] == calls[-1]
    assert torch.tensor(calls).gt(0).all()

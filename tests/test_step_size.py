"""The step size of a run: the trust-region rule by hand, the controller holding its target on a toy policy, the same
rates after a resume, the curve files' checks, a training run on the tiny world that logs and checkpoints it, and the
open-loop replay of a multiplier curve there (its rates by hand, the same after a resume)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from searchr1_lld.algo.step_size import trust_region_multiplier
from searchr1_lld.config import ConfigError, StepSizeConfig, TrainerConfig, load_config
from searchr1_lld.learner import optim
from searchr1_lld.learner.step_size import StepSizeController, read_curve_file

from test_trainer import _cfg, _trainer, shared_retriever  # noqa: F401  (the tiny world's learner and retriever)

RULE = dict(gain=0.5, max_change=1.5, lo=0.01, hi=2.0)


def test_the_rule_by_hand():
    # measured 4x the target: the full correction is sqrt(1/4) = 0.5; gain 0.5 applies half of it in log space:
    # 0.5 ** 0.5 = 0.70711; inside max_change 1.5
    assert trust_region_multiplier(0.8, 0.4, 0.1, **RULE) == pytest.approx(0.8 * 0.5 ** 0.5)
    # measured 1/4 of the target: x 2 ** 0.5 = 1.41421
    assert trust_region_multiplier(0.5, 0.025, 0.1, **RULE) == pytest.approx(0.5 * 2 ** 0.5)
    # a 100x error is bounded by max_change per step, and the multiplier by hi / lo
    assert trust_region_multiplier(1.0, 10.0, 0.1, **RULE) == pytest.approx(1 / 1.5)
    assert trust_region_multiplier(1.9, 0.001, 0.1, **RULE) == 2.0
    assert trust_region_multiplier(0.012, 10.0, 0.1, **RULE) == 0.01
    # gain 1 removes the whole error at once: 4x too large in KL -> half the rate
    assert trust_region_multiplier(1.0, 0.4, 0.1, gain=1.0, max_change=4.0, lo=0.01, hi=2.0) == pytest.approx(0.5)
    # no usable measurement: unchanged
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        assert trust_region_multiplier(0.7, bad, 0.1, **RULE) == 0.7
    assert trust_region_multiplier(0.7, 0.3, 0.0, **RULE) == 0.7


def toy_step(logits: torch.nn.Parameter, optimizer: torch.optim.Optimizer, scheduler, gen: torch.Generator,
             updates: int = 4) -> float:
    """A rollout step of a toy policy (a categorical over 50 actions, reward = action index / 50): ``updates``
    REINFORCE updates on 64 samples each, then the exact KL(before || after) of the distribution."""
    before = torch.log_softmax(logits.detach(), -1)
    reward = torch.arange(50, dtype=torch.float32) / 50
    for _ in range(updates):
        logp = torch.log_softmax(logits, -1)
        actions = torch.multinomial(logp.exp().detach(), 64, replacement=True, generator=gen)
        adv = reward[actions] - reward[actions].mean()
        loss = -(adv * logp[actions]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    after = torch.log_softmax(logits.detach(), -1)
    return float((before.exp() * (before - after)).sum())


def toy_run(settings: StepSizeConfig, steps: int, *, lr: float = 0.05, state: dict | None = None,
            start: int = 0) -> tuple[list[float], list[float], dict]:
    """``steps`` toy rollout steps under the controller (from ``state``, a checkpoint of an earlier pass that ran
    ``start`` steps); the step KLs, the learning rates in force at each step's first update, and the state."""
    tc = TrainerConfig(lr=lr, warmup_ratio=0.0, weight_decay=0.0, step_size=settings)
    controller = StepSizeController.of(settings, start + steps)
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.zeros(50))
    module = torch.nn.Module()
    module.logits = logits
    optimizer, scheduler = optim.make_optimizer(module, tc, 1000, controller)
    if state is not None:
        logits.data.copy_(state["logits"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        controller.load_state_dict(state["controller"])
        optim.refresh_lr(scheduler)
    kls, lrs = [], []
    for s in range(start, start + steps):
        gen = torch.Generator().manual_seed(1000 + s)  # every step re-seeded, as the trainer does
        lrs.append(optimizer.param_groups[0]["lr"])
        kls.append(toy_step(logits, optimizer, scheduler, gen))
        controller.observe(s + 1, kls[-1])
        optim.refresh_lr(scheduler)
    state = {"logits": logits.detach().clone(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "controller": controller.state_dict()}
    return kls, lrs, state


def test_the_controller_holds_a_constant_target_on_a_toy_policy():
    free, _, _ = toy_run(StepSizeConfig(), 40)
    target = 0.25 * sum(free[:10]) / 10  # a quarter of what the uncontrolled policy takes
    held, lrs, _ = toy_run(StepSizeConfig(target_kl=target, max_multiplier=4.0), 40)
    # after a burn-in of 15 steps, the step KL stays near the target: the mean log-ratio within log(1.25), every
    # step within a factor 2.5 (the step's own sampling noise)
    ratios = [math.log(k / target) for k in held[15:]]
    assert abs(sum(ratios) / len(ratios)) < math.log(1.25), (target, held[15:])
    assert max(abs(r) for r in ratios) < math.log(2.5)
    assert min(lrs) < 0.05  # the controller shrank the rate to get there
    # the uncontrolled run stays above the target over the same stretch: the control did the work
    assert sum(free[15:]) / 25 > 1.5 * target


def test_the_controller_follows_a_per_step_target_from_a_file(tmp_path):
    free, _, _ = toy_run(StepSizeConfig(), 10)
    base = sum(free) / 10
    curve = [base * (0.5 if s < 20 else 0.15) for s in range(45)]  # a step down at step 21
    path = tmp_path / "target.json"
    path.write_text(json.dumps({"step_kl": curve}))
    held, _, _ = toy_run(StepSizeConfig(target_file=str(path), gain=0.7, max_multiplier=4.0), 45)
    for lo, hi, level in ((10, 20, curve[0]), (32, 45, curve[-1])):
        mean_log = sum(math.log(k / level) for k in held[lo:hi]) / (hi - lo)
        assert abs(mean_log) < math.log(1.3), (lo, hi, held[lo:hi], level)


def test_a_resumed_controller_gives_the_same_rates():
    settings = StepSizeConfig(target_kl=0.002, max_multiplier=4.0)
    kls_a, lrs_a, _ = toy_run(settings, 30)
    kls_b1, lrs_b1, state = toy_run(settings, 12)
    kls_b2, lrs_b2, _ = toy_run(settings, 18, state=state, start=12)
    assert lrs_a == lrs_b1 + lrs_b2
    assert kls_a == kls_b1 + kls_b2
    assert len(set(lrs_a)) > 5  # the rates moved: the test compares something


def test_the_target_file_is_checked(tmp_path):
    path = tmp_path / "t.json"
    with pytest.raises(ConfigError, match="target_file: no file"):
        read_curve_file(path, "target_file", 3)
    path.write_text(json.dumps({"step_kl": [0.1, 0.2]}))
    with pytest.raises(ConfigError, match="holds 2 values, the run has 3 steps"):
        read_curve_file(path, "target_file", 3)
    path.write_text(json.dumps({"step_kl": [0.1, -0.2, 0.3]}))
    with pytest.raises(ConfigError, match=r"steps \[2\]"):
        read_curve_file(path, "target_file", 3)
    path.write_text(json.dumps([0.1, 0.2, 0.3]))
    with pytest.raises(ConfigError, match="'step_kl' list"):
        read_curve_file(path, "target_file", 3)
    path.write_text(json.dumps({"step_kl": [0.1, 0.2, 0.3, 0.4]}))
    assert read_curve_file(path, "target_file", 3) == [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize("values, message", [
    ([0.5, 0.7], "holds 2 values, the run has 3 steps"),
    ([0.5, 0.0, 0.7], r"steps \[2\] are not finite positive"),
    ([0.5, 0.7, -1.0], r"steps \[3\] are not finite positive"),
    ([float("nan"), 0.7, 0.7], r"steps \[1\] are not finite positive"),
    ([0.5, float("inf"), 0.7], r"steps \[2\] are not finite positive"),
])
def test_a_multiplier_file_with_too_few_or_bad_values_is_refused(tmp_path, values, message):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"lr_multiplier": values}))  # NaN and Infinity as Python's json writes them
    with pytest.raises(ConfigError, match=r"trainer\.step_size\.multiplier_file: .*" + message):
        StepSizeController.of(StepSizeConfig(multiplier_file=str(path)), 3)
    path.write_text(json.dumps({"step_kl": [0.5, 0.7, 0.9]}))  # a target file is not a multiplier file
    with pytest.raises(ConfigError, match="'lr_multiplier' list"):
        StepSizeController.of(StepSizeConfig(multiplier_file=str(path)), 3)


@pytest.mark.parametrize("target", ["trainer.step_size.target_kl=0.1", "trainer.step_size.target_file=t.json"])
def test_a_multiplier_file_with_a_target_is_refused(target):
    with pytest.raises(ConfigError, match="trainer.step_size.multiplier_file: replays its multipliers open-loop"):
        load_config(None, ["trainer.step_size.multiplier_file=m.json", target])


def test_the_replay_is_open_loop(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"lr_multiplier": [0.5, 2.0, 0.25]}))
    # the measurement is not used: any step KL, none, or one far from any target gives the same multipliers
    for measured in (1e-6, 10.0, float("nan")):
        controller = StepSizeController.of(StepSizeConfig(multiplier_file=str(path)), 3)
        assert controller.multiplier == 0.5  # in force from the first update on
        logged = [controller.observe(s, measured) for s in (1, 2, 3)]
        assert logged == [{"step_size/lr_multiplier": m} for m in (0.5, 2.0, 0.25)]
        assert controller.multiplier == 0.25  # after the curve's end: its last value


@pytest.mark.parametrize("override, message", [
    ("trainer.step_size.gain=0", "trainer.step_size.gain"),
    ("trainer.step_size.max_change=1", "trainer.step_size.max_change"),
    ("trainer.step_size.max_multiplier=0.5", "trainer.step_size.max_multiplier"),
    ("trainer.step_size.min_multiplier=0", "trainer.step_size.min_multiplier"),
])
def test_bad_settings_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_constant_and_a_file_target_together_are_refused():
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, ["trainer.step_size.target_kl=0.1", "trainer.step_size.target_file=x.json"])


def test_training_on_the_tiny_world_logs_checkpoints_and_resumes_the_controller(tmp_path, tiny_world,
                                                                                 shared_retriever):
    common = ["trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last_k=3",
              "trainer.step_size.target_kl=1e-5", "trainer.step_size.max_change=3"]
    a = _trainer(_cfg(tmp_path / "a", *common, "trainer.resume=never"), tiny_world, shared_retriever)
    hist_a = a.run(evaluate=False).history
    # the multiplier in force at step 1 is 1; each later one is the rule applied to the step before
    assert [h["step_size/target_kl"] for h in hist_a] == [1e-5] * 3
    assert hist_a[0]["step_size/lr_multiplier"] == 1.0
    for prev, cur in zip(hist_a, hist_a[1:]):
        assert cur["step_size/lr_multiplier"] == pytest.approx(trust_region_multiplier(
            prev["step_size/lr_multiplier"], prev["lld/step_kl"], 1e-5, gain=1.0, max_change=3.0, lo=0.01, hi=1.0))
        assert cur["actor/lr"] == pytest.approx(1e-3 * cur["step_size/lr_multiplier"])
    assert hist_a[-1]["step_size/lr_multiplier"] < 1.0  # the tiny policy moves more than 1e-5 nats a step
    state = json.loads((a.run_dir / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert state["step_size"]["multiplier"] < hist_a[-1]["step_size/lr_multiplier"]  # the next step's, saved
    # interrupted after step 1, resumed: the same rates and the same weights as the uninterrupted run
    cfg_b = _cfg(tmp_path / "b", *common, "trainer.resume=auto")
    b1 = _trainer(cfg_b, tiny_world, shared_retriever)
    b1.train_step()
    b1.save()
    del b1
    b2 = _trainer(cfg_b, tiny_world, shared_retriever)
    hist_b = b2.run(evaluate=False).history
    assert [h["actor/lr"] for h in hist_b] == [h["actor/lr"] for h in hist_a]
    for pa, pb in zip(a.learner.model.parameters(), b2.learner.model.parameters()):
        assert torch.equal(pa, pb)


def lrs_per_update(trainer) -> list[float]:
    """The learning rate of every optimiser step ``trainer`` takes from now on, recorded as it is taken."""
    seen: list[float] = []
    take_step = trainer.learner.optimizer_step

    def recording():
        seen.append(trainer.learner.optimizer.param_groups[0]["lr"])
        return take_step()

    trainer.learner.optimizer_step = recording
    return seen


# 2 prompts x 2 responses in mini-batches of 2, 2 epochs: 4 optimiser steps per rollout step, 12 in 3 steps; a
# warm-up of half of them: W = 6 updates, factor (u + 1) / 6 for update u < 6, then 1
REPLAY = ["trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last_k=3", "trainer.warmup_ratio=0.5"]
REPLAYED = [0.5, 2.0, 0.25]


@pytest.fixture(scope="module")
def replayed_run(tmp_path_factory, tiny_world, shared_retriever):
    """An unbroken 3-step run on the tiny world replaying :data:`REPLAYED`: its directory, history and the learning
    rate of each of its updates."""
    root = tmp_path_factory.mktemp("replay")
    (root / "m.json").write_text(json.dumps({"lr_multiplier": REPLAYED}))
    trainer = _trainer(_cfg(root / "a", *REPLAY, f"trainer.step_size.multiplier_file={root / 'm.json'}",
                            "trainer.resume=never"), tiny_world, shared_retriever)
    lrs = lrs_per_update(trainer)
    history = trainer.run(evaluate=False).history
    return root, history, lrs


def test_a_replayed_multiplier_curve_sets_each_steps_learning_rate(replayed_run):
    _, history, lrs = replayed_run
    # base 1e-3 x warm-up (u + 1) / 6 x m_s:
    #   step 1 (m 0.5):  1/12, 2/12, 3/12, 4/12 (x 1e-3)
    #   step 2 (m 2.0):  5/6 x 2 = 10/6, then 2, 2, 2
    #   step 3 (m 0.25): 0.25 each
    expected = [1 / 12, 2 / 12, 3 / 12, 4 / 12, 10 / 6, 2.0, 2.0, 2.0, 0.25, 0.25, 0.25, 0.25]
    assert lrs == pytest.approx([1e-3 * e for e in expected], rel=1e-9)
    assert [h["step_size/lr_multiplier"] for h in history] == REPLAYED
    assert not any("step_size/target_kl" in h for h in history)  # nothing is fed back


def test_a_resumed_replay_gives_the_same_learning_rates(replayed_run, tiny_world, shared_retriever):
    root, history, lrs = replayed_run
    cfg = _cfg(root / "b", *REPLAY, f"trainer.step_size.multiplier_file={root / 'm.json'}", "trainer.resume=auto")
    first = _trainer(cfg, tiny_world, shared_retriever)
    lrs_first = lrs_per_update(first)
    first.train_step()  # step 1, then interrupted
    first.save()
    del first
    resumed = _trainer(cfg, tiny_world, shared_retriever)
    lrs_resumed = lrs_per_update(resumed)
    history_b = resumed.run(evaluate=False).history
    assert len(lrs_first) == 4 and lrs_first + lrs_resumed == lrs
    assert [h["step_size/lr_multiplier"] for h in history_b] == REPLAYED

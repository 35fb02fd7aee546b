"""What LLDS costs in a whole training step: ``Trainer.train_step`` on the tiny config, LLDS on vs off.

The demo's learner as ``make demo`` runs it (configs/tiny.yaml: 16 prompts x 8 responses, 4 optimiser steps a step,
micro-batch token budget 4096, LLDS lam 0.2 with the action gate, HF rollout backend, in-process retriever) on the
synthetic world in ``--world-dir`` (default ``.cache/world``, the demo's; built there from
configs/world/default.yaml first if it is not, as ``make demo`` does).

Paired steps: before each step the trainer's state (policy weights, optimiser and scheduler state, data position,
RNG, monitor state) is saved in memory; the step runs with one variant, the state is restored and the *same* step
runs with the other variant (same prompts, same sampled responses: the rollout is seeded per step), and the second
run's state is kept. The two runs of a pair differ only in the variant, so their ratio is free of the step-to-step
variation of the rollout; the order within a pair alternates, and the number of timed pairs is even: the first run of
a pair is slower than the second by a few per cent whichever the variant (``RESULT order_effect_wall`` measures it),
so a ratio over unequal numbers of each order (or the median of the per-pair ratios, which picks one of them) carries
that effect; over equal numbers it cancels. One untimed pair first (warm-up). Times are wall-clock
(``time.perf_counter``) and the process's CPU time (``time.process_time``, all threads) of the whole ``train_step``,
and wall-clock of its update phase (``step.update_policy``: the ppo_epochs x mini-batches x micro-batches of forward,
objective, backward and optimiser step). The machine may be shared: only ratios within one run mean anything.

Variants: ``llds_on`` (the config: LLDS lam 0.2, action gate) and ``llds_off`` (``algorithm.llds.enabled=false``).
Prints one line per timed run, then, with the first variant as the numerator and the second as the denominator:
``RESULT step_ratio_<a>_over_<b>_wall X`` (geometric mean of the per-pair ratios of whole-step wall time),
``RESULT step_ratio_<a>_over_<b>_cpu X`` (the same in CPU time), ``RESULT update_ratio_<a>_over_<b>_wall X``
(the update phase alone), ``RESULT order_effect_wall X`` (geometric mean of first / second run of a pair), and the
medians ``RESULT step_wall_s_<variant> X`` / ``RESULT update_wall_s_<variant> X``; ``..._wall_ci95_low / _high``: the 95 %
interval of the step and update ratios (Student's t on the per-pair log ratios; the rollout's time varies from run to
run even on the same samples, so a ratio nearer 1 than this interval's half-width is not resolved).
"""

from __future__ import annotations

import argparse
import copy
import math
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable

from scipy import stats

from searchr1_lld.bookkeeping import checkpoint
from searchr1_lld.config import load_config
from searchr1_lld.learner import step


def _llds(enabled: bool) -> Callable[[Any], None]:
    def apply(tr: Any) -> None:
        tr.cfg.algorithm.llds.enabled = enabled  # read by the objective at every update

    return apply


VARIANTS: dict[str, Callable[[Any], None]] = {"llds_on": _llds(True), "llds_off": _llds(False)}


def snapshot(tr: Any) -> dict[str, Any]:
    """Everything one train_step reads and changes, copied."""
    return {
        "model": {k: v.detach().clone() for k, v in tr.learner.model.state_dict().items()},
        "optimizer": copy.deepcopy(tr.learner.optimizer.state_dict()),
        "scheduler": copy.deepcopy(tr.learner.scheduler.state_dict()),
        "sampler": dict(tr.sampler.state()),
        "step": tr.step,
        "skipped_updates": tr.skipped_updates,
        "detector": copy.deepcopy(tr.detector),
        "probe": copy.deepcopy(tr.probe),
        "rng": checkpoint.capture_rng_state(),
    }


def restore(tr: Any, state: dict[str, Any]) -> None:
    tr.learner.model.load_state_dict(state["model"])
    # (copies: the optimiser adopts the tensors it is given and its step updates them in place, which would change
    # ``state`` for its next use)
    tr.learner.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
    tr.learner.scheduler.load_state_dict(copy.deepcopy(state["scheduler"]))
    tr.sampler.load_state(state["sampler"])
    tr.step, tr.skipped_updates = state["step"], state["skipped_updates"]
    tr.detector = copy.deepcopy(state["detector"])
    tr.probe = copy.deepcopy(state["probe"])
    checkpoint.restore_rng_state(state["rng"])
    tr.learner.sync_engine()


def timed_step(tr: Any) -> tuple[float, float, dict[str, Any]]:
    """(wall s, CPU s, metrics) of one train_step."""
    w0, c0 = time.perf_counter(), time.process_time()
    metrics = tr.train_step()
    return time.perf_counter() - w0, time.process_time() - c0, metrics


def ratio_interval(xs: list[float], ys: list[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` interval of the geometric mean of the per-pair ratios ``x_i / y_i``: Student's t on their logs
    (n - 1 degrees of freedom). A ratio nearer 1 than this interval's half-width is not resolved by the run."""
    low, high = mean_interval([math.log(x / y) for x, y in zip(xs, ys)], level)
    return math.exp(low), math.exp(high)


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` Student's t interval of the mean of ``values`` (n - 1 degrees of freedom)."""
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    centre = statistics.fmean(values)
    return centre - half, centre + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--world-dir", default=".cache/world", help="the synthetic world (built there if missing)")
    ap.add_argument("--world", default="configs/world/default.yaml", help="its world config")
    ap.add_argument("--pairs", type=int, default=6, help="timed pairs, even (after one untimed warm-up pair)")
    ap.add_argument("--update-pairs", type=int, default=0,
                    help="then time the update phase alone on one fixed batch, this many pairs (even; 0: skip)")
    ap.add_argument("--variants", default="llds_on,llds_off", help=f"two of {sorted(VARIANTS)}: numerator,denominator")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_args()
    names = args.variants.split(",")
    if len(names) != 2 or not set(names) <= set(VARIANTS):
        raise SystemExit(f"--variants needs two of {sorted(VARIANTS)}; got {args.variants!r}")
    if args.pairs < 2 or args.pairs % 2:
        raise SystemExit(f"--pairs must be even and >= 2 (each order of the variants as often); got {args.pairs}")
    if args.update_pairs < 0 or args.update_pairs % 2 or args.update_pairs == 2:
        raise SystemExit(f"--update-pairs must be 0 or even and >= 4; got {args.update_pairs}")

    from searchr1_lld.learner.trainer import Trainer
    from searchr1_lld.world import ensure_world, load_world_config, trainer_overrides

    ensure_world(args.world_dir, load_world_config(args.world))

    out = tempfile.mkdtemp(prefix="bench_llds_step-")
    overrides = [f"trainer.output_dir={out}", "logging.progress_bar=false", "logging.plot_every=0",
                 "trainer.total_steps=1000",  # (the LR schedule: nearly constant over the few steps run here)
                 *trainer_overrides(args.world_dir), *args.overrides]
    cfg = load_config(args.config, overrides)
    tr = Trainer(cfg, run_dir=out)

    update_times: list[float] = []
    update_inputs: list[tuple[tuple, dict]] = []  # the last update's arguments
    real_update = step.update_policy

    def timed_update(*a: Any, **k: Any) -> Any:
        update_inputs[:] = [(a, k)]
        t0 = time.perf_counter()
        result = real_update(*a, **k)
        update_times.append(time.perf_counter() - t0)
        return result

    step.update_policy = timed_update
    wall: dict[str, list[float]] = {n: [] for n in names}
    first_over_second: list[float] = []
    cpu: dict[str, list[float]] = {n: [] for n in names}
    upd: dict[str, list[float]] = {n: [] for n in names}
    print(f"config {args.config}, world {args.world_dir}, {tr.updates_per_step} updates a step, "
          f"variants {names[0]} / {names[1]}, {args.pairs} timed pairs after 1 warm-up pair", flush=True)
    for pair in range(args.pairs + 1):
        order = names if pair % 2 == 0 else names[::-1]
        state = snapshot(tr)
        for k, name in enumerate(order):
            if k:
                restore(tr, state)
            VARIANTS[name](tr)
            w, c, m = timed_step(tr)
            label = "warm-up" if pair == 0 else f"pair {pair}"
            print(f"{label} {name:9s} step {w:6.2f} s wall, {c:6.2f} s CPU, update {update_times[-1]:6.2f} s wall; "
                  f"reward {m.get('reward/em_mean', float('nan')):.4f}, "
                  f"response tokens {m.get('rollout/response_length_mean', float('nan')):.2f}, "
                  f"pg_loss {m.get('actor/pg_loss', float('nan')):.6f}, llds/loss {m.get('llds/loss', 0.0):.6f}",
                  flush=True)
            if pair:
                if k:
                    first_over_second.append(wall[order[0]][-1] / w)
                wall[name].append(w)
                cpu[name].append(c)
                upd[name].append(update_times[-1])
    a, b = names
    ratio = lambda xs, ys: statistics.geometric_mean([x / y for x, y in zip(xs, ys)])  # noqa: E731
    print(f"RESULT step_ratio_{a}_over_{b}_wall {ratio(wall[a], wall[b]):.4f}")
    print(f"RESULT step_ratio_{a}_over_{b}_cpu {ratio(cpu[a], cpu[b]):.4f}")
    print(f"RESULT update_ratio_{a}_over_{b}_wall {ratio(upd[a], upd[b]):.4f}")
    for name, xs, ys in (("step", wall[a], wall[b]), ("update", upd[a], upd[b])):
        low, high = ratio_interval(xs, ys)
        print(f"RESULT {name}_ratio_{a}_over_{b}_wall_ci95_low {low:.4f}")
        print(f"RESULT {name}_ratio_{a}_over_{b}_wall_ci95_high {high:.4f}")
    print(f"RESULT order_effect_wall {statistics.geometric_mean(first_over_second):.4f}")
    for n in names:
        print(f"RESULT step_wall_s_{n} {statistics.median(wall[n]):.3f}")
        print(f"RESULT update_wall_s_{n} {statistics.median(upd[n]):.3f}")
    if args.update_pairs:
        a_args, a_kwargs = update_inputs[0]
        fixed_update_pairs(tr, names, args.update_pairs, lambda: real_update(*a_args, **a_kwargs),
                           statistics.median(wall[b]))
    shutil.rmtree(out, ignore_errors=True)


def fixed_update_pairs(tr: Any, names: list[str], pairs: int, run_update: Callable[[], dict[str, float]],
                       step_wall_b: float) -> None:
    """Time ``run_update`` (one step's update phase on a fixed batch) under each variant in ``pairs`` interleaved
    pairs of alternating order after one untimed pair, the learner's state restored before every run; print the
    RESULT lines of the module's docstring."""
    state = snapshot(tr)
    times: dict[str, list[float]] = {n: [] for n in names}
    pg_loss: dict[str, list[float]] = {n: [] for n in names}
    for pair in range(pairs + 1):
        for name in names if pair % 2 == 0 else names[::-1]:
            restore(tr, state)
            VARIANTS[name](tr)
            t0 = time.perf_counter()
            metrics = run_update()
            seconds = time.perf_counter() - t0
            print(f"{'warm-up' if pair == 0 else f'pair {pair}'} {name:9s} fixed-batch update {seconds:6.3f} s wall; "
                  f"pg_loss {metrics.get('actor/pg_loss', float('nan')):.6f}", flush=True)
            if pair:
                times[name].append(seconds)
                pg_loss[name].append(metrics.get("actor/pg_loss", float("nan")))
    a, b = names
    ratios = [x / y for x, y in zip(times[a], times[b])]
    low, high = ratio_interval(times[a], times[b])
    print(f"RESULT fixed_update_ratio_{a}_over_{b}_wall {statistics.geometric_mean(ratios):.4f}")
    print(f"RESULT fixed_update_ratio_{a}_over_{b}_wall_ci95_low {low:.4f}")
    print(f"RESULT fixed_update_ratio_{a}_over_{b}_wall_ci95_high {high:.4f}")
    for n in names:
        print(f"RESULT fixed_update_wall_s_{n} {statistics.median(times[n]):.3f}")
    spread = max(max(v) - min(v) for v in pg_loss.values())
    print(f"RESULT fixed_update_pg_loss_spread {spread:.3g}")
    if spread:
        raise SystemExit("the runs of one variant computed different losses: the learner's state is not fully "
                         "restored between runs, so their times do not time the same work")
    diffs = [x - y for x, y in zip(times[a], times[b])]
    low, high = mean_interval(diffs)
    print(f"RESULT step_ratio_{a}_over_{b}_from_update {1 + statistics.fmean(diffs) / step_wall_b:.4f}")
    print(f"RESULT step_ratio_{a}_over_{b}_from_update_ci95_low {1 + low / step_wall_b:.4f}")
    print(f"RESULT step_ratio_{a}_over_{b}_from_update_ci95_high {1 + high / step_wall_b:.4f}")


if __name__ == "__main__":
    main()

"""The death-spiral lab: GRPO vs LLDS (response gate, action gate, LLDS-MA) on the synthetic world, on a CPU.

    python -m searchr1_lab                       # full comparison (configs/lab/lab.yaml, seeds 0,1) -> docs/lab
    python -m searchr1_lab --quick --out /tmp/lab   # under a minute on the demo's world: configs/lab/quick.yaml
    python -m searchr1_lab --seeds 0,1 --methods grpo,llds_action trainer.lr=1e-3 rollout.n=8   # exploration
    python -m searchr1_lab --report-only --runs-dir runs/lab    # rebuild the report from finished runs
    python -m searchr1_lab --runs-dir runs/lab-90 --extend-from runs/lab trainer.total_steps=90   # 30 more steps
    python -m searchr1_lab grid --config configs/lab/compare.yaml --lrs 5e-4,1e-3,2e-3 ...   # the comparison
    python -m searchr1_lab report --runs docs/lab/runs --out docs/lab --readme docs/lab/results.md   # its claims

Five studies share the resumable grid (grid.py, on the task driver in driver.py, which ``sweep --local`` runs
through too) and its pieces (compact.py, one small file per finished run;
baselines.py, the baselines, the not-guessable slice and each question's subject; ``stats/``, the statistics: survival,
small-sample tests, bootstrap and proportion intervals; ``registered/``, the registration and report command every
registered study shares), each in a folder of its own with one public entry: ``comparison/`` (selection on validation,
intervals, the detector measured, the report and the README block, from the compact files alone; docs/lab.md),
``prereg/`` (the pre-registered study: the registration, its label and alarms, its analysis and report),
``demo/`` (the demo's selection on validation and its report; run by :mod:`searchr1_lab.demo`), ``stepsize/``
(the step-size study and the trust-region study built like it: its registration, which the grid runs, its analysis of
mechanism or smaller steps, survival of runs to a collapse, the registered hypotheses, alarms at a matched false-alarm
rate, and its report, ``python -m searchr1_lab stepsize-report``) and ``frontier/`` (every fix at its doses:
``python -m searchr1_lab frontier-report``). The reports write their result blocks into docs/lab/results.md;
``findings.py`` takes one row per claim from their summaries into the README's findings table, and draws the headline
figure (``python -m searchr1_lab.findings``). ``studies.py`` names the world each committed study ran on and how it is
rebuilt; ``fresh.py`` reruns a study's grid into a fresh directory (``grid --fresh DIR``).

What one lab does
    1. one synthetic world (``searchr1_lld.world.ensure_world`` of the lab config's ``world: FILE``; ``--world-dir`` or
       ``.cache/lab-world-<config hash>``)
       and one in-process retriever shared by every run;
    2. the warm-started policy evaluated once (greedy, test split): the "warm start" row of the EM table;
    3. for every seed, for every method: ``searchr1_lld.learner.trainer.Trainer(cfg).run()`` (metrics.jsonl, the monitor's
       phase per step) then the evaluator (``searchr1_lld.evaluation.evaluate``: greedy, test split, results.json with
       single-hop / multi-hop EM and searches per question) on the trained policy, in memory, and with ``--sampled N``
       (default 4) the sampled policy's EM (``searchr1_lld.evaluation.sampled_em``: N rollouts per test question at
       the rollout temperature, one sampling seed for every policy; the warm start too), and with ``--train-eval N``
       (default 100; 16 with --quick) greedy on the first N training questions (RUN/eval_train);
    4. one markdown report (``OUT/README.md``) + ``OUT/summary.json`` + side-by-side curves (``OUT/*.png``).

Methods (:data:`METHODS`) differ ONLY in ``algorithm.llds.{enabled, gate, ma}``; every other setting, the LLDS
coefficients included, comes from the same config and overrides. :func:`check_only_llds_differs` enforces this before
anything trains ("never tune the two methods differently").

Numbers in the report
    EM table: per method, mean ± sample std over seeds of the per-run test EM (all questions; single-hop; multi-hop)
    and of the mean number of valid searches per test question. "All" is the micro-average over every test question
    (what ``results.json`` calls ``em``), not the mean of the two columns. Sampled EM: mean EM over all N x questions
    rollouts (what the training reward measures; greedy EM scores the policy's mode, which can drift from it).
    Copy or recall: per split (test; the first N training questions), EM and where the answers came from, judged from
    the passages each trajectory retrieved (``running.provenance``; ``world.scoring.answer_provenance``): a gold
    passage retrieved, the answer copied from one, right without one (recalled, or guessed).
    Phases: the trainer's phase detector (``phase/name`` per step in metrics.jsonl): first step and number of steps in
    each phase; early-warning steps are recomputed with the same detector (:class:`searchr1_lld.instruments.monitor.PhaseDetector`).
    Trends: means over the first / last ``TREND_WINDOW`` steps of reward, correct / incorrect log-likelihood per token,
    the probe set's log-likelihood (the same correct responses re-measured), entropy, and the largest grad norm.

Layout: methods.py (the arms and their configs), running.py (world, runs, summary), evaluating.py (greedy and
sampled EM of a policy, provenance), analysis.py (phases, trends, verdicts), plots.py (curves, and the one table of
colours every figure draws its arms with), report.py
(README.md), cli.py (the command line).
"""

from __future__ import annotations

from searchr1_lab.analysis import (aggregate, aggregate_curves, curve_summary, finite, lld_verdict, load_records,
                                   mean_std, phase_summary, val_em_curve, trend_summary, warning_summary,
                                   window_mean)
from searchr1_lab.methods import (FULL_CONFIG, LLD_MARGIN, METHODS, METHOD_KEYS, QUICK_CONFIG, REPO_ROOT,
                                  REWARD_MARGIN, RUN_KEYS, RUN_PLAN, RUN_RECORD, TREND_WINDOW, Method,
                                  check_only_llds_differs, config_differences, lab_config, method_config,
                                  parse_methods, parse_seeds, read_lab_config, run_name, shared_settings)
from searchr1_lab.plots import COLOURS, CURVES, colour, plot_curves
from searchr1_lab.report import (curve_columns, em_table, fmt, fmt_ms, per_run_table, phase_table, trend_table,
                                 warning_text, write_report)
from searchr1_lab.evaluating import (eval_summary, evaluate_policy, evaluate_sampled, evaluate_train,
                                     evaluate_warm_start, final_policy, load_warm_start, provenance, sampled_of_run,
                                     warm_start_sampled)
from searchr1_lab.running import exclusive, finished, load_run, prepare_world, resolve_world_dir, run_lab, run_one
from searchr1_lab.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    """The command line (:mod:`searchr1_lab.cli`)."""
    return cli_main(argv, description=__doc__)

"""The pre-registered death-spiral comparison, analysed exactly as registered (pure but for reading files and git).
Its report, figures and README block: :mod:`.report` (``python -m searchr1_lab prereg-report``).

The registration (``docs/lab/preregistration.json``, with its prose twin ``docs/lab/preregistration.md``) fixes the
grid, the held-out collapse label, the alarms and the hypotheses before any of its runs; this module reads it and the
grid's compact results (:mod:`.compact`: one file per run, and the baselines' file with the warm start's answers on
the validation and test splits) and computes:

- per run: the held-out collapse label (:func:`.detection.held_out_collapse_step` of its validation-EM curve against
  the warm start's validation EM), the training-reward collapse (secondary), the first step of every registered alarm
  and the phenomena (likelihood displacement, entropy, gradient norm, valid searches, reward; :func:`phenomena`);
- H1: at the rates where GRPO's held-out EM collapses on at least half of its seeds, each LLDS arm's share of
  collapsed runs minus GRPO's (Newcombe interval); supported for an arm when the interval lies below 0;
- H2: the probe-likelihood alarm, per collapsed run whether it fired at least ``lead_k`` steps before the collapse,
  and within the rates that hold both outcomes, how often it fired (at all) in runs that collapsed vs runs that did
  not; supported when that difference's interval lies above 0;
- H3: single-hop test EM of each LLDS arm minus GRPO at the H1 rates (paired bootstrap over test subjects and seeds);
  supported for an arm when the interval lies above 0;
- every alarm scored against the held-out label overall and within each rate (:func:`.detection.score_alarm`).

Anything else the report shows is exploratory and says so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lld.config import ConfigError
from searchr1_lab.analysis import finite, mean_std, val_em_curve, window_mean
from searchr1_lab.baselines import subjects
from searchr1_lab.compact import read_runs
from searchr1_lab.prereg.detection import held_out_collapse_step, refuse_collapse_signals, score_alarm
from searchr1_lab.stats.proportions import newcombe_difference, wilson
from searchr1_lab.stats.bootstrap import clustered_bootstrap
from searchr1_lab.methods import REPO_ROOT
from searchr1_lld.instruments import alarms
from searchr1_lld.instruments.alarms import Alarm, median_of_first
from searchr1_lld.instruments.phases import reward_collapse_step

PREREG_FILE = "docs/lab/preregistration.json"
CONTROL = "grpo"  # the arm every hypothesis compares against
def load_preregistration(path: str | Path = REPO_ROOT / PREREG_FILE) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def make_alarm(spec: Mapping[str, Any]) -> Alarm:
    """An alarm from its registered ``spec`` (:func:`searchr1_lld.instruments.alarms.make_alarm`: ``{"name", "kind",
    "key", ...}``, e.g. kind ``drop_below_start`` with ``drop`` and optional ``reference_key`` / ``start_points``, or
    ``ratio_over_early`` with ``ratio`` and ``early_steps``), refused when it reads a collapse signal."""
    return refuse_collapse_signals(alarms.make_alarm(spec))


def warm_val_em(base: Mapping[str, Any]) -> float:
    """The warm start's greedy validation EM from the baselines' file (its answers question by question)."""
    correct = base["splits"]["val"]["correct"]["warm_start"]
    return sum(correct.values()) / len(correct)


def val_curve(records: Sequence[Mapping[str, Any]], warm_em: float) -> list[list[float]]:
    """``[[step, validation EM], ...]`` of a run, starting with the warm start's at step 0."""
    return [[0, warm_em], *val_em_curve(records)]


def _ratio_to_early(records: Sequence[Mapping[str, Any]], key: str, early: int) -> float:
    """Largest value of ``key`` over the median of its first ``early`` finite values (NaN when undefined)."""
    vals = [float(r[key]) for r in records if finite(r.get(key))]
    base = median_of_first(vals, early)
    return max(vals) / base if finite(base) and base > 0 else float("nan")


def phenomena(records: Sequence[Mapping[str, Any]], window: int, early_steps: int) -> dict[str, float]:
    """The paper's phenomena in one run: start and end (means of the first / last ``window`` finite values) of the
    sampled correct and incorrect responses' log-likelihood per token, entropy, valid searches and reward; the probe
    set's likelihood before any update of it and at the end; the largest gradient norm over its early median (the
    first ``early_steps`` values), over all updates and over the updates with non-zero advantages."""
    out: dict[str, float] = {}
    for name, key in (("correct_logp", "lld/correct_logp_old_per_token"),
                      ("incorrect_logp", "lld/incorrect_logp_old_per_token"), ("entropy", "actor/entropy"),
                      ("valid_searches", "rollout/valid_searches_mean"), ("reward", "reward/em_mean")):
        out[f"{name}_start"] = window_mean(records, key, "first", window)
        out[f"{name}_end"] = window_mean(records, key, "last", window)
    out["probe_logp_initial"] = window_mean(records, "probe/initial_logp_per_token", "first", 1)
    out["probe_logp_end"] = window_mean(records, "probe/logp_per_token", "last", 1)
    out["grad_norm_max_ratio"] = _ratio_to_early(records, "actor/grad_norm", early_steps)
    out["grad_norm_signal_max_ratio"] = _ratio_to_early(records, "actor/grad_norm_signal", early_steps)
    return out


def run_labels(run: Mapping[str, Any], warm_em: float, label: Mapping[str, Any], alarms: Sequence[Alarm],
               phen: Mapping[str, Any]) -> dict[str, Any]:
    """One run's label, secondary label, alarms and phenomena."""
    records = run["records"]
    curve = val_curve(records, warm_em)
    rewards = [r.get("reward/em_mean") for r in records]
    idx = reward_collapse_step(rewards, ratio=label["reward_ratio"], persist=label["persist"])
    return {"method": run["method"], "lr": run["lr"], "seed": run["seed"], "code": run.get("code"),
            "collapse_step": held_out_collapse_step(curve, warm_em, ratio=label["ratio"], persist=label["persist"]),
            "reward_collapse_step": int(records[idx]["step"]) if idx is not None else None,
            "val_em_curve": curve, "val_em_end": curve[-1][1], "test_em": run["test"]["em"],
            "alarms": {a.name: a.first_step(records) for a in alarms},
            "phenomena": phenomena(records, phen["window"], phen["early_steps"])}


def h1(labels: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Collapse counts per arm and rate; the rates where GRPO collapsed on at least half its seeds; per LLDS arm its
    pooled collapse share there minus GRPO's, with Newcombe's interval; supported when the interval is below 0."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in arms:
        for lr in sorted({r["lr"] for r in labels}):
            mine = [r for r in labels if r["method"] == arm and r["lr"] == lr]
            cells.setdefault(arm, {})[f"{lr:g}"] = wilson(sum(r["collapse_step"] is not None for r in mine), len(mine))
    rates = [lr for lr, c in cells.get(CONTROL, {}).items() if c["n"] and c["k"] >= c["n"] / 2]
    out: dict[str, Any] = {"cells": cells, "rates": rates, "arms": {}}
    if not rates:
        out["verdict"] = "not testable: GRPO's held-out EM collapsed on at least half the seeds at no rate"
        return out
    k0, n0 = (sum(cells[CONTROL][lr][x] for lr in rates) for x in ("k", "n"))
    for arm in arms:
        if arm == CONTROL:
            continue
        k, n = (sum(cells[arm][lr][x] for lr in rates) for x in ("k", "n"))
        d = newcombe_difference(k, n, k0, n0)
        out["arms"][arm] = {"collapsed": k, "runs": n, "grpo_collapsed": k0, "grpo_runs": n0, "difference": d,
                            "supported": d["hi"] is not None and d["hi"] < 0}
    return out


def h2(labels: Sequence[Mapping[str, Any]], alarm: str, lead_k: int) -> dict[str, Any]:
    """The likelihood alarm ``alarm``: among collapsed runs, the share it warned at least ``lead_k`` steps ahead;
    within the rates holding both outcomes, its firing share in collapsed minus non-collapsed runs (supported when
    that interval lies above 0)."""
    collapsed = [r for r in labels if r["collapse_step"] is not None]
    early = sum(r["alarms"][alarm] is not None and r["collapse_step"] - r["alarms"][alarm] >= lead_k for r in collapsed)
    mixed = [lr for lr in sorted({r["lr"] for r in labels})
             if len({r["collapse_step"] is None for r in labels if r["lr"] == lr}) == 2]
    inside = [r for r in labels if r["lr"] in mixed]
    fired_c = [r["alarms"][alarm] is not None for r in inside if r["collapse_step"] is not None]
    fired_q = [r["alarms"][alarm] is not None for r in inside if r["collapse_step"] is None]
    d = newcombe_difference(sum(fired_c), len(fired_c), sum(fired_q), len(fired_q))
    return {"alarm": alarm, "lead_k": lead_k, "warned_k_ahead": wilson(early, len(collapsed)),
            "mixed_rates": [f"{lr:g}" for lr in mixed], "fired_in_collapsed": wilson(sum(fired_c), len(fired_c)),
            "fired_in_not_collapsed": wilson(sum(fired_q), len(fired_q)), "difference": d,
            "supported": d["lo"] is not None and d["lo"] > 0,
            "verdict": None if mixed else "not testable: no rate holds both collapsed and non-collapsed runs"}


def h3(raw: Sequence[Mapping[str, Any]], base: Mapping[str, Any], arms: Sequence[str],
       rates: Sequence[str]) -> dict[str, Any]:
    """Single-hop test EM of each LLDS arm minus GRPO over the H1 ``rates`` (every seed of each), paired bootstrap
    over the test split's subjects and the runs."""
    questions = base["splits"]["test"]["questions"]
    one_hop = [q["id"] for q in questions if q["hops"] == 1]
    clusters = subjects(questions)

    def correct(arm: str) -> list[dict[str, float]]:
        return [r["test"]["correct"] for r in raw if r["method"] == arm and f"{r['lr']:g}" in rates]

    out: dict[str, Any] = {"rates": list(rates), "questions": len(one_hop), "arms": {}}
    for arm in arms:
        if arm == CONTROL or not rates:
            continue
        ci = clustered_bootstrap(correct(arm), one_hop, clusters, other=correct(CONTROL))
        out["arms"][arm] = {"difference": ci, "supported": ci["lo"] is not None and ci["lo"] > 0}
    if not rates:
        out["verdict"] = "not testable: no H1 rate"
    return out


def phenomena_table(labels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per method and rate: the mean over its seeds of every phenomenon (:func:`phenomena`)."""
    rows = []
    for arm in dict.fromkeys(r["method"] for r in labels):
        for lr in sorted({r["lr"] for r in labels if r["method"] == arm}):
            mine = [r["phenomena"] for r in labels if r["method"] == arm and r["lr"] == lr]
            mean = {k: mean_std([p[k] for p in mine])[0] for k in mine[0]}
            rows.append({"method": arm, "lr": lr, "runs": len(mine), **mean})
    return rows


def analyse(prereg: Mapping[str, Any], runs_dir: str | Path) -> dict[str, Any]:
    """The registered analysis of the compact results in ``runs_dir`` (see the module docstring)."""
    raw, base = read_runs(runs_dir)
    if base is None:
        raise FileNotFoundError(f"{runs_dir} holds no baselines file: the warm start's validation EM defines the label")
    grid = prereg["grid"]
    planned = len(grid["methods"]) * len(grid["lrs"]) * len(grid["seeds"])
    alarms = [make_alarm(spec) for spec in prereg["alarms"]]
    warm = warm_val_em(base)
    labels = [run_labels(r, warm, prereg["label"], alarms, prereg["phenomena"]) for r in raw]
    hyp = prereg["hypotheses"]
    one = h1(labels, grid["methods"])
    return {"registration": prereg["registration"], "warm_start_val_em": warm,
            "collapse_bound": prereg["label"]["ratio"] * warm, "runs_finished": len(raw), "runs_planned": planned,
            "complete": len(raw) >= planned, "H1": one, "H2": h2(labels, hyp["H2"]["alarm"], hyp["H2"]["lead_k"]),
            "H3": h3(raw, base, grid["methods"], one["rates"]),
            "alarms": [score_alarm([{**lab, "records": r["records"]} for lab, r in zip(labels, raw)], a)
                       for a in alarms],
            "phenomena": phenomena_table(labels), "runs": labels}


def _git(repo: str | Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)


def registration_violations(repo: str | Path, prereg_file: str, runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why the runs cannot count as pre-registered, one sentence each (empty: they all can). ``prereg_file``: the
    registration's path in the git repository ``repo``; ``runs``: compact run records (their ``code``).

    The registration's commit is the last commit that changed ``prereg_file``; checked: the file in the working tree
    is that commit's, and its recorded ``analysis_commit`` is an ancestor of it; every run records the clean commit it
    started from, which descends from the registration's commit and holds the registration as it is (a run started
    before the registration took its present form, or from a dirty tree, is named)."""
    last = _git(repo, "log", "-1", "--format=%H", "--", prereg_file).stdout.strip()
    if not last:
        return [f"{prereg_file} is not committed"]
    now = (Path(repo) / prereg_file).read_text()
    out: list[str] = []
    if _git(repo, "show", f"{last}:{prereg_file}").stdout != now:
        out.append(f"{prereg_file} has uncommitted changes")
    analysis = json.loads(now)["registration"].get("analysis_commit")
    if not analysis or _git(repo, "merge-base", "--is-ancestor", str(analysis), last).returncode != 0:
        out.append(f"analysis_commit {analysis!r} is not an ancestor of the registration's commit {last[:10]}")
    for run in runs:
        name = f"{run.get('method')}-lr{run.get('lr')}-seed{run.get('seed')}"
        code = run.get("code") or {}
        commit = code.get("commit")
        if not commit:
            out.append(f"{name} records no commit")
            continue
        if code.get("dirty"):
            out.append(f"{name} started from a tree with uncommitted changes ({commit[:10]})")
        if _git(repo, "merge-base", "--is-ancestor", last, commit).returncode != 0:
            out.append(f"{name} started from {commit[:10]}, which does not descend from the registration's commit "
                       f"{last[:10]}")
        elif _git(repo, "show", f"{commit}:{prereg_file}").stdout != now:
            out.append(f"{name} started from {commit[:10]}, whose {prereg_file} differs from the registration's")
    return out


def registration_of(compact_dir: str | Path, prereg_path: str | Path = REPO_ROOT / PREREG_FILE
                    ) -> dict[str, Any] | None:
    """The registration whose ``runs_dir`` is ``compact_dir`` (its ``registration`` block), or None."""
    if not Path(prereg_path).is_file():
        return None
    reg = load_preregistration(prereg_path)["registration"]
    return reg if Path(compact_dir).resolve() == (REPO_ROOT / reg["runs_dir"]).resolve() else None


def check_registered(compact_dir: str | Path, prereg_path: str | Path = REPO_ROOT / PREREG_FILE) -> None:
    """Refuse (ConfigError) to run a grid into the registration's ``runs_dir`` before its status is ``registered``:
    a run of a draft registration could not count as pre-registered. Any other directory passes."""
    reg = registration_of(compact_dir, prereg_path)
    if reg is not None and reg.get("status") != "registered":
        raise ConfigError(f"{reg['runs_dir']} holds the runs of the registration {prereg_path}, whose status is "
                          f"{reg.get('status')!r}: register it (status 'registered') before its grid runs")

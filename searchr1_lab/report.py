"""The lab's markdown report (``OUT/README.md``): tables built from the summary; every number is also in summary.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from searchr1_lab.analysis import PROVENANCE_KEYS, PROVENANCE_SPLITS, finite
from searchr1_lab.methods import LLD_MARGIN, REWARD_MARGIN, TREND_WINDOW, run_name
from searchr1_lld.instruments.monitor import PHASES, PhaseThresholds


def fmt(x: Any, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if finite(x) else "-"


def signed(x: Any, digits: int = 1) -> str:
    """``+1.5`` (``-`` for None)."""
    return "-" if x is None else f"{x:+.{digits}f}"


def signed_interval(d: Mapping[str, Any] | None, digits: int = 1) -> str:
    """``+15.2 [+11.3, +19.1]`` from ``{"estimate", "low", "high"}`` (the estimate alone without bounds, ``-``
    without an estimate)."""
    if not d or d.get("estimate") is None:
        return "-"
    if d.get("low") is None:
        return signed(d["estimate"], digits)
    return f"{signed(d['estimate'], digits)} [{signed(d['low'], digits)}, {signed(d['high'], digits)}]"


def signed_bca(d: Mapping[str, Any] | None, digits: int = 1) -> str:
    """The BCa interval beside a bootstrap's percentile one (:func:`searchr1_lab.stats.bootstrap.resampled_interval`),
    as :func:`signed_interval` writes it (``-`` where none was computed)."""
    if not d or not d.get("bca"):
        return "-"
    return signed_interval({"estimate": d["estimate"], **d["bca"]}, digits)


def analysis_change_lines(changes: Sequence[Mapping[str, str]] | None,
                          late: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """A registered report's list of the commits that changed the code that writes it after the registered analysis
    commit (:func:`searchr1_lab.studies.analysis_changes`; None, a registration without one: nothing); a commit that
    added a reading after a split was read (``late``: :func:`searchr1_lab.studies.late_readings`) says so."""
    if changes is None:
        return []
    if not changes:
        return ["The code that writes this report is as it was at the registered analysis commit.", ""]
    marks = {c["commit"]: f" (**{late_text(entry)}**)" for entry in (late or {}).values() for c in changes
             if entry["added"].startswith(c["commit"])}
    return [f"The code that writes this report changed in {len(changes)} commit(s) after the registered analysis "
            "commit (`git log` of the registration's analysis files and of every module of `searchr1_lab` that the "
            "report's module imports, directly or through another, under their names today and before any move; "
            "`git show COMMIT` gives each one's change):", "",
            *(f"- `{c['commit']}` {c['subject']}{marks.get(c['commit'], '')}" for c in changes), ""]


def late_text(entry: Mapping[str, str]) -> str:
    """``added after the test split was read (in `8ac3ab37b4`; its scores first shown in `c8e8d5d2e8`), not
    registered`` for a reading of :func:`searchr1_lab.studies.late_readings`."""
    return (f"added after the {entry['split']} split was read (in `{entry['added'][:10]}`; its scores first shown in "
            f"`{entry['read'][:10]}`), not registered")


def fmt_ms(cell: dict[str, Any], nd: int = 3) -> str:
    """``mean ± std`` as the EM table prints it (the test parses this back)."""
    if not finite(cell["mean"]):
        return "-"
    return f"{cell['mean']:.{nd}f} ± {cell['std']:.{nd}f}"


def em_table(agg: Sequence[dict[str, Any]], warm: dict[str, Any] | None, sampled: bool = False) -> str:
    """Per-method EM table; with ``sampled``, a last column with the sampled policy's EM."""
    extra = (" Sampled EM |", "---:|") if sampled else ("", "")
    lines = ["| Method | seeds | Single-hop EM | Multi-hop EM | All (avg.) EM | searches / question |" + extra[0],
             "|---|---|---:|---:|---:|---:|" + extra[1]]
    if warm is not None:
        e = warm["eval"]
        cell = f" {fmt((warm.get('eval_sampled') or {}).get('em'))} |" if sampled else ""
        lines.append(f"| warm start (untrained) | - | {fmt(e['em_single_hop'])} | {fmt(e['em_multi_hop'])} | "
                     f"{fmt(e['em'])} | {fmt(e['mean_valid_searches'], 2)} |" + cell)
    for row in agg:
        cell = f" {fmt_ms(row.get('sampled_em') or {'mean': None})} |" if sampled else ""
        lines.append(f"| {row['label']} | {','.join(map(str, row['seeds']))} | {fmt_ms(row['em_single_hop'])} | "
                     f"{fmt_ms(row['em_multi_hop'])} | {fmt_ms(row['em'])} | {fmt_ms(row['mean_valid_searches'], 2)} |"
                     + cell)
    return "\n".join(lines) + "\n"


def per_run_table(runs: Sequence[dict[str, Any]], sampled: bool = False) -> str:
    extra = (" sampled EM (1-hop / 2-hop) |", "---:|") if sampled else ("", "")
    lines = ["| run | single-hop EM | multi-hop EM | all EM | searches / q | answered | train s | eval s |" + extra[0],
             "|---|---:|---:|---:|---:|---:|---:|---:|" + extra[1]]
    for r in runs:
        e = r["eval"]
        cell = ""
        if sampled:
            es = r.get("eval_sampled") or {}
            cell = f" {fmt(es.get('em'))} ({fmt(es.get('em_single_hop'), 2)} / {fmt(es.get('em_multi_hop'), 2)}) |"
        lines.append(f"| {run_name(r['method'], r['seed'])} | {fmt(e['em_single_hop'])} | "
                     f"{fmt(e['em_multi_hop'])} | {fmt(e['em'])} | {fmt(e['mean_valid_searches'], 2)} | "
                     f"{fmt(e['answer_rate'], 2)} | {r['train_s']:.0f} | {r['eval_s']:.0f} |" + cell)
    return "\n".join(lines) + "\n"


def phase_table(runs: Sequence[dict[str, Any]]) -> str:
    head = " | ".join(f"{p} (first step / steps)" for p in PHASES)
    lines = [f"| run | {head} | final phase | early-warning steps | reward collapsed at | warning lead | "
             "collapse alarm (first step) | collapse-alarm lead | verdict |",
             "|---|" + "---|" * len(PHASES) + "---|---|---|---|---|---|---|"]
    for r in runs:
        ph = r["phases"]
        cells = [f"{'-' if ph['first_step'][p] is None else ph['first_step'][p]} / {ph['steps_in'][p]}" for p in PHASES]
        warn = ph["warning_steps"]
        warn_txt = "none" if not warn else f"{len(warn)} (first {warn[0]})"
        acc = ph["warning"]
        collapsed = "-" if acc["collapse_step"] is None else str(acc["collapse_step"])
        drawdown = ph["drawdown_steps"]
        drawdown_txt = "none" if not drawdown else str(drawdown[0])
        lines.append(f"| {run_name(r['method'], r['seed'])} | " + " | ".join(cells) +
                     f" | {ph['final']} | {warn_txt} | {collapsed} | {lead_text(acc)} | {drawdown_txt} | "
                     f"{lead_text(ph['drawdown'])} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def lead_text(acc: dict[str, Any]) -> str:
    """One run's alarm outcome (:func:`searchr1_lld.instruments.phases.warning_accounting`) as a table cell."""
    return {"warned": f"{acc['lead_steps']} steps", "late": "late", "missed": "missed",
            "false_alarm": "false alarm", "quiet": "-"}[acc["outcome"]]


def warning_text(w: dict[str, Any]) -> str:
    lead = (f"lead times {', '.join(map(str, w['lead_steps']))} steps" if w["lead_steps"] else "no lead time measured")
    return (f"Runs whose reward collapsed: {w['collapsed_runs']} (warned before the collapse: {w['warned']}, {lead}; "
            f"warned only at/after it: {w['late']}; never warned: {w['missed']}). Runs that did not collapse: "
            f"{w['non_collapsed_runs']} (false alarms: {w['false_alarms']}; quiet: {w['quiet']}).")


def trend_table(runs: Sequence[dict[str, Any]]) -> str:
    lines = ["| run | reward start→end | correct logp/tok start→peak→end | incorrect logp/tok start→end | "
             "probe logp/tok start→end | entropy start→end | grad norm first→max | LLD rate (mean) |",
             "|---|---|---|---|---|---|---|---:|"]
    for r in runs:
        t = r["trend"]
        lines.append(
            f"| {run_name(r['method'], r['seed'])} | {fmt(t['reward_start'])}→{fmt(t['reward_end'])} | "
            f"{fmt(t['correct_logp_start'])}→{fmt(t['correct_logp_peak'])}→{fmt(t['correct_logp_end'])} | "
            f"{fmt(t['incorrect_logp_start'])}→{fmt(t['incorrect_logp_end'])} | "
            f"{fmt(t['probe_logp_start'])}→{fmt(t['probe_logp_end'])} | "
            f"{fmt(t['entropy_start'])}→{fmt(t['entropy_end'])} | {fmt(t['grad_norm_first'], 2)}→"
            f"{fmt(t['grad_norm_max'], 2)} | {fmt(t['lld_rate_mean'], 2)} |")
    return "\n".join(lines) + "\n"


PROVENANCE_HEADS = ("EM", "gold passage retrieved", "answer copied, given a gold passage",
                    "right without a gold passage", "answer in a retrieved passage")


def provenance_table(agg: Sequence[dict[str, Any]], warm: dict[str, Any] | None) -> str:
    """Per policy and split: EM and where the answers came from (mean ± std over seeds; the warm start's values)."""
    lines = ["| policy | split | " + " | ".join(PROVENANCE_HEADS) + " |", "|---|---|" + "---:|" * len(PROVENANCE_HEADS)]
    for split in PROVENANCE_SPLITS:
        cell = ((warm or {}).get("provenance") or {}).get(split)
        if cell:
            lines.append(f"| warm start | {split} ({cell['n']} q) | "
                         + " | ".join(fmt(cell[k]) for k in PROVENANCE_KEYS) + " |")
        for row in agg:
            cells = (row.get("provenance") or {}).get(split)
            if cells:
                lines.append(f"| {row['label']} | {split} | " + " | ".join(fmt_ms(cells[k]) for k in PROVENANCE_KEYS)
                             + " |")
    return "\n".join(lines) + "\n"


def sampled_temperature(summary: dict[str, Any]) -> str:
    temps = {r["eval_sampled"]["temperature"] for r in summary["runs"] if r.get("eval_sampled")}
    return ", ".join(map(str, sorted(temps))) or "-"


def provenance_section(s: dict[str, Any]) -> list[str]:
    """'Copy or recall': the provenance table with its legend; empty when no run has the rates."""
    if not any(r.get("provenance") for r in s["runs"]):
        return []
    train = s.get("train_eval")
    return [
        "## Copy or recall: where the answers come from",
        "",
        "Greedy decoding; *test*: the test split evaluated above"
        + (f"; *train*: the first {train} training questions, the questions the policy was trained on "
           "(`--train-eval`)" if train else " (train-split rows: pass `--train-eval N`)")
        + ". Judged from "
        "the passages each answer's trajectory retrieved (any turn): *gold passage retrieved*: one of them contains a "
        "gold answer; *answer copied*: among those questions, the answer is right and in such a passage; *right "
        "without a gold passage*: right although no retrieved passage held a gold answer (recalled from training, or "
        "a guess; over all questions); *answer in a retrieved passage*: the answer, right or wrong, is in one of "
        "them (over all questions). The test split asks about subjects no training question names, so there only "
        "copying carries over.",
        "",
        provenance_table(s["aggregate"], s.get("warm_start")),
    ]


CURVE_COLUMNS = 10  # at most this many evaluation steps in the held-out EM table (the last one always)


def curve_columns(steps: Sequence[int], at_most: int = CURVE_COLUMNS) -> list[int]:
    """Evenly thinned ``steps``: the first one (where the early peak shows), then every k-th (k as small as fits
    ``at_most``), always ending with the last one."""
    if len(steps) <= at_most:
        return list(steps)
    k = -(-len(steps) // (at_most - 1))
    picked = list(steps[k - 1::k])
    if picked[-1] != steps[-1]:
        picked = [*picked[: at_most - 2], steps[-1]]
    return picked if picked[0] == steps[0] else [steps[0], *picked]


def curve_section(s: dict[str, Any]) -> list[str]:
    """'Validation EM during training' (runs with trainer.eval_every > 0): mean ± std per method at the evaluated
    steps, and per run its peak and its last value."""
    rows = s.get("val_em_curves") or []
    if not rows:
        return []
    steps = curve_columns(sorted({c["step"] for row in rows for c in row["cells"]}))
    lines = ["## Validation EM during training", "",
             "Greedy EM on the world's validation split while the policy trains (the trainer's evaluation every "
             "`trainer.eval_every` steps and at the last one). Mean ± std over seeds; `val_em.png` draws every seed.",
             "", "| method | " + " | ".join(f"step {st}" for st in steps) + " |", "|---|" + "---:|" * len(steps)]
    for row in rows:
        by_step = {c["step"]: c for c in row["cells"]}
        cells = [fmt_ms(by_step[st], 2) if st in by_step else "-" for st in steps]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines += ["", "| run | peak EM (step) | last EM (step) |", "|---|---:|---:|"]
    for r in s["runs"]:
        c = r.get("val_em_curve_summary") or {}
        if c.get("evaluations"):
            lines.append(f"| {run_name(r['method'], r['seed'])} | {fmt(c['peak_em'])} ({c['peak_step']}) | "
                         f"{fmt(c['last_em'])} ({c['last_step']}) |")
    return [*lines, ""]


QUICK_NOTE = ("Quick mode checks that the pipeline runs end to end (the world, the warm start scored, every method "
              "trained a few tiny steps and evaluated, this report) on a few test questions: its EM differences are "
              "noise, not a comparison of the methods (that is docs/lab.md).")


def _setup_section(s: dict[str, Any]) -> list[str]:
    """Title, command, config, seeds and methods, the world, the time, and the settings the methods share."""
    w = s["world"]
    return [
        f"# Death-spiral lab: GRPO vs LLDS on the synthetic world{' (quick mode)' if s['quick'] else ''}", "",
        f"Command: `{s['command']}`  ",
        f"Config: `{s['config_path']}` + overrides `{' '.join(s['overrides']) or '(none)'}`  ",
        f"Seeds: {', '.join(map(str, s['seeds']))}; methods: {', '.join(m['label'] for m in s['methods'])}  ",
        f"World: `{w['dir']}` ({w['counts'].get('train_questions')} train / "
        f"{w['counts'].get('test_questions')} test questions, "
        f"{w['counts'].get('test_multi_hop')} test multi-hop; multi-hop share "
        f"{w['config'].get('multi_hop_fraction')}, model hidden {w['config'].get('model_hidden_size')}"
        f" x {w['config'].get('model_layers')} layers)  ",
        (f"Time: {s['runs_s'] / 60:.1f} min = sum of the runs' training + evaluation times ({s['machine']}), "
         "as recorded by the pass that finished each run (a run resumed from a checkpoint counts its last segment "
         "only); "
         + ("this report was rebuilt with --report-only from finished runs." if s.get("report_only") else
            f"this pass took {s['wall_s'] / 60:.1f} min of wall time.")),
        "",
        *([QUICK_NOTE, ""] if s["quick"] else []),
        "The methods share every setting; they differ only in `algorithm.llds.{enabled,gate,ma}` (checked by "
        "`check_only_llds_differs` before training). LLDS-MA here is the **adaptive** variant: answer-span "
        "coefficient `min(lam, lam_answer * max(mean valid searches - 1, 0))`.",
        "",
        "| shared setting | value |", "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in s["shared_settings"]],
        "",
    ]


def _em_section(s: dict[str, Any], sampled: int) -> list[str]:
    """The test EM tables: per method (greedy; and sampled, with ``sampled`` rollouts per question) and per run."""
    return [
        "## Test exact match (world test split; greedy" + (", and sampled)" if sampled else ")"),
        "",
        "Mean ± sample std over seeds. *All* = EM over every test question (micro-average), not the mean of the two "
        "columns. *searches / question* = mean valid searches per test question."
        + (f" *Sampled EM*: the policy sampled instead of decoded greedily, {sampled} rollouts per test question at "
           f"temperature {sampled_temperature(s)} (the decoding its training reward measures; mean EM over all "
           "rollouts, one fixed sampling seed for every policy). Greedy EM scores the policy's mode; the two part "
           "when the mode drifts from the samples." if sampled else ""),
        "",
        em_table(s["aggregate"], s.get("warm_start"), sampled=bool(sampled)),
        "Per run:",
        "",
        per_run_table(s["runs"], sampled=bool(sampled)),
    ]


def _curves_section(pngs: Sequence[Path]) -> list[str]:
    """The overview figure and links to every other curve."""
    return [
        "## Curves",
        "",
        "Thin lines: one seed; bold: mean over seeds. `overview.png` has every curve side by side.",
        "",
        *[f"![{p.stem}]({p.name})" for p in pngs if p.name == "overview.png"],
        "",
        *[f"- [{p.stem}]({p.name})" for p in pngs if p.name != "overview.png"],
        "",
    ]


def _phases_section(s: dict[str, Any]) -> list[str]:
    """How the phases, the alarms and the verdict are computed, the phase table and both alarms' accounting."""
    return [
        "## Phases detected by the monitor",
        "",
        "The monitor's `PhaseDetector` re-run on each run's metrics.jsonl with evidence proportional to the run: a "
        "phase (and the early warning) counts only after its condition held on "
        f"{s['runs'][0]['phases']['persistence'] if s['runs'] else '-'} consecutive steps "
        "(`max(2, ceil(0.1 x steps))`). First step each phase was reported and how many steps it lasted. "
        "Early-warning steps: 'correct likelihood falls while reward rises'. *Reward collapsed at*: judged from the "
        "reward alone (two-step mean at or below 0.3 x its peak from that step to the end of the run, peak >= 0.05); "
        "*warning lead*: steps from the first alarm (early warning, or steady_decay / accelerated_collapse reported) "
        "to that collapse (`late` / `missed` when the alarm came at or after it / never; `false alarm` when a run "
        "that did not collapse raised one). *Collapse alarm*: the probe set's log-likelihood per token at least "
        f"{PhaseThresholds().drawdown_alarm_logp} nats below its best measurement (held as long as a phase must), "
        "with its lead counted the same way. Verdict (computed): `collapse` "
        "(accelerated_collapse reported, or the reward collapsed as judged above), `LLD` (mean of the last "
        f"{TREND_WINDOW} values vs the first {TREND_WINDOW}: reward up by more than {REWARD_MARGIN} while the "
        f"correct-response or probe-set log-likelihood per token is down by more than {LLD_MARGIN} nats), `none`.",
        "",
        phase_table(s["runs"]),
        "Early warning (LLD alarm): " + warning_text(s["warning_summary"]),
        "",
        "Collapse alarm: " + warning_text(s["drawdown_summary"]),
        "",
    ]


def write_report(out_dir: Path, summary: dict[str, Any], pngs: Sequence[Path]) -> Path:
    """``OUT/README.md`` from the summary (everything in it is also in summary.json)."""
    s = summary
    lines = [
        *_setup_section(s),
        *_em_section(s, s.get("sampled") or 0),
        *provenance_section(s),
        *curve_section(s),
        *_curves_section(pngs),
        *_phases_section(s),
        "## Trends (first / last " + str(TREND_WINDOW) + " logged values)",
        "",
        trend_table(s["runs"]),
    ]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path

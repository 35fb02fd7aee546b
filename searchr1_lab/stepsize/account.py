"""The account a step-size report gives beside its registered verdicts (text; the numbers come from :mod:`.analysis`
and :mod:`.readings`): what the data support on mechanism, the survival comparisons at small-sample strength, the
step sizes after the learning-rate warm-up, each cell's utility, the label's sensitivity per hypothesis, and the
comparisons nobody registered, worded as such.

What the data support on mechanism follows the rule a registration with ``matched_control`` fixes in advance
(:func:`.analysis.matched_verdict`): "mechanism" needs controls matched to the treatment's step size after the
warm-up that the treatment outlived at no worse utility; "smaller steps suffice" needs survival shown equivalent
within a margin fixed in advance. A mechanism hypothesis of the older kind (``controls``) registered neither a
margin nor a match after the warm-up, so its verdict is reported as registered and read here by that rule.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from searchr1_lab.report import signed, signed_bca, signed_interval

MATCH_TOLERANCE = 0.2  # a control "matched" after the warm-up: its step size within 1/1.2-1.2 x the treatment's


def _num(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _cell(s: Mapping[str, Any], arm: str, lr: float) -> Mapping[str, Any] | None:
    return next((c for c in s.get("cells", []) if c["arm"] == arm and abs(c["lr"] - lr) <= 1e-12 * max(lr, 1)), None)


def _after(s: Mapping[str, Any], arm: str, lr: float) -> float | None:
    c = _cell(s, arm, lr)
    return c["step_size"]["to_collapse"] if c else None


def _peak(s: Mapping[str, Any], arm: str, lr: float) -> float | None:
    c = _cell(s, arm, lr)
    return c["utility"]["mean_peak_gain"] if c else None


def controls_reading(s: Mapping[str, Any], res: Mapping[str, Any]) -> tuple[str, list[str]]:
    """What the data support on mechanism for a ``controls`` hypothesis, and the sentences that say why: each
    control's step size after the warm-up beside the treatment's, whether it learned, and what not outliving it
    means without an equivalence margin."""
    treat = res["baseline"]["comparison"]["a"]
    ta, tl = treat["arm"], treat["lr"]
    mine = _after(s, ta, tl)
    matched, why = [], []
    for name, c in sorted(res["controls"].items()):
        b = c["comparison"]["b"]
        theirs = _after(s, b["arm"], b["lr"])
        ok = mine is not None and theirs is not None and 1 / (1 + MATCH_TOLERANCE) <= theirs / mine <= 1 + MATCH_TOLERANCE
        matched.append(ok)
        why.append(f"{name} {_num(theirs, 3)} ({_num(theirs / mine, 1)}x)" if mine and theirs is not None else
                   f"{name} - (collapsed within the warm-up)")
    first, last = s["step_size_window"]
    warm = s.get("warmup_steps") or 0
    during = (" (the learning-rate warm-up)" if (first, last) == (1, warm) else
              f" (within the learning-rate warm-up, steps 1-{warm})" if warm and last <= warm else "")
    lines = [f"The controls were matched to {ta}'s step size over steps {first}-{last}{during}; from step {warm + 1} "
             f"to each run's collapse the mean per-step KL was {ta} {_num(mine, 3)}, " + ", ".join(why) + "."]
    for name, c in sorted(res["controls"].items()):
        b = c["comparison"]["b"]
        if c["supported"]:
            p_holm = c["comparison"].get("p_holm")
            lines.append(f"{ta} outlived {name} by the registered rule, with {name} taking "
                         f"{_num(_after(s, b['arm'], b['lr']), 3)} after the warm-up; RMST difference "
                         f"{signed_interval(c['comparison'].get('welch'))} steps (Welch 95 %)"
                         + (f", Holm-adjusted log-rank p {p_holm:.2g}." if p_holm is not None else "."))
            continue
        welch = c["comparison"].get("welch") or {}
        lines.append(f"{ta} did not outlive {name}: RMST difference {signed_interval(welch)} steps (Welch 95 %), "
                     "a failure to reject, not an equivalence (no margin was registered); "
                     f"{name}'s peak held-out gain over step 0 was {signed(_peak(s, b['arm'], b['lr']), 3)} against "
                     f"{ta}'s {signed(_peak(s, ta, tl), 3)}"
                     + (": it survived without learning." if (_peak(s, b["arm"], b["lr"]) or 0) < 0.02 else "."))
    reading = "mechanism" if res["verdict"] == "mechanism" and all(matched) else "inconclusive"
    return reading, lines


def matched_text(res: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """A matched-control hypothesis in one paragraph: the verdict, survival (Holm-adjusted), the match after the
    warm-up, utility and equivalence."""
    comp, match, util = res["comparison"], res["step_size"], res["utility"]
    a, b = comp["a"], comp["b"]
    if a["rmst"] is None or b["rmst"] is None:
        return f"{a['arm']} against {b['arm']}: no runs of one of them yet"
    return (f"verdict **{res['verdict']}**. Survival: {a['arm']} {a['count']} collapsed, RMST {_num(a['rmst'])} vs "
            f"{b['arm']} {b['count']}, RMST {_num(b['rmst'])}: difference {signed_interval(comp.get('welch'))} steps "
            f"(Welch 95 %; 90 %: {signed_interval(comp.get('welch90'))}, equivalence margin +-{spec['equivalence_margin']}: "
            f"{'equivalent' if res['equivalent'] else 'not shown equivalent'}), log-rank one-sided p "
            f"{comp['logrank']['p_one_sided']:.3g}, Holm-adjusted {comp.get('p_holm', float('nan')):.3g}: "
            f"{'outlived' if res['supported'] else 'not outlived'}. Step size over the {match['steps']} steps of "
            f"{match['first']}-{match['last']} where both had runs alive: {a['arm']} {_num(match['mean_a'], 3)}, "
            f"{b['arm']} {_num(match['mean_b'], 3)} (ratio "
            f"{_num(match['ratio'], 2)}, tolerance {spec['match_tolerance']}: "
            f"{'matched' if match['matched'] else 'not matched'}). Utility, peak held-out gain over step 0: "
            f"{signed(util['a']['mean_peak_gain'], 3)} vs {signed(util['b']['mean_peak_gain'], 3)}, difference "
            f"{signed_interval(util['peak_gain'], 3)} (margin -{spec['utility_margin']}: "
            f"{'no worse' if res['utility_ok'] else 'not shown no worse'})")


def _percent(level: float) -> str:
    """``97.5 %`` / ``95 %``: a level in percent, to the digits it needs (at most two decimals)."""
    return f"{100 * level:.2f}".rstrip("0").rstrip(".") + " %"


def endpoint_text(res: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """An endpoint hypothesis in one line: the difference of the gains over the warm start, its Holm-adjusted 95 %
    Welch interval (at the level Holm tests it at) with the raw and adjusted p, the 90 % interval against the
    equivalence margin, the step-KL ratio against its tolerance, the verdict, and each arm's gain."""
    welch, a, b, match = res["welch"], res["a"], res["b"], res["step_size"]
    head = (f"{res['treatment']} minus {res['control']} (lr {res['lr']:g}), gain of `{res['key']}` over the warm "
            f"start (step 0) after step {res['step']}")
    if welch["estimate"] is None:
        return f"{head}: waiting for runs ({a['n']} and {b['n']} finished)"
    holm, w90 = res["welch_holm"], res["welch90"]
    factor = 1 + spec["match_tolerance"]
    verdict = res["verdict"] + (f" ({res['reason']})" if res.get("reason") else "")
    return (f"{head}: {signed(welch['estimate'], 3)}, Holm-adjusted 95 % [{signed(holm['low'], 3)}, "
            f"{signed(holm['high'], 3)}] (Welch at {_percent(res['holm_level'])}; p {_num(welch['p_two_sided'], 4)}, "
            f"Holm-adjusted {_num(res['p_holm'], 4)} over the {res['family_size']} of family {res['family']}); 90 % "
            f"[{signed(w90['low'], 3)}, {signed(w90['high'], 3)}] ({'inside' if res['equivalent'] else 'not inside'} "
            f"+-{spec['equivalence_margin']}); step KL {res['control']} / {res['treatment']} "
            f"{_num(match['ratio'], 2)} over the {match['steps']} steps of {match['first']}-{match['last']} with runs "
            f"alive ({'matched' if match['matched'] else 'not matched'} within {factor:g}x): **{verdict}**. Against "
            f"the warm start: {res['treatment']} {signed_interval(a, 3)} ({a['n']} runs), {res['control']} "
            f"{signed_interval(b, 3)} ({b['n']} runs)")


def sensitivity_sentence(s: Mapping[str, Any], reg: Mapping[str, Any]) -> str:
    """Per hypothesis, under how many of the other registered labels its verdict differs from the primary's."""
    rows = s["sensitivity"]
    primary = next((r for r in rows if r["primary"]), None)
    if primary is None or len(rows) < 2:
        return ""
    stable, flips = [], []
    for h in reg["hypotheses"]:
        if h not in primary["verdicts"]:
            continue
        n = sum(1 for r in rows if not r["primary"] and r["verdicts"][h] != primary["verdicts"][h])
        (flips.append(f"{h}'s differs under {n} of the {len(rows) - 1} other labels") if n else stable.append(h))
    said = (f" The verdicts of {', '.join(stable)} are the same under all {len(rows)} registered labels"
            if stable else " Every verdict depends on the label")
    return said + ("; " + ", ".join(flips) + " (the sensitivity table)." if flips else ".")


def small_sample_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The confirmatory comparisons at small-sample strength, a table."""
    if not rows:
        return []
    out = ["## Survival at small-sample strength", "",
           "Each survival comparison of the confirmatory family: the RMST difference (steps) by the registered "
           "bootstrap (a percentile bootstrap over 5-10 runs is too narrow: it has few distinct resamples and about "
           "(n - 1) / n of the variance), the bias-corrected and accelerated (BCa) interval from the same "
           "replicates (not registered), Welch's interval on the runs' restricted survival times (their mean is "
           "the RMST; no run is censored before the horizon), the exact permutation test's one-sided p, and the "
           "one-sided log-rank p raw and Holm-adjusted over the family.", "",
           "| comparison | bootstrap 95 % | BCa 95 % (not registered) | Welch 95 % | permutation p | log-rank p | "
           "Holm-adjusted p |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        perm = r["permutation"] or {}
        out.append(f"| {r['name']}: {r['treatment']} ({r['lr']:g}) vs {r['control']} ({r['control_lr']:g}) | "
                   f"{signed_interval(r['bootstrap'])} | {signed_bca(r['bootstrap'])} | "
                   f"{signed_interval(r['welch'])} | "
                   f"{_num(perm.get('p_one_sided'), 4)} | {r['p']:.3g} | {_num(r['p_holm'], 3)} |")
    return out + [""]


def cell_lines(s: Mapping[str, Any]) -> list[str]:
    """Step size after the warm-up and utility, per cell, a table."""
    cells = s.get("cells") or []
    if not cells:
        return []
    first, last = s["step_size_window"]
    warm = s.get("warmup_steps") or 0
    fixed = cells[0]["step_size"]["fixed_steps"]
    return ["## Step size after the warm-up, and utility", "",
            f"Mean per-step KL over the registered window (steps {first}-{last}), from the end of the learning-rate "
            f"warm-up (step {warm + 1}) to each run's collapse (the horizon when censored), and over steps "
            f"{warm + 1}-{warm + fixed}; utility: the peak gain of the held-out EM over the run's step 0 and the area "
            "under the gain curve per step (EM; negative when the run ends below its start), and the whole "
            "validation split before and after. Means over the cell's runs; not registered.", "",
            f"| arm | lr | runs | step KL {first}-{last} | step KL {warm + 1}-collapse | step KL {warm + 1}-"
            f"{warm + fixed} | peak gain | gain area | validation EM start -> end |",
            "|---|---|---|---|---|---|---|---|---|"] + [
        f"| {c['arm']} | {c['lr']:g} | {c['runs']} | {_num(c['step_size']['registered'], 3)} | "
        f"{_num(c['step_size']['to_collapse'], 3)} | {_num(c['step_size']['fixed'], 3)} | "
        f"{signed(c['utility']['mean_peak_gain'], 3)} | {signed(c['utility']['mean_gain_area'], 3)} | "
        f"{_num(c['val_em_start'], 3)} -> {_num(c['val_em_end'], 3)} |" for c in cells] + [
        "", "![Per-step KL against the step: the treatment and its step-size controls](step_kl.png)", ""]


def unregistered_lines(found: Sequence[Mapping[str, Any]]) -> list[str]:
    """Comparisons of the arms no hypothesis names, each against the primary treatment, worded as exploratory."""
    if not found:
        return []
    out = ["## Comparisons not registered (exploratory)", ""]
    for f in found:
        comp = f["comparison"]
        a, b = comp["a"], comp["b"]
        welch = comp.get("welch") or {}
        better = welch.get("low") is not None and welch["low"] > 0
        worse = welch.get("high") is not None and welch["high"] < 0
        word = ("survived longer" if better else "survived shorter" if worse else
                "no evidence of a difference in survival")
        out.append(f"- {a['arm']} against {b['arm']} (lr {f['lr']:g}): {word}: RMST {_num(a['rmst'])} vs "
                   f"{_num(b['rmst'])}, difference {signed_interval(welch)} steps (Welch 95 %), bootstrap "
                   f"{signed_interval(comp['rmst_difference'])} (BCa {signed_bca(comp['rmst_difference'])}).")
    return out + [""]

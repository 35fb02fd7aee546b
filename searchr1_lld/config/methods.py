"""Methods by name: ``algorithm.method: NAME`` expands into the ordinary settings that define the method.

Every preset pins the same switches (:data:`SWITCHES`: the advantage estimator, the policy loss, its clip ranges, the
loss aggregation, whether LLDS, the likelihood anchor, NTHR and dynamic sampling are on, and the reward shaping), so
that a method means the same thing whatever file it is set in; a few pin one more key of their own (LLDS-MA:
``llds.ma``; the gate arms: ``llds.gate``; DAPO: ``dynamic_sampling.filter``; TRL's bnpo: ``loss_scale``). Every other key (coefficients such as
``llds.lam``, ``nll_anchor.coef``, ``nthr.*``, ``clip_cov.*``, ``kl_cov.*``, ``sapo.*``, ``dppo_tv.*``, ``vespo.*``,
``dynamic_sampling.max_rounds``, ``overlong.*``, the KL, the batch) stays a setting of the config.

Precedence: a key a preset pins may be written in the config (its YAML files and ``key=value`` overrides) only with
the preset's value; any other value is a ConfigError that names the key, the method and both values (to change a
pinned key, drop ``algorithm.method`` and write the switches yourself: ``algorithm.method: ""`` is a custom method).
So a saved ``config.yaml``, which holds the method and every expanded key, loads back to the same config, and a
preset never silently loses to a base file. ``python train.py --help-config`` prints every preset's expansion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MethodPreset:
    """A named method: its paper and the ``algorithm.*`` settings (dotted, relative to ``algorithm``) it pins."""

    name: str
    paper: str
    settings: dict[str, Any]


# the switches every preset pins, at their GRPO values (a preset lists what it changes)
SWITCHES: dict[str, Any] = {
    "advantage": "grpo", "policy_loss": "ppo_clip", "clip_low": None, "clip_high": None,
    "loss_agg_mode": "token-mean", "llds.enabled": False, "nll_anchor.enabled": False, "nthr.enabled": False,
    "dynamic_sampling.enabled": False, "reward_shaping": "none",
}


def _preset(name: str, paper: str, **changes: Any) -> MethodPreset:
    return MethodPreset(name, paper, {**SWITCHES, **{k.replace("__", "."): v for k, v in changes.items()}})


METHODS: dict[str, MethodPreset] = {p.name: p for p in (
    _preset("grpo", "GRPO (Shao et al. 2024, arXiv 2402.03300) as Search-R1 runs it (Jin et al. 2025, arXiv "
            "2503.09516)"),
    _preset("llds", "LLDS (Deng et al. 2025, arXiv 2512.04220); gate and lambda from algorithm.llds",
            llds__enabled=True),
    _preset("llds_action", "LLDS with the action-level gate (arXiv 2512.04220)", llds__enabled=True,
            llds__gate="action"),
    _preset("llds_response", "LLDS with the response-level gate (arXiv 2512.04220)", llds__enabled=True,
            llds__gate="response"),
    _preset("llds_ma", "LLDS-MA: LLDS with the adaptive answer mask (arXiv 2512.04220)", llds__enabled=True,
            llds__ma="adaptive"),
    _preset("nll_anchor", "a plain likelihood anchor: NLL of the responses with A >= 0, no gate (this repository's "
            "control for LLDS)", nll_anchor__enabled=True),
    _preset("nthr", "NTHR on GRPO: selected tokens of incorrect responses get eta x their advantage (Deng et al. "
            "2025, arXiv 2505.18830); settings algorithm.nthr", nthr__enabled=True),
    _preset("dapo_clip_higher", "DAPO's clip-higher, eps_low 0.2 / eps_high 0.28 (Yu et al. 2025, arXiv 2503.14476)",
            clip_low=0.2, clip_high=0.28),
    _preset("dr_grpo", "Dr. GRPO: no std division, token sums over a constant (Liu et al. 2025, arXiv 2503.20783)",
            advantage="grpo_no_std", loss_agg_mode="seq-mean-token-sum-norm"),
    _preset("gspo", "GSPO: sequence-level ratio, clip 3e-4 / 4e-4 (Zheng et al. 2025, arXiv 2507.18071)",
            policy_loss="gspo", clip_low=3e-4, clip_high=4e-4, loss_agg_mode="seq-mean-token-mean"),
    _preset("clip_cov", "Clip-Cov (Cui et al. 2025, arXiv 2505.22617); settings algorithm.clip_cov",
            policy_loss="clip_cov"),
    _preset("kl_cov", "KL-Cov (Cui et al. 2025, arXiv 2505.22617); settings algorithm.kl_cov", policy_loss="kl_cov"),
    _preset("cispo", "CISPO: clipped importance weight without gradient times the log-prob, upper clip only "
            "(MiniMax-M1, arXiv 2506.13585; verl's example: clip_low 10, clip_high 0.2)", policy_loss="cispo",
            clip_low=10.0, clip_high=0.2),
    _preset("sapo", "SAPO: a soft gate in place of the clip, seq-mean-token-mean (Gao et al. 2025, arXiv 2511.20347); "
            "settings algorithm.sapo", policy_loss="sapo", loss_agg_mode="seq-mean-token-mean"),
    _preset("gmpo", "GMPO: geometric mean of the token ratios, clip 0.4 / 0.4 in log space (Zhao et al. 2025, arXiv "
            "2507.20673)", policy_loss="geo_mean", clip_low=0.4, clip_high=0.4, loss_agg_mode="seq-mean-token-mean"),
    _preset("gpg", "GPG: -A log p with its batch-rescaled group baseline, no ratio (Chu et al. 2025, arXiv "
            "2504.02546)", advantage="gpg", policy_loss="gpg"),
    _preset("dppo_tv", "DPPO-Binary-TV: a total-variation trust region in place of the ratio clip, threshold 0.15, "
            "as verl's example run (arXiv 2602.04879); settings algorithm.dppo_tv", advantage="grpo_no_std",
            policy_loss="dppo_tv", clip_low=0.15, clip_high=0.15, loss_agg_mode="seq-mean-token-sum-norm"),
    _preset("dppo_kl", "DPPO-Binary-KL: a binary-KL trust region in place of the ratio clip, threshold 0.05, as "
            "verl's example run (arXiv 2602.04879); settings algorithm.dppo_kl", advantage="grpo_no_std",
            policy_loss="dppo_kl", clip_low=0.05, clip_high=0.05, loss_agg_mode="seq-mean-token-sum-norm"),
    _preset("grpo_passk", "Pass@k training: only each group's best response gets an advantage (Chen et al. 2025, "
            "arXiv 2503.19595)", advantage="grpo_passk"),
    _preset("opo", "OPO's length-weighted group baseline (Hao et al. 2025, arXiv 2505.23585)", advantage="opo"),
    _preset("rloo", "RLOO's leave-one-out baseline (Ahmadian et al. 2024, arXiv 2402.14740)", advantage="rloo"),
    _preset("reinforce_pp_baseline", "REINFORCE++ with a group baseline, whitened over the batch (Hu 2025, arXiv "
            "2501.03262)", advantage="reinforce_pp_baseline"),
    _preset("dapo", "DAPO: clip-higher 0.2 / 0.28, dynamic sampling (groups of equal rewards replaced), soft overlong "
            "punishment, token-mean (Yu et al. 2025, arXiv 2503.14476); settings algorithm.dynamic_sampling, "
            "algorithm.overlong", clip_low=0.2, clip_high=0.28, dynamic_sampling__enabled=True,
            dynamic_sampling__filter="nonzero_std", reward_shaping="overlong"),
    _preset("remax", "ReMax: r minus the reward of a greedy rollout of the same prompt (Li et al. 2023, arXiv "
            "2310.10505)", advantage="remax"),
    _preset("bnpo", "TRL's loss_type bnpo: PPO-clip, token mean over each micro-batch (the local batch), averaged "
            "over the micro-batches (TRL 1.16 GRPOTrainer; no paper)", loss_scale="micro-batch-mean"),
    _preset("luspo", "LUSPO: GSPO's sequence ratio, each response's loss times its length (token sums, mean over "
            "responses), GSPO's clip 3e-4 / 4e-4 (arXiv 2602.05261; TRL 1.16 loss_type luspo)", policy_loss="gspo",
            clip_low=3e-4, clip_high=4e-4, loss_agg_mode="seq-mean-token-sum"),
    _preset("vespo", "VESPO: a Gamma-shaped weight of the sequence ratio in place of the clip, token-mean (arXiv "
            "2602.10693; TRL 1.16 loss_type vespo); settings algorithm.vespo", policy_loss="vespo"),
)}

# every key some preset pins (dotted, relative to algorithm): what two methods' configs may differ in
PINNED_KEYS: tuple[str, ...] = tuple(sorted({k for p in METHODS.values() for k in p.settings}))


def format_presets() -> str:
    """``--help-config``'s list of the presets: name, paper, and every setting it pins."""
    lines = ["[algorithm.method presets]  each pins these settings (docs/design.md, \"Methods by name\")"]
    for p in METHODS.values():
        pinned = ", ".join(f"algorithm.{k}={v!r}" for k, v in p.settings.items())
        lines += [f"  {p.name}: {p.paper}", f"      {pinned}"]
    return "\n".join(lines) + "\n"

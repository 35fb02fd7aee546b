"""Rollout-correction presets by name: ``algorithm.rollout_correction.preset: NAME`` expands into the settings of
``algorithm.rollout_correction`` (algo/rollout_correction.py) that define it.

Each of verl 0.9.1's presets (the classmethods of ``verl.trainer.config.algorithm.RolloutCorrectionConfig``, by
their names) and TRL 1.16.0's default (``vllm_importance_sampling_mode="sequence_mask"``, clip_max 3.0). A preset
*pins* its switches -- the weight mode, the rejection rule, bypass or not, and for the bypass presets the policy
loss verl's ``loss_type`` selects (``ppo_clip``, or ``reinforce`` = -A w log pi) -- and *fills in* its thresholds,
the defaults of verl's classmethod arguments, unless the config writes them (as one passes another threshold to the
classmethod). Precedence as for ``algorithm.method`` (config/methods.py): a pinned key written with another value is
a ConfigError naming the key, the preset and both values; a key pinned by both the method and the preset to
different values (e.g. ``policy_loss``) is one too.

verl's names map onto this repository's settings as
    rollout_is="token" / "sequence", threshold C      -> mode token / sequence, cap C
    rollout_is=..., threshold "c_C" (IcePop)           -> mode token_mask / sequence_mask, cap C, cap_lower c
    rollout_rs=OPTION, rollout_rs_threshold "lo_up"    -> rejection OPTION, rejection_lower lo, rejection_upper up
    bypass_mode=True, loss_type=L                      -> bypass true, policy_loss ppo_clip | reinforce
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RC = "rollout_correction."


@dataclass(frozen=True)
class CorrectionPreset:
    """A named correction: its source, the ``algorithm.*`` settings it pins and the thresholds it fills in (dotted,
    relative to ``algorithm``)."""

    name: str
    source: str
    pins: dict[str, Any]
    thresholds: dict[str, Any]


def _preset(name: str, source: str, *, mode: str = "off", rejection: str = "off", bypass: str = "",
            **thresholds: Any) -> CorrectionPreset:
    """``bypass``: '' (decoupled) or the policy loss of verl's bypass ``loss_type``."""
    pins: dict[str, Any] = {RC + "mode": mode, RC + "rejection": rejection, RC + "bypass": bool(bypass)}
    if bypass:
        pins["policy_loss"] = bypass
    return CorrectionPreset(name, source, pins, {RC + k: v for k, v in thresholds.items()})


_GEO = dict(rejection="seq_mean_k1", rejection_lower=0.999, rejection_upper=1.001)
_K3 = dict(rejection="seq_mean_k3", rejection_upper=0.01)
_V = "verl RolloutCorrectionConfig."

CORRECTION_PRESETS: dict[str, CorrectionPreset] = {p.name: p for p in (
    _preset("disabled", _V + "disabled(): diagnostics only"),
    _preset("decoupled_token_is", _V + "decoupled_token_is(): token TIS", mode="token", cap=2.0),
    _preset("decoupled_seq_is", _V + "decoupled_seq_is(): sequence TIS", mode="sequence", cap=2.0),
    _preset("decoupled_token_icepop", _V + "decoupled_token_icepop(): token IcePop", mode="token_mask", cap=5.0,
            cap_lower=0.5),
    _preset("decoupled_seq_is_rs", _V + "decoupled_seq_is_rs(): sequence TIS + sequence rejection (seq-MIS)",
            mode="sequence", cap=2.0, rejection="seq_sum_k1", rejection_lower=0.5, rejection_upper=2.0),
    _preset("decoupled_geo_rs", _V + "decoupled_geo_rs(): geometric rejection", **_GEO),
    _preset("decoupled_geo_rs_seq_tis", _V + "decoupled_geo_rs_seq_tis()", mode="sequence", cap=2.0, **_GEO),
    _preset("decoupled_geo_rs_token_tis", _V + "decoupled_geo_rs_token_tis()", mode="token", cap=2.0, **_GEO),
    _preset("decoupled_k3_rs", _V + "decoupled_k3_rs(): K3 rejection", **_K3),
    _preset("decoupled_k3_rs_seq_tis", _V + "decoupled_k3_rs_seq_tis()", mode="sequence", cap=2.0, **_K3),
    _preset("decoupled_k3_rs_token_tis", _V + "decoupled_k3_rs_token_tis()", mode="token", cap=2.0, **_K3),
    _preset("bypass_ppo_clip", _V + "bypass_ppo_clip(): PPO-clip against the engine", bypass="ppo_clip"),
    _preset("bypass_ppo_clip_geo_rs", _V + "bypass_ppo_clip_geo_rs()", bypass="ppo_clip", **_GEO),
    _preset("bypass_ppo_clip_k3_rs", _V + "bypass_ppo_clip_k3_rs()", bypass="ppo_clip", **_K3),
    _preset("bypass_pg_is", _V + "bypass_pg_is(): REINFORCE + sequence TIS", bypass="reinforce", mode="sequence",
            cap=2.0),
    _preset("bypass_pg_token_icepop", _V + "bypass_pg_token_icepop()", bypass="reinforce", mode="token_mask",
            cap=5.0, cap_lower=0.5),
    _preset("bypass_pg_geo_rs", _V + "bypass_pg_geo_rs()", bypass="reinforce", **_GEO),
    _preset("bypass_pg_geo_rs_seq_tis", _V + "bypass_pg_geo_rs_seq_tis()", bypass="reinforce", mode="sequence",
            cap=2.0, **_GEO),
    _preset("bypass_pg_geo_rs_token_tis", _V + "bypass_pg_geo_rs_token_tis()", bypass="reinforce", mode="token",
            cap=2.0, **_GEO),
    _preset("trl_sequence_mask", "TRL 1.16.0 GRPOConfig default: vllm_importance_sampling_mode='sequence_mask', "
            "vllm_importance_sampling_clip_max=3.0, clip_min None", mode="sequence_mask", cap=3.0, cap_lower=None),
)}


def registered_names() -> dict[str, list[str]]:
    """The weight modes and rejection rules registered in algo/rollout_correction.py, each with 'off'."""
    from searchr1_lld.algo.rollout_correction import REJECTIONS, WEIGHT_MODES  # deferred: torch

    return {"mode": ["off", *WEIGHT_MODES], "rejection": ["off", *REJECTIONS]}


def format_correction_presets() -> str:
    """``--help-config``'s list of the registered modes and rules and of the presets with what each pins and fills."""
    names = registered_names()
    lines = ["[algorithm.rollout_correction names]  registered in algo/rollout_correction.py",
             *(f"  {key}: {', '.join(values)}" for key, values in names.items()), "",
             "[algorithm.rollout_correction.preset presets]  each pins / fills in (docs/design.md, \"Rollout "
             "correction\")"]
    for p in CORRECTION_PRESETS.values():
        lines += [f"  {p.name}: {p.source}",
                  "      pins " + ", ".join(f"algorithm.{k}={v!r}" for k, v in p.pins.items())]
        if p.thresholds:
            lines.append("      fills " + ", ".join(f"algorithm.{k}={v!r}" for k, v in p.thresholds.items()))
    return "\n".join(lines) + "\n"

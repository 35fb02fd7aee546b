"""Rollout correction: importance weights and rejection rules for the train/inference mismatch (verl 0.9.1's
``verl/trainer/ppo/rollout_corr_helper.py``; Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills Stability").

The rollout engine samples from pi_engine (bf16, its own kernels, vLLM's top-p renormalisation); the learner's
policy gradient assumes samples from pi_old. With the learner's log-probs ``logp_old`` and the engine's
``logp_engine`` on the response tokens (mask m ``[B, T]``):

    log r[i,t] = logp_old[i,t] - logp_engine[i,t],   R_i = exp( sum_t m[i,t] log r[i,t] )   (sequence ratio)

Logs are clamped to [-20, 20] before any exp (verl's ``SAFETY_BOUND``). Two kinds of correction, each a registry of
pure functions (names = the config's values; a new one is one decorated function):

IS weight modes (:data:`WEIGHT_MODES`, ``algorithm.rollout_correction.mode``): w ``[B, T]`` multiplies the policy
loss's per-token term (no gradient; 1 off the response), upper bound C = ``cap``, lower c = ``cap_lower`` (None: none)
    token          w = clip(r, c, C)                      TIS  (verl rollout_is="token"; TRL "token_truncate")
    sequence       w = clip(R, c, C) on every token       TIS  (verl rollout_is="sequence"; TRL "sequence_truncate")
    token_mask     w = r if c <= r <= C else 0            IcePop (verl "token" with threshold "c_C"; TRL "token_mask")
    sequence_mask  w = R if c <= R <= C else 0            masked IS (verl "sequence" with "c_C"; TRL "sequence_mask")

Rejection rules (:data:`REJECTIONS`, ``algorithm.rollout_correction.rejection``; verl's ``rollout_rs`` options,
``compute_rollout_rejection_mask``): a rejected token (token rules) or response (sequence rules) leaves the response
mask of the update. Token statistics k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r, aggregated per token or
per response (sum, mean, max over its tokens); kept when
    k1 rules:      log(lower) <= s <= log(upper)           (lower = 1 / upper unless given; i.e. the ratio
                                                            pi_engine / pi_old, or its product / geometric mean,
                                                            lies in [lower, upper] -- verl bounds -log r, not log r)
    k2 / k3 rules: s <= upper
Named in the literature: seq_sum_k1 = sequence-level masked IS / rejection (seq-MIS: a response whose sequence ratio
leaves [lower, upper] is rejected), seq_mean_k1 = geometric rejection (Geo-RS: the geometric mean of the token
ratios), seq_mean_k3 = K3 rejection (K3-RS), token_k1 = token-level rejection.

verl 0.9.1 has no veto threshold (an older verl's ``rollout_token_veto_threshold``, which rejected a response with any
token ratio below it, is gone; seq_max_k2 / seq_max_k3 are its nearest kin) and no other threshold than those above
and the +-20 clamp. Its optional ``rollout_is_batch_normalize`` (weights rescaled to mean 1) is not offered here.

Shapes: logp_old, logp_engine, response_mask ``[B, T]``; weights and keep masks ``[B, T]`` float32, no gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import torch

from searchr1_lld.algo import registry

SAFETY_BOUND = 20.0  # verl's clamp of every log-ratio before exp

WeightFn = Callable[..., torch.Tensor]
RejectionFn = Callable[..., torch.Tensor]
WEIGHT_MODES: dict[str, WeightFn] = {}
REJECTIONS: dict[str, RejectionFn] = {}


class CorrectionSettings(Protocol):
    """What the correction reads of ``algorithm.rollout_correction`` (config/sections.py RolloutCorrectionConfig)."""

    mode: str
    cap: float
    cap_lower: Optional[float]
    rejection: str
    rejection_upper: Optional[float]
    rejection_lower: Optional[float]
    bypass: bool


def register_weight_mode(name: str) -> Callable[[WeightFn], WeightFn]:
    """Decorator: ``fn(log_r [B, T], m [B, T] bool, *, cap, cap_lower) -> w [B, T]`` as the IS weight mode ``name``."""
    return registry.register(WEIGHT_MODES, "rollout-correction weight mode", name)


def register_rejection(name: str, *, lower_bound: bool) -> Callable[[RejectionFn], RejectionFn]:
    """Decorator: ``fn(log_r [B, T], m [B, T] bool, *, upper, lower) -> keep [B, T] bool`` as the rejection rule
    ``name``; ``lower_bound``: the rule takes a lower bound (the k1 rules, bounds on a ratio)."""
    def decorate(fn: RejectionFn) -> RejectionFn:
        fn.lower_bound = lower_bound  # type: ignore[attr-defined]
        return registry.register(REJECTIONS, "rollout-correction rejection rule", name)(fn)
    return decorate


def takes_lower_bound(rejection: str) -> bool:
    """Whether the rejection rule ``rejection`` takes ``rejection_lower`` (a ratio bound)."""
    return bool(getattr(registry.lookup(REJECTIONS, "rollout-correction rejection rule", rejection), "lower_bound"))


def log_ratio(logp_old: torch.Tensor, logp_engine: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """log r = logp_old - logp_engine ``[B, T]``, float32, detached, 0 off the response."""
    if not (logp_old.shape == logp_engine.shape == response_mask.shape) or logp_old.dim() != 2:
        raise ValueError(f"logp_old, logp_engine, response_mask must all be [B, T]; got {tuple(logp_old.shape)}, "
                         f"{tuple(logp_engine.shape)}, {tuple(response_mask.shape)}")
    m = (response_mask != 0).float()
    return (logp_old.detach().float() - logp_engine.detach().float()) * m


def _clamp(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, -SAFETY_BOUND, SAFETY_BOUND)


def _seq_sum(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum(dim=1)


def _seq_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum(dim=1) / m.float().sum(dim=1).clamp(min=1)


def _seq_max(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    top = torch.where(m, x, torch.full_like(x, -math.inf)).max(dim=1).values
    return torch.where(torch.isinf(top), torch.zeros_like(top), top)


# --------------------------------------------------------------------------------------------------------------------
# IS weight modes: w [B, T], 1 off the response
# --------------------------------------------------------------------------------------------------------------------


def _truncate(ratio: torch.Tensor, m: torch.Tensor, cap: float, cap_lower: Optional[float]) -> torch.Tensor:
    w = ratio.clamp(min=cap_lower, max=cap) if cap_lower is not None else ratio.clamp(max=cap)
    return torch.where(m, w.expand_as(m), torch.ones_like(m, dtype=w.dtype))


def _mask_outside(ratio: torch.Tensor, m: torch.Tensor, cap: float, cap_lower: Optional[float]) -> torch.Tensor:
    inside = (ratio <= cap) & (ratio >= (cap_lower if cap_lower is not None else 0.0))
    w = torch.where(inside, ratio, torch.zeros_like(ratio)).expand_as(m)
    return torch.where(m, w, torch.ones_like(w))


@register_weight_mode("token")
def token_tis(log_r: torch.Tensor, m: torch.Tensor, *, cap: float, cap_lower: Optional[float] = None) -> torch.Tensor:
    """Token TIS: w[i,t] = clip(r[i,t], c, C), r = exp(clamp(log r, +-20)). verl
    ``compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold=C)``; TRL ``token_truncate``."""
    return _truncate(torch.exp(_clamp(log_r)), m, cap, cap_lower)


@register_weight_mode("sequence")
def sequence_tis(log_r: torch.Tensor, m: torch.Tensor, *, cap: float,
                 cap_lower: Optional[float] = None) -> torch.Tensor:
    """Sequence TIS: w[i,t] = clip(R_i, c, C) on every token of response i, R_i = exp(clamp(sum_t log r, +-20)).
    verl ``compute_rollout_correction_weights(rollout_is="sequence")``; TRL ``sequence_truncate``."""
    return _truncate(torch.exp(_clamp(_seq_sum(log_r, m)))[:, None], m, cap, cap_lower)


@register_weight_mode("token_mask")
def token_mask(log_r: torch.Tensor, m: torch.Tensor, *, cap: float, cap_lower: Optional[float] = None) -> torch.Tensor:
    """Token masked IS (IcePop): w[i,t] = r[i,t] if c <= r[i,t] <= C else 0 (c = 0 when None). verl
    ``compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold="c_C")``; TRL ``token_mask``."""
    return _mask_outside(torch.exp(_clamp(log_r)), m, cap, cap_lower)


@register_weight_mode("sequence_mask")
def sequence_mask(log_r: torch.Tensor, m: torch.Tensor, *, cap: float,
                  cap_lower: Optional[float] = None) -> torch.Tensor:
    """Sequence masked IS: w[i,t] = R_i if c <= R_i <= C else 0 on every token of response i (c = 0 when None). verl
    ``compute_rollout_correction_weights(rollout_is="sequence", rollout_is_threshold="c_C")``; TRL ``sequence_mask``
    (its default, C = 3)."""
    return _mask_outside(torch.exp(_clamp(_seq_sum(log_r, m)))[:, None], m, cap, cap_lower)


# --------------------------------------------------------------------------------------------------------------------
# Rejection rules (verl's rollout_rs options): keep [B, T] bool
# --------------------------------------------------------------------------------------------------------------------


def _k1(log_r: torch.Tensor) -> torch.Tensor:
    return -_clamp(log_r)


def _k2(log_r: torch.Tensor) -> torch.Tensor:
    return 0.5 * _clamp(log_r) ** 2


def _k3(log_r: torch.Tensor) -> torch.Tensor:
    x = _clamp(log_r)
    return torch.exp(x) - 1.0 - x


def _in_ratio_bounds(stat: torch.Tensor, upper: float, lower: Optional[float]) -> torch.Tensor:
    lo = lower if lower is not None else 1.0 / upper
    return (stat >= math.log(lo)) & (stat <= math.log(upper))


def _each_token(keep_row: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return keep_row[:, None].expand_as(m)


@register_rejection("token_k1", lower_bound=True)
def token_k1(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Token rejection: token kept iff log(lower) <= -log r <= log(upper). verl ``rollout_rs="token_k1"``."""
    return _in_ratio_bounds(_k1(log_r), upper, lower)


@register_rejection("token_k2", lower_bound=False)
def token_k2(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Token kept iff (log r)^2 / 2 <= upper. verl ``rollout_rs="token_k2"``."""
    return _k2(log_r) <= upper


@register_rejection("token_k3", lower_bound=False)
def token_k3(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Token kept iff r - 1 - log r <= upper. verl ``rollout_rs="token_k3"``."""
    return _k3(log_r) <= upper


@register_rejection("seq_sum_k1", lower_bound=True)
def seq_sum_k1(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Sequence masked IS (seq-MIS): response kept iff log(lower) <= sum_t -log r <= log(upper), i.e. its sequence
    ratio pi_engine / pi_old lies in [lower, upper]. verl ``rollout_rs="seq_sum_k1"`` (preset decoupled_seq_is_rs)."""
    return _each_token(_in_ratio_bounds(_seq_sum(_k1(log_r), m), upper, lower), m)


@register_rejection("seq_sum_k2", lower_bound=False)
def seq_sum_k2(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Response kept iff sum_t (log r)^2 / 2 <= upper. verl ``rollout_rs="seq_sum_k2"``."""
    return _each_token(_seq_sum(_k2(log_r), m) <= upper, m)


@register_rejection("seq_sum_k3", lower_bound=False)
def seq_sum_k3(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Response kept iff sum_t (r - 1 - log r) <= upper. verl ``rollout_rs="seq_sum_k3"``."""
    return _each_token(_seq_sum(_k3(log_r), m) <= upper, m)


@register_rejection("seq_mean_k1", lower_bound=True)
def seq_mean_k1(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Geometric rejection (Geo-RS): response kept iff log(lower) <= mean_t -log r <= log(upper), i.e. the geometric
    mean of its token ratios pi_engine / pi_old lies in [lower, upper]. verl ``rollout_rs="seq_mean_k1"`` (presets
    *_geo_rs*)."""
    return _each_token(_in_ratio_bounds(_seq_mean(_k1(log_r), m), upper, lower), m)


@register_rejection("seq_mean_k2", lower_bound=False)
def seq_mean_k2(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Response kept iff mean_t (log r)^2 / 2 <= upper. verl ``rollout_rs="seq_mean_k2"``."""
    return _each_token(_seq_mean(_k2(log_r), m) <= upper, m)


@register_rejection("seq_mean_k3", lower_bound=False)
def seq_mean_k3(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """K3 rejection (K3-RS): response kept iff its K3 divergence mean_t (r - 1 - log r) <= upper. verl
    ``rollout_rs="seq_mean_k3"`` (presets *_k3_rs*)."""
    return _each_token(_seq_mean(_k3(log_r), m) <= upper, m)


@register_rejection("seq_max_k2", lower_bound=False)
def seq_max_k2(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Response kept iff max_t (log r)^2 / 2 <= upper. verl ``rollout_rs="seq_max_k2"``."""
    return _each_token(_seq_max(_k2(log_r), m) <= upper, m)


@register_rejection("seq_max_k3", lower_bound=False)
def seq_max_k3(log_r: torch.Tensor, m: torch.Tensor, *, upper: float, lower: Optional[float] = None) -> torch.Tensor:
    """Response kept iff max_t (r - 1 - log r) <= upper. verl ``rollout_rs="seq_max_k3"``."""
    return _each_token(_seq_max(_k3(log_r), m) <= upper, m)


# --------------------------------------------------------------------------------------------------------------------
# The configured correction, and its statistics
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """The correction of one batch: IS weights ``[B, T]`` (1 off the response; None: mode off) and the keep mask
    ``[B, T]`` (1 kept, 0 rejected; None: no rejection rule), both float32 without gradient."""

    weights: Optional[torch.Tensor]
    keep: Optional[torch.Tensor]

    def mask(self, response_mask: torch.Tensor) -> torch.Tensor:
        """The response mask with the rejected tokens removed (``response_mask`` itself when nothing is rejected)."""
        return response_mask if self.keep is None else response_mask * self.keep.to(response_mask.dtype)


def is_on(rc: CorrectionSettings) -> bool:
    """Whether ``rc`` weights or rejects anything (mode or rejection rule other than off)."""
    return rc.mode != "off" or rc.rejection != "off"


def correct(rc: CorrectionSettings, logp_old: torch.Tensor, logp_engine: torch.Tensor,
            response_mask: torch.Tensor) -> Correction:
    """The weights of ``rc.mode`` and the keep mask of ``rc.rejection`` (module docstring) for the ratio
    pi_old / pi_engine; ``logp_old`` is the learner's (the policy being updated, in bypass mode). verl
    ``compute_rollout_correction_and_rejection_mask``."""
    log_r = log_ratio(logp_old, logp_engine, response_mask)
    m = response_mask != 0
    weights = keep = None
    if rc.mode != "off":
        fn = registry.lookup(WEIGHT_MODES, "rollout-correction weight mode", rc.mode)
        weights = fn(log_r, m, cap=rc.cap, cap_lower=rc.cap_lower).float()
    if rc.rejection != "off":
        fn = registry.lookup(REJECTIONS, "rollout-correction rejection rule", rc.rejection)
        if rc.rejection_upper is None:
            raise ValueError(f"rejection rule {rc.rejection!r} needs an upper threshold")
        keep = (fn(log_r, m, upper=rc.rejection_upper, lower=rc.rejection_lower) | ~m).float()
    return Correction(weights, keep)


def tis_weights(logp_old: torch.Tensor, logp_engine: torch.Tensor, response_mask: torch.Tensor, *,
                mode: str = "token", cap: float = 2.0, cap_lower: Optional[float] = None) -> torch.Tensor:
    """The IS weights ``[B, T]`` of the registered ``mode`` with bounds ``cap`` (C >= 1) and ``cap_lower``."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    fn = registry.lookup(WEIGHT_MODES, "rollout-correction weight mode", mode)
    log_r = log_ratio(logp_old, logp_engine, response_mask)
    return fn(log_r, response_mask != 0, cap=cap, cap_lower=cap_lower).float()


def _per_unit(values: torch.Tensor, m: torch.Tensor, sequence: bool) -> torch.Tensor:
    """``values`` ``[B, T]`` on the response tokens, or (``sequence``) one per response with a token (its first)."""
    if not sequence:
        return values[m]
    rows = m.any(dim=1)
    return values[rows, m[rows].float().argmax(dim=1)]


def weight_stats(logp_old: torch.Tensor, logp_engine: torch.Tensor, response_mask: torch.Tensor,
                 weights: torch.Tensor, *, mode: str, cap: float, cap_lower: Optional[float] = None
                 ) -> dict[str, float]:
    """Over response tokens (token modes) or responses (sequence modes): rollout/tis_weight_mean, _min, _max,
    rollout/tis_capped_frac (share whose uncapped ratio exceeded C: truncated, or zeroed by a mask mode) and, with a
    lower bound, rollout/tis_below_frac (share below it)."""
    m = response_mask != 0
    sequence = mode.startswith("sequence")
    log_r = log_ratio(logp_old, logp_engine, response_mask)
    if sequence:
        log_r = _seq_sum(log_r, m)[:, None].expand_as(m)
    w, log_r = _per_unit(weights, m, sequence), _per_unit(log_r, m, sequence)
    if w.numel() == 0:
        return {}
    out = {"rollout/tis_weight_mean": float(w.mean()), "rollout/tis_weight_min": float(w.min()),
           "rollout/tis_weight_max": float(w.max()),
           "rollout/tis_capped_frac": float((log_r > math.log(cap)).float().mean())}
    if cap_lower is not None:
        out["rollout/tis_below_frac"] = float((log_r < math.log(cap_lower)).float().mean())
    return out


def rejection_stats(response_mask: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """rollout/masked_token_frac (share of response tokens rejected; verl ``rollout_rs_masked_fraction``) and
    rollout/rejected_response_frac (share of responses with a token rejected; verl ``rollout_rs_seq_masked_fraction``
    counts over all rows, here over the responses with at least one token)."""
    m = response_mask != 0
    rejected = m & (keep == 0)
    rows = m.any(dim=1)
    if not bool(rows.any()):
        return {}
    return {"rollout/masked_token_frac": float(rejected.sum()) / float(m.sum()),
            "rollout/rejected_response_frac": float(rejected.any(dim=1)[rows].float().mean())}


def correction_stats(rc: CorrectionSettings, logp_old: torch.Tensor, logp_engine: torch.Tensor,
                     response_mask: torch.Tensor, correction: Correction) -> dict[str, float]:
    """The weight statistics (:func:`weight_stats`) and rejection statistics (:func:`rejection_stats`) of a
    correction of one step."""
    out: dict[str, float] = {}
    if correction.weights is not None:
        out.update(weight_stats(logp_old, logp_engine, response_mask, correction.weights, mode=rc.mode, cap=rc.cap,
                                cap_lower=rc.cap_lower))
    if correction.keep is not None:
        out.update(rejection_stats(response_mask, correction.keep))
    return out


# --------------------------------------------------------------------------------------------------------------------
# Diagnostics of the mismatch (logged whenever the engine reports log-probs, correction on or off)
# --------------------------------------------------------------------------------------------------------------------


def mismatch_metrics(logp_learner: Optional[torch.Tensor], logp_engine: torch.Tensor,
                     response_mask: torch.Tensor) -> dict[str, float]:
    """verl's ``compute_offpolicy_metrics`` under rollout/ names, over the responses with at least one token
    (x = logp_learner - logp_engine, per response i the token means mean_i(.) over its response tokens):

        engine_learner_kl_k1  = token mean of -x                  (KL(pi_engine || pi_learner), verl ``kl``)
        engine_learner_kl_k3  = token mean of exp(x) - 1 - x      (verl ``k3_kl``)
        engine_ppl, learner_ppl = mean_i exp(-mean_i(logp))       (verl ``rollout_ppl``, ``training_ppl``)
        log_ppl_diff          = mean_i (mean_i(logp_engine) - mean_i(logp_learner))   (verl ``log_ppl_diff``; > 0:
                                the learner finds the responses less likely than the engine did), and its |.| mean
                                log_ppl_abs_diff
        chi2_token            = token mean of exp(2 x) - 1        (verl ``chi2_token``)
        chi2_seq              = mean_i exp(2 sum_t x) - 1         (verl ``chi2_seq``)

    (x clamped to +-20 inside the exps, as verl.) ``logp_learner`` None: engine_ppl alone. verl counts a response
    without tokens as perplexity 1; here it is left out."""
    m = response_mask != 0
    rows = m.any(dim=1)
    if not bool(rows.any()):
        return {}
    mf, eng = m.float()[rows], logp_engine.detach().float()[rows]
    out = {"rollout/engine_ppl": float(torch.exp(-_seq_mean(eng, mf)).mean())}
    if logp_learner is None:
        return out
    lrn = logp_learner.detach().float()[rows]
    x = (lrn - eng) * mf
    tokens = float(mf.sum())
    diff = _seq_mean(eng, mf) - _seq_mean(lrn, mf)
    out.update({
        "rollout/engine_learner_kl_k1": float((-x * mf).sum()) / tokens,
        "rollout/engine_learner_kl_k3": float(((torch.exp(_clamp(x)) - 1 - x) * mf).sum()) / tokens,
        "rollout/learner_ppl": float(torch.exp(-_seq_mean(lrn, mf)).mean()),
        "rollout/log_ppl_diff": float(diff.mean()), "rollout/log_ppl_abs_diff": float(diff.abs().mean()),
        "rollout/chi2_token": float((torch.exp(2 * _clamp(x)) * mf).sum()) / tokens - 1.0,
        "rollout/chi2_seq": float(torch.exp(2 * _clamp(_seq_sum(x, mf))).mean()) - 1.0,
    })
    return out


def bypass_correction(rc: CorrectionSettings, logp_new: torch.Tensor, logp_engine: torch.Tensor,
                      response_mask: torch.Tensor) -> tuple[Correction, dict[str, float]]:
    """verl's bypass mode (``compute_policy_loss_bypass_mode``): logp_old is the engine's, and the correction of one
    micro-batch is taken between the policy being updated and the engine, w and the keep mask from
    r = pi_new / pi_engine (without gradient). Returns it and the micro-batch's token means (the step averages them
    over its tokens, algo/step_metrics.py): rollout/engine_learner_kl_k1 and _k3 over x = logp_new - logp_engine,
    rollout/masked_token_frac (the rejected share) and rollout/tis_weight_mean."""
    c = correct(rc, logp_new.detach(), logp_engine, response_mask)
    m = response_mask != 0
    if not bool(m.any()):
        return c, {}
    x = log_ratio(logp_new, logp_engine, response_mask)[m]
    out = {"rollout/engine_learner_kl_k1": float((-x).mean()),
           "rollout/engine_learner_kl_k3": float((torch.exp(_clamp(x)) - 1 - x).mean())}
    if c.keep is not None:
        out["rollout/masked_token_frac"] = float((c.keep[m] == 0).float().mean())
    if c.weights is not None:
        out["rollout/tis_weight_mean"] = float(c.weights[m].mean())
    return c, out

"""The learner's objective on one micro-batch, normalised by its *mini-batch* totals (GRPO + KL + entropy + LLDS).

For a mini-batch M split into micro-batches, with response mask m ``[B, T]``, every term is a sum over the
micro-batch divided by a mini-batch total, so that summing the micro-batch losses (gradient accumulation) gives exactly
the mini-batch loss, however unevenly M was cut:

    N_tok  = sum_{i in M, t} m[i,t]               (mini_tokens:    response tokens of the mini-batch)
    N_resp = |{ i in M : sum_t m[i,t] > 0 }|     (mini_responses: responses with at least one token)
    D      = N_tok for agg_mode "token-mean", N_resp for the seq-mean modes

    L = pg                                       policy-gradient surrogate (PPO-clip or GSPO), aggregated over D
      + kl_coef      * agg(KL(logp_new || logp_ref), D)
      - entropy_coef * agg(H, D)
      + L_LLDS                                   sum m g c max(0, logp_old - logp_new) / N_tok   (algo.llds)

agg(x, D) is :func:`searchr1_lld.algo.aggregation.aggregate` with ``denominator=D``. The policy loss functions
normalise by the micro-batch count n (tokens or responses); it is rescaled by n / D, which is the same sum over D.
``token_weights`` ``[B, T]`` (optional, None = 1; e.g. truncated importance-sampling weights between the rollout
engine and the learner) are handed to the policy loss, which multiplies its per-token term by them.

A padding micro-batch (a rank with fewer micro-batches than its peers) is this loss times 0: same graph, zero
gradient. Pure tensor function: no I/O, no distributed calls.

Two paths, equal within float rounding (tests/test_algo_objective.py checks 1e-6, values and gradients):
- :func:`composed_objective` -- the reference: calls policy_loss, kl, aggregation and llds one after the other, each
  with its own autograd graph and metrics.
- the fused path (``policy_loss == "ppo_clip"``, what :func:`objective` runs) -- every term is a sum over tokens of
  a function of logp_new[i,t] (and entropy[i,t]) alone, so dL/dlogp_new and dL/dH are ``[B, T]`` tensors that one
  no-grad pass computes next to the loss, sharing the intermediates (mask, token counts, r, d = logp_old - logp_new,
  the LLDS gate); a one-line autograd Function returns them in backward. With a_{i,t} the aggregation weight (m/D for
  token-mean and seq-mean-token-sum, m/(n_i D) for seq-mean-token-mean; n_i = response i's token count), w the
  token weights, x = logp_new - logp_ref:

      dL/dlogp_new = a w s_dual 1[|log r| <= 20] 1[l1 >= l2] (-A r)   (PPO-clip; l1 == l2 inside the clip range)
                   + kl_coef a dKL/dx                     (k1: 1, abs: sign x, k2: x, k3: (1 - e^{-x}) inside clamps)
                   - (m g c 1[d > 0]) / N_tok              (LLDS, algo.llds.llds_update)
      dL/dH        = -entropy_coef a
  where s_dual is 1 where the dual clip is not the active bound (A >= 0, or max(l1, l2) < -A c; 1/2 on a tie, as
  torch.minimum's gradient). Metrics are one tensor, converted to floats once. The LLDS part (its gate, weights,
  loss and metrics, its gradient added in place) is one call at the end of the pass, :func:`algo.llds.llds_update`:
  on CPU float32 a C kernel (searchr1_lld/kernels/llds_cpu.c), elsewhere its torch formulation (static shapes, no
  ``nonzero``: one graph under ``torch.compile``, no host synchronisation on GPU).
  ``ObjectiveSpec.compile`` runs that pass through ``torch.compile`` (dynamic shapes); if compiling fails or is
  unavailable, the eager pass runs instead, with one warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from searchr1_lld.algo import aggregation, kl, llds, policy_loss


@dataclass(frozen=True)
class ObjectiveSpec:
    """The coefficients and modes of the objective (a view of ``AlgorithmConfig``)."""

    policy_loss: str = "ppo_clip"  # "ppo_clip" | "gspo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    llds_lam: float = 0.0  # 0 = LLDS off
    llds_gate: str = "action"
    llds_tau: float = 0.0
    compile: bool = False  # torch.compile the fused pass (eager fallback with one warning)


def mini_batch_denominators(response_mask: torch.Tensor) -> tuple[float, float]:
    """(N_tok, N_resp) of a mini-batch's response mask ``[B, T]`` (module docstring)."""
    per_row = (response_mask != 0).sum(dim=1)
    return float(per_row.sum()), float((per_row > 0).sum())


def _check_aggregation(spec: ObjectiveSpec, mini_tokens: float, mini_responses: float) -> None:
    """The aggregation mode is known and the mini-batch denominators are positive (both objective paths)."""
    if spec.agg_mode not in aggregation.AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {spec.agg_mode!r}; expected one of {list(aggregation.AGG_MODES)}")
    if mini_tokens <= 0 or mini_responses <= 0:
        raise ValueError(f"mini-batch denominators must be > 0; got mini_tokens={mini_tokens}, mini_responses={mini_responses}")


def composed_objective(
    spec: ObjectiveSpec,
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    mini_tokens: float,
    mini_responses: float,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    answer_mask: torch.Tensor | None = None,
    lam_answer: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Micro-batch loss L (module docstring) and its metrics: the reference path, term by term (same arguments and
    result as :func:`objective`).

    Args:
        spec: coefficients and modes.
        logp_new: [B, T] current log-probs (carry the gradient). logp_old: [B, T] rollout-policy log-probs.
        advantages: [B] or [B, T] (token broadcast). response_mask: [B, T].
        mini_tokens, mini_responses: N_tok and N_resp of the whole mini-batch (:func:`mini_batch_denominators`).
        logp_ref: [B, T] reference log-probs (KL term when given and spec.kl_coef > 0).
        entropy: [B, T] token entropies (entropy term when given and spec.entropy_coef != 0; carries gradient).
        answer_mask, lam_answer: LLDS-MA (both or neither). token_weights: [B, T] per-token policy-gradient weights.

    Returns:
        (loss, metrics): metrics are micro-batch means over its response tokens -- pg_loss, pg_clip_frac, approx_kl
        (from the policy loss), kl_ref, entropy (when computed), and the ``llds/*`` metrics when LLDS is on.
    """
    _check_aggregation(spec, mini_tokens, mini_responses)
    n_tok, n_resp = mini_batch_denominators(response_mask)
    denom = mini_tokens if spec.agg_mode == "token-mean" else mini_responses
    local = n_tok if spec.agg_mode == "token-mean" else n_resp

    loss_fn = policy_loss.get_policy_loss_fn(spec.policy_loss)
    extra = {} if token_weights is None else {"token_weights": token_weights}
    pg, pg_m = loss_fn(logp_new, logp_old, advantages, response_mask, clip_low=spec.clip_low, clip_high=spec.clip_high,
                       dual_clip=spec.dual_clip, agg_mode=spec.agg_mode, **extra)
    loss = pg * (local / denom)  # pg normalises by the micro-batch count `local`: rescaled to the mini-batch's D
    metrics = {"pg_loss": pg_m["pg_loss"], "pg_clip_frac": pg_m["pg_clip_frac"], "approx_kl": pg_m["approx_kl"]}

    if entropy is not None:
        if spec.entropy_coef:
            loss = loss - spec.entropy_coef * aggregation.aggregate(entropy, response_mask, spec.agg_mode, denominator=denom)
        metrics["entropy"] = float(aggregation.masked_mean(entropy.detach(), response_mask))
    if logp_ref is not None:
        kl_tok = kl.kl_penalty(logp_new, logp_ref.detach(), spec.kl_type)
        if spec.kl_coef > 0:
            loss = loss + spec.kl_coef * aggregation.aggregate(kl_tok, response_mask, spec.agg_mode, denominator=denom)
        metrics["kl_ref"] = float(aggregation.masked_mean(kl_tok.detach(), response_mask))
    if spec.llds_lam > 0:
        l_llds, llds_m = llds.llds_loss(
            logp_new, logp_old, advantages, response_mask, gate=spec.llds_gate, lam=spec.llds_lam, tau=spec.llds_tau,
            answer_mask=answer_mask if lam_answer is not None else None, lam_answer=lam_answer,
            denominator=mini_tokens,
        )
        loss = loss + l_llds
        metrics.update(llds_m)
    return loss, metrics


def objective(
    spec: ObjectiveSpec,
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    mini_tokens: float,
    mini_responses: float,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    answer_mask: torch.Tensor | None = None,
    lam_answer: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Micro-batch loss L (module docstring) and its metrics.

    Args:
        spec: coefficients and modes.
        logp_new: [B, T] current log-probs (carry the gradient). logp_old: [B, T] rollout-policy log-probs.
        advantages: [B] or [B, T] (token broadcast). response_mask: [B, T].
        mini_tokens, mini_responses: N_tok and N_resp of the whole mini-batch (:func:`mini_batch_denominators`).
        logp_ref: [B, T] reference log-probs (KL term when given and spec.kl_coef > 0).
        entropy: [B, T] token entropies (entropy term when given and spec.entropy_coef != 0; carries gradient).
        answer_mask, lam_answer: LLDS-MA (both or neither). token_weights: [B, T] per-token policy-gradient weights.

    Returns:
        (loss, metrics): metrics are micro-batch means over its response tokens -- pg_loss, pg_clip_frac, approx_kl
        (from the policy loss), kl_ref, entropy (when computed), and the ``llds/*`` metrics when LLDS is on.
        PPO-clip runs the fused path, any other policy loss :func:`composed_objective`.
    """
    if spec.policy_loss != "ppo_clip":
        return composed_objective(spec, logp_new, logp_old, advantages, response_mask, mini_tokens=mini_tokens,
                                  mini_responses=mini_responses, logp_ref=logp_ref, entropy=entropy,
                                  answer_mask=answer_mask, lam_answer=lam_answer, token_weights=token_weights)
    _check_aggregation(spec, mini_tokens, mini_responses)
    policy_loss._check(logp_new, logp_old, response_mask, spec.clip_low, spec.clip_high, spec.dual_clip)
    policy_loss._token_advantages(advantages, response_mask)  # shape check
    if token_weights is not None and token_weights.shape != response_mask.shape:
        raise ValueError(f"token_weights must be [B, T] like response_mask {tuple(response_mask.shape)}; "
                         f"got {tuple(token_weights.shape)}")
    if logp_ref is not None and logp_ref.shape != logp_new.shape:
        raise ValueError(f"logp and ref_logp shapes differ: {tuple(logp_new.shape)} vs {tuple(logp_ref.shape)}")
    if spec.kl_type not in kl.KL_KINDS:
        raise ValueError(f"unknown KL estimator {spec.kl_type!r}; expected one of {list(kl.KL_KINDS)}")
    use_llds = spec.llds_lam > 0
    if use_llds:  # the same argument checks as llds.llds_loss
        llds.check_llds_args(logp_new, logp_old, response_mask, spec.llds_gate, spec.llds_lam,
                             answer_mask if lam_answer is not None else None, lam_answer)
    use_entropy = entropy is not None

    core = _compiled_core() if spec.compile else _fused_core
    loss_value, grad_logp, grad_entropy, stats = core(
        logp_new.detach(), logp_old.detach(), advantages.detach(), response_mask.detach(),
        None if logp_ref is None else logp_ref.detach(),
        entropy.detach() if use_entropy else None,
        None if token_weights is None else token_weights.detach(),
        answer_mask.detach() if (use_llds and lam_answer is not None) else None,
        float(mini_tokens), float(mini_responses),
        spec.agg_mode, spec.clip_low, spec.clip_high, spec.dual_clip, spec.kl_type, float(spec.kl_coef),
        float(spec.entropy_coef), float(spec.llds_lam), spec.llds_gate, float(spec.llds_tau),
        None if lam_answer is None else float(lam_answer),
    )
    loss = _FusedLoss.apply(loss_value, grad_logp, grad_entropy, logp_new, entropy if use_entropy else None)
    names = ["pg_loss", "pg_clip_frac", "approx_kl"]
    names += ["entropy"] if use_entropy else []
    names += ["kl_ref"] if logp_ref is not None else []
    names += [f"llds/{k}" for k in llds.STAT_NAMES] if use_llds else []
    values = stats.tolist()  # the one host conversion of all metrics
    return loss, {k: float(v) for k, v in zip(names, values)}


class _FusedLoss(torch.autograd.Function):
    """loss (computed without a graph) with the precomputed gradients dL/dlogp_new and dL/dH."""

    @staticmethod
    def forward(ctx, value, grad_logp, grad_entropy, logp_new, entropy):
        ctx.save_for_backward(grad_logp, grad_entropy)
        ctx.has_entropy = entropy is not None
        return value.clone()

    @staticmethod
    def backward(ctx, grad_out):
        grad_logp, grad_entropy = ctx.saved_tensors
        g_ent = grad_out * grad_entropy if ctx.has_entropy and ctx.needs_input_grad[4] else None
        g_logp = grad_out * grad_logp if ctx.needs_input_grad[3] else None
        return None, None, None, g_logp, g_ent


def _kl_and_grad(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """kl.kl_penalty(logp, ref, kind) with x = logp - ref, and its derivative d/dx (clamp: 0 outside, as autograd)."""
    if kind == "k1":
        return x, torch.ones_like(x)
    if kind == "abs":
        return x.abs(), torch.sign(x)
    if kind in ("k2", "mse"):
        return 0.5 * x.square(), x
    lr_raw = -x  # ref - logp, clamped before exp and the result clamped (kl.py)
    lr = lr_raw.clamp(-kl.K3_LOG_RATIO_CLAMP, kl.K3_LOG_RATIO_CLAMP)
    e = torch.exp(lr)
    k = e - lr - 1
    keep = (lr_raw.abs() <= kl.K3_LOG_RATIO_CLAMP) & (k.abs() <= kl.K3_RESULT_CLAMP)
    return k.clamp(-kl.K3_RESULT_CLAMP, kl.K3_RESULT_CLAMP), torch.where(keep, 1 - e, 0.0)


@torch.no_grad()
def _fused_core(logp_new, logp_old, advantages, mask, logp_ref, entropy, token_weights, answer_mask, mini_tokens: float,
                mini_responses: float, agg_mode: str, clip_low: float, clip_high: float, dual_clip: float | None,
                kl_type: str, kl_coef: float, entropy_coef: float, llds_lam: float, llds_gate: str, llds_tau: float,
                lam_answer: float | None):
    """The fused pass (module docstring): (loss value, dL/dlogp_new [B, T], dL/dH [B, T] or 0-dim, metrics [k])."""
    m = mask if mask.dtype == torch.bool else mask != 0
    mf = m.to(logp_new.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1] broadcasts like the token advantages
    tokens_per_row = mf.sum(dim=1)  # [B]
    n_tok = tokens_per_row.sum()
    safe_tok = n_tok.clamp(min=1)
    if agg_mode == "token-mean":
        denom, local = mini_tokens, n_tok
        a = mf / denom  # aggregation weight a[i,t]: agg(x, D) = sum a x
    else:
        denom, local = mini_responses, (tokens_per_row > 0).sum().to(mf.dtype)
        a = mf / denom if agg_mode == "seq-mean-token-sum" else mf / (tokens_per_row.clamp(min=1)[:, None] * denom)

    # PPO-clip (policy_loss.ppo_clip_loss): r = exp(clamp(logp_new - logp_old, +-20))
    neg_d = logp_new - logp_old  # log r before the clamp; d = logp_old - logp_new for LLDS
    log_ratio = neg_d.clamp(-policy_loss.LOG_RATIO_CLAMP, policy_loss.LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    neg_adv = -adv
    l1 = neg_adv * ratio
    l2 = neg_adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(l1, l2)
    # d max(l1, l2) / d log r: l1 == l2 inside the clip range, so the unclipped branch carries the whole gradient there
    d_tok = torch.where((l1 >= l2) & (neg_d.abs() <= policy_loss.LOG_RATIO_CLAMP), l1, 0.0)  # l1 = -A r = dl1/dlog r
    if dual_clip is not None:
        l3 = neg_adv * dual_clip
        lower = adv < 0
        d_tok = d_tok * torch.where(lower & (l3 < per_token), 0.0, torch.where(lower & (l3 == per_token), 0.5, 1.0))
        per_token = torch.where(lower, torch.minimum(per_token, l3), per_token)
    a_pg = a if token_weights is None else a * token_weights.to(a.dtype)
    pg = (per_token * a_pg).sum()  # already over D (the reference normalises by `local`, then rescales by local / D)
    grad_logp = d_tok * a_pg
    loss = pg
    stats = [
        pg * denom / local.clamp(min=1),  # pg_loss: normalised by the micro-batch count, as the policy loss reports it
        ((l2 > l1) & m).sum() / safe_tok,  # pg_clip_frac
        -(log_ratio * mf).sum() / safe_tok,  # approx_kl = mean of k1 = logp_old - logp_new (clamped, as the loss's)
    ]
    if entropy is not None:
        stats.append((entropy * mf).sum() / safe_tok)
        if entropy_coef:
            loss = loss - entropy_coef * (entropy * a).sum()
        grad_entropy = a * (-entropy_coef)
    else:
        grad_entropy = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    if logp_ref is not None:
        kl_tok, kl_grad = _kl_and_grad(logp_new - logp_ref, kl_type)
        stats.append((kl_tok * mf).sum() / safe_tok)
        if kl_coef > 0:
            loss = loss + kl_coef * (kl_tok * a).sum()
            grad_logp = grad_logp + (kl_coef * a) * kl_grad
    if llds_lam > 0:  # last: grad_logp is in cache; adds -w / N_tok to it (N_tok of the mini-batch, > 0: checked)
        llds_stats = llds.llds_update(neg_d, m, advantages, grad_logp, gate=llds_gate, lam=llds_lam, tau=llds_tau,
                                      answer_mask=answer_mask, lam_answer=lam_answer, inv_den=1.0 / mini_tokens)
        loss = loss + llds_stats[-1]
        stats.append(llds_stats)
    return loss, grad_logp, grad_entropy, torch.cat([s.to(logp_new.dtype).reshape(-1) for s in stats])


_COMPILED = None


def _compiled_core():
    """``torch.compile(_fused_core, dynamic=True)`` on the first call; the eager core (one warning) if that fails."""
    global _COMPILED
    if _COMPILED is None:
        try:
            compiled = torch.compile(_fused_core, dynamic=True)
        except Exception as e:  # noqa: BLE001 -- no compiler / unsupported platform: eager is the same function
            warnings.warn(f"torch.compile of the fused objective failed ({type(e).__name__}: {e}); running it eagerly",
                          stacklevel=3)
            _COMPILED = _fused_core
        else:
            _COMPILED = _SafeCompiled(compiled)
    return _COMPILED


class _SafeCompiled:
    """Calls the compiled core; on the first failure (compilation happens lazily, at the first call) warns once and
    runs the eager core from then on."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *args):
        global _COMPILED
        try:
            return self.compiled(*args)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"torch.compile of the fused objective failed ({type(e).__name__}: {e}); running it eagerly",
                          stacklevel=3)
            _COMPILED = _fused_core
            return _fused_core(*args)

"""LLDS: Lazy-Likelihood-Displacement Shaping (docs/design.md, section "The science in one page").

For response i and token t (all tensors ``[B, T]``):

    m[i,t] = response_mask                       1 on generated tokens (not prompt, not <information>, not padding)
    d[i,t] = logp_old[i,t] - logp_new[i,t]       > 0 where the update lowered the token's likelihood
    P      = { i : A_i >= 0 }                    preserving set (correct / not-worse-than-average responses)
    p[i,t] = max(0, d[i,t])                      token penalty
    g[i,t] (no gradient):
        none     : 1[i in P]
        response : 1[i in P and sum_t m d > tau]                       (R-gate)
        action   : 1[i in P and sum_{t' in span(t)} d[i,t'] > tau]     (A-gate; span = maximal run of m == 1)
    c[i,t] = lam, or min(lam_answer, lam) where answer_mask == 1 (LLDS-MA; only when both are given)
    L_LLDS = sum_{i,t} m g c p / sum_{i,t} m     (0 when the mask is empty)

The gradient flows only through ``logp_new`` (``logp_old``, the advantages and the gate are constants). It is a no-op
while logp_new == logp_old (the first mini-batch after a rollout): the trainer must report ``llds/active_token_frac``.
Fully vectorised, static shapes: no Python loop over responses or spans and no tensor whose size depends on the data
(the action gate's span sums are one ``scatter_add`` by span number and one gather back to the tokens), so the gate
needs no host synchronisation on a GPU.

Kinds by name (``algorithm.llds.*`` names them; registered like the losses, so the config, ``--help-config`` and the
errors read the tables): the gates (:data:`GATES`, ``llds.gate``), LLDS-MA's answer-span modes
(:data:`ANSWER_MASK_MODES`, ``llds.ma``: off, fixed, adaptive) and the adaptive mode's rules (:data:`ADAPTIVE_RULES`,
``llds.ma_adaptive_rule``: code, paper).
"""

from __future__ import annotations

from typing import Callable

import torch

from searchr1_lld.algo import registry, spans
from searchr1_lld.algo.advantages import check_advantages

# gate(on [B, T] bool: m and i in P, d*m [B, T], m [B, T] bool, span starts [B, T] bool, tau) -> g [B, T] bool
GateFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
GATES: dict[str, GateFn] = {}
# answer-span mode(lam_answer, the step's mean valid searches or None, adaptive rule) -> lam_answer' or None (no MA)
AnswerMaskFn = Callable[[float, "float | None", str], "float | None"]
ANSWER_MASK_MODES: dict[str, AnswerMaskFn] = {}
# adaptive rule(lam_answer, mean valid searches V) -> lam_answer'
AdaptiveRuleFn = Callable[[float, float], float]
ADAPTIVE_RULES: dict[str, AdaptiveRuleFn] = {}


def register_gate(name: str) -> Callable[[GateFn], GateFn]:
    """Decorator: register ``fn`` as the LLDS gate ``name``."""
    return registry.register(GATES, "LLDS gate", name)


@register_gate("none")
def no_gate(on: torch.Tensor, d_masked: torch.Tensor, m: torch.Tensor, starts: torch.Tensor,
            tau: float) -> torch.Tensor:
    """g = 1[i in P] on the response tokens."""
    return on


@register_gate("response")
def response_gate(on: torch.Tensor, d_masked: torch.Tensor, m: torch.Tensor, starts: torch.Tensor,
                  tau: float) -> torch.Tensor:
    """The R-gate: g = 1[i in P and sum_t m d > tau]."""
    return on & (d_masked.sum(dim=1, keepdim=True) > tau)


@register_gate("action")
def action_gate(on: torch.Tensor, d_masked: torch.Tensor, m: torch.Tensor, starts: torch.Tensor,
                tau: float) -> torch.Tensor:
    """The A-gate: g = 1[i in P and sum_{t' in span(t)} d[i,t'] > tau]. Static shapes: the spans of the flattened
    batch are numbered by a cumulative sum of their first tokens (1-based; 0 for the tokens before the first span),
    d*m is summed per span number into a ``[B*T + 1]`` buffer (``scatter_add``; tokens outside m add 0) and each
    token's span sum read back with one gather (tokens outside m read some span's sum and are masked out by ``on``)."""
    run = torch.cumsum(starts.reshape(-1), 0)
    span_sum = torch.zeros(m.numel() + 1, dtype=d_masked.dtype, device=d_masked.device)
    span_sum.scatter_add_(0, run, d_masked.reshape(-1))
    return on & (span_sum[run] > tau).view(m.shape)


def per_response_advantage(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` advantage per response.

    ``[B]`` input is returned as is. ``[B, T]`` input (token broadcast) is read at the first masked token of each row
    (rows without masked tokens get 0). Token-broadcast advantages are constant over the mask, so any masked token
    gives the same value.
    """
    check_advantages(advantages, response_mask)
    if advantages.dim() == 1:
        return advantages.detach()
    m = response_mask.detach()
    m = m if m.dtype == torch.bool else m != 0
    first = torch.argmax(m.to(torch.uint8), dim=1)  # first masked position (0 for empty rows)
    adv = advantages.detach().gather(1, first[:, None]).squeeze(1)
    return torch.where(m.any(dim=1), adv, torch.zeros_like(adv))


def preserving_rows(advantages: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: i in P. ``[B]`` advantages: A_i >= 0. ``[B, T]``: every response token's advantage is >= 0
    (the same thing for token-broadcast advantages; two tensor ops instead of a gather)."""
    check_advantages(advantages, m)
    if advantages.dim() == 1:
        return advantages.detach() >= 0
    return torch.where(m, advantages.detach(), 0.0).amin(dim=1) >= 0


@torch.no_grad()
def _gate(d_masked: torch.Tensor, m: torch.Tensor, in_p: torch.Tensor, gate: str, tau: float):
    """Gate from the masked displacement d*m, the bool mask m and P membership ``[B]``: (g ``[B, T]`` bool, the
    registered gate ``gate``; and the action spans' first tokens ``[B, T]`` bool,
    :func:`searchr1_lld.algo.spans.span_starts`). Static shapes only (no ``nonzero``, no per-span tensors whose length
    depends on the data)."""
    starts = spans.span_starts(m)
    return registry.lookup(GATES, "LLDS gate", gate)(m & in_p[:, None], d_masked, m, starts, tau), starts


@torch.no_grad()
def llds_gate(
    displacement: torch.Tensor, response_mask: torch.Tensor, response_advantage: torch.Tensor, gate: str, tau: float
) -> torch.Tensor:
    """Gate g ``[B, T]`` (bool, no gradient) from d ``[B, T]``, m ``[B, T]`` and A ``[B]`` (formulas in module doc).

    The gate is also False outside the response mask.
    """
    registry.lookup(GATES, "LLDS gate", gate)
    m = response_mask != 0
    d_masked = torch.where(m, displacement.detach(), 0.0)
    if m.numel() == 0:
        return m.clone()
    return _gate(d_masked, m, response_advantage >= 0, gate, tau)[0]


def _check_args(logp_new: torch.Tensor, logp_old: torch.Tensor, response_mask: torch.Tensor, gate: str, lam: float,
                answer_mask: torch.Tensor | None, lam_answer: float | None) -> None:
    """The argument checks of :func:`llds_loss`."""
    if not (logp_new.shape == logp_old.shape == response_mask.shape) or logp_new.dim() != 2:
        raise ValueError(
            f"logp_new, logp_old, response_mask must all be [B, T]; got {tuple(logp_new.shape)}, "
            f"{tuple(logp_old.shape)}, {tuple(response_mask.shape)}"
        )
    registry.lookup(GATES, "LLDS gate", gate)
    if lam < 0:
        raise ValueError(f"LLDS lam must be >= 0, got {lam}")
    if lam_answer is not None and lam_answer < 0:
        raise ValueError(f"LLDS lam_answer must be >= 0, got {lam_answer}")
    if lam_answer is not None and answer_mask is None:
        raise ValueError("lam_answer given without answer_mask (LLDS-MA needs the answer span)")
    if answer_mask is not None and answer_mask.shape != response_mask.shape:
        raise ValueError(f"answer_mask must be [B, T] like response_mask; got {tuple(answer_mask.shape)}")


def llds_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gate: str = "action",
    lam: float = 0.2,
    tau: float = 0.0,
    answer_mask: torch.Tensor | None = None,
    lam_answer: float | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """L_LLDS (module docstring) and its metrics.

    Args:
        logp_new: [B, T] log-probs of the current policy (carries the gradient).
        logp_old: [B, T] log-probs of the rollout policy (constant).
        advantages: [B] or [B, T] (token broadcast) GRPO advantages.
        response_mask: [B, T] 1 on generated tokens.
        gate: "none" | "response" | "action".
        lam: LLDS coefficient lambda >= 0.  tau: gate threshold on summed displacement.
        answer_mask: [B, T] 1 on the final answer span (LLDS-MA). lam_answer: its coefficient (>= 0); c = min(lam_answer,
            lam) there. Both or neither (answer_mask alone is ignored; lam_answer alone is an error).
        denominator: replaces sum m as the normaliser (micro-batch accumulation); default sum m.

    Returns:
        (loss scalar, metrics) with float metrics:
        llds/active_token_frac   fraction of response tokens with g c p > 0
        llds/gated_responses     responses with the gate on for at least one token
        llds/preserved_responses responses in P (with at least one response token)
        llds/gated_actions       action spans whose gate is on
        llds/total_actions       action spans in the batch
        llds/mean_penalty        mean of p over response tokens of P-responses (displacement LLDS could act on)
        llds/mean_displacement   mean of d over all response tokens
        llds/loss                the loss value

    Implementation: the constant weight w = m g c 1[d > 0] is built without gradient, then L = sum(w d) / sum(m),
    differentiated by autograd (identical value and gradient to sum(m g c relu(d)) / sum(m)). P for ``[B, T]``
    advantages: every response token's advantage >= 0 (= A_i >= 0 when broadcast).
    """
    _check_args(logp_new, logp_old, response_mask, gate, lam, answer_mask, lam_answer)
    m = response_mask.detach()
    m = m if m.dtype == torch.bool else m != 0
    dd = logp_old.detach() - logp_new.detach()  # d, [B, T]
    weight, den, stats = llds_weight_and_stats(dd, m, advantages, gate=gate, lam=lam, tau=tau, answer_mask=answer_mask,
                                               lam_answer=lam_answer, denominator=denominator)
    # = sum(m g c relu(d)) / den; 0 when the mask is empty (weight is 0 there), graph intact
    loss = (weight * (logp_old.detach() - logp_new)).sum() / den
    values = torch.cat([stats, loss.detach().reshape(1)]).tolist()
    return loss, {f"llds/{k}": float(v) for k, v in zip(STAT_NAMES, values)}


STAT_NAMES = ("active_token_frac", "gated_responses", "preserved_responses", "gated_actions", "total_actions",
              "mean_penalty", "mean_displacement", "loss")


@torch.no_grad()
def llds_weight_and_stats(
    dd: torch.Tensor,
    m: torch.Tensor,
    advantages: torch.Tensor,
    *,
    gate: str,
    lam: float,
    tau: float,
    answer_mask: torch.Tensor | None,
    lam_answer: float | None,
    denominator: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The constant part of L_LLDS: (w ``[B, T]`` = m g c 1[d > 0], the normaliser (0-dim, > 0), stats ``[7]``).

    ``dd`` is d = logp_old - logp_new (detached), ``m`` the bool response mask. L_LLDS = sum(w d) / normaliser; its
    gradient w.r.t. logp_new is -w / normaliser. ``stats`` are the first seven of :data:`STAT_NAMES` (the loss value
    is the caller's), as one tensor so that all metrics are converted with one ``.tolist()``.
    """
    d_masked = torch.where(m, dd, 0.0)
    in_p = preserving_rows(advantages, m)  # [B]
    g, starts = _gate(d_masked, m, in_p, gate, tau)
    active = g & (d_masked > 0)  # (g is False outside m)
    weight = active.to(dd.dtype).mul_(float(lam))  # m g c 1[d > 0] with c = lam
    if answer_mask is not None and lam_answer is not None:  # LLDS-MA: c = min(lam_answer, lam) on the answer span
        weight.masked_fill_(active & (answer_mask.detach() != 0), min(float(lam_answer), float(lam)))
    tokens_per_row = torch.count_nonzero(m, dim=1)  # (bool .sum() casts to int64 first: slow)
    n_tok = tokens_per_row.sum()
    den = n_tok.to(dd.dtype) if denominator is None else torch.tensor(float(denominator), dtype=dd.dtype, device=dd.device)
    safe_den = torch.where(den > 0, den, torch.ones_like(den))
    p_rows = in_p & (tokens_per_row > 0)
    p_tokens = (tokens_per_row * p_rows).sum()
    stats = torch.stack(
        [
            torch.count_nonzero(weight) / n_tok.clamp(min=1),
            torch.count_nonzero(g.any(dim=1)),  # responses gated (on one token or more)
            torch.count_nonzero(p_rows),
            torch.count_nonzero(g & starts),  # spans gated (the gate is constant over a span)
            torch.count_nonzero(starts),
            (d_masked.clamp(min=0).sum(dim=1) * p_rows).sum() / p_tokens.clamp(min=1),
            d_masked.sum() / n_tok.clamp(min=1),
        ]
    ).to(dd.dtype)
    return weight, safe_den, stats


def answer_coefficient(ma: str, lam_answer: float, valid_searches_mean: float | None,
                       rule: str = "code") -> float | None:
    """LLDS-MA's answer-span coefficient lam_answer' (the coefficient applied there is min(lam_answer', lam)) of the
    registered answer-span mode ``ma``: "off" -> None (no MA), "fixed" -> ``lam_answer``, "adaptive" ->
    :func:`adaptive_lam_answer` of the step's mean number of valid searches per response (required then)."""
    return registry.lookup(ANSWER_MASK_MODES, "LLDS-MA mode", ma)(lam_answer, valid_searches_mean, rule)


@registry.register(ANSWER_MASK_MODES, "LLDS-MA mode", "off")
def no_answer_mask(lam_answer: float, valid_searches_mean: float | None, rule: str) -> None:
    """No LLDS-MA: the answer span is penalised like every other token."""
    return None


@registry.register(ANSWER_MASK_MODES, "LLDS-MA mode", "fixed")
def fixed_answer_mask(lam_answer: float, valid_searches_mean: float | None, rule: str) -> float:
    """lam_answer' = lam_answer."""
    return float(lam_answer)


@registry.register(ANSWER_MASK_MODES, "LLDS-MA mode", "adaptive")
def adaptive_answer_mask(lam_answer: float, valid_searches_mean: float | None, rule: str) -> float:
    """lam_answer' = :func:`adaptive_lam_answer` of the step's mean valid searches under ``rule``."""
    if valid_searches_mean is None:
        raise ValueError("adaptive LLDS-MA needs the step's mean number of valid searches")
    return adaptive_lam_answer(lam_answer, valid_searches_mean, rule)


def adaptive_lam_answer(lam_answer: float, mean_valid_searches: float, rule: str = "code") -> float:
    """Adaptive LLDS-MA weight of the answer span from the batch mean V of valid searches per response, by the
    registered rule ``rule`` (:data:`ADAPTIVE_RULES`):

        rule="code":  lam_answer * max(V - 1, 0)   (the authors' released dp_actor.py; what their runs used)
        rule="paper": lam_answer * min(V / 2, 1)   (the paper's text)

    The coefficient applied is then min(this, lam) (:func:`llds_loss`). Under "code", with at most one valid search
    per response on average the answer span is masked completely (coefficient 0).
    """
    if lam_answer < 0:
        raise ValueError(f"lam_answer must be >= 0, got {lam_answer}")
    return registry.lookup(ADAPTIVE_RULES, "adaptive answer-mask rule", rule)(float(lam_answer),
                                                                             float(mean_valid_searches))


@registry.register(ADAPTIVE_RULES, "adaptive answer-mask rule", "code")
def released_code_rule(lam_answer: float, v: float) -> float:
    """lam_answer * max(V - 1, 0): the authors' released dp_actor.py."""
    return lam_answer * max(v - 1.0, 0.0)


@registry.register(ADAPTIVE_RULES, "adaptive answer-mask rule", "paper")
def paper_text_rule(lam_answer: float, v: float) -> float:
    """lam_answer * min(V / 2, 1): the paper's text."""
    return lam_answer * min(v / 2.0, 1.0)


def llds_can_act(ppo_epochs: int, mini_batches_per_rollout: int) -> bool:
    """Whether LLDS can ever be non-zero: it needs logp_new != logp_old, i.e. at least one optimiser step between the
    rollout and a later mini-batch of the same rollout batch (ppo_epochs * mini_batches_per_rollout > 1).
    With a single optimiser step per rollout batch LLDS is a permanent no-op; the trainer should warn."""
    if ppo_epochs < 1 or mini_batches_per_rollout < 1:
        raise ValueError(f"need ppo_epochs >= 1 and mini_batches_per_rollout >= 1; got {ppo_epochs}, {mini_batches_per_rollout}")
    return ppo_epochs * mini_batches_per_rollout > 1

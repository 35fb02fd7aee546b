"""NTHR: Negative Token Hidden Reward, selective penalisation of the tokens of incorrect responses (Deng, Ren, Li,
Sutherland, Li, Thrampoulidis, "On the Effect of Negative Gradient in Group Relative Deep Reinforcement
Optimization", arXiv 2505.18830, NeurIPS 2025; the same authors' first fix for lazy likelihood displacement). No
counterpart in verl or TRL.

Notation of the paper, for one group (prompt x) of G responses: y+_i (i in [N+]) the correct ones (here A_i > 0),
y-_j (j in [N-]) the incorrect ones (A_j < 0); p = N+ / G; for the k-th token of a response y, h_{y,<k} in R^H the
final-layer hidden state that predicts it and pi(.|x, y_<k) the old policy's next-token distribution (the policy
before the step's updates, App. 7.4: the forward pass that computes logp_old). Token-level prediction-error
similarity (App. 7.2):

    alpha_{k,k'} = < e_{y+_{i,k}} - pi(.|x, y+_{i,<k}),  e_{y-_{j,k'}} - pi(.|x, y-_{j,<k'}) >

    s-_{j,<k'} = sum_{i in [N+]} sum_{k=1}^{|y+_i|} alpha_{k,k'} < h_{y+_{i,<k}}, h_{y-_{j,<k'}} >        (Eq. 7)

the influence of penalising token k' of y-_j on the likelihood of the group's correct responses (Corollary 4.5). It
is the inner product of the gradients, with respect to the output head W (logits = W h), of sum_{i,k} log pi(y+_{i,k})
and of log pi(y-_{j,k'}). Summing over the positive tokens first (App. 7.4, "calculate summations first"):

    M+ = sum_{i,k} g+_{i,k} h+_{i,k}^T   [C, H],      s_t = g_t^T M+ h_t  for any token t of the group,

with g = e_y - pi restricted to C vocabulary columns. Selection and threshold (Eq. 8, Alg. 1, Eq. 9):

    V-_j = { k' : s-_{j,<k'} > tau },   tau = beta * min_{i' in [N+]} sbar+_{i'},
    sbar+_{i'} = (1 / |y+_{i'}|) sum_{k''} s_{(i', k'')}      (the mean influence of y+_{i'}'s tokens on the correct
                                                               responses, the same bilinear form on a positive token)

and the selected tokens' advantage becomes eta * A (Alg. 1, lines 11-12), eta < 1. The paper's runs: beta = 1 and
eta = 2 |0.5 - p| (App. 7.3; ablations, Tables 4-5: beta in {-inf, 0, 0.1, 1}, eta in {p, 1 - p, 2|0.5 - p|}; the
likelihood experiment of Sec. 5.3: beta = 1, eta = 0; DeepSeek-1.5B, App. 7.9: beta = 0).

Here the factor multiplies the token's policy-loss term (``token_weights`` of algo/policy_loss.py), which is the
advantage scaling eta * A for PPO-clip (with or without dual clip: the per-token loss is positively homogeneous in
A). Weights are 1 on correct responses, on unselected tokens, off the response mask, and in groups with no correct
response (no anchor) or no incorrect one. Choices this implementation makes where the paper leaves room: the
responses' tokens are those of the response mask (retrieved text carries no gradient, so it neither anchors nor is
weighted); correct / incorrect = the sign of the advantage (for the paper's 0/1 rewards under GRPO, r = 1 / r = 0 in
a mixed group); sbar+_{i'} sums over every correct response, i' itself included (so that a group with one correct
response has a threshold, and the sum is the matrix M+ above); pi is the policy's softmax as the loss uses it (over
the sampled vocabulary, divided by the rollout temperature); beta = -inf selects every token of an incorrect
response (the paper's reading of its -inf ablation, whatever the sign of min sbar+).

Vocabulary: Eq. 7 sums over the whole vocabulary; the paper restricts g to the ids of the group's responses, V*_x,
without renormalising (App. 7.4, "focus on vocabulary of the responses"); :func:`response_vocabulary_errors` does the
same. The scoring functions take any column set (the full vocabulary in the tests).

Shapes: hidden ``[B, T, H]``; errors ``[B, T, C]``; advantages, group_ids ``[B]``; response_mask, scores, weights
``[B, T]``. No gradient: every function runs under ``torch.no_grad()``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from searchr1_lld.algo import registry
from searchr1_lld.algo.logprobs import linear_logprobs_entropy

EtaRule = Callable[[torch.Tensor, float], torch.Tensor]
ETA_RULES: dict[str, EtaRule] = {}


def register_eta_rule(name: str) -> Callable[[EtaRule], EtaRule]:
    """Decorator: register ``fn(p [B], eta) -> eta [B]`` as the NTHR factor rule ``name``."""
    return registry.register(ETA_RULES, "NTHR eta rule", name)


def get_eta_rule(name: str) -> EtaRule:
    """The factor rule registered as ``name``; a ValueError listing the known names otherwise."""
    return registry.lookup(ETA_RULES, "NTHR eta rule", name)


@register_eta_rule("two_abs_half_minus_p")
def eta_two_abs_half_minus_p(p: torch.Tensor, eta: float) -> torch.Tensor:
    """eta = 2 |0.5 - p| (the paper's runs, App. 7.3)."""
    return 2.0 * (0.5 - p).abs()


@register_eta_rule("one_minus_p")
def eta_one_minus_p(p: torch.Tensor, eta: float) -> torch.Tensor:
    """eta = 1 - p (ablation, Table 5)."""
    return 1.0 - p


@register_eta_rule("p")
def eta_p(p: torch.Tensor, eta: float) -> torch.Tensor:
    """eta = p (ablation, Table 5)."""
    return p.clone()


@register_eta_rule("constant")
def eta_constant(p: torch.Tensor, eta: float) -> torch.Tensor:
    """eta = the given constant (Sec. 5.3: 0, no penalty on the selected tokens)."""
    return torch.full_like(p, float(eta))


def _check(hidden: torch.Tensor, errors: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor,
           response_mask: torch.Tensor) -> None:
    if response_mask.dim() != 2 or hidden.dim() != 3 or hidden.shape[:2] != response_mask.shape:
        raise ValueError(f"hidden must be [B, T, H] over response_mask [B, T]; got {tuple(hidden.shape)} and "
                         f"{tuple(response_mask.shape)}")
    if errors.dim() != 3 or errors.shape[:2] != response_mask.shape:
        raise ValueError(f"errors must be [B, T, C] over response_mask [B, T]; got {tuple(errors.shape)}")
    if advantages.shape != group_ids.shape or advantages.shape != response_mask.shape[:1]:
        raise ValueError(f"advantages and group_ids must both be [B={response_mask.shape[0]}]; got "
                         f"{tuple(advantages.shape)} and {tuple(group_ids.shape)}")


@torch.no_grad()
def prediction_errors(probs: torch.Tensor, token_cols: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """g = e_y - pi ``[B, T, C]`` over C vocabulary columns: ``probs`` ``[B, T, C]`` the old policy's probabilities
    of those columns, ``token_cols`` ``[B, T]`` the column of each token's id (-1: not among them, no one-hot);
    0 off the response mask."""
    if probs.dim() != 3 or token_cols.shape != probs.shape[:2] or response_mask.shape != probs.shape[:2]:
        raise ValueError(f"probs must be [B, T, C] over token_cols and response_mask [B, T]; got "
                         f"{tuple(probs.shape)}, {tuple(token_cols.shape)}, {tuple(response_mask.shape)}")
    g = -probs.detach().float()
    inside = (token_cols >= 0) & (response_mask != 0)
    g.scatter_add_(-1, token_cols.clamp(min=0).long()[..., None], inside.float()[..., None])
    return g * (response_mask != 0)[..., None]


@torch.no_grad()
def response_vocabulary_errors(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               labels: torch.Tensor, response_mask: torch.Tensor, *, temperature: float = 1.0,
                               chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(g ``[B, T, C]``, the columns ``[C]``): :func:`prediction_errors` over V*, the sorted ids of the tokens of
    the response mask (App. 7.4), for the softmax of (hidden W^T + bias) / temperature (hidden ``[B, T, H]`` the
    final hidden states predicting ``labels`` ``[B, T]``, W ``[V, H]``, bias ``[V]``), not renormalised on V*:
    pi_v = exp(z_v - lse) with lse = z_y - log pi_y, log pi_y from the full vocabulary in tiles
    (algo.logprobs.linear_logprobs_entropy, in the head's dtype as for logp_old; the rows of V* and of the labels in
    fp32), so ``[B, T, V]`` never exists, nor an fp32 copy of W."""
    m = response_mask != 0
    labels = torch.where(m, labels, 0).long()
    cols = torch.unique(labels[m])
    h, weight = hidden.detach().float(), weight.detach()
    bias = bias.detach() if bias is not None else None
    logp, _ = linear_logprobs_entropy(h, weight, labels, bias=bias, chunk_size=chunk_size, temperature=temperature,
                                      compute_entropy=False)  # in the head's dtype, as logp_old
    rows = lambda ids: (weight[ids].float(), bias[ids].float() if bias is not None else None)  # noqa: E731
    w_y, b_y = rows(labels)
    lse = ((h * w_y).sum(-1) + (b_y if b_y is not None else 0.0)) / temperature - logp
    z = torch.nn.functional.linear(h, *rows(cols)) / temperature
    probs = torch.exp(z - lse[..., None])
    token_cols = torch.where(m, torch.searchsorted(cols, labels), -1)
    return prediction_errors(probs, token_cols, response_mask), cols


@torch.no_grad()
def nthr_scores(hidden: torch.Tensor, errors: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor,
                response_mask: torch.Tensor) -> torch.Tensor:
    """s ``[B, T]`` (module docstring): for each token of the response mask in a group with a correct response
    (A > 0), s_t = g_t^T M+ h_t with M+ = sum over the group's correct responses' tokens of g h^T; on the tokens of
    incorrect responses this is Eq. 7's s-, on those of correct ones the summand of Eq. 9. 0 elsewhere."""
    _check(hidden, errors, advantages, group_ids, response_mask)
    h, g = hidden.detach().float(), errors.detach().float()
    m = response_mask != 0
    out = torch.zeros(m.shape, dtype=torch.float32, device=h.device)
    for gid in torch.unique(group_ids):
        rows = group_ids == gid
        anchors = m & (rows & (advantages > 0))[:, None]
        if not anchors.any():
            continue
        big_m = g[anchors].T @ h[anchors]  # [C, H] = sum over anchor tokens of g h^T
        tokens = m & rows[:, None]
        out[tokens] = ((g[tokens] @ big_m) * h[tokens]).sum(-1)
    return out


@torch.no_grad()
def nthr_thresholds(scores: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor,
                    response_mask: torch.Tensor, *, beta: float) -> torch.Tensor:
    """tau ``[B]``, each row its group's: beta * min over the group's correct responses (A > 0, at least one token)
    of their mean score sbar+ (Eq. 9); +inf for a group without one (nothing selected); beta = -inf gives -inf."""
    if math.isnan(beta) or beta == math.inf:
        raise ValueError(f"beta must be finite or -inf, got {beta}")
    m = (response_mask != 0).float()
    n_tok = m.sum(1)
    anchor = (advantages > 0) & (n_tok > 0)
    sbar = torch.where(anchor, (scores * m).sum(1) / n_tok.clamp(min=1.0), torch.inf)
    tau = torch.full(advantages.shape, torch.inf, dtype=torch.float32, device=scores.device)
    for gid in torch.unique(group_ids):
        rows = group_ids == gid
        if anchor[rows].any():
            tau[rows] = -torch.inf if beta == -math.inf else beta * float(sbar[rows].min())
    return tau


@torch.no_grad()
def nthr_selection(scores: torch.Tensor, tau: torch.Tensor, advantages: torch.Tensor,
                   response_mask: torch.Tensor) -> torch.Tensor:
    """V- ``[B, T]`` bool (Eq. 8): tokens of the response mask of incorrect responses (A < 0) with s > tau."""
    return (response_mask != 0) & (advantages < 0)[:, None] & (scores > tau[:, None])


@torch.no_grad()
def nthr_token_weights(selected: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor, *,
                       eta_rule: str = "two_abs_half_minus_p", eta: float = 0.0) -> torch.Tensor:
    """Weights ``[B, T]``: eta(p) on the ``selected`` tokens, p = N+ / G of the row's group (A > 0 responses over
    the group's responses in the batch), eta by the registered rule ``eta_rule`` (``eta``: the constant rule's value);
    1 elsewhere (Alg. 1, lines 11-12)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    count = torch.zeros(int(inverse.max()) + 1 if inverse.numel() else 0, device=advantages.device)
    size = count.index_add(0, inverse, torch.ones_like(advantages, dtype=torch.float32))
    correct = count.index_add(0, inverse, (advantages > 0).float())
    factor = get_eta_rule(eta_rule)((correct / size)[inverse], eta).float()
    return torch.where(selected, factor[:, None].expand_as(selected), torch.ones_like(selected, dtype=torch.float32))


@torch.no_grad()
def nthr_weights(hidden: torch.Tensor, errors: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor,
                 response_mask: torch.Tensor, *, beta: float = 1.0, eta_rule: str = "two_abs_half_minus_p",
                 eta: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights ``[B, T]``, selected ``[B, T]`` bool): scores, thresholds, selection and factors in one call."""
    scores = nthr_scores(hidden, errors, advantages, group_ids, response_mask)
    tau = nthr_thresholds(scores, advantages, group_ids, response_mask, beta=beta)
    selected = nthr_selection(scores, tau, advantages, response_mask)
    return nthr_token_weights(selected, advantages, group_ids, eta_rule=eta_rule, eta=eta), selected


def nthr_metrics(weights: torch.Tensor, selected: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor) -> dict[str, float]:
    """nthr/selected_token_frac (selected tokens over the response-mask tokens of incorrect responses, A < 0) and
    nthr/incorrect_weight_mean (the mean weight on those tokens); 0 and 1 when there is none."""
    negative = (response_mask != 0) & (advantages < 0)[:, None]
    n = int(negative.sum())
    if n == 0:
        return {"nthr/selected_token_frac": 0.0, "nthr/incorrect_weight_mean": 1.0}
    return {"nthr/selected_token_frac": float((selected & negative).sum()) / n,
            "nthr/incorrect_weight_mean": float(weights[negative].float().mean())}

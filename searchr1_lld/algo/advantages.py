"""Outcome advantages: one scalar per response from its score, its prompt group and (for a batch baseline) the
response lengths. Every estimator is registered by name (``algorithm.advantage`` names the one the step uses):

    grpo                   A_i = (r_i - mean_{G(i)} r) / (std_{G(i)} r + eps)              (Shao et al. 2024)
    grpo_no_std            A_i =  r_i - mean_{G(i)} r                                        (Dr. GRPO, Liu et al. 2025)
    rloo                   A_i = |G| / (|G| - 1) * (r_i - mean_{G(i)} r)
                               = r_i - mean_{j in G(i), j != i} r_j                          (Ahmadian et al. 2024)
    reinforce_pp_baseline  c_i = r_i - mean_{G(i)} r, then whitened over the batch's response tokens:
                           A_i = (c_i - mu) / sqrt(var + 1e-8),  mu = sum_i n_i c_i / N,
                           var = sum_i n_i (c_i - mu)^2 / (N - 1),  n_i = sum_t m[i,t], N = sum_i n_i
                                                                                          (REINFORCE++, Hu 2025)
    grpo_passk             only the best response of each group learns:
                           A_i = (r_(1) - r_(2)) / (std_{G(i)} r + eps) for i the first response with the group's
                           largest score r_(1) (r_(2) the second largest, counting ties), A_j = 0 for the others
                                                           (Pass@k training, Chen et al. 2025, arXiv 2503.19595;
                                                            verl compute_grpo_passk_outcome_advantage)
    opo                    A_i = r_i - b_{G(i)},  b_G = sum_{j in G} n_j r_j / sum_{j in G} n_j,  n_j = sum_t m[j,t]
                           (the length-weighted group mean: the optimal baseline of On-Policy RL with Optimal
                            reward baseline, Hao et al. 2025, arXiv 2505.23585; verl compute_opo_outcome_advantage)
    gpg                    A_i = alpha (r_i - mean_{G(i)} r),  alpha = B / max(#{j : r_j != 0}, 1) over the batch
                           (GPG, Chu et al. 2025, arXiv 2504.02546; verl compute_gpg_outcome_advantage with its
                            f_norm = 1, the value verl's trainer runs it with)
    remax                  A_i = r_i - b_i,  b_i the reward of one greedy response to i's prompt (the same agent loop
                           at temperature 0, n = 1, retrieval included; the step rolls it out only for an estimator
                           registered with ``needs_baselines``)
                           (ReMax, Li et al. 2023, arXiv 2310.10505; verl compute_remax_outcome_advantage)

std is the *unbiased* sample standard deviation (divide by |G| - 1) as in verl / Search-R1's ``torch.std``. A group
with a single response has no baseline: its advantage is 0 under every estimator of a group baseline (verl gives such
a response its raw score (grpo: divided by 1 + eps; grpo_passk raises); ``rollout.n >= 2`` makes every group here at
least two); remax's baseline is the greedy response, so it has none of these rules. A group whose rewards are all
equal gets advantage 0 under grpo, grpo_no_std, rloo, grpo_passk, opo and gpg.

An estimator is ``fn(scores [B], group_ids [B], response_mask [B, T], *, eps) -> advantages [B]``; the step broadcasts
it to the tokens (:func:`broadcast_to_tokens`). One registered with ``needs_baselines=True`` (:func:`needs_baselines`)
also takes ``baselines [B]``, a per-response baseline reward the step computes for it (remax: the greedy response's).
"""

from __future__ import annotations

from typing import Callable

import torch

from searchr1_lld.algo import registry

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}
BASELINE_ESTIMATORS: set[str] = set()  # the estimators that take ``baselines [B]`` (registered needs_baselines=True)


def register_advantage(name: str, *, needs_baselines: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register ``fn`` as the advantage estimator ``name`` (a name may be registered once);
    ``needs_baselines``: it takes ``baselines [B]``, which the step then computes (:func:`needs_baselines`)."""
    if needs_baselines:
        BASELINE_ESTIMATORS.add(name)
    return registry.register(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def needs_baselines(name: str) -> bool:
    """Whether the estimator registered as ``name`` takes ``baselines [B]`` (the step then rolls them out)."""
    return name in BASELINE_ESTIMATORS


def get_advantage_fn(name: str) -> AdvantageFn:
    """The advantage estimator registered as ``name``; a clear error listing the known names otherwise."""
    return registry.lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def _group_stats(scores: torch.Tensor, group_ids: torch.Tensor):
    """(r [B] float, inverse [B] group index, count [G], centred r - mean_{G(i)} r [B]) of the scores."""
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(f"scores and group_ids must both be [B]; got {tuple(scores.shape)} and {tuple(group_ids.shape)}")
    r = scores.detach().to(torch.float32 if not scores.is_floating_point() else scores.dtype)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros_like(count).index_add_(0, inverse, r) / count
    return r, inverse, count, r - mean[inverse]


def _no_singletons(adv: torch.Tensor, inverse: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``adv`` with 0 for the responses alone in their group (no baseline)."""
    return torch.where((count == 1)[inverse], torch.zeros_like(adv), adv)


def grpo_outcome_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-6, norm_by_std: bool = True, unbiased: bool = True
) -> torch.Tensor:
    """GRPO advantage ``[B]`` from outcome scores ``[B]`` and group ids ``[B]`` (any integers; vectorised):
    (r_i - mean) / (std + eps), or r_i - mean when ``norm_by_std`` is False; ``unbiased=False`` divides the variance
    by |G| instead of |G| - 1."""
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if scores.numel() == 0:
        return scores.clone()
    _, inverse, count, centred = _group_stats(scores, group_ids)
    adv = centred
    if norm_by_std:
        sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
        dof = (count - 1).clamp(min=1) if unbiased else count
        adv = centred / ((sq / dof).sqrt()[inverse] + eps)
    return _no_singletons(adv, inverse, count)


@register_advantage("grpo")
def grpo(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
         eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_{G(i)} r) / (std_{G(i)} r + eps), ``[B]`` (``response_mask [B, T]`` unused)."""
    return grpo_outcome_advantages(scores, group_ids, eps=eps, norm_by_std=True)


@register_advantage("grpo_no_std")
def grpo_no_std(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
                eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO's advantage: A_i = r_i - mean_{G(i)} r, ``[B]`` (no std division; mask and eps unused)."""
    return grpo_outcome_advantages(scores, group_ids, eps=eps, norm_by_std=False)


@register_advantage("rloo")
def rloo(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
         eps: float = 1e-6) -> torch.Tensor:
    """RLOO: A_i = r_i - mean of the other responses of its group = |G| / (|G| - 1) (r_i - mean_{G(i)} r), ``[B]``."""
    if scores.numel() == 0:
        return scores.clone()
    _, inverse, count, centred = _group_stats(scores, group_ids)
    scale = count / (count - 1).clamp(min=1)
    return _no_singletons(centred * scale[inverse], inverse, count)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
                          eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with a group baseline: c_i = r_i - mean_{G(i)} r, whitened by the token-weighted mean and unbiased
    variance over the batch's N response tokens (module docstring); ``[B]``. Needs N >= 2."""
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(f"response_mask must be [B, T] with B={scores.shape[0]}; got {tuple(response_mask.shape)}")
    _, inverse, count, centred = _group_stats(scores, group_ids)
    c = _no_singletons(centred, inverse, count)
    n = (response_mask != 0).sum(dim=1).to(c.dtype)  # tokens per response
    total = n.sum()
    if total < 2:
        raise ValueError(f"reinforce_pp_baseline whitens over the batch's response tokens: needs >= 2, got {int(total)}")
    mu = (n * c).sum() / total
    var = (n * (c - mu) ** 2).sum() / (total - 1)
    return (c - mu) * torch.rsqrt(var + 1e-8)


def _group_reduce(values: torch.Tensor, inverse: torch.Tensor, n_groups: int, how: str) -> torch.Tensor:
    """``[G]``: the ``how`` ("amax" / "amin" / "sum") of ``values [B]`` within each group."""
    out = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, inverse, values, how, include_self=False)


@register_advantage("grpo_passk")
def grpo_passk(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
               eps: float = 1e-6) -> torch.Tensor:
    """Pass@k advantage ``[B]`` (module docstring): (r_(1) - r_(2)) / (std_{G} r + eps) on the first best response
    of each group, 0 on every other response (``response_mask [B, T]`` unused)."""
    if scores.numel() == 0:
        return scores.clone()
    r, inverse, count, centred = _group_stats(scores, group_ids)
    n_groups, index = len(count), torch.arange(len(r), device=r.device)
    best = _group_reduce(r, inverse, n_groups, "amax")
    is_best = r == best[inverse]
    ties = _group_reduce(is_best.to(r.dtype), inverse, n_groups, "sum") >= 2
    below = _group_reduce(torch.where(is_best, torch.full_like(r, -torch.inf), r), inverse, n_groups, "amax")
    second = torch.where(ties, best, below)
    first_best = _group_reduce(torch.where(is_best, index, len(r)), inverse, n_groups, "amin")
    std = (_group_reduce(centred * centred, inverse, n_groups, "sum") / (count - 1).clamp(min=1)).sqrt()
    gap = ((best - second) / (std + eps))[inverse]
    adv = torch.where(index == first_best[inverse], gap, torch.zeros_like(r))
    return _no_singletons(adv, inverse, count)


@register_advantage("opo")
def opo(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
        eps: float = 1e-6) -> torch.Tensor:
    """OPO: A_i = r_i - sum_{j in G(i)} n_j r_j / sum_{j in G(i)} n_j with n_j response j's token count (module
    docstring), ``[B]`` (eps unused)."""
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(f"response_mask must be [B, T] with B={scores.shape[0]}; got {tuple(response_mask.shape)}")
    if scores.numel() == 0:
        return scores.clone()
    r, inverse, count, _ = _group_stats(scores, group_ids)
    n = (response_mask != 0).sum(dim=1).to(r.dtype)
    weighted = _group_reduce(n * r, inverse, len(count), "sum")
    tokens = _group_reduce(n, inverse, len(count), "sum")
    return _no_singletons(r - (weighted / tokens.clamp(min=1))[inverse], inverse, count)


@register_advantage("gpg")
def gpg(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *,
        eps: float = 1e-6) -> torch.Tensor:
    """GPG: A_i = B / max(#nonzero scores, 1) * (r_i - mean_{G(i)} r) over the batch of B responses (module
    docstring), ``[B]`` (mask and eps unused)."""
    if scores.numel() == 0:
        return scores.clone()
    r, inverse, count, centred = _group_stats(scores, group_ids)
    alpha = len(r) / max(int(torch.count_nonzero(r)), 1)
    return _no_singletons(alpha * centred, inverse, count)


@register_advantage("remax", needs_baselines=True)
def remax(scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor, *, eps: float = 1e-6,
          baselines: torch.Tensor | None = None) -> torch.Tensor:
    """ReMax: A_i = r_i - b_i, ``[B]``, with ``baselines [B]`` b_i the reward of the greedy response to response i's
    prompt (every response of a prompt has the same b); group ids, mask and eps unused. Broadcast to the tokens it is
    verl's (r_i - b_i) m[i,t] (the outcome reward summed from t to the end, minus b on the mask)."""
    if baselines is None:
        raise ValueError("advantage estimator 'remax' needs baselines [B] (the reward of a greedy rollout of each "
                         "response's prompt); the training step computes them when algorithm.advantage=remax, a "
                         "direct call must pass baselines=")
    if scores.dim() != 1 or baselines.shape != scores.shape:
        raise ValueError(f"scores and baselines must both be [B]; got {tuple(scores.shape)} and "
                         f"{tuple(baselines.shape)}")
    r = scores.detach().to(torch.float32 if not scores.is_floating_point() else scores.dtype)
    return r - baselines.detach().to(r.dtype)


def broadcast_to_tokens(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B] -> [B, T]``: A[i, t] = adv[i] * response_mask[i, t] (0 outside the mask)."""
    if adv.dim() != 1 or response_mask.dim() != 2 or adv.shape[0] != response_mask.shape[0]:
        raise ValueError(f"expected adv [B] and response_mask [B, T]; got {tuple(adv.shape)} and {tuple(response_mask.shape)}")
    return adv[:, None] * response_mask.to(adv.dtype)


def check_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> None:
    """The advantages are ``[B]`` (one per response) or ``[B, T]`` (token broadcast) like ``response_mask [B, T]``;
    a ValueError naming both shapes otherwise."""
    if advantages.dim() == 1:
        if advantages.shape[0] != response_mask.shape[0]:
            raise ValueError(f"advantages [B] has B={advantages.shape[0]} but response_mask has "
                             f"B={response_mask.shape[0]}")
    elif advantages.shape != response_mask.shape:
        raise ValueError(f"advantages must be [B] or [B, T] like response_mask {tuple(response_mask.shape)}; "
                         f"got {tuple(advantages.shape)}")

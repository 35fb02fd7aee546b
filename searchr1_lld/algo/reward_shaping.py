"""Reward shaping: the outcome rewards [B] rewritten before the advantage estimator sees them. Every rule is
registered by name (``algorithm.reward_shaping`` names the one the step uses; its settings are the config section of
the same name, e.g. ``algorithm.overlong``):

    none       r'_i = r_i
    overlong   r'_i = r_i + R_length(n_i),  with n_i = sum_t m[i,t] the tokens the policy generated in response i and
               R_length(n) = 0                                  if n <= L_max - L_cache
                           = f * ((L_max - L_cache) - n) / L_cache   if L_max - L_cache < n <= L_max
                           = -f                                 if n > L_max
               DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13), times verl's penalty factor
               f (``overlong_buffer.penalty_factor``; verl ``DAPORewardManager``: min(-(n - (L_max - L_cache)) /
               L_cache * f, 0), which equals the above for n <= L_max, the most verl's rollout generates)

Which length counts: the generated tokens only (response_mask = 1), never the retrieved documents (observations,
mask 0) nor padding; a multi-turn response is charged for what the policy wrote in all its turns. (verl's manager
counts every response token its attention mask covers; on a single-turn response the two are the same.)

A rule is ``fn(rewards [B], response_mask [B, T], **settings) -> (rewards' [B], metrics)``; the rewards the step logs
(reward/em_mean), filters on (algo/batch_filters.py) and measures the LLD monitor with stay the unshaped EM.
"""

from __future__ import annotations

from typing import Callable

import torch

from searchr1_lld.algo import registry

RewardShapingFn = Callable[..., "tuple[torch.Tensor, dict[str, float]]"]
REWARD_SHAPINGS: dict[str, RewardShapingFn] = {}


def register_reward_shaping(name: str) -> Callable[[RewardShapingFn], RewardShapingFn]:
    """Decorator: register ``fn`` as the reward-shaping rule ``name`` (a name may be registered once)."""
    return registry.register(REWARD_SHAPINGS, "reward shaping", name)


def get_reward_shaping(name: str) -> RewardShapingFn:
    """The reward-shaping rule registered as ``name``; a clear error listing the known names otherwise."""
    return registry.lookup(REWARD_SHAPINGS, "reward shaping", name)


@register_reward_shaping("none")
def no_shaping(rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards [B] as they are (``response_mask [B, T]`` unused); no metrics."""
    return rewards, {}


@register_reward_shaping("overlong")
def soft_overlong_punishment(rewards: torch.Tensor, response_mask: torch.Tensor, *, max_length: int,
                             cache_length: int, penalty_factor: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO's soft overlong punishment (module docstring): rewards [B] + R_length of each response's generated-token
    count sum_t response_mask [B, T] with L_max = ``max_length``, L_cache = ``cache_length`` (0 < L_cache <= L_max)
    and f = ``penalty_factor`` (>= 0). Metrics: ``reward/overlong_penalty_mean`` (mean R_length over the batch, <= 0)
    and ``reward/overlong_frac`` (share of responses longer than L_max - L_cache, i.e. penalised when f > 0)."""
    if rewards.dim() != 1 or response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"expected rewards [B] and response_mask [B, T]; got {tuple(rewards.shape)} and "
                         f"{tuple(response_mask.shape)}")
    if not 0 < cache_length <= max_length:
        raise ValueError(f"soft overlong punishment needs 0 < cache_length <= max_length; got cache_length="
                         f"{cache_length}, max_length={max_length}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    r = rewards.detach().float()
    lengths = (response_mask != 0).sum(dim=1).to(r.dtype)
    expected = max_length - cache_length
    penalty = penalty_factor * ((expected - lengths) / cache_length).clamp(min=-1.0, max=0.0)
    metrics = {"reward/overlong_penalty_mean": float(penalty.mean()) if len(r) else 0.0,
               "reward/overlong_frac": float((lengths > expected).float().mean()) if len(r) else 0.0}
    return r + penalty, metrics

"""Batch filters: which prompt groups of a rollout a training batch keeps, from the responses' rewards and group ids.
Every filter is registered by name (``algorithm.dynamic_sampling.filter`` names the one the step uses); the step's
dynamic sampling (learner/sampling.py) rolls out more prompts until it holds its full number of kept groups.

    nonzero_std   keep group G  iff  |G| = 1  or  std_{G} r > 0   (i.e. not all r_j, j in G, are equal)
                  DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, Eq. 11: 0 < |{correct}| < G); verl
                  ``algorithm.filter_groups`` (std of the group's metric == 0 -> dropped; a group of one response is
                  kept, as verl keeps it)

A group whose rewards are all equal has advantage 0 under every group-baseline estimator (algo/advantages.py): it
carries no policy-gradient signal, only KL / entropy / regulariser gradients.

A filter is ``fn(rewards [B], group_ids [B]) -> keep [B] bool``: True on every response of a kept group (the same
value across a group).
"""

from __future__ import annotations

from typing import Callable

import torch

from searchr1_lld.algo import registry

BatchFilterFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BATCH_FILTERS: dict[str, BatchFilterFn] = {}


def register_batch_filter(name: str) -> Callable[[BatchFilterFn], BatchFilterFn]:
    """Decorator: register ``fn`` as the batch filter ``name`` (a name may be registered once)."""
    return registry.register(BATCH_FILTERS, "batch filter", name)


def get_batch_filter(name: str) -> BatchFilterFn:
    """The batch filter registered as ``name``; a clear error listing the known names otherwise."""
    return registry.lookup(BATCH_FILTERS, "batch filter", name)


@register_batch_filter("nonzero_std")
def nonzero_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DAPO's rule: keep [B] bool, False on every response of a group of two or more whose rewards are all equal
    (std 0: all correct or all wrong under EM), True elsewhere. Equality is exact (max == min within the group)."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be [B]; got {tuple(rewards.shape)} and "
                         f"{tuple(group_ids.shape)}")
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    r = rewards.detach().float()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    empty = torch.zeros(n_groups, dtype=r.dtype, device=r.device)
    high = empty.scatter_reduce(0, inverse, r, "amax", include_self=False)
    low = empty.scatter_reduce(0, inverse, r, "amin", include_self=False)
    count = torch.zeros(n_groups, dtype=torch.long, device=r.device).index_add_(0, inverse, torch.ones_like(inverse))
    return ((high > low) | (count == 1))[inverse]

"""TRL's GRPO loss types, and its top-entropy token selection, equal what this repository trains with the settings
docs/design.md maps them to (TRL 1.16's GRPOTrainer from the pinned PyPI release, tests/trl_reference.py), on random
tensors, to float tolerance: value and gradient of a mini-batch of two micro-batches, each printing its largest
absolute gap to TRL. VESPO's Gamma weight and the entropy selection are compared function to function."""

from __future__ import annotations

import pytest
import torch

from searchr1_lld.algo.logprob_losses import gamma_weights
from searchr1_lld.algo.objective import mini_batch_denominators, objective
from searchr1_lld.algo.token_selection import top_entropy_mask
from searchr1_lld.config import load_config
from trl_reference import trainer, trl_grpo, trl_loss  # noqa: F401  (trl_grpo: the session fixture)

# TRL loss_type -> (this repository's settings, TRL's settings, the scale of the log-ratio noise). Clip ranges as
# each preset pins them (TRL: epsilon, epsilon_high; CISPO's epsilon_high is the weight's cap itself, 1 + clip_high).
# luspo's clip is GSPO's 3e-4 / 4e-4: its ratios move by about that much, so some responses are clipped and some not.
EQUIVALENTS = {
    "grpo": (["algorithm.llds.enabled=false", "algorithm.loss_agg_mode=seq-mean-token-mean",
              "algorithm.loss_scale=micro-batch-mean", "algorithm.clip_high=0.28"], {"epsilon_high": 0.28}, 0.3),
    "bnpo": (["algorithm.method=bnpo"], {}, 0.3),
    "dr_grpo": (["algorithm.method=dr_grpo", "algorithm.seq_token_sum_norm=16"], {"max_completion_length": 16}, 0.3),
    "dapo": (["algorithm.method=dapo_clip_higher"], {"epsilon_high": 0.28}, 0.3),
    "cispo": (["algorithm.method=cispo"], {"epsilon_high": 1.2}, 0.3),
    "sapo": (["algorithm.method=sapo"], {}, 0.3),
    "luspo": (["algorithm.method=luspo"], {"epsilon": 3e-4, "epsilon_high": 4e-4,
                                           "importance_sampling_level": "sequence"}, 1e-3),
    "vespo": (["algorithm.method=vespo", "algorithm.vespo.k_neg=2.5"], {"vespo": (2.0, 3.0, 2.5, 2.0)}, 0.1),
}


def _micro_batches(seed: int, scale: float, B: int = 5, T: int = 12):
    """Two micro-batches of B responses each (ragged masks of 1..T tokens), log-probs, advantages, entropies."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (2 * B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logp_old = -torch.rand(2 * B, T, generator=g) * 4
    logp_new = (logp_old + scale * torch.randn(2 * B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(2 * B, generator=g)
    adv[0] = 0.0  # a response without signal
    entropy = torch.rand(2 * B, T, generator=g) * 3
    return mask, logp_old, logp_new, adv, entropy, [slice(0, B), slice(B, 2 * B)]


def _ours(alg, mask, logp_old, logp_new, adv, entropy, parts) -> torch.Tensor:
    tokens, responses = mini_batch_denominators(mask)
    return sum(objective(alg, logp_new[p], logp_old[p], adv[p], mask[p], mini_tokens=tokens, mini_responses=responses,
                         entropy=entropy[p], micro_batches=len(parts))[0] for p in parts)


def _trls(grpo, loss_type, settings, rho, mask, logp_old, logp_new, adv, entropy, parts) -> torch.Tensor:
    t = trainer(grpo, loss_type=loss_type, top_entropy_quantile=rho, gradient_accumulation_steps=len(parts),
                steps_per_generation=len(parts), **settings)
    return sum(trl_loss(t, logp_new[p], logp_old[p], adv[p], mask[p], entropy=entropy[p],
                        num_items_in_batch=float(mask.sum())) for p in parts)


@pytest.mark.parametrize("loss_type", list(EQUIVALENTS))
@pytest.mark.parametrize("rho", [1.0, 0.2])
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_types_equal_trls(trl_grpo, loss_type, rho, seed):
    """A mini-batch of two micro-batches (gradient accumulation 2, one optimiser step per generation batch, one
    process): the summed loss and its gradient equal TRL's, with every token and with the top 20% by entropy."""
    overrides, settings, scale = EQUIVALENTS[loss_type]
    alg = load_config(None, [*overrides, "algorithm.kl_coef=0", f"algorithm.top_entropy_quantile={rho}"]).algorithm
    mask, logp_old, logp_new, adv, entropy, parts = _micro_batches(seed, scale)
    ours = _ours(alg, mask, logp_old, logp_new, adv, entropy, parts)
    (g_ours,) = torch.autograd.grad(ours, logp_new)
    theirs = _trls(trl_grpo, loss_type, settings, rho, mask, logp_old, logp_new, adv, entropy, parts)
    (g_theirs,) = torch.autograd.grad(theirs, logp_new)
    if rho < 1:  # the selection left tokens out: here their gradient is 0
        assert 0 < int((g_ours[mask != 0] == 0).sum()) < int(mask.sum())
    what = "gradient"
    if rho < 1 and settings.get("importance_sampling_level") == "sequence":
        # one ratio per response: TRL's sequence ratio carries the selected tokens' terms to every token of the
        # response, GSPO's stop-gradient form here to the selected tokens alone; the per-response sums agree
        g_ours, g_theirs, what = g_ours.sum(-1), g_theirs.sum(-1), "gradient summed per response"
    gap, grad_gap = abs(float(ours) - float(theirs)), float((g_ours - g_theirs).abs().max())
    print(f"{loss_type} rho={rho} seed={seed}: loss {float(ours):.6f} vs TRL {float(theirs):.6f}; max abs gap "
          f"{gap:.2e} (value), {grad_gap:.2e} ({what})")
    assert gap <= 1e-6 * max(1.0, abs(float(theirs))) and grad_gap <= 1e-6
    assert float(g_theirs.abs().sum()) > 0  # the case trains something


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vespo_gamma_weights_equal_trls(trl_grpo, seed):
    """phi(W_i) on random responses whose sequence log-ratio spans about [-3, 3] (and one beyond TRL's clamp at
    +20), both advantage signs and several (k, lambda): TRL's ``GRPOTrainer.get_gamma_weights``."""
    g = torch.Generator().manual_seed(seed)
    B, T = 16, 10
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]).float()
    log_ratio = 0.4 * torch.randn(B, T, generator=g)
    log_ratio[0] = 5.0  # sum 5 n: W far above 1 (phi ~ 0), the sum clamped at 20 when n >= 4
    adv = torch.randn(B, generator=g)
    worst = 0.0
    for k_pos, lambda_pos, k_neg, lambda_neg in ((2.0, 3.0, 3.0, 2.0), (1.0, 0.5, 4.0, 6.0)):
        settings = dict(k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)
        theirs = trl_grpo.GRPOTrainer.get_gamma_weights(adv[:, None], log_ratio, mask, None, **settings)  # [B, 1]
        ours = gamma_weights(log_ratio, adv[:, None].expand(B, T), mask, **settings)
        torch.testing.assert_close(ours, theirs.expand(B, T), rtol=1e-6, atol=1e-7)
        worst = max(worst, float((ours - theirs).abs().max()))
        assert float(theirs.min()) < 0.01 and float(theirs.max()) > 0.5  # both tails of phi are exercised
    print(f"vespo gamma weights seed={seed}: max abs gap to TRL {worst:.2e}")


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_top_entropy_mask_equals_trls(trl_grpo, rho):
    """The selection equals TRL's ``get_high_entropy_mask(entropies, mask, 1 - rho)`` token for token, on continuous
    entropies and on tied ones (entropies rounded to 0.5)."""
    g = torch.Generator().manual_seed(3)
    B, T = 8, 20
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]).float()
    t = trainer(trl_grpo, loss_type="dapo")
    for entropy in (torch.rand(B, T, generator=g) * 4, (torch.rand(B, T, generator=g) * 8).round() / 2):
        theirs = t.get_high_entropy_mask(entropy, mask, 1 - rho)
        ours = top_entropy_mask(entropy, mask, rho)
        assert torch.equal(ours, theirs)
        kept = float(ours.sum() / mask.sum())
        print(f"top-entropy rho={rho}: kept {kept:.3f} of {int(mask.sum())} tokens, same tokens as TRL")

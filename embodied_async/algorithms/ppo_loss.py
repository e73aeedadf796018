"""Decoupled PPO actor loss and clipped value loss (pure torch).

The decoupled objective (AReaL / RLinf async PPO) separates three policies:
behaviour pi_b (sampled the action, possibly several versions old), proximal
pi_p (the trust-region anchor of this update) and current pi_theta. The ratio
r = pi_theta / pi_p is clipped as in PPO, while the importance weight
w = pi_p / pi_b corrects for off-policy sampling and is never differentiated.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

Normalizer = Optional[Union[float, torch.Tensor]]


def masked_mean(
    x: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    denom: Normalizer = None,
) -> torch.Tensor:
    """sum(x[mask]) / denom, with denom defaulting to max(mask.sum(), 1).

    Passing `denom` lets data-parallel ranks divide by a global count so the
    summed gradients equal those of one big batch.
    """
    if mask is None:
        mask = torch.ones_like(x, dtype=torch.bool)
    mask = mask.bool()
    # where (not multiply) so inf/nan in masked-out entries cannot leak in.
    total = torch.where(mask, x, torch.zeros_like(x)).sum()
    if denom is None:
        denom = mask.sum().clamp(min=1).to(x.dtype)
    return total / denom


def _fraction(flag: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_mean(flag.float(), mask))


def _per_element(logprobs: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor,
                 loss_normalizer: Normalizer, entry_mask: Optional[torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor, Normalizer]:
    """token_level ([N, K] log-probs): each dimension of a decision carries its advantage and mask
    (and ``entry_mask``'s: the entries of actions that never ran train on nothing), and the
    normaliser counts dimensions. [N] log-probs: all as they are."""
    if logprobs.dim() != 2:
        return advantages, loss_mask, loss_normalizer
    dims = logprobs.shape[1]
    mask = loss_mask[:, None].expand_as(logprobs)
    if entry_mask is not None:
        mask = mask & entry_mask.bool()
    return (advantages[:, None].expand_as(logprobs), mask,
            None if loss_normalizer is None else loss_normalizer * dims)


def _per_decision(values: torch.Tensor) -> torch.Tensor:
    """[N, K] per-dimension terms -> [N], a decision's the sum of its independent dimensions'."""
    return values.sum(dim=1) if values.dim() == 2 else values


def _reported_kl(log_ratio: torch.Tensor, decision_mask: torch.Tensor) -> float:
    """The mean KL per decision as RLinf reports it (-mean log r, estimator k1), so that curves
    compare: the samples come from the denominator's policy, so its mean is KL(denominator || numerator)."""
    return float(masked_mean(-_per_decision(log_ratio), decision_mask))


def _trust_region_kl(ratio: torch.Tensor, log_ratio: torch.Tensor, behav_weight: torch.Tensor,
                     trained: torch.Tensor) -> float:
    """What ``algorithm.target_kl`` reads: KL(proximal || current) per trained decision, estimator k3
    = (r - 1) - log r (never negative), over the samples the loss trains on, each weighted by its
    behaviour weight w = pi_p / pi_b: the samples were drawn by pi_b, and w makes the mean one over
    the proximal policy's own actions (self-normalised)."""
    k3 = _per_decision((ratio - 1.0) - log_ratio)
    weight = torch.where(trained, _decision_weight(behav_weight), torch.zeros_like(k3))
    return float((weight * k3).sum() / weight.sum().clamp_min(1e-12))


def _kl_metrics(log_ratio: torch.Tensor, log_behav_weight: torch.Tensor, entry_mask: Optional[torch.Tensor],
                decision_mask: torch.Tensor, trained: torch.Tensor) -> dict[str, float]:
    """The reported KLs (RLinf's) and the trust-region KL ``target_kl`` reads; a decision's KL sums
    the entries that ran (``entry_mask``)."""
    if entry_mask is not None:
        log_ratio, log_behav_weight = (torch.where(entry_mask.bool(), x, torch.zeros_like(x))
                                       for x in (log_ratio, log_behav_weight))
    return {"train/actor/proximal_approx_kl": _reported_kl(log_ratio, decision_mask),
            "train/actor/behav_approx_kl": _reported_kl(log_behav_weight, decision_mask),
            "train/actor/trust_region_kl": _trust_region_kl(torch.exp(log_ratio), log_ratio,
                                                            torch.exp(log_behav_weight), trained)}


def _all_dimensions(flags: torch.Tensor) -> torch.Tensor:
    return flags.all(dim=1) if flags.dim() == 2 else flags


def _decision_weight(behav_weight: torch.Tensor) -> torch.Tensor:
    """A decision's behaviour weight: over [N, K] the product of its dimensions'."""
    return torch.exp(_per_decision(torch.log(behav_weight))) if behav_weight.dim() == 2 else behav_weight


def decoupled_ppo_actor_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: Optional[torch.Tensor] = None,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: Optional[float],
    behave_weight_threshold: Optional[float],
    loss_normalizer: Normalizer = None,
    entry_mask: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO policy loss with dual clip and behaviour-weight masking.

    Log-probs are one per decision, shape [N] (``algorithm.logprob_type=chunk_level``: summed
    over the executed actions and dimensions), or one per executed action dimension, [N, K]
    (``token_level``): then every dimension has its own ratio, clipped on its own, the advantage
    and mask of its decision, and the loss is the mean over dimensions (RLinf's token-level
    ratio). Only `logprobs` receives gradient.

    The denominator counts the decisions of ``loss_mask`` (x K over [N, K]), behaviour-masked or
    not: training passes that count over every rank; without one the same rule holds here.

    The settings (keyword-only) are ``algorithm``'s as they are (defaults and bounds: the schema).

    Args:
        logprobs: log pi_theta(a), current policy.
        proximal_logprobs: log pi_p(a), anchor of the trust region.
        behaviour_logprobs: log pi_b(a), the policy that sampled a.
        advantages: [N] advantage estimates (one per decision).
        loss_mask: [N] bool; False entries contribute nothing.
        clip_ratio_low / clip_ratio_high: ratio clipped to [1 - low, 1 + high].
        clip_ratio_c: dual-clip constant (> 1, checked at start-up) bounding the loss for
            A < 0; None disables dual clip.
        behave_weight_threshold: samples with w = pi_p / pi_b above this are
            masked out (too off-policy); None disables.
        loss_normalizer: optional denominator, a count of decisions (e.g. the global count of
            valid ones); with [N, K] log-probs it is scaled by K. None: ``loss_mask``'s count.
        entry_mask: [N, K] with [N, K] log-probs: the entries that ran (an episode ending
            part-way through a chunk never ran the rest); the others train on nothing.

    Returns:
        (scalar loss, metrics dict of python floats).
    """
    if loss_mask is None:
        loss_mask = torch.ones_like(advantages, dtype=torch.bool)
    decision_mask = loss_mask.bool()
    if loss_normalizer is None:  # the rule training follows: behaviour-masked samples count, as zeros
        loss_normalizer = decision_mask.sum().clamp(min=1).float()
    advantages, loss_mask, loss_normalizer = _per_element(logprobs, advantages.detach(), decision_mask,
                                                          loss_normalizer, entry_mask)
    proximal_logprobs, behaviour_logprobs = proximal_logprobs.detach(), behaviour_logprobs.detach()

    log_ratio, log_behav_weight = logprobs - proximal_logprobs, proximal_logprobs - behaviour_logprobs
    ratio, behav_weight = torch.exp(log_ratio), torch.exp(log_behav_weight)

    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.max(pg_loss1, pg_loss2)

    negative_adv = advantages < 0
    if clip_ratio_c is not None:
        # Dual clip: with A < 0 a huge ratio would make the loss unbounded;
        # cap it at c * |A| (the gradient there is zero).
        dual_bound = -advantages * clip_ratio_c
        per_sample = torch.where(negative_adv, torch.min(clipped, dual_bound), clipped)
        dual_active = negative_adv & (dual_bound < clipped)
    else:
        per_sample = clipped
        dual_active = torch.zeros_like(loss_mask)

    no_mask = torch.zeros_like(loss_mask)
    behav_masked = behav_weight > behave_weight_threshold if behave_weight_threshold is not None else no_mask
    effective_mask = loss_mask & ~behav_masked

    per_sample = behav_weight * per_sample
    loss = masked_mean(per_sample, effective_mask, loss_normalizer)

    with torch.no_grad():
        metrics = {
            "train/actor/policy_loss": float(loss),
            **_kl_metrics(log_ratio, log_behav_weight, entry_mask, decision_mask,
                          decision_mask & ~_all_dimensions(behav_masked)),
            "train/actor/clip_fraction": _fraction(pg_loss2 > pg_loss1, loss_mask),
            "train/actor/dual_clip_fraction": _fraction(dual_active, loss_mask),
            "train/actor/behav_clip_fraction": _fraction(behav_masked, loss_mask),
            "train/actor/ratio_mean": float(masked_mean(ratio, loss_mask)),
        }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: Optional[torch.Tensor] = None,
    *,
    value_clip: Optional[float],
    huber_delta: float,
    loss_normalizer: Normalizer = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Huber value loss (``huber_delta``), optionally PPO-clipped around `old_values`.

    With `value_clip`, the prediction is also clipped to
    old_values +- value_clip and the elementwise max of both losses is used,
    so the critic cannot profit from moving far from its rollout estimate; None disables it.
    The settings (keyword-only, no defaults) are ``algorithm``'s, passed as they are.

    Returns:
        (scalar loss, {"train/critic/value_loss", "train/critic/value_clip_fraction"}).
    """
    if loss_mask is None:
        loss_mask = torch.ones_like(values, dtype=torch.bool)
    loss_mask = loss_mask.bool()
    returns = returns.detach()
    old_values = old_values.detach()

    unclipped = F.huber_loss(values, returns, reduction="none", delta=huber_delta)
    if value_clip is not None:
        clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = F.huber_loss(clipped_values, returns, reduction="none", delta=huber_delta)
        per_sample = torch.max(unclipped, clipped)
        clip_active = clipped > unclipped
    else:
        per_sample = unclipped
        clip_active = torch.zeros_like(loss_mask)

    loss = masked_mean(per_sample, loss_mask, loss_normalizer)
    with torch.no_grad():
        metrics = {
            "train/critic/value_loss": float(loss),
            "train/critic/value_clip_fraction": _fraction(clip_active, loss_mask),
        }
    return loss, metrics

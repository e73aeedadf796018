"""Proximal log-prob approximation for decoupled PPO (pure torch)."""

from __future__ import annotations

import torch


@torch.no_grad()
def interpolate_proximal_logprobs(
    behaviour_logprobs: torch.Tensor,
    current_logprobs: torch.Tensor,
    behaviour_versions: torch.Tensor,
    proximal_version: int,
    current_version: int,
) -> torch.Tensor:
    """Approximate log pi_p by interpolating between behaviour and current.

    Recomputing the proximal policy costs an extra forward pass; instead we
    interpolate linearly in policy version (log-space):

        alpha = clamp((v_p - v_b) / (v_theta - v_b), 0, 1)   (0 when v_theta == v_b)
        log pi_p ~= log pi_b + alpha * (log pi_theta - log pi_b)

    The actor at version V trains the policy that will become V + 1, so callers
    pass proximal_version=V and current_version=V + 1. Fresh samples
    (v_b = V) then get alpha = 0 (proximal = behaviour) and one-version-old
    samples (v_b = V - 1) get alpha = 1/2.

    Args:
        behaviour_logprobs: [N] log pi_b(a) ([N, K] per action dimension, token_level).
        current_logprobs: log pi_theta(a), the same shape.
        behaviour_versions: [N] int policy version that sampled each action.
        proximal_version: v_p.
        current_version: v_theta.

    Returns:
        detached proximal log-probs, the shape of ``behaviour_logprobs``.
    """
    behaviour_logprobs = behaviour_logprobs.detach().float()
    current_logprobs = current_logprobs.detach().float()
    v_b = behaviour_versions.to(behaviour_logprobs.device).float()
    if behaviour_logprobs.dim() == 2:  # token_level: [N, K], one version per decision
        v_b = v_b[:, None]
    numer = float(proximal_version) - v_b
    denom = float(current_version) - v_b
    # Avoid 0/0: where the current policy *is* the behaviour policy, alpha = 0.
    safe_denom = torch.where(denom == 0, torch.ones_like(denom), denom)
    alpha = torch.where(denom == 0, torch.zeros_like(denom), numer / safe_denom)
    alpha = alpha.clamp(0.0, 1.0)
    return behaviour_logprobs + alpha * (current_logprobs - behaviour_logprobs)

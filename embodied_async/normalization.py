"""One observation normaliser per run, owned by the actor.

Policies hold ``RunningNorm`` modules (buffers, not parameters). A rollout worker never changes
its statistics: in train mode it only *observes* the raw features, and ships their moments with
each trajectory. The actor merges the moments of the trajectories it trains on and publishes the
statistics with the weights, so every rollout rank normalises with the same numbers, and the
actor's checkpoint (the one a deployment loads) holds them.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn


def _combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Merge two ``[count, mean..., var...]`` moment vectors (Chan et al.'s parallel rule)."""
    dim = (a.shape[0] - 1) // 2
    count_a, mean_a, var_a = a[0], a[1:1 + dim], a[1 + dim:]
    count_b, mean_b, var_b = b[0], b[1:1 + dim], b[1 + dim:]
    total = count_a + count_b
    if float(total) == 0.0:
        return a.clone()
    delta = mean_b - mean_a
    mean = mean_a + delta * count_b / total
    m2 = var_a * count_a + var_b * count_b + delta.pow(2) * count_a * count_b / total
    return torch.cat([total.reshape(1), mean, m2 / total])


class RunningNorm(nn.Module):
    """Running mean/variance normalisation of a feature vector.

    ``observe`` records moments without touching the statistics (the rollout side);
    ``merge_moments`` folds recorded moments into them (the actor side). Rows that are not finite
    or exceed ``max_abs`` are ignored: the env worker drops such samples, this is the second guard.
    """

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8, max_abs: float = 1e6):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.eps, self.max_abs = clip, eps, max_abs
        # observed since the last pop: count, sum and sum of squares (float64; cheap per step)
        self._pending = torch.zeros(1 + 2 * dim, dtype=torch.float64)

    def _state(self) -> torch.Tensor:
        return torch.cat([self.count.reshape(1), self.mean, self.var])

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        x = x.detach().to(device="cpu", dtype=torch.float64).reshape(-1, self.mean.shape[0])
        ok = (x.abs() <= self.max_abs).all(dim=1)  # NaN compares False: dropped too
        if not bool(ok.all()):
            x = x[ok]
        dim = self.mean.shape[0]
        self._pending[0] += x.shape[0]
        self._pending[1:1 + dim] += x.sum(0)
        self._pending[1 + dim:] += (x * x).sum(0)

    def pop_moments(self) -> Optional[torch.Tensor]:
        """``[count, mean..., var...]`` of what was observed since the last pop; None if nothing."""
        pending, self._pending = self._pending, torch.zeros_like(self._pending)
        count = float(pending[0])
        if count == 0.0:
            return None
        dim = self.mean.shape[0]
        mean = pending[1:1 + dim] / count
        var = (pending[1 + dim:] / count - mean * mean).clamp(min=0.0)
        return torch.cat([pending[:1], mean, var])

    @torch.no_grad()
    def merge_moments(self, moments: torch.Tensor) -> None:
        merged = _combine(self._state(), moments.to(self.mean.device, torch.float64))
        dim = self.mean.shape[0]
        self.count.copy_(merged[0])
        self.mean.copy_(merged[1:1 + dim])
        self.var.copy_(merged[1 + dim:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.eps)
        return normed.clamp(-self.clip, self.clip)


class InputStatistics(nn.Module):
    """Fixed statistics a policy normalises its inputs or actions with (e.g. a dataset's action
    range), as buffers: published with the weights and kept in checkpoints like a
    ``RunningNorm``'s, so a policy fine-tuned on a dataset acts with that dataset's statistics in
    every process, and a run started from its checkpoint (``model.init_from``) keeps them."""

    def __init__(self, **values):
        super().__init__()
        for name, value in values.items():
            self.register_buffer(name, torch.as_tensor(value).clone())

    @torch.no_grad()
    def assign(self, name: str, value) -> None:
        """Replace one statistic (same number of values)."""
        buffer = getattr(self, name)
        value = torch.as_tensor(value, dtype=buffer.dtype, device=buffer.device).reshape(buffer.shape)
        buffer.copy_(value)


def _normalizers(policy: nn.Module) -> Dict[str, RunningNorm]:
    return {name: m for name, m in policy.named_modules() if isinstance(m, RunningNorm)}


def pop_observation_moments(policy: nn.Module) -> Dict[str, torch.Tensor]:
    """Moments observed since the last pop, per normaliser (module name); empty when none."""
    out = {}
    for name, module in _normalizers(policy).items():
        moments = module.pop_moments()
        if moments is not None:
            out[name] = moments
    return out


def merge_observation_moments(policy: nn.Module, moments: Dict[str, torch.Tensor]) -> None:
    modules = _normalizers(policy)
    for name, value in moments.items():
        if name not in modules:
            raise KeyError(f"observation moments for '{name}', but the policy has no normaliser of that name")
        modules[name].merge_moments(value)


def normalizer_state(policy: nn.Module) -> Dict[str, torch.Tensor]:
    """The statistics of every normaliser, under their state-dict names (published with weights)."""
    out = {}
    modules = {name: m for name, m in policy.named_modules() if isinstance(m, (RunningNorm, InputStatistics))}
    for name, module in modules.items():
        prefix = f"{name}." if name else ""
        for buffer_name, value in module.named_buffers(recurse=False):
            out[prefix + buffer_name] = value.detach().cpu().clone()
    return out

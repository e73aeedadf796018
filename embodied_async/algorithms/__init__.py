"""Pure-torch RL algorithm pieces: GAE, decoupled PPO loss, the version gate, the rollout store."""

from embodied_async.algorithms.advantages import (
    compute_gae,
    explained_variance,
    normalize_advantages,
)
from embodied_async.algorithms.ppo_loss import (
    decoupled_ppo_actor_loss,
    masked_mean,
    value_loss,
)
from embodied_async.algorithms.proximal import interpolate_proximal_logprobs
from embodied_async.algorithms.rollout_store import RolloutStore
from embodied_async.algorithms.version_gate import VersionGate, staleness

__all__ = [
    "RolloutStore",
    "VersionGate",
    "compute_gae",
    "decoupled_ppo_actor_loss",
    "explained_variance",
    "interpolate_proximal_logprobs",
    "masked_mean",
    "normalize_advantages",
    "staleness",
    "value_loss",
]

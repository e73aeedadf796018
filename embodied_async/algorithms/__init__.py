"""Pure-torch RL algorithm pieces: GAE, decoupled PPO loss, the version gate, the rollout store."""

from embodied_async.algorithms.advantages import (
    EpisodeCutError,
    compute_gae,
    explained_variance,
    group_relative_advantages,
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
    "EpisodeCutError",
    "RolloutStore",
    "VersionGate",
    "compute_gae",
    "decoupled_ppo_actor_loss",
    "explained_variance",
    "group_relative_advantages",
    "interpolate_proximal_logprobs",
    "masked_mean",
    "normalize_advantages",
    "staleness",
    "value_loss",
]

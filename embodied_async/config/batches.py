"""The batch arithmetic of a PPO run, written once: validation checks it, the dry-run plan prints
it, the actor trains by it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateBatches:
    decisions: int  # one update's decisions: rollout_store_size_per_rank x env.num_envs x rollout.num_steps
    minibatch: int  # samples per optimiser step over all actor ranks (actor.global_batch_size)
    minibatches: int  # per epoch: decisions // minibatch
    optimizer_steps: int  # per update: minibatches x algorithm.update_epochs
    per_rank: int  # one actor rank's share of a minibatch
    micro: int  # samples per forward/backward on one rank: actor.micro_batch_size, capped at per_rank


def update_batches(cfg, world_size: int) -> UpdateBatches:
    """The batches of one update of ``cfg`` (a TrainConfig) over ``world_size`` actor ranks.
    Divisions are floor divisions: ``config.validate`` refuses a config where any leaves a rest."""
    decisions = cfg.algorithm.rollout_store_size_per_rank * cfg.env.num_envs * cfg.rollout.num_steps
    minibatch = cfg.actor.global_batch_size
    per_rank = minibatch // world_size
    minibatches = decisions // minibatch
    return UpdateBatches(decisions=decisions, minibatch=minibatch, minibatches=minibatches,
                         optimizer_steps=minibatches * cfg.algorithm.update_epochs, per_rank=per_rank,
                         micro=min(cfg.actor.micro_batch_size, per_rank))

"""Actor worker: one FSDP2 rank of the PPO trainer (the trainer core plus the PPO step). Fills
its rollout store with trajectories, runs the PPO update on the store's batch, bumps the version
and publishes weights (with the observation statistics and acknowledgements of what it consumed)
to the rollout workers."""

from __future__ import annotations

import time
from typing import Dict, List

from embodied_async.algorithms import compute_gae, explained_variance
from embodied_async.algorithms.ppo import PPOBatch, UpdateSettings, ppo_update
from embodied_async.algorithms.rollout_store import RolloutStore
from embodied_async.algorithms.version_gate import VersionGate
from embodied_async.data import Trajectory
from embodied_async.normalization import merge_observation_moments
from embodied_async.scheduler.channel import ChannelClosed
from embodied_async.workers.base import process_metrics
from embodied_async.workers.trainer_core import TrainerCore

POLL_SECONDS = 0.5


class ActorWorker(TrainerCore):
    def __init__(self, cfg, topology, rank: int, device_id: int, env_spec, channels):
        super().__init__(cfg, topology, rank, device_id, env_spec, channels)
        self.actor_channel = channels.trajectories
        self.store = RolloutStore(topology.streams, VersionGate.from_config(cfg.algorithm))
        self.actor_channel.listen([(*stream, rank) for stream in topology.streams])

    def publish_weights(self) -> int:
        """Collective: publish the weights with each rollout rank's acknowledgements."""
        acknowledged: Dict[int, Dict[int, int]] = {}
        for (rollout_rank, stream), count in self.store.acknowledged.items():
            acknowledged.setdefault(rollout_rank, {})[stream] = count
        return self.publish(acknowledged)

    # ---- training ----------------------------------------------------------------------------
    def _get_shard(self, stream: tuple) -> Trajectory:
        while True:
            try:
                return self.actor_channel.get(key=(*stream, self.rank), timeout=POLL_SECONDS)
            except TimeoutError:
                continue

    def _collect(self) -> List[Trajectory]:
        """Pull shards into the rollout store until it holds a complete batch.

        The store decides from versions and arrival order alone, and every rank receives its shard
        of the same trajectories in the same order, so all ranks keep, drop and train on the same
        ones without talking to each other.
        """
        while True:
            stream = self.store.stream_to_wait_for(self.version)
            if stream is None:
                return self.store.take(self.version)
            shard = self._get_shard(stream)
            self.store.add(stream, shard, int(shard.versions.min()))

    def _build_batch(self, traj: Trajectory) -> tuple:
        alg = self.cfg.algorithm
        advantages, returns = compute_gae(traj.rewards, traj.values, traj.dones, traj.next_values,
                                          traj.bootstrap_values, alg.gamma, alg.gae_lambda)
        flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731  [T, B, ...] -> [T * B, ...]
        steps = traj.map(lambda t, env_dim: flat(t) if env_dim == 1 else t)
        batch = PPOBatch(steps.forward_inputs, steps.actions, behaviour_logprobs=steps.logprobs,
                         old_values=steps.values, advantages=flat(advantages), returns=flat(returns),
                         versions=steps.versions, loss_mask=steps.loss_mask)
        return batch, explained_variance(batch.old_values, batch.returns, batch.loss_mask)

    def _settings(self) -> UpdateSettings:
        return UpdateSettings.from_config(self.cfg, self.world_size, self.version, self.optimizer_steps)

    def train_step(self) -> Dict[str, float]:
        """Collect one rollout batch, update, publish. Returns metrics averaged over ranks."""
        with self._update_lock:  # a checkpoint never sees a half-done update
            return self._train_step()

    def _train_step(self) -> Dict[str, float]:
        wait_start = time.perf_counter()
        try:
            shards = self._collect()
        except ChannelClosed:
            raise RuntimeError("the trajectory channel closed while the actor was waiting for data") from None
        start, start_cpu = time.perf_counter(), time.thread_time()
        for shard in shards:  # the run's one normaliser learns from what it trains on
            merge_observation_moments(self.policy, shard.obs_moments)
        traj = Trajectory.concat(shards)
        batch, explained = self._build_batch(traj)
        self.policy.train()
        metrics = ppo_update(self.policy, self.optimizer, batch, self._settings(), self._all_reduce_sum,
                             self.generator, self.device)
        self.optimizer_steps += int(metrics["train/actor/optimizer_steps"])
        versions = traj.versions.float()
        out = {**metrics, **self.store.pop_metrics(),
               "train/critic/explained_variance": explained,
               "train/actor/average_version": float(versions.mean()),
               "train/actor/current_version": float(self.version),
               "train/actor/staleness": float(self.version - versions.mean()),
               "train/actor/num_samples": float(batch.loss_mask.sum())}
        self.version += 1
        self.publish_weights()
        out["train/actor/published_bytes"] = float(self.published_bytes)
        out["time/actor_training"] = time.perf_counter() - start
        out["time/actor_data_wait"] = start - wait_start
        # summed over ranks below, like the other components' CPU: averaging divides it back
        out.update({k: v * self.world_size for k, v in process_metrics(
            "actor", self.clock, time.thread_time() - start_cpu, self.actor_channel, self.weight_channel).items()})
        return self._average_metrics(out)

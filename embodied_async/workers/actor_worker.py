"""Actor worker: one FSDP2 rank of the PPO trainer (the trainer core plus the PPO step). Fills
its rollout store with trajectories, runs the PPO update on the store's batch, bumps the version
and publishes weights (with the observation statistics and acknowledgements of what it consumed)
to the rollout workers."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from embodied_async.algorithms import compute_gae, explained_variance, group_relative_advantages
from embodied_async.algorithms.ppo import PPOBatch, UpdateSettings, ppo_update
from embodied_async.algorithms.rollout_store import RolloutStore
from embodied_async.algorithms.version_gate import StalenessController, VersionGate, mean_staleness
from embodied_async.data import Trajectory, WeightMessage
from embodied_async.normalization import merge_observation_moments
from embodied_async.scheduler.channel import ChannelClosed
from embodied_async.scheduler.futures import first_done
from embodied_async.workers.base import process_metrics
from embodied_async.workers.trainer_core import TrainerCore

POLL_SECONDS = 0.5


class ActorWorker(TrainerCore):
    def __init__(self, cfg, topology, rank: int, device_id: int, env_spec, channels):
        super().__init__(cfg, topology, rank, device_id, env_spec, channels)
        self.actor_channel = channels.trajectories
        self.store = RolloutStore(topology.streams, VersionGate.from_config(cfg.algorithm), cfg.algorithm.batch_from)
        self._armed_gets: Dict[int, Any] = {}  # first_arrived, rank 0: per stream index, its pending get
        self._next_stream = 0
        # algorithm.staleness_control=kl: the bound follows the measured behaviour KL
        self.staleness_control = StalenessController.from_config(cfg.algorithm) \
            if cfg.algorithm.staleness_control == "kl" else None
        # the bound published with each recent version: a trajectory is judged by its own version's
        self.bound_of_version: Dict[int, int] = {}
        self.actor_channel.listen([(*stream, rank) for stream in topology.streams])
        self._demo_batches = None
        self._warm_start: Dict[str, torch.Tensor] = {}
        self._update_began: Optional[float] = None  # time.monotonic() at the start of the update under way

    def init_model(self, host: str, port: int) -> None:
        """The trainer core's set-up; with ``algorithm.anchor_kl_coef`` > 0, a copy of the trainable
        weights as built and loaded (``model.init_from``), before any resume: the anchor."""
        super().init_model(host, port)
        if self.cfg.algorithm.anchor_kl_coef > 0:
            self._warm_start = {name: p.detach().clone() for name, p in self.policy.named_parameters()
                                if p.requires_grad}

    def prepare_policy(self, policy) -> None:
        """With ``algorithm.demo_loss_coef`` > 0: the demonstrations of ``dataset.root`` as a stream of
        supervised batches (every episode; the policy keeps the statistics it was trained with)."""
        alg = self.cfg.algorithm
        if alg.demo_loss_coef <= 0:
            return
        from embodied_async.contracts import SupervisedPolicy
        from embodied_async.datasets.batches import SupervisedSamples, batch_stream, open_dataset

        if not isinstance(policy, SupervisedPolicy):
            raise TypeError(f"algorithm.demo_loss_coef={alg.demo_loss_coef}: the {self.cfg.model.name} policy "
                            "defines no supervised loss (contracts.SupervisedPolicy); set it to 0")
        data = self.cfg.dataset
        reader, keys = open_dataset(data.root, data.keys, self.env_spec, data.cache_episodes, data.recorded_hz,
                                    check_videos=False)  # the launcher checked them
        samples = SupervisedSamples(reader, keys, int(policy.supervised_horizon), range(reader.num_episodes))
        self._demo_batches = batch_stream(samples, alg.demo_batch_size, self.cfg.runner.seed + 1, data.window_episodes,
                                          0, self.rank, self.world_size, data.num_workers)

    def _demo_backward(self, scale: float) -> Dict[str, float]:
        """``ppo.DemoBackward``: scale x the mean supervised loss of the next demonstration batch."""
        batch = next(self._demo_batches)
        sums = self.supervised_losses(batch, scale / len(batch), backward=True)
        named = lambda name: "train/demo/loss" if name == "loss" else name.replace("train/sft/", "train/demo/")  # noqa: E731
        return {named(name): value / len(batch) for name, value in sums.items()}

    def publish_weights(self) -> int:
        """Collective: publish the weights with each rollout rank's acknowledgements (and the
        staleness bound, when it follows the KL)."""
        acknowledged: Dict[int, Dict[int, int]] = {}
        for (rollout_rank, stream), count in self.store.acknowledged.items():
            acknowledged.setdefault(rollout_rank, {})[stream] = count
        if self.staleness_control is None:
            return self.publish(acknowledged)
        bound = self.store.gate.staleness_threshold
        self.bound_of_version[self.version] = bound
        for old in [v for v in self.bound_of_version if v < self.version - self.store.gate.highest]:
            del self.bound_of_version[old]  # older data is too stale under any bound
        return self.publish(acknowledged, bound)

    def resend_weights(self, rollout_rank: int) -> int:
        """Rank 0: the weights last published, again, to rollout worker ``rollout_rank``, which the
        runner just replaced (its predecessor took them with it), with how many trajectories of
        each of its streams the actor has accounted for: where the new process's counts begin.
        Read most advanced first (acknowledged, held, still in the channel): a trajectory moving on
        meanwhile is missed, never counted twice, so the throttle can only be looser, and what
        is too stale the store drops."""
        version, shared, bound = self.last_published
        acknowledged, shipped = {}, {}
        for rank, index in self.store.streams:
            if rank == rollout_rank:
                acknowledged[index], held = self.store.accounted((rank, index))
                shipped[index] = acknowledged[index] + held + self.actor_channel.qsize((rank, index, 0))
        self.weight_channel.put(WeightMessage(version, shared, acknowledged, bound, shipped), key=rollout_rank)
        return version

    def checkpoint_counters(self) -> Dict[str, Any]:
        return self.staleness_control.state() if self.staleness_control is not None else {}

    def restore_counters(self, state) -> None:
        if self.staleness_control is not None:
            self.staleness_control.restore(state)
            self.store.gate = self.store.gate.with_threshold(self.staleness_control.threshold)

    def _follow_behaviour_kl(self, metrics: Dict[str, float], trajectory_versions: List[int]) -> None:
        """KL control: this update's rank-averaged behaviour KL, if its trajectories were all
        started under the bound in force, sets the bound of the trajectories started from now on
        (sent with the weights about to be published)."""
        bound = self.store.gate.staleness_threshold
        settled = all(self.bound_of_version.get(v, bound) == bound for v in trajectory_versions)
        kl = metrics.get("train/actor/behav_approx_kl")
        self.store.gate = self.store.gate.with_threshold(self.staleness_control.observe(kl, settled))

    # ---- training ----------------------------------------------------------------------------
    def _get_shard(self, stream: tuple) -> Trajectory:
        while True:
            try:
                return self.actor_channel.get(key=(*stream, self.rank), timeout=POLL_SECONDS)
            except TimeoutError:
                continue

    def _add_shard(self, stream: tuple, shard: Trajectory) -> None:
        version = int(shard.versions.min())
        self.store.add(stream, shard, version, self.bound_of_version.get(version))

    def _collect(self) -> List[Trajectory]:
        """Pull shards into the rollout store until it holds a complete batch.

        every_stream: the store decides from versions and each stream's order alone, and every
        rank receives its shard of the same trajectories in the same order, so all ranks keep, drop
        and train on the same ones without talking to each other.
        """
        if self.store.first_arrived:
            return self._collect_first_arrived()
        while True:
            stream = self.store.stream_to_wait_for(self.version)
            if stream is None:
                return self.store.take(self.version)
            self._add_shard(stream, self._get_shard(stream))

    def _collect_first_arrived(self) -> List[Trajectory]:
        """first_arrived: rank 0 takes shards as they arrive from any stream (a get armed on each,
        kept across updates) until its store holds a batch, then sends the other ranks the streams
        in the order it took them; they take their shards in that order, so every rank's store
        receives, keeps, drops and trains on the same trajectories."""
        streams = self.store.streams
        order: List[int] = []
        if self.rank == 0:
            waiting = self.store.stream_to_wait_for(self.version) is not None
            while waiting:
                for index, stream in enumerate(streams):
                    if index not in self._armed_gets:
                        self._armed_gets[index] = self.actor_channel.get_async(key=(*stream, self.rank))
                # round robin from the stream after the last one taken: of those waiting together,
                # none is always first
                turn = [(self._next_stream + k) % len(streams) for k in range(len(streams))]
                arrived = first_done([self._armed_gets[i] for i in turn], POLL_SECONDS)
                if arrived is None:
                    continue
                index = turn[arrived]
                self._add_shard(streams[index], self._armed_gets.pop(index).result())
                order.append(index)
                self._next_stream = (index + 1) % len(streams)
                waiting = self.store.stream_to_wait_for(self.version) is not None
        order = self._broadcast_from_first_rank(order)
        if self.rank != 0:
            self.store.stream_to_wait_for(self.version)  # as often as rank 0 (its drop and wait counts)
            for index in order:
                self._add_shard(streams[index], self._get_shard(streams[index]))
                self.store.stream_to_wait_for(self.version)
        return self.store.take(self.version)

    def _build_batch(self, traj: Trajectory) -> tuple:
        """(the flat batch, metrics of its advantages). GAE over the critic's values, or (grpo)
        group-relative advantages, whose dropped groups and post-episode steps leave the batch."""
        alg = self.cfg.algorithm
        loss_mask = traj.loss_mask
        if alg.adv_type == "grpo":
            advantages, trained, metrics = group_relative_advantages(
                traj.rewards, traj.dones, alg.group_size, normalize_std=alg.group_normalize_std,
                episode_weight=alg.group_episode_weight, valid=loss_mask)
            returns, loss_mask = torch.zeros_like(advantages), loss_mask & trained
        else:
            advantages, returns = compute_gae(traj.rewards, traj.values, traj.dones, traj.next_values,
                                              traj.bootstrap_values, alg.gamma, alg.gae_lambda)
        flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731  [T, B, ...] -> [T * B, ...]
        steps = traj.map(lambda t, env_dim: flat(t) if env_dim == 1 else t)
        batch = PPOBatch(steps.forward_inputs, steps.actions, behaviour_logprobs=steps.logprobs,
                         old_values=steps.values, advantages=flat(advantages), returns=flat(returns),
                         versions=steps.versions, loss_mask=flat(loss_mask),
                         executed_actions=steps.executed_actions)
        if alg.adv_type == "grpo":
            return self._trained_rows(batch), metrics
        return batch, {"train/critic/explained_variance": explained_variance(batch.old_values, batch.returns,
                                                                             batch.loss_mask)}

    def _trained_rows(self, batch: PPOBatch) -> PPOBatch:
        """The rows that enter the loss, first: every forward pass costs the same whether its sample
        is masked or not, and grpo masks the dropped groups and the steps after each episode. Each
        rank keeps as many rows as the rank with the most (padded with masked rows), so all ranks
        take the same number of steps."""
        trained = torch.nonzero(batch.loss_mask).flatten()
        counts = torch.zeros(self.world_size)
        counts[self.rank] = float(len(trained))
        keep = int(self._all_reduce_sum(counts).max())
        padding = torch.nonzero(~batch.loss_mask).flatten()[:keep - len(trained)]
        return batch.rows(torch.cat([trained, padding]))

    def _settings(self) -> UpdateSettings:
        return UpdateSettings.from_config(self.cfg, self.world_size, self.version, self.optimizer_steps)

    def train_step(self) -> Dict[str, float]:
        """Collect one rollout batch, update, publish. Returns metrics averaged over ranks."""
        with self._update_lock:  # a checkpoint never sees a half-done update
            try:
                return self._train_step()
            finally:
                self._update_began = None

    def heartbeat(self) -> Optional[Tuple[str, float]]:
        """``("update", seconds)`` while an update is under way (None while the actor waits for
        trajectories or for the next step): answered beside the update, so a process that does not
        answer is stopped or wedged; the runner's hang check reads it (``runner.update_hang_factor``)."""
        began = self._update_began
        return None if began is None else ("update", time.monotonic() - began)

    def _train_step(self) -> Dict[str, float]:
        wait_start = time.perf_counter()
        try:
            shards = self._collect()
        except ChannelClosed:
            raise RuntimeError("the trajectory channel closed while the actor was waiting for data") from None
        start, start_cpu = time.perf_counter(), time.thread_time()
        self._update_began = time.monotonic()
        for shard in shards:  # the run's one normaliser learns from what it trains on
            merge_observation_moments(self.policy, shard.obs_moments)
        traj = Trajectory.concat(shards)
        batch, advantage_metrics = self._build_batch(traj)
        self.policy.train()
        demo = self._demo_backward if self._demo_batches is not None else None
        metrics = ppo_update(self.policy, self.optimizer, batch, self._settings(), self._all_reduce_sum,
                             self.generator, self.device, demo_backward=demo,
                             warm_start=self._warm_start or None)
        self.optimizer_steps += int(metrics["train/actor/optimizer_steps"])
        versions = traj.versions.float()
        out = {**metrics, **self.store.pop_metrics(), **advantage_metrics,
               "train/actor/average_version": float(versions.mean()),
               "train/actor/current_version": float(self.version),
               # the version gate's lag (actor version - the trajectory's oldest step's), mean over trajectories
               "train/actor/staleness": mean_staleness([shard.versions for shard in shards], self.version),
               "train/actor/num_samples": float(batch.loss_mask.sum()),
               # the bound this update's batch was gathered under
               "train/staleness_threshold": float(self.store.gate.staleness_threshold)}
        if self.staleness_control is not None:  # every rank reads the same averaged KL
            self._follow_behaviour_kl(self._average_metrics(metrics), [int(s.versions.min()) for s in shards])
        self.version += 1
        self.publish_weights()
        out["train/actor/published_bytes"] = float(self.published_bytes)
        out["time/actor_training"] = time.perf_counter() - start
        out["time/actor_data_wait"] = start - wait_start
        # summed over ranks below, like the other components' CPU: averaging divides it back
        out.update({k: v * self.world_size for k, v in process_metrics(
            "actor", self.clock, time.thread_time() - start_cpu, self.actor_channel, self.weight_channel).items()})
        return self._average_metrics(out)

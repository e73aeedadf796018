"""Actor worker: one FSDP2 rank. Fills its rollout store with trajectories, runs the PPO update on
the store's batch, bumps the version and publishes weights (with the observation statistics and
acknowledgements of what it consumed) to the rollout workers."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings
from typing import Dict, List

import torch
import torch.distributed as dist

from embodied_async.algorithms import compute_gae, explained_variance
from embodied_async.algorithms.ppo import PPOBatch, UpdateSettings, ppo_update
from embodied_async.algorithms.rollout_store import RolloutStore
from embodied_async.algorithms.version_gate import VersionGate
from embodied_async.checkpoint_io import load_tree, save_tree
from embodied_async.data import Trajectory, WeightMessage
from embodied_async.normalization import merge_observation_moments, normalizer_state
from embodied_async.registry import build_policy
from embodied_async.scheduler.channel import ChannelClosed
from embodied_async.workers.base import ProcessClock, process_metrics, setup_worker_process
from embodied_async.workers.sharding import (COMPUTE_DTYPES, gather_trainable, load_model_state, make_optimizer,
                                             name_param_groups, shard_policy, tensor_bytes, trainable_parameters)

POLL_SECONDS = 0.5
SAVE_LOCK_TIMEOUT_S = 30.0
# Our policies return values.squeeze(-1) (a view) and never modify it in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def owned_copy(obj):
    """Deep copy of a (nested) state dict whose tensors own compact storage.

    FSDP may hand out tensors that alias its internal buffers (on one rank a full tensor can be
    the local shard itself); saving or sending those while FSDP resizes a buffer would write a
    truncated storage. Copies make checkpoints and published weights independent of that.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: owned_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(owned_copy(v) for v in obj)
    return obj


class ActorWorker:
    def __init__(self, cfg, topology, rank: int, device_id: int, env_spec, channels):
        self.cfg, self.rank, self.world_size = cfg, rank, topology.actor_world_size
        self.device_kind = topology.device_kind
        self.device = setup_worker_process(self.device_kind, device_id, cfg.cluster.cpu_threads_per_worker,
                                           cfg.runner.seed * 100_003 + 90_000 + rank)
        self.env_spec = env_spec
        self.actor_channel, self.weight_channel = channels.trajectories, channels.weights
        self.num_rollout_ranks = topology.num_rollout_workers
        self.version = 0
        self.optimizer_steps = 0  # critic warm-up is counted in these
        self.published_bytes = 0
        self.store = RolloutStore(topology.streams, VersionGate.from_config(cfg.algorithm))
        self.actor_channel.listen([(*stream, rank) for stream in topology.streams])
        self.generator = torch.Generator().manual_seed(cfg.runner.seed)
        self._update_lock = threading.Lock()
        self.clock = ProcessClock()

    # ---- set-up ------------------------------------------------------------------------------
    def master_address(self) -> tuple:
        host = "127.0.0.1"
        if self.cfg.cluster.num_nodes > 1:  # the other ranks may live on other nodes
            import ray

            host = ray.util.get_node_ip_address()
        return host, free_port()

    def init_model(self, host: str, port: int) -> None:
        """Join the process group, build the policy, shard it with FSDP2, make the optimiser."""
        backend = "nccl" if self.device_kind == "gpu" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size)
        torch.manual_seed(self.cfg.runner.seed)  # same initial weights on every rank
        policy = build_policy(self.cfg.model, self.env_spec, device=self.device)
        shard_policy(policy, self.device_kind, self.world_size, self.cfg.model.precision)
        self.policy = policy
        policy_params, value_params = trainable_parameters(policy, policy.value_parameter_prefixes)
        self.trainable_names = {name for name, p in policy.named_parameters() if p.requires_grad}
        self.optimizer = make_optimizer(self.cfg.actor, policy_params, value_params)

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        tensor = tensor.clone().to(self.device if self.device_kind == "gpu" else "cpu")
        dist.all_reduce(tensor)
        return tensor.cpu()

    # ---- weights -----------------------------------------------------------------------------
    def trainable_state(self) -> Dict[str, torch.Tensor]:
        """Collective: the full trainable parameters (float32) and the observation statistics."""
        state = gather_trainable(self.policy)
        state.update(normalizer_state(self.policy))
        return state

    def publish_weights(self) -> int:
        """Collective: gather the trainable parameters only (frozen weights never change); rank 0
        stores them once, in the compute dtype the rollout runs in, and sends each rollout rank a
        message with that handle, the version and its acknowledgements."""
        compute_dtype = COMPUTE_DTYPES[self.cfg.model.precision]
        published = gather_trainable(self.policy, dtype=compute_dtype)
        published.update(normalizer_state(self.policy))
        self.published_bytes = tensor_bytes(published)  # every rank: the metric is averaged over ranks
        if self.rank == 0:
            shared = self.weight_channel.share(published)
            for rollout_rank in range(self.num_rollout_ranks):
                acknowledged = {stage: count for (r, stage), count in self.store.acknowledged.items()
                                if r == rollout_rank}
                self.weight_channel.put(WeightMessage(self.version, shared, acknowledged), key=rollout_rank)
        return self.version

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
        alg, actor = self.cfg.algorithm, self.cfg.actor
        per_rank = actor.global_batch_size // self.world_size
        return UpdateSettings(
            epochs=alg.update_epochs, minibatch_size=per_rank,
            micro_batch_size=min(actor.micro_batch_size, per_rank), world_size=self.world_size, version=self.version,
            recompute_logprobs=self.cfg.rollout.recompute_logprobs,
            critic_warmup_left=max(0, actor.critic_warmup_steps - self.optimizer_steps), clip_ratio_low=alg.clip_ratio_low,
            clip_ratio_high=alg.clip_ratio_high, clip_ratio_c=alg.clip_ratio_c,
            behave_weight_threshold=alg.behave_weight_threshold, value_clip=alg.value_clip,
            huber_delta=alg.huber_delta, value_loss_coef=alg.value_loss_coef, entropy_coef=alg.entropy_coef,
            normalize_advantages=alg.normalize_advantages, target_kl=alg.target_kl,
            max_grad_norm=actor.max_grad_norm)

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

    def _average_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        if self.world_size == 1:
            return metrics
        keys = sorted(metrics)
        values = self._all_reduce_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
        return {k: float(v) / self.world_size for k, v in zip(keys, values)}

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, folder: str) -> int:
        """Collective; rank 0 writes the model state, optimiser state and counters (no pickle)."""
        if not self._update_lock.acquire(timeout=SAVE_LOCK_TIMEOUT_S):
            raise RuntimeError("an update is still running on the actor; not saving a half-updated model")
        try:
            self._write_checkpoint(folder)
        finally:
            self._update_lock.release()
        return self.version

    def _write_checkpoint(self, folder: str) -> None:
        """Tensors as safetensors, structure as JSON: a checkpoint never runs code when loaded.

        ``model.safetensors`` holds, under the policy's own parameter names, the trainable
        parameters and the observation statistics; ``model_info.json`` names the base checkpoint
        (``model.path``) they apply to. For a policy trained in full (MLP, CNN) that is the whole
        policy; under LoRA the frozen 7B weights are not copied into every checkpoint unless
        ``runner.checkpoint_frozen_weights`` asks for the full state dict.
        """
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = self.cfg.runner.checkpoint_frozen_weights
        model_state = owned_copy(get_model_state_dict(self.policy, options=options)) if full \
            else self.trainable_state()
        optim_state = owned_copy(get_optimizer_state_dict(self.policy, self.optimizer, options=options))
        if self.rank == 0:
            os.makedirs(folder, exist_ok=True)
            save_tree(model_state, folder, "model")
            save_tree(optim_state, folder, "optimizer")
            save_tree({"version": self.version, "optimizer_steps": self.optimizer_steps,
                       "generator": self.generator.get_state()}, folder, "actor_state")
            with open(os.path.join(folder, "model_info.json"), "w") as f:
                json.dump({"family": self.cfg.model.name, "base": getattr(self.cfg.model, "path", None),
                           "contents": "full" if full else "trainable"}, f, indent=1)

    def load_checkpoint(self, folder: str) -> int:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        # the runner verified every file against the manifest before any worker started
        # (read_resume_state): hashing a large checkpoint again on each rank would only cost start-up
        load_model_state(self.policy, load_tree(folder, "model"), self.trainable_names)
        saved = load_tree(folder, "optimizer")
        # not strict: a parameter that never took a step (the adapters during critic warm-up)
        # has no Adam state. Loading gives it a zero state at step 1 all the same; dropping that
        # keeps its first real step the same as in a run that was never interrupted.
        set_optimizer_state_dict(self.policy, self.optimizer, saved,
                                 options=StateDictOptions(full_state_dict=True, strict=False))
        for name, param in self.policy.named_parameters():
            if param.requires_grad and name not in saved["state"]:
                self.optimizer.state.pop(param, None)
        name_param_groups(self.optimizer)  # loading replaces the group dicts with the saved ones
        state = load_tree(folder, "actor_state")
        self.version = int(state["version"])
        if "optimizer_steps" not in state and self.cfg.actor.critic_warmup_steps:
            raise RuntimeError(f"{folder} was written before checkpoints counted optimiser steps, so the critic "
                               "warm-up cannot be resumed exactly; resume it with actor.critic_warmup_steps=0")
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.generator.set_state(state["generator"])
        return self.version

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

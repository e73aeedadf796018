"""Actor worker: one FSDP2 rank. Fills its rollout store with trajectories, runs the PPO update on
the store's batch, bumps the version and publishes weights (with the observation statistics and
acknowledgements of what it consumed) to the rollout workers."""

from __future__ import annotations

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
from embodied_async.workers.base import setup_worker_process

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
        self.store = RolloutStore(topology.streams, VersionGate.from_config(cfg.algorithm))
        self.generator = torch.Generator().manual_seed(cfg.runner.seed)
        self._update_lock = threading.Lock()

    # ---- set-up ------------------------------------------------------------------------------
    def master_address(self) -> tuple:
        host = "127.0.0.1"
        if self.cfg.cluster.num_nodes > 1:  # the other ranks may live on other nodes
            import ray

            host = ray.util.get_node_ip_address()
        return host, free_port()

    def init_model(self, host: str, port: int) -> None:
        """Join the process group, build the policy, shard it with FSDP2, make the optimiser."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        backend = "nccl" if self.device_kind == "gpu" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size)
        torch.manual_seed(self.cfg.runner.seed)  # same initial weights on every rank
        policy = build_policy(self.cfg.model, self.env_spec).to(self.device)
        mesh = init_device_mesh("cuda" if self.device_kind == "gpu" else "cpu", (self.world_size,))
        mp = None
        if self.cfg.model.precision == "bfloat16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(policy, mesh=mesh, **({"mp_policy": mp} if mp else {}))
        for method in ("evaluate", "value", "predict"):
            register_fsdp_forward_method(policy, method)
        self.policy = policy
        value_prefixes = policy.value_parameter_prefixes
        groups: Dict[str, list] = {"policy": [], "value": []}
        self.trainable_names = set()
        for name, param in policy.named_parameters():
            if param.requires_grad:
                self.trainable_names.add(name)
                groups["value" if name.startswith(tuple(value_prefixes)) else "policy"].append(param)
        actor = self.cfg.actor
        self.optimizer = torch.optim.Adam(
            [{"params": groups["policy"], "lr": actor.lr},
             {"params": groups["value"], "lr": actor.value_lr if actor.value_lr is not None else actor.lr}],
            eps=actor.adam_eps, weight_decay=actor.weight_decay, fused=True)

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        tensor = tensor.clone().to(self.device if self.device_kind == "gpu" else "cpu")
        dist.all_reduce(tensor)
        return tensor.cpu()

    # ---- weights -----------------------------------------------------------------------------
    def _full_state_dict(self) -> Dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return owned_copy(get_model_state_dict(self.policy,
                                               options=StateDictOptions(full_state_dict=True, cpu_offload=True)))

    def publish_weights(self) -> int:
        """Collective: gather parameters; rank 0 sends the trainable ones, the observation
        statistics and each rollout rank's acknowledgements with the version."""
        state = self._full_state_dict()
        if self.rank == 0:
            published = {k: v for k, v in state.items() if k in self.trainable_names}
            published.update(normalizer_state(self.policy))
            for rollout_rank in range(self.num_rollout_ranks):
                acknowledged = {stage: count for (r, stage), count in self.store.acknowledged.items()
                                if r == rollout_rank}
                self.weight_channel.put(WeightMessage(self.version, published, acknowledged), key=rollout_rank)
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
            train_policy=self.version >= actor.critic_warmup_steps, clip_ratio_low=alg.clip_ratio_low,
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
        start = time.perf_counter()
        for shard in shards:  # the run's one normaliser learns from what it trains on
            merge_observation_moments(self.policy, shard.obs_moments)
        traj = Trajectory.concat(shards)
        batch, explained = self._build_batch(traj)
        self.policy.train()
        metrics = ppo_update(self.policy, self.optimizer, batch, self._settings(), self._all_reduce_sum,
                             self.generator, self.device)
        versions = traj.versions.float()
        out = {**metrics, **self.store.pop_metrics(),
               "train/critic/explained_variance": explained,
               "train/actor/average_version": float(versions.mean()),
               "train/actor/current_version": float(self.version),
               "train/actor/staleness": float(self.version - versions.mean()),
               "train/actor/num_samples": float(batch.loss_mask.sum())}
        self.version += 1
        self.publish_weights()
        out["time/actor_training"] = time.perf_counter() - start
        out["time/actor_data_wait"] = start - wait_start
        return self._average_metrics(out)

    def _average_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        if self.world_size == 1:
            return metrics
        keys = sorted(metrics)
        values = self._all_reduce_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
        return {k: float(v) / self.world_size for k, v in zip(keys, values)}

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, folder: str) -> int:
        """Collective; rank 0 writes the full model, optimiser state and version (no pickle)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if not self._update_lock.acquire(timeout=SAVE_LOCK_TIMEOUT_S):
            raise RuntimeError("an update is still running on the actor; not saving a half-updated model")
        try:
            self._write_checkpoint(folder, StateDictOptions, get_optimizer_state_dict)
        finally:
            self._update_lock.release()
        return self.version

    def _write_checkpoint(self, folder: str, StateDictOptions, get_optimizer_state_dict) -> None:
        """Tensors as safetensors, structure as JSON: a checkpoint never runs code when loaded.

        ``model.safetensors`` is the policy's full state dict under its own parameter names,
        observation statistics included: what a deployment loads.
        """
        model_state = self._full_state_dict()
        optim_state = owned_copy(get_optimizer_state_dict(
            self.policy, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        if self.rank == 0:
            os.makedirs(folder, exist_ok=True)
            save_tree(model_state, folder, "model")
            save_tree(optim_state, folder, "optimizer")
            save_tree({"version": self.version, "generator": self.generator.get_state()}, folder, "actor_state")

    def load_checkpoint(self, folder: str) -> int:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        # the runner verified every file against the manifest before any worker started
        # (read_resume_state): hashing a large checkpoint again on each rank would only cost start-up
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.policy, load_tree(folder, "model"), options=options)
        set_optimizer_state_dict(self.policy, self.optimizer, load_tree(folder, "optimizer"), options=options)
        state = load_tree(folder, "actor_state")
        self.version = int(state["version"])
        self.generator.set_state(state["generator"])
        return self.version

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

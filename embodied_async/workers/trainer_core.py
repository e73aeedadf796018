"""The trainer core: one FSDP2 rank of whatever trains the policy. It joins the process group,
builds the policy (starting from ``model.init_from`` when given), shards it, makes the optimiser,
publishes weights to the rollout workers and writes and reads checkpoints.

Two trainers stand on it: the PPO actor (``actor_worker.py``: trajectories in, a PPO update) and
the supervised trainer (``sft_worker.py``: dataset batches in, a supervised step). Neither
copies the other's plumbing.
"""

from __future__ import annotations

import os
import socket
import threading
import warnings
from collections import defaultdict
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from embodied_async.checkpoint_io import CheckpointError, load_tree, save_tree
from embodied_async.data import WeightMessage
from embodied_async.normalization import normalizer_state
from embodied_async.registry import build_policy, reported_logprob_type
from embodied_async.run_folder import MODEL_TREE, fit_rl_only_heads, write_model_info
from embodied_async.workers.base import ProcessClock, setup_worker_process
from embodied_async.workers.sharding import (
    COMPUTE_DTYPES,
    gather_trainable,
    load_model_state,
    make_optimizer,
    name_param_groups,
    shard_policy,
    tensor_bytes,
    trainable_parameters,
)

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


def check_frozen_prefixes(prefixes, trainable_names) -> None:
    """Each of ``actor.frozen_parameter_prefixes`` must name trainable parameters of the policy."""
    for prefix in prefixes:
        if not any(name.startswith(prefix) for name in trainable_names):
            roots = sorted({".".join(name.split(".")[:3]) + "." for name in trainable_names})
            raise ValueError(f"actor.frozen_parameter_prefixes: {prefix!r} names no trainable parameter of this "
                             f"policy; its trainable parameters start with: {', '.join(roots[:12])}")


def load_initial_weights(policy, folder: str, model_cfg) -> None:
    """``model.init_from``: the checkpoint's weights and observation statistics, nothing else
    (``run_folder.check_init_from`` verified the files at start-up). The heads only RL trains
    (value head, noise head) start fresh where the checkpoint lacks them or holds other ones: a
    real run's RL starts from a supervised checkpoint (``run_folder.fit_rl_only_heads``)."""
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    state, left_as_built = fit_rl_only_heads(policy, load_tree(folder, MODEL_TREE), folder, "init_from")
    trainable -= left_as_built
    try:
        load_model_state(policy, state, trainable)
    except (KeyError, ValueError) as err:
        raise CheckpointError(f"model.init_from={folder!r} does not fit this {model_cfg.name} policy (another model "
                              f"size, LoRA setting or env?): {err}") from None


class TrainerCore:
    """One rank: ``rank`` of ``world_size``; ``seed_offset`` keeps its random streams apart from
    the other components'."""

    def __init__(self, cfg, topology, rank: int, device_id: int, env_spec, channels, seed_offset: int = 90_000):
        self.cfg, self.rank, self.world_size = cfg, rank, topology.actor_world_size
        self.device_kind = topology.device_kind
        self.device = setup_worker_process(self.device_kind, device_id, cfg.cluster.cpu_threads_per_worker,
                                           cfg.runner.seed * 100_003 + seed_offset + rank)
        self.env_spec = env_spec
        self.weight_channel = channels.weights
        self.num_rollout_ranks = topology.num_rollout_workers
        self.version = 0
        self.last_published = None  # rank 0: (version, stored weights, bound) of the last publish
        self.optimizer_steps = 0
        self.published_bytes = 0
        self.generator = torch.Generator().manual_seed(cfg.runner.seed)
        self._update_lock = threading.Lock()  # a checkpoint never sees a half-done step
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
        policy = build_policy(self.cfg.model, self.env_spec, device=self.device,
                              logprob_type=reported_logprob_type(self.cfg))
        if self.cfg.model.init_from:
            load_initial_weights(policy, self.cfg.model.init_from, self.cfg.model)
        self.prepare_policy(policy)
        shard_policy(policy, self.device_kind, self.world_size, self.cfg.model.precision)
        self.policy = policy
        policy_params, value_params = trainable_parameters(policy, policy.value_parameter_prefixes)
        self.trainable_names = {name for name, p in policy.named_parameters() if p.requires_grad}
        check_frozen_prefixes(self.cfg.actor.frozen_parameter_prefixes, self.trainable_names)
        self.optimizer = make_optimizer(self.cfg.actor, policy_params, value_params)

    def prepare_policy(self, policy) -> None:
        """What a trainer does to the built policy before sharding (nothing here)."""

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        tensor = tensor.clone().to(self.device if self.device_kind == "gpu" else "cpu")
        dist.all_reduce(tensor)
        return tensor.cpu()

    def _broadcast_from_first_rank(self, values: List[int]) -> List[int]:
        """Rank 0's ``values`` on every rank (the others pass anything)."""
        if self.world_size == 1:
            return list(values)
        device = self.device if self.device_kind == "gpu" else "cpu"
        length = torch.tensor([len(values)], dtype=torch.int64, device=device)
        dist.broadcast(length, src=0)
        data = torch.tensor(values, dtype=torch.int64, device=device) if self.rank == 0 else \
            torch.zeros(int(length.item()), dtype=torch.int64, device=device)
        dist.broadcast(data, src=0)
        return [int(v) for v in data.cpu()]

    def _average_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        if self.world_size == 1:
            return metrics
        keys = sorted(metrics)
        values = self._all_reduce_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
        return {k: float(v) / self.world_size for k, v in zip(keys, values)}

    def supervised_losses(self, batch, scale: float, backward: bool) -> Dict[str, float]:
        """The policy's supervised loss (``contracts.SupervisedPolicy``) over a batch of
        demonstration frames (``datasets.batches.SupervisedBatch``), micro-batch by micro-batch,
        back-propagating ``scale`` x each sum when ``backward``; per-sample sums of the loss
        (``loss``) and of the family's metrics."""
        sums: Dict[str, float] = defaultdict(float)
        micro = self.cfg.actor.micro_batch_size
        for start in range(0, len(batch), micro):
            batch_part = batch.rows(slice(start, start + micro))
            actions = torch.as_tensor(batch_part.actions, device=self.device)
            pad = torch.as_tensor(batch_part.action_pad, device=self.device)
            losses, metrics = self.policy.supervised_loss(batch_part.obs, actions, pad)
            if backward:
                (losses.float().sum() * scale).backward()
            sums["loss"] += float(losses.detach().float().sum())
            for name, value in metrics.items():
                sums[name] += float(value) * len(batch_part)
        return sums

    # ---- weights -----------------------------------------------------------------------------
    def trainable_state(self) -> Dict[str, torch.Tensor]:
        """Collective: the full trainable parameters (float32) and the observation statistics."""
        state = gather_trainable(self.policy)
        state.update(normalizer_state(self.policy))
        return state

    def publish(self, acknowledged: Dict[int, Dict[int, int]], staleness_threshold: Optional[int] = None) -> int:
        """Collective: gather the trainable parameters only (frozen weights never change); rank 0
        stores them once, in the compute dtype the rollout runs in, and sends each rollout rank a
        message with that handle, the version, its acknowledgements (``acknowledged[rank]``) and
        the staleness bound when the actor sets it."""
        compute_dtype = COMPUTE_DTYPES[self.cfg.model.precision]
        published = gather_trainable(self.policy, dtype=compute_dtype)
        published.update(normalizer_state(self.policy))
        self.published_bytes = tensor_bytes(published)  # every rank: the metric is averaged over ranks
        if self.rank == 0:
            shared = self.weight_channel.share(published)
            self.last_published = (self.version, shared, staleness_threshold)  # for a replaced rollout worker
            for rollout_rank in range(self.num_rollout_ranks):
                message = WeightMessage(self.version, shared, acknowledged.get(rollout_rank, {}), staleness_threshold)
                self.weight_channel.put(message, key=rollout_rank)
        return self.version

    # ---- checkpoints -------------------------------------------------------------------------
    def checkpoint_bytes(self) -> int:
        """About what one checkpoint takes on disk: the trainable parameters in float32 with Adam's
        two moments of each, and the frozen weights too under ``runner.checkpoint_frozen_weights``
        (sizes of the whole policy: a sharded parameter counts all its shards)."""
        params = list(self.policy.parameters())
        size = sum(p.numel() for p in params if p.requires_grad) * 4 * 3
        if self.cfg.runner.checkpoint_frozen_weights:
            size += sum(p.numel() * p.element_size() for p in params if not p.requires_grad)
        return size

    def save_checkpoint(self, folder: str) -> int:
        """Collective; rank 0 writes the model state, optimiser state and counters (no pickle)."""
        if not self._update_lock.acquire(timeout=SAVE_LOCK_TIMEOUT_S):
            raise RuntimeError("a training step is still running; not saving a half-updated model")
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
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = self.cfg.runner.checkpoint_frozen_weights
        model_state = owned_copy(get_model_state_dict(self.policy, options=options)) if full \
            else self.trainable_state()
        optim_state = owned_copy(get_optimizer_state_dict(self.policy, self.optimizer, options=options))
        if self.rank == 0:
            os.makedirs(folder, exist_ok=True)
            save_tree(model_state, folder, MODEL_TREE)
            save_tree(optim_state, folder, "optimizer")
            save_tree({"version": self.version, "optimizer_steps": self.optimizer_steps,
                       "generator": self.generator.get_state(), **self.checkpoint_counters()}, folder, "actor_state")
            write_model_info(folder, self.cfg.model, full)

    def load_checkpoint(self, folder: str) -> int:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        # the runner verified every file against the manifest before any worker started
        # (read_resume_state): hashing a large checkpoint again on each rank would only cost start-up
        load_model_state(self.policy, load_tree(folder, MODEL_TREE), self.trainable_names)
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
        self.restore_counters(state)
        return self.version

    def checkpoint_counters(self) -> Dict[str, Any]:
        """A subclass's own counters to keep in a checkpoint (numbers, and dicts of them)."""
        return {}

    def restore_counters(self, state: Dict[str, Any]) -> None:
        """Take back what ``checkpoint_counters`` wrote (absent from an older checkpoint)."""

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

"""Supervised trainer: one FSDP2 rank of the trainer core plus the supervised step. Draws its
share of each global batch of demonstration frames from a LeRobot dataset, takes one optimiser
step on the policy's own supervised loss (``contracts.SupervisedPolicy``) under a warm-up +
cosine learning rate, reports a held-out loss, and publishes weights for evaluation."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Dict, Iterator, Optional

import numpy as np
import torch

from embodied_async.algorithms.ppo import all_ranks_finite, clip_gradients
from embodied_async.algorithms.schedules import lr_factor
from embodied_async.contracts import SupervisedPolicy
from embodied_async.datasets.batches import (
    SupervisedBatch,
    SupervisedSamples,
    batch_stream,
    iterate_batch_indices,
    open_dataset,
    split_episodes,
)
from embodied_async.workers.base import process_metrics
from embodied_async.workers.sharding import reshard
from embodied_async.workers.trainer_core import TrainerCore


class SupervisedWorker(TrainerCore):
    def __init__(self, cfg, topology, rank: int, device_id: int, env_spec, channels):
        super().__init__(cfg, topology, rank, device_id, env_spec, channels, seed_offset=95_000)
        data = cfg.dataset
        self.reader, self.keys = open_dataset(data.root, data.keys, env_spec, data.cache_episodes, data.recorded_hz,
                                              check_videos=False)  # the launcher checked them
        self.train_episodes, self.val_episodes = split_episodes(self.reader.num_episodes, data.validation_fraction,
                                                                cfg.runner.seed)
        self._batches: Optional[Iterator[np.ndarray]] = None

    def prepare_policy(self, policy) -> None:
        if not isinstance(policy, SupervisedPolicy):
            raise TypeError(f"the {self.cfg.model.name} policy defines no supervised loss (supervised_loss and "
                            "supervised_horizon, contracts.SupervisedPolicy): it cannot be trained with "
                            "runner.mode=sft")
        horizon = int(policy.supervised_horizon)
        self.train_samples = SupervisedSamples(self.reader, self.keys, horizon, self.train_episodes)
        self.val_samples = SupervisedSamples(self.reader, self.keys, horizon, self.val_episodes) \
            if self.val_episodes else None
        # a policy that starts from a checkpoint keeps the statistics it was trained with
        if hasattr(policy, "set_input_statistics") and not self.cfg.model.init_from:
            policy.set_input_statistics({name: self.reader.stats[key] for name, key in self.keys.items()})

    def publish_weights(self) -> int:
        return self.publish({})

    # ---- the supervised step -----------------------------------------------------------------
    def train_step(self) -> Dict[str, float]:
        with self._update_lock:  # a checkpoint never sees a half-done step
            return self._train_step()

    def _next_batch(self) -> SupervisedBatch:
        if self._batches is None:  # a resumed run continues the same sequence of batches
            data = self.cfg.dataset
            self._batches = batch_stream(self.train_samples, self.cfg.actor.global_batch_size, self.cfg.runner.seed,
                                         data.window_episodes, self.version, self.rank, self.world_size,
                                         data.num_workers)
        return next(self._batches)

    def _set_lr(self) -> float:
        sft, actor = self.cfg.sft, self.cfg.actor
        factor = lr_factor(self.version, sft.lr_warmup_steps, self.cfg.runner.max_steps, sft.lr_schedule,
                           sft.min_lr_ratio)
        bases = {"policy": actor.lr, "value": actor.value_lr if actor.value_lr is not None else actor.lr}
        for group in self.optimizer.param_groups:
            group["lr"] = bases[group["name"]] * factor
        return actor.lr * factor

    def _train_step(self) -> Dict[str, float]:
        start, start_cpu = time.perf_counter(), time.thread_time()
        batch = self._next_batch()
        lr = self._set_lr()
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        # each rank averages over its share; FSDP averages the gradients over ranks
        sums = self.supervised_losses(batch, 1.0 / len(batch), backward=True)
        grad_norm = clip_gradients(self.policy, self.cfg.actor.max_grad_norm)
        skipped = not all_ranks_finite(bool(np.isfinite(sums["loss"])), grad_norm, self._all_reduce_sum,
                                       self.world_size)
        if skipped:  # a NaN/inf would poison the weights for good: skip the step on every rank
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.optimizer_steps += 1
        self.version += 1
        out = {f"train/sft/{k}" if k == "loss" else k: v / len(batch) for k, v in sums.items()}
        out.update({"train/sft/lr": lr, "train/sft/grad_norm": float(grad_norm),
                    "train/sft/nonfinite_skipped": float(skipped),
                    "train/sft/epoch": self.version * self.cfg.actor.global_batch_size / self.train_samples.num_frames,
                    "time/actor_training": time.perf_counter() - start})
        out.update({k: v * self.world_size for k, v in process_metrics(
            "actor", self.clock, time.thread_time() - start_cpu, self.weight_channel).items()})
        return self._average_metrics(out)

    @torch.no_grad()
    def validate(self) -> Dict[str, float]:
        """Collective: the held-out episodes' loss (the first ``sft.validation_batches`` batches
        of a fixed order), named ``val/sft/...``; empty without held-out episodes."""
        # every rank must run as many forward passes as the others: equal shares of whole batches
        size = min(self.cfg.actor.global_batch_size,
                   (self.val_samples.num_frames if self.val_samples else 0) // self.world_size * self.world_size)
        if size == 0:
            return {}
        was_training = self.policy.training
        self.policy.eval()
        try:
            batches = iterate_batch_indices(self.val_samples, size, self.cfg.runner.seed,
                                            self.cfg.dataset.window_episodes)
            sums: Dict[str, float] = defaultdict(float)
            count = 0
            for _, indices in zip(range(self.cfg.sft.validation_batches), batches):
                share = self.val_samples.batch(indices[self.rank::self.world_size])
                for name, value in self.supervised_losses(share, 0.0, backward=False).items():
                    sums[name] += value
                count += len(share)
        finally:
            reshard(self.policy)
            self.policy.train(was_training)
        out = {("val/sft/loss" if k == "loss" else k.replace("train/", "val/")): v / max(count, 1)
               for k, v in sums.items()}
        return self._average_metrics(out)

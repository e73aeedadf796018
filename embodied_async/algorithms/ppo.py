"""One decoupled-PPO update over a flat batch, read top to bottom (CleanRL style).

Data parallelism enters only through ``all_reduce_sum`` (sums a tensor over ranks; identity for
one rank): gradients are averaged by FSDP, and every normaliser here is a global count divided by
the world size, so N ranks on N shards give the same update as one rank on the whole batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from embodied_async.algorithms.advantages import normalize_advantages
from embodied_async.algorithms.ppo_loss import decoupled_ppo_actor_loss, masked_mean, value_loss
from embodied_async.algorithms.proximal import interpolate_proximal_logprobs
from embodied_async.algorithms.schedules import lr_factor
from embodied_async.config.batches import update_batches
from embodied_async.data import map_tree


@dataclass
class PPOBatch:
    """Flat samples ``[N, ...]`` of this rank."""

    forward_inputs: Dict[str, torch.Tensor]
    actions: torch.Tensor
    behaviour_logprobs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    versions: torch.Tensor
    loss_mask: torch.Tensor
    # [N] actions of each decision's chunk the env executed (None: all); with log-probs per entry
    # ([N, K], K = chunk x action dims, action-major) the update leaves the unexecuted ones out
    executed_actions: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "PPOBatch":
        """A batch with ``fn`` applied to every tensor (those in ``forward_inputs`` too)."""
        return PPOBatch(**{f.name: map_tree(fn, getattr(self, f.name)) for f in dataclasses.fields(self)})

    def rows(self, index: torch.Tensor) -> "PPOBatch":
        return self.map(lambda t: t[index])


@dataclass
class UpdateSettings:
    """The settings of one update, every one passed (``from_config``: the config's, whose defaults
    live in the schema)."""

    epochs: int
    minibatch_size: int  # per rank
    micro_batch_size: int  # per rank
    world_size: int
    version: int  # the actor's version before this update (= the proximal policy's)
    recompute_logprobs: bool
    # optimiser steps still to take in critic warm-up: those steps train only the value head
    critic_warmup_left: int
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    behave_weight_threshold: Optional[float]
    value_clip: Optional[float]
    huber_delta: float
    value_loss_coef: float
    entropy_coef: float
    normalize_advantages: bool
    target_kl: Optional[float]
    max_grad_norm: float
    # False: only samples of older versions get a recomputed proximal log-prob; the current
    # version's keep their behaviour log-probs (the same weights)
    recompute_fresh_logprobs: bool
    # the policy group's learning rate: warmed up linearly over policy_lr_warmup_steps policy
    # steps (0: left as the optimiser holds it); policy_steps_before counts those of earlier updates
    policy_lr: float
    policy_lr_warmup_steps: int
    policy_steps_before: int
    # this update's multiplier of policy_lr from actor.policy_lr_schedule (1: constant)
    policy_lr_factor: float
    # False: a value-free update (algorithm.adv_type=grpo): no value loss, no critic to warm up
    train_critic: bool
    # weight of the demonstrations' supervised loss added to every policy step (0: none)
    demo_loss_coef: float
    # parameters named with one of these prefixes take no step (actor.frozen_parameter_prefixes)
    frozen_prefixes: Tuple[str, ...]
    # algorithm.logprob_type: a policy reporting log-probs per entry ([N, K]) has them summed over
    # each decision's executed entries under "chunk_level"; env.num_action_chunks: the actions of a chunk
    logprob_type: str = "chunk_level"
    action_chunk: int = 1
    # weight of the KL penalty toward the warm start (algorithm.anchor_kl_coef; 0: none)
    anchor_kl_coef: float = 0.0

    @classmethod
    def from_config(cls, cfg, world_size: int, version: int = 0, optimizer_steps: int = 0) -> "UpdateSettings":
        """The settings of an update from ``cfg`` (a TrainConfig), the one place a config key
        becomes an update setting. ``version``: the actor's version before the update;
        ``optimizer_steps``: those taken by earlier updates (critic warm-up and the policy's
        learning-rate warm-up count them)."""
        alg, actor = cfg.algorithm, cfg.actor
        batches = update_batches(cfg, world_size)
        return cls(
            epochs=alg.update_epochs, minibatch_size=batches.per_rank, micro_batch_size=batches.micro,
            world_size=world_size, version=version, recompute_logprobs=cfg.rollout.recompute_logprobs,
            recompute_fresh_logprobs=cfg.rollout.recompute_fresh_logprobs,
            critic_warmup_left=max(0, actor.critic_warmup_steps - optimizer_steps),
            clip_ratio_low=alg.clip_ratio_low, clip_ratio_high=alg.clip_ratio_high, clip_ratio_c=alg.clip_ratio_c,
            behave_weight_threshold=alg.behave_weight_threshold, value_clip=alg.value_clip,
            huber_delta=alg.huber_delta, value_loss_coef=alg.value_loss_coef, entropy_coef=alg.entropy_coef,
            normalize_advantages=alg.normalize_advantages, target_kl=alg.target_kl,
            max_grad_norm=actor.max_grad_norm, policy_lr=actor.lr, policy_lr_warmup_steps=actor.policy_lr_warmup_steps,
            policy_steps_before=max(0, optimizer_steps - actor.critic_warmup_steps),
            policy_lr_factor=lr_factor(version, 0, cfg.runner.max_steps, actor.policy_lr_schedule,
                                       actor.policy_min_lr_ratio),
            train_critic=alg.adv_type == "gae", demo_loss_coef=alg.demo_loss_coef,
            frozen_prefixes=tuple(actor.frozen_parameter_prefixes), logprob_type=alg.logprob_type,
            action_chunk=cfg.env.num_action_chunks, anchor_kl_coef=alg.anchor_kl_coef)


def _to(device, batch: PPOBatch) -> PPOBatch:
    return batch.map(lambda t: t.to(device, non_blocking=True))


@torch.no_grad()
def recompute_logprobs(policy, batch: PPOBatch, micro_batch_size: int, device,
                       fresh_version: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(log pi_proximal, V_proximal): the current (pre-update) policy's log-probs of the stored
    actions and its values, from one pass. The values anchor the value clip: the rollout's are
    several versions old.

    In eval mode: the anchor is the policy itself, not one random dropout mask of it.
    ``fresh_version``: samples of this version (the policy itself drew them) keep their behaviour
    log-probs and rollout values (the same weights), and only the others are recomputed.
    """
    proximal = batch.behaviour_logprobs.detach().float().clone()
    values = batch.old_values.detach().float().clone()
    stale = torch.ones(len(batch), dtype=torch.bool) if fresh_version is None else batch.versions != fresh_version
    rows = torch.nonzero(stale).flatten()
    was_training = policy.training
    policy.eval()
    try:
        for start in range(0, len(rows), micro_batch_size):
            index = rows[start:start + micro_batch_size]
            micro = _to(device, batch.rows(index))
            logprobs, _, micro_values = policy.evaluate(micro.forward_inputs, micro.actions)
            proximal[index], values[index] = logprobs.float().cpu(), micro_values.float().cpu()
    finally:
        policy.train(was_training)
    return proximal, values


def anchor_kl_per_decision(logprobs: torch.Tensor, anchor: torch.Tensor,
                           executed: Optional[torch.Tensor]) -> torch.Tensor:
    """KL(current || warm start) per decision on the stored actions, estimator k3 with
    r = pi_anchor / pi_theta (never negative, its gradient that of the KL); over log-probs per
    entry the sum of the executed entries'."""
    log_ratio = anchor.to(logprobs.device).float() - logprobs
    k3 = torch.exp(log_ratio) - 1.0 - log_ratio
    if k3.dim() == 2:
        k3 = (k3 * (executed if executed is not None else 1.0)).sum(1)
    return k3


def executed_entries(logprobs: torch.Tensor, executed_actions: Optional[torch.Tensor],
                     action_chunk: int) -> Optional[torch.Tensor]:
    """[N, K] float: 1 at the log-prob entries of executed actions (K = chunk x action dims,
    action-major), 0 at the rest (all 1 when the batch does not say); None for decision log-probs [N]."""
    if logprobs.dim() != 2:
        return None
    if executed_actions is None:
        return torch.ones_like(logprobs)
    dims = logprobs.shape[1] // action_chunk
    action_of_entry = torch.arange(logprobs.shape[1], device=logprobs.device) // dims
    return (action_of_entry[None, :] < executed_actions.to(logprobs.device)[:, None]).float()


def clip_gradients(policy, max_norm: float) -> torch.Tensor:
    """Clip the gradients' global norm (over every rank's shards) to ``max_norm``; returns it."""
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
    return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm


def all_ranks_finite(loss_finite: bool, grad_norm: torch.Tensor, all_reduce_sum: Callable, world_size: int) -> bool:
    """True when every rank's losses and the global gradient norm are finite (ranks agree)."""
    ok = torch.tensor([float(loss_finite and bool(torch.isfinite(grad_norm)))])
    return float(all_reduce_sum(ok)[0]) == world_size


def _micro_batch_loss(policy, mc: PPOBatch, proximal: Optional[torch.Tensor], s: UpdateSettings,
                      normalizer: float, train_policy: bool, anchor: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The loss of one micro-batch (scaled by the minibatch's global ``normalizer``) and its
    per-sample metrics. ``proximal``: recomputed log pi_p, or None to interpolate it by version;
    ``anchor``: the warm start's log-probs of the actions (``algorithm.anchor_kl_coef``)."""
    # ---- forward: current log-probs, entropy, values ----
    logprobs, entropy, values = policy.evaluate(mc.forward_inputs, mc.actions)
    logprobs, values, behaviour = logprobs.float(), values.float(), mc.behaviour_logprobs
    if proximal is None:
        proximal = interpolate_proximal_logprobs(behaviour, logprobs.detach(), mc.versions, s.version, s.version + 1)
    # ---- only the executed actions of a chunk: per entry, or summed back into the decision ----
    executed = executed_entries(logprobs, mc.executed_actions, s.action_chunk)
    anchor_kl = None if anchor is None else anchor_kl_per_decision(logprobs, anchor, executed)
    if executed is not None and s.logprob_type == "chunk_level":
        logprobs, proximal, behaviour = ((lp * executed).sum(1) for lp in (logprobs, proximal, behaviour))
        executed = None
    # ---- losses: decoupled clipped policy loss, clipped Huber value loss, entropy ----
    pg_loss, pg_metrics = decoupled_ppo_actor_loss(
        logprobs, proximal, behaviour, mc.advantages, mc.loss_mask, clip_ratio_low=s.clip_ratio_low,
        clip_ratio_high=s.clip_ratio_high, clip_ratio_c=s.clip_ratio_c,
        behave_weight_threshold=s.behave_weight_threshold, loss_normalizer=normalizer, entry_mask=executed)
    ent = masked_mean(entropy.float(), mc.loss_mask, denom=normalizer)
    # token_level: the policy term is a mean over a decision's K entries, so the bonus is too (its
    # decision's entropy is a sum over them: it would be K times stronger than under chunk_level)
    entries = logprobs.shape[1] if logprobs.dim() == 2 else 1
    to_mean = normalizer / max(float(mc.loss_mask.sum()), 1.0)  # undo the global normaliser
    loss = pg_loss - s.entropy_coef * ent / entries if train_policy else pg_loss.new_zeros(())
    if anchor_kl is not None:
        anchor_term = masked_mean(anchor_kl, mc.loss_mask, denom=normalizer)
        loss = loss + s.anchor_kl_coef * anchor_term if train_policy else loss
        pg_metrics["train/actor/anchor_kl"] = float(anchor_term.detach()) * normalizer / max(
            float(mc.loss_mask.sum()), 1.0)
    v_metrics: Dict[str, float] = {}
    if s.train_critic:
        v_loss, v_metrics = value_loss(values, mc.old_values, mc.returns, mc.loss_mask, value_clip=s.value_clip,
                                       huber_delta=s.huber_delta, loss_normalizer=normalizer)
        loss = loss + s.value_loss_coef * v_loss
        v_metrics["train/critic/value_loss"] *= to_mean
    # ---- bookkeeping: per-sample means of the micro-batch ----
    pg_metrics["train/actor/policy_loss"] *= to_mean
    return loss, {**pg_metrics, **v_metrics, "train/actor/entropy": float(ent.detach()) * to_mean}


def _drop_policy_gradients(optimizer) -> None:
    """Critic warm-up: only the value head may move. The value loss also back-propagates into
    the shared trunk (LoRA adapters), so those gradients are dropped before the step: a
    parameter without a gradient is skipped by the optimiser (no weight decay, no moments)."""
    for group in _policy_groups(optimizer, "critic warm-up"):
        for param in group["params"]:
            param.grad = None


def _set_policy_lr(optimizer, lr: float) -> None:
    for group in _policy_groups(optimizer, "the policy's learning-rate warm-up"):
        group["lr"] = lr


def _policy_groups(optimizer, purpose: str) -> list:
    groups = [g for g in optimizer.param_groups if g.get("name") == "policy"]
    if not groups:
        raise ValueError(f"{purpose} needs the optimiser's parameter groups named 'policy' and 'value'")
    return groups


# demonstrations in the loss: ``demo_backward(scale)`` back-propagates scale x the mean supervised
# loss of the next batch of demonstration frames (this rank's share) and returns its metrics
DemoBackward = Callable[[float], Dict[str, float]]


def _accumulate_gradients(policy, optimizer, batch: PPOBatch, mb_index: torch.Tensor,
                          proximal: Optional[torch.Tensor], s: UpdateSettings, normalizer: float,
                          train_policy: bool, device, demo_backward: Optional[DemoBackward] = None,
                          anchor: Optional[torch.Tensor] = None
                          ) -> Tuple[bool, list, Dict[str, float], torch.Tensor]:
    """Forward and backward over the micro-batches of one minibatch (and, on a policy step, the
    demonstrations' term), then clip: returns whether every loss was finite, per micro-batch its
    trained (unmasked) decisions and its metrics (means over them), the demonstrations' metrics
    and the global gradient norm."""
    optimizer.zero_grad(set_to_none=True)
    loss_finite, step_metrics = True, []
    for mc_start in range(0, len(mb_index), s.micro_batch_size):
        index = mb_index[mc_start:mc_start + s.micro_batch_size]
        mc = _to(device, batch.rows(index))
        prox = proximal[index].to(device) if proximal is not None else None
        anchored = anchor[index].to(device) if anchor is not None else None
        loss, micro_metrics = _micro_batch_loss(policy, mc, prox, s, normalizer, train_policy, anchored)
        loss_finite &= bool(torch.isfinite(loss.detach()))
        if loss.requires_grad:
            loss.backward()
        step_metrics.append((int(batch.loss_mask[index].sum()), micro_metrics))
    demo_metrics: Dict[str, float] = {}
    if train_policy and demo_backward is not None and s.demo_loss_coef > 0:
        demo_metrics = demo_backward(s.demo_loss_coef)
        loss_finite &= math.isfinite(demo_metrics.get("train/demo/loss", 0.0))
    if not train_policy:
        _drop_policy_gradients(optimizer)
    if s.frozen_prefixes:  # a parameter without a gradient is skipped by the optimiser
        for name, param in policy.named_parameters():
            if name.startswith(s.frozen_prefixes):
                param.grad = None
    return loss_finite, step_metrics, demo_metrics, clip_gradients(policy, s.max_grad_norm)


@contextlib.contextmanager
def holding_weights(policy, weights: Dict[str, torch.Tensor]) -> Iterator[None]:
    """Inside, the policy's parameters named in ``weights`` hold those values; after, their own."""
    params = dict(policy.named_parameters())
    own = {name: params[name].detach().clone() for name in weights}
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in own.items():
                params[name].copy_(value)


def _reference_logprobs(policy, batch: PPOBatch, s: UpdateSettings, device,
                        warm_start: Optional[Dict[str, torch.Tensor]]
                        ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(proximal, anchor) log-probs of the stored actions, once per update: the proximal ones from a
    forward pass (its values then anchor the value clip; None: interpolated by version per
    minibatch), the warm start's with ``s.anchor_kl_coef`` (None without)."""
    anchor = None
    if s.anchor_kl_coef > 0:
        if not warm_start:
            raise ValueError("algorithm.anchor_kl_coef > 0 needs the warm start's weights (ppo_update's warm_start)")
        with holding_weights(policy, warm_start):
            anchor = recompute_logprobs(policy, batch, s.micro_batch_size, device)[0]
    proximal = None
    if s.recompute_logprobs:
        proximal, batch.old_values = recompute_logprobs(policy, batch, s.micro_batch_size, device,
                                                        None if s.recompute_fresh_logprobs else s.version)
    return proximal, anchor


def ppo_update(policy, optimizer, batch: PPOBatch, s: UpdateSettings, all_reduce_sum: Callable,
               generator: torch.Generator, device="cpu", demo_backward: Optional[DemoBackward] = None,
               warm_start: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, float]:
    """Epochs of minibatch steps; the optimiser's groups are named "policy" and "value".
    ``demo_backward``: the demonstrations' term, added to every policy step (``s.demo_loss_coef``).
    ``warm_start``: the trainable weights the run began with, by parameter name (the anchor of
    ``s.anchor_kl_coef``; held for one pass per update). An empty batch (every group-relative
    sample dropped) takes no step."""
    if len(batch) == 0:
        return _update_metrics({}, {}, s, 0, 0, 0)
    proximal, anchor = _reference_logprobs(policy, batch, s, device, warm_start)

    # ---- advantage normalisation with global statistics ----
    if s.normalize_advantages:
        batch.advantages = normalize_advantages(batch.advantages, batch.loss_mask, all_reduce=all_reduce_sum)

    sums: Dict[str, float] = defaultdict(float)
    counts: Dict[str, int] = defaultdict(int)
    epochs_run, nonfinite_skipped, steps_taken = 0, 0, 0
    for _ in range(s.epochs):
        # the proximal KL summed over this epoch's trained decisions (of the steps taken), and their count
        epoch_kl_sum, epoch_decisions = 0.0, 0
        order = torch.randperm(len(batch), generator=generator)
        for mb_start in range(0, len(batch), s.minibatch_size):
            mb_index = order[mb_start:mb_start + s.minibatch_size]
            # every rank divides by the global valid count / world: FSDP averages over ranks
            valid = all_reduce_sum(batch.loss_mask[mb_index].sum().float().reshape(1))[0]
            normalizer = max(float(valid), 1.0) / s.world_size
            train_policy = steps_taken >= s.critic_warmup_left
            loss_finite, step_metrics, demo_metrics, grad_norm = _accumulate_gradients(
                policy, optimizer, batch, mb_index, proximal, s, normalizer, train_policy, device, demo_backward,
                anchor)
            # ---- a NaN/inf loss or gradient would poison the weights for good: skip that step ----
            if not all_ranks_finite(loss_finite, grad_norm, all_reduce_sum, s.world_size):
                optimizer.zero_grad(set_to_none=True)
                nonfinite_skipped += 1
                continue
            # only steps taken count in the averages, each micro-batch by its trained decisions
            # (a mostly masked one would otherwise weigh as much as a full one)
            for decisions, micro_metrics in step_metrics:
                for name, value in micro_metrics.items():
                    sums[name] += value * decisions
                    counts[name] += decisions
                epoch_kl_sum += micro_metrics["train/actor/trust_region_kl"] * decisions
                epoch_decisions += decisions
            for name, value in {**demo_metrics, "train/actor/grad_norm": float(grad_norm)}.items():
                sums[name] += value
                counts[name] += 1
            if train_policy and (s.policy_lr_warmup_steps or s.policy_lr_factor != 1.0):
                policy_step = s.policy_steps_before + steps_taken - s.critic_warmup_left
                _set_policy_lr(optimizer, s.policy_lr * s.policy_lr_factor * lr_factor(
                    policy_step, s.policy_lr_warmup_steps, 0, "constant", 1.0))
            optimizer.step()
            steps_taken += 1
        epochs_run += 1
        # ---- early stop once the policy moved too far from the proximal anchor: the epoch's mean
        # trust-region KL per trained decision over every rank (a micro-batch's is the mean over
        # its own, behaviour-weighted: ppo_loss._trust_region_kl) ----
        kl_sum, decisions = all_reduce_sum(torch.tensor([epoch_kl_sum, float(epoch_decisions)])).tolist()
        kl = kl_sum / max(decisions, 1.0)
        if s.target_kl is not None and steps_taken > s.critic_warmup_left and kl > s.target_kl:
            break

    return _update_metrics(sums, counts, s, epochs_run, steps_taken, nonfinite_skipped)


def _update_metrics(sums: Dict[str, float], counts: Dict[str, int], s: UpdateSettings, epochs_run: int,
                    steps_taken: int, nonfinite_skipped: int) -> Dict[str, float]:
    """The update's means; one whose every step was skipped (non-finite, or an empty batch) still
    reports its losses, as NaN."""
    reported = ("train/actor/policy_loss", "train/critic/value_loss", "train/critic/value_clip_fraction") \
        if s.train_critic else ("train/actor/policy_loss",)
    metrics = {name: float("nan") for name in reported}
    metrics.update({name: sums[name] / counts[name] for name in sums if counts[name]})
    metrics["train/actor/epochs"] = float(epochs_run)
    metrics["train/actor/optimizer_steps"] = float(steps_taken)
    metrics["train/actor/nonfinite_skipped"] = float(nonfinite_skipped)
    return metrics

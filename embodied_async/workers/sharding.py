"""FSDP2 on the actor: which dtype each parameter keeps, which modules are their own units, and
gathering only what the rollout needs.

- Trainable parameters (and so the optimiser's state) are kept in float32 whatever the policy
  was loaded in: LoRA updates of ~1e-6 relative size round away in bfloat16. With
  ``precision: bfloat16`` FSDP's mixed-precision policy casts every parameter to bfloat16 for the
  forward and backward passes and reduces gradients in float32; frozen weights stay in the dtype
  they were loaded in (bfloat16 for a 7B model: no float32 copy of what never changes).
- A policy may name submodules to shard as their own units (``Policy.fsdp_units``, e.g. decoder
  layers and ViT blocks): FSDP then gathers one unit at a time instead of the whole model for
  every micro-batch. The root unit holds the rest.

This module imports neither Ray nor the config machinery, so ``scripts/gpu_check.py`` can use it
on a machine that has neither.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from embodied_async.config.schema import PRECISIONS

# the Policy methods that run a forward pass on the actor (FSDP must gather around each)
FORWARD_METHODS = ("evaluate", "value", "predict", "supervised_loss")
COMPUTE_DTYPES = {name: getattr(torch, name) for name in PRECISIONS}


def keep_trainable_in_float32(policy: nn.Module) -> int:
    """Cast trainable floating parameters to float32 in place; returns how many were cast."""
    cast = 0
    for param in policy.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
            param.data = param.data.float()
            cast += 1
    return cast


def fsdp_units(policy: nn.Module) -> List[nn.Module]:
    """The submodules the policy asks to shard on their own (none: the root unit holds everything)."""
    units = getattr(policy, "fsdp_units", None)
    return list(units()) if callable(units) else []


def shard_policy(policy: nn.Module, device_kind: str, world_size: int, precision: str) -> bool:
    """Apply FSDP2 in place: each unit of ``fsdp_units`` first, then the root. Returns whether it
    did: a single rank in float32 has nothing to shard and no precision to manage, and FSDP's
    hooks alone made the MLP recipe's update ~1.5x as expensive on a CPU
    (benchmarks/2026-12-01-throughput-cpu.md), so that policy trains unwrapped."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if precision not in COMPUTE_DTYPES:
        raise ValueError(f"model.precision={precision!r}; use one of {sorted(COMPUTE_DTYPES)}")
    keep_trainable_in_float32(policy)
    if world_size == 1 and precision == "float32":
        return False
    mesh = init_device_mesh("cuda" if device_kind == "gpu" else "cpu", (world_size,))
    options, root_options = {"mesh": mesh}, {"mesh": mesh}
    if precision == "bfloat16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # The root's methods take the data as sampled: FSDP would round every float input to bf16
        # (expert actions before tokenising, Pi0's stored chains before re-scoring them), and the
        # policies cast what their modules need themselves, as the unsharded rollout copy does.
        root_options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                         cast_forward_inputs=False)
    for unit in fsdp_units(policy):
        fully_shard(unit, **options)
    fully_shard(policy, **root_options)
    for method in FORWARD_METHODS:
        if hasattr(policy, method):
            register_fsdp_forward_method(policy, method)
    return True


def reshard(policy: nn.Module) -> None:
    """Put a sharded policy's parameters back in shards after forward passes without a backward
    (a validation loss): the root unit keeps them gathered for the backward it expects, and a
    state dict or optimiser step taken meanwhile would not find the parameters it knows."""
    from torch.distributed.fsdp import FSDPModule

    for module in policy.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def trainable_parameters(policy: nn.Module, value_prefixes: Iterable[str]) -> Tuple[list, list]:
    """(policy parameters, value parameters) that require grad, split by name prefix."""
    prefixes = tuple(value_prefixes)
    policy_params, value_params = [], []
    for name, param in policy.named_parameters():
        if param.requires_grad:
            (value_params if name.startswith(prefixes) else policy_params).append(param)
    return policy_params, value_params


def gather_trainable(policy: nn.Module, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """Collective (every rank calls it): the full trainable parameters as CPU tensors that own
    their storage, in ``dtype`` when given. Frozen weights are never gathered."""
    out: Dict[str, torch.Tensor] = {}
    for name, param in policy.named_parameters():
        if not param.requires_grad:
            continue
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        # a copy: FSDP may hand out views of buffers it resizes later
        out[name] = full.detach().to(device="cpu", dtype=dtype or full.dtype, copy=True)
    return out


def tensor_bytes(state: Dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


PARAM_GROUPS = ("policy", "value")  # the optimiser's groups, in this order (ppo.py reads the names)


def make_optimizer(actor_cfg, policy_params: list, value_params: list) -> torch.optim.Optimizer:
    """Adam or AdamW (``actor.optimizer``) with a "policy" and a "value" parameter group."""
    optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    value_lr = actor_cfg.value_lr if actor_cfg.value_lr is not None else actor_cfg.lr
    groups = [{"params": policy_params, "lr": actor_cfg.lr}, {"params": value_params, "lr": value_lr}]
    # fused kernels exist for CUDA and CPU float32 parameters, which trainable ones always are
    optimizer = optimizers[actor_cfg.optimizer](groups, betas=tuple(actor_cfg.betas), eps=actor_cfg.adam_eps,
                                                weight_decay=actor_cfg.weight_decay, fused=True)
    name_param_groups(optimizer)
    return optimizer


def name_param_groups(optimizer: torch.optim.Optimizer) -> None:
    """Label the groups "policy" and "value" (again after ``load_state_dict``, which replaces
    each group's dict with the saved one)."""
    for group, name in zip(optimizer.param_groups, PARAM_GROUPS, strict=True):
        group["name"] = name


@torch.no_grad()
def load_model_state(policy: nn.Module, state: Dict[str, torch.Tensor], trainable_names: set) -> None:
    """Copy a checkpoint's tensors (full, unsharded) into the sharded policy.

    ``state`` holds either the whole state dict or the trainable parameters plus buffers (the
    default checkpoint): every trainable parameter must be there, and nothing the policy lacks.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    targets = dict(policy.named_parameters())
    targets.update(policy.named_buffers())
    unexpected = sorted(set(state) - set(targets))
    missing = sorted(set(trainable_names) - set(state))
    if unexpected or missing:
        raise KeyError(f"the checkpoint does not fit this policy: {len(missing)} trainable parameters missing "
                       f"(e.g. {missing[:3]}), {len(unexpected)} unknown tensors (e.g. {unexpected[:3]})")
    for name, value in state.items():
        target = targets[name]
        if isinstance(target, DTensor):
            local = target.to_local()
            value = distribute_tensor(value.to(local.device, target.dtype), target.device_mesh, target.placements)
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"checkpoint tensor {name}: shape {tuple(value.shape)}, policy {tuple(target.shape)}")
        target.copy_(value)

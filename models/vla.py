"""What the VLA families (OpenVLA, Pi0, and the next one) share, so a family adds only its model,
processor and config: the compute dtype of ``model.precision``, LoRA adapters injected in place,
the tiny random checkpoint made once, and the checks of the env's action chunk against the
checkpoint's."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from embodied_async.config.schema import PRECISIONS
from embodied_async.contracts import EnvSpec
from embodied_async.normalization import RunningNorm
from models.checkpoints import make_once
from models.common import as_tensor, head_output, make_mlp


def compute_dtype(precision: str) -> torch.dtype:
    """The torch dtype a VLA's frozen weights and its compute use (``model.precision``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"model.precision={precision!r}; use one of {list(PRECISIONS)}")
    return getattr(torch, precision)


def inject_lora(model: nn.Module, roots: Sequence[nn.Module], rank: int, alpha: float,
                targets: Union[str, Sequence[str]], dropout: float = 0.0, init: Union[bool, str] = True) -> None:
    """peft LoRA adapters of ``rank`` in the ``targets`` linear layers of each of ``roots``, in place
    (no PeftModel wrapper: module paths and forward signatures stay the same); every parameter of
    ``model`` but the adapters is then frozen (a value head added afterwards trains)."""
    from peft import LoraConfig, inject_adapter_in_model  # lazy: only LoRA runs need peft

    for root in roots:
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                                           init_lora_weights=init), root)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA adapter of ``model`` into its base linear layer and put the plain layer
    back in its place (what an exported checkpoint holds: the base architecture's tensor names,
    no adapter tensors); returns how many layers were merged."""
    from peft.tuners.lora import LoraLayer

    merged = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge(safe_merge=True)  # safe_merge: refuse non-finite merged weights
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
            merged += 1
    return merged


def make_tiny_once(path: str, make: Callable[[str], None]) -> None:
    """Make the tiny random checkpoint at ``path`` with ``make(folder)`` unless it is there (once,
    whichever worker asks first)."""
    if not os.path.isdir(path):
        make_once(path, make)


def check_tiny_image_size(path: str, image_size: Optional[int], wanted: int) -> None:
    """A tiny checkpoint already at ``path`` must take ``model.tiny_image_size`` images."""
    if image_size is not None and int(image_size) != int(wanted):
        raise ValueError(f"the tiny checkpoint at {path} takes {image_size} px images, not model.tiny_image_size="
                         f"{wanted}: set model.tiny_image_size={image_size}, or remove that folder to make a new one")


def check_action_chunk(env_spec: Optional[EnvSpec], family: str, chunk: int, action_dim: int,
                       exact: bool, source: str) -> None:
    """The env's decisions fit the checkpoint's: at most ``chunk`` actions executed per decision
    (``env.num_action_chunks``) of ``action_dim`` values each (exactly, where ``exact``; at most,
    where the family pads them). ``source``: where the checkpoint's figures come from."""
    if env_spec is None:
        return
    if env_spec.num_action_chunks > chunk:
        raise ValueError(f"env.num_action_chunks={env_spec.num_action_chunks}: {family} emits {chunk} action(s) per "
                         f"decision ({source}); set it to at most {chunk}")
    if env_spec.action_dim > action_dim or (exact and env_spec.action_dim != action_dim):
        relation = "" if exact else "at most "
        raise ValueError(f"the env's actions have {env_spec.action_dim} values, {family}'s {relation}{action_dim} "
                         f"({source}): choose an env control mode with {relation}{action_dim} action values")


def privileged_value_dim(model_cfg, env_spec) -> int:
    """The size of the env's privileged state vector a ``model.value_input=privileged_states``
    critic reads (0 for any other value input, or without a value head)."""
    if getattr(model_cfg, "value_input", None) != "privileged_states" or not model_cfg.builds_value_head():
        return 0
    if env_spec is None or "privileged_states" not in env_spec.obs_shapes:
        raise ValueError("model.value_input=privileged_states: the env gives no privileged states; set "
                         "env.privileged_states=true (families that support it: ManiSkill, robosuite, Meta-World, "
                         "Fetch)")
    return int(env_spec.obs_shapes["privileged_states"][0])


class PrivilegedValueHead(nn.Module):
    """The asymmetric critic's head: the env's privileged state vector, normalised per entry with
    the run's running statistics (a ``RunningNorm``: observed by the rollout, merged and published
    by the actor, like a state policy's; the entries differ in scale by orders of magnitude), then
    an MLP to one value."""

    def __init__(self, dim: int, hidden_sizes, dtype: torch.dtype):
        super().__init__()
        self.normalizer = RunningNorm(dim)
        self.mlp = make_mlp(dim, list(hidden_sizes), 1, "gelu", out_std=1.0).to(dtype)

    def observe(self, states: torch.Tensor) -> None:
        """The rollout's side (a decision in training): record the states' moments for the actor."""
        self.normalizer.observe(states)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return head_output(self.mlp, self.normalizer(states.float()))


def privileged_states_input(obs, device) -> torch.Tensor:
    """The observation's ``privileged_states`` as float32 on ``device`` (the critic's input)."""
    if "privileged_states" not in obs:
        raise KeyError("the value head reads 'privileged_states' (model.value_input=privileged_states), and the "
                       "observation has none: set env.privileged_states=true")
    return as_tensor(obs["privileged_states"], dtype=torch.float32, device=device)

"""GPU memory estimate of the Pi0 family for ``runner.dry_run``.

Parameter counts are exact for the configured policy (built on the meta device from the
checkpoint's shapes when its files are on this machine, else from the released Pi0's shape).
Activations follow the same rules of thumb as ``models/openvla/memory.py``: 34 bytes x tokens x
width per layer and sample in 16-bit without recomputation, a layer's input with it.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import torch

from .configuration_pi0 import WEIGHTS_FILE, Pi0Architecture, pi0_base_architecture, read_architecture

SUFFIX_TOKENS_EXTRA = 1  # the state token before the chunk


def _architecture(model_cfg) -> Tuple[Pi0Architecture, str]:
    path = os.path.expanduser(model_cfg.path or "")
    if os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
        return read_architecture(path), f"the checkpoint at {model_cfg.path}"
    if model_cfg.tiny_random_init:
        from .tiny import tiny_architecture

        tiny = tiny_architecture(8, 7, ["base_0_rgb"], image_size=model_cfg.tiny_image_size)
        return tiny, "the tiny random checkpoint's shape"
    return pi0_base_architecture(), f"the released Pi0's shape (PaliGemma 3B + 300M expert): {model_cfg.path} not here"


def _counts(model_cfg, arch: Pi0Architecture) -> Dict[str, int]:
    from .chain import ChainSettings
    from .modeling_pi0 import Pi0Model
    from .policy_pi0 import Pi0Policy
    from .processing_pi0 import Normalization

    lora = model_cfg.lora
    with torch.device("meta"):
        policy = Pi0Policy(Pi0Model(arch), Normalization(), lambda text: [], ChainSettings(
            model_cfg.noise_method, model_cfg.num_steps or arch.num_inference_steps, 1, 1),
            value_input=model_cfg.value_input, value_head_hidden_sizes=model_cfg.value_head_hidden_sizes,
            noise_head_hidden_sizes=model_cfg.noise_head_hidden_sizes,
            lora_rank=int(lora.rank) if lora.enabled else 0, lora_alpha=float(lora.alpha),
            lora_targets=list(lora.target_modules), lora_parts=list(lora.parts))
    units = [sum(p.numel() for p in unit.parameters()) for unit in policy.fsdp_units()]
    total = sum(p.numel() for p in policy.parameters())
    return {"total": total, "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
            "largest_unit": max(units), "root": total - sum(units)}


def estimate(model_cfg, workload) -> Dict[str, Dict[str, float]]:
    arch, _ = _architecture(model_cfg)
    counts = _counts(model_cfg, arch)
    compute = 2 if model_cfg.precision == "bfloat16" else 4
    vlm, expert, vision = arch.vlm, arch.expert, arch.vision
    # cameras the env fills (model.camera_keys, at most the checkpoint's); absent ones are left out
    cameras = min(len(model_cfg.camera_keys), len(arch.cameras))
    prefix = cameras * vision.num_patches + arch.tokenizer_max_length
    suffix = arch.chunk_size + SUFFIX_TOKENS_EXTRA
    kv = lambda batch: batch * prefix * vlm.depth * 2 * vlm.num_kv_heads * vlm.head_dim * compute  # noqa: E731

    def inference(batch: int) -> Dict[str, float]:
        transient = max(batch * cameras * vision.num_patches * (6 * vision.width + 3 * vision.mlp_dim),
                        batch * prefix * (6 * vlm.width + 3 * vlm.mlp_dim))
        return {"KV cache": kv(batch), "activations": transient * compute}

    steps = model_cfg.num_steps or arch.num_inference_steps
    passes = steps if model_cfg.noise_method == "flow_noise" else 1  # suffix passes re-scored with gradients
    m, world, trainable = workload.actor_micro_batch, workload.actor_world_size, counts["trainable"]
    layers = [(vision.depth, cameras * vision.num_patches, vision.width), (vlm.depth, prefix, vlm.width),
              (expert.depth, suffix * (passes + 1), expert.width)]  # + the value probe
    if model_cfg.gradient_checkpointing:
        activations = (sum(m * n * w * compute * depth for depth, n, w in layers)
                       + max(34 * m * n * w for _, n, w in layers))
    else:
        activations = sum(34 * m * n * w * depth for depth, n, w in layers)
    actor = {"frozen weights (shard)": (counts["total"] - trainable) * compute / world,
             "trainable fp32 (shard)": trainable * 4 / world, "gradients fp32 (shard)": trainable * 4 / world,
             "Adam moments (shard)": trainable * 8 / world,
             "gathered units": (counts["root"] + 2 * counts["largest_unit"]) * compute,
             "KV cache (prefix, kept for the backward)": kv(m), "activations": activations}
    return {"rollout": {"weights": counts["total"] * compute, **inference(workload.rollout_batch)},
            "actor": actor, "evaluation": inference(workload.eval_batch),
            "startup": {"the whole model, loaded before FSDP shards it": counts["total"] * compute}}


def notes(model_cfg) -> List[str]:
    _, source = _architecture(model_cfg)
    return [f"model shape from {source}", "activations are rules of thumb (models/pi0/memory.py)"]

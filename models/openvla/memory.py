"""GPU memory estimate of the OpenVLA family for ``runner.dry_run``.

Parameter counts are exact: the policy is built on the meta device from the checkpoint's
config (its ``config.json`` when it is on this machine, else the OpenVLA-7B shape), with the
configured LoRA targets and value head. Activation sizes are rules of thumb, stated here:

- a transformer layer's saved activations: ``34 * tokens * width`` bytes per sample in 16-bit
  (Korthikanti et al. 2022, attention scores not stored: SDPA);
- with gradient checkpointing, each layer keeps only its input (``tokens * width``) and one
  layer at a time is recomputed;
- inference holds one layer's transient (``~(6 * width + 3 * mlp_width) * tokens``) and the KV cache.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

import torch

PROMPT_TOKENS = 32  # "In: What action should the robot take to ...?\nOut:" with a short instruction


def _architecture(model_cfg) -> Tuple[object, str]:
    """(OpenVLAConfig, where it came from)."""
    from .configuration_openvla import OpenVLAConfig
    from .tiny import openvla_7b_config_dict, tiny_config

    path = os.path.expanduser(model_cfg.path or "")
    if os.path.isfile(os.path.join(path, "config.json")):
        return OpenVLAConfig.from_pretrained(path), f"the config.json of {model_cfg.path}"
    if model_cfg.tiny_random_init:
        return tiny_config(image_size=model_cfg.tiny_image_size), "the tiny random checkpoint's config"
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_cfg.path, "config.json")
    except Exception:  # not a repo id, or no cache: the assumed shape below
        cached = None
    if isinstance(cached, str):
        return OpenVLAConfig.from_pretrained(os.path.dirname(cached)), f"the cached config.json of {model_cfg.path}"
    return (OpenVLAConfig.from_dict(openvla_7b_config_dict()),
            f"the OpenVLA-7B shape (Llama-2-7B, DINOv2-L + SigLIP-so400m): no config.json of {model_cfg.path} here")


def _meta_policy(model_cfg, config):
    from .modeling_openvla import OpenVLAModel
    from .policy_openvla import OpenVLAPolicy

    lora = model_cfg.lora
    with torch.device("meta"):
        vla = OpenVLAModel(config)
        return OpenVLAPolicy(vla, unnorm_key=next(iter(config.norm_stats or {"": 0}), None) or None,
                             lora_rank=int(lora.rank) if lora.enabled else 0, lora_alpha=float(lora.alpha),
                             lora_target_modules=list(lora.target_modules),
                             value_head_hidden_sizes=tuple(model_cfg.value_head_hidden_sizes))


def _counts(policy) -> Dict[str, int]:
    numel = lambda params: sum(p.numel() for p in params)  # noqa: E731
    units = [numel(unit.parameters()) for unit in policy.fsdp_units()]
    total = numel(policy.parameters())
    return {"total": total, "trainable": numel(p for p in policy.parameters() if p.requires_grad),
            "largest_unit": max(units, default=0), "root": total - sum(units)}


def estimate(model_cfg, workload) -> Dict[str, Dict[str, float]]:
    config, _ = _architecture(model_cfg)
    counts = _counts(_meta_policy(model_cfg, config))
    text = config.text_config
    width, layers, mlp = int(text.hidden_size), int(text.num_hidden_layers), int(text.intermediate_size)
    kv_width = int(text.num_key_value_heads) * (width // int(text.num_attention_heads))
    towers = [config.featurizer, config.fused_featurizer]
    patches = towers[0].num_patches
    tokens = 1 + patches + PROMPT_TOKENS + 7  # BOS, patches, prompt, action tokens
    compute = 2 if model_cfg.precision == "bfloat16" else 4

    def inference(batch: int) -> Dict[str, float]:
        vision = max(batch * (t.num_patches + t.num_prefix_tokens) * (6 * t.embed_dim + 3 * t.mlp_hidden)
                     for t in towers)
        return {"KV cache": batch * tokens * layers * 2 * kv_width * compute,
                "activations": max(vision, batch * tokens * (6 * width + 3 * mlp)) * compute}

    m, world, trainable = workload.actor_micro_batch, workload.actor_world_size, counts["trainable"]
    vision_tokens = [(t.depth, t.num_patches + t.num_prefix_tokens, t.embed_dim) for t in towers]
    if model_cfg.gradient_checkpointing:
        kept = m * tokens * width * compute * layers + sum(m * n * d * compute * depth for depth, n, d in vision_tokens)
        recompute = max([34 * m * tokens * width] + [34 * m * n * d for _, n, d in vision_tokens])
        activations = kept + recompute
    else:
        activations = 34 * m * tokens * width * layers + sum(34 * m * n * d * depth for depth, n, d in vision_tokens)
    actor = {
        "frozen weights (shard)": (counts["total"] - trainable) * compute / world,
        "trainable fp32 (shard)": trainable * 4 / world,
        "gradients fp32 (shard)": trainable * 4 / world,
        "Adam moments (shard)": trainable * 8 / world,
        "gathered units": (counts["root"] + 2 * counts["largest_unit"]) * compute,
        "activations": activations,
    }
    rollout = {"weights": counts["total"] * compute, **inference(workload.rollout_batch)}
    return {"rollout": rollout, "actor": actor, "evaluation": inference(workload.eval_batch),
            "startup": {"the whole model, loaded before FSDP shards it": counts["total"] * compute}}


def notes(model_cfg) -> List[str]:
    _, source = _architecture(model_cfg)
    return [f"model shape from {source}",
            f"activations assume {PROMPT_TOKENS}-token prompts; rules of thumb in models/openvla/memory.py"]


def parameter_counts(model_cfg) -> Dict[str, int]:
    """Total / trainable parameters and FSDP unit sizes of the configured policy (meta device)."""
    config, _ = _architecture(model_cfg)
    return _counts(_meta_policy(model_cfg, config))



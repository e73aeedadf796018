"""A trained Pi0 written as LeRobot's Pi0 policy folder (``lerobot.policies.pi0``), the layout its
``PI0Policy.from_pretrained`` and ``make_pre_post_processors`` read:

- ``config.json``: the ``PI0Config`` fields LeRobot 0.4.4 saves, starting from the base checkpoint's
  own, with what the trained policy acts with (features, chunk, steps, normalisation modes);
- ``model.safetensors``: the base checkpoint's tensor names, shapes and dtypes, LoRA merged, our
  RL heads (value, noise, privileged critic) left out;
- ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and their statistics files, holding
  the statistics the policy was trained with (its buffers), under LeRobot's ``<feature>.<stat>`` keys.

A tiny test checkpoint also gets ``meta.json`` with its SigLIP head count: no tensor shows it and
LeRobot's config has no field for it (our loader reads it; LeRobot's variants cannot build tiny sizes).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from embodied_async.export import ExportError, ExportRequest, ExportResult
from models.vla import merge_lora

from .configuration_pi0 import CONFIG_FILE, META_FILE, SIGLIP_SO400M_HEADS, WEIGHTS_FILE
from .modeling_pi0 import TIED_EMBEDDING, UNUSED_KEYS
from .processing_pi0 import (
    ACTION_KEY,
    LEROBOT_NORM_MAP,
    PALIGEMMA_TOKENIZER,
    POSTPROCESSOR_FILE,
    PREPROCESSOR_FILE,
    STATE_KEY,
    lerobot_pipelines,
)

FORMAT = "LeRobot Pi0 policy (lerobot.policies.pi0)"
# Every field of LeRobot's PI0Config as its save_pretrained writes it (0.4.4), with its defaults, in
# its order: a base config.json lacking some (our tiny checkpoints write only what our loader reads)
# is completed from these. No other key is added: LeRobot's config parser refuses unknown fields.
LEROBOT_PI0_CONFIG = {
    "type": "pi0", "n_obs_steps": 1, "input_features": {}, "output_features": {}, "device": "cpu",
    "use_amp": False, "use_peft": False, "push_to_hub": True, "repo_id": None, "private": None, "tags": None,
    "license": None, "pretrained_path": None, "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m",
    "dtype": "float32", "chunk_size": 50, "n_action_steps": 50, "max_state_dim": 32, "max_action_dim": 32,
    "num_inference_steps": 10, "time_sampling_beta_alpha": 1.5, "time_sampling_beta_beta": 1.0,
    "time_sampling_scale": 0.999, "time_sampling_offset": 0.001, "min_period": 0.004, "max_period": 4.0,
    "rtc_config": None, "image_resolution": [224, 224], "empty_cameras": 0,
    "normalization_mapping": dict(LEROBOT_NORM_MAP), "gradient_checkpointing": False, "compile_model": False,
    "compile_mode": "max-autotune", "freeze_vision_encoder": False, "train_expert_only": False,
    "optimizer_lr": 2.5e-05, "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-08, "optimizer_weight_decay": 0.01,
    "optimizer_grad_clip_norm": 1.0, "scheduler_warmup_steps": 1000, "scheduler_decay_steps": 30000,
    "scheduler_decay_lr": 2.5e-06, "tokenizer_max_length": 48,
}
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
LOAD_WITH = """```python
from lerobot.policies.factory import make_pre_post_processors
from lerobot.policies.pi0.modeling_pi0 import PI0Policy

path = "<this folder or its hub repo id>"
policy = PI0Policy.from_pretrained(path)
preprocessor, postprocessor = make_pre_post_processors(policy.config, pretrained_path=path)
# batch: "observation.images.<camera>" float [B, 3, H, W] in [0, 1], "observation.state" [B, D], "task" [B strings]
action = postprocessor(policy.select_action(preprocessor(batch)))
```"""


def _read_json(folder: Optional[str], name: str) -> Optional[dict]:
    path = os.path.join(folder, name) if folder else None
    if path is None or not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_json(folder: str, name: str, content: dict, indent: int = 2) -> None:
    with open(os.path.join(folder, name), "w") as f:
        json.dump(content, f, indent=indent)


def _dims(request: ExportRequest) -> Tuple[int, int]:
    """(state, action) sizes the policy acts with: the env's."""
    spec = request.env_spec
    return int(spec.obs_shapes["states"][0]), int(spec.action_dim)


def _features(request: ExportRequest) -> Tuple[Dict[str, dict], Dict[str, dict]]:
    """LeRobot's (input_features, output_features). Every camera of the checkpoint stays declared,
    also one the env does not fill: LeRobot feeds an absent one as a masked blank, which acts as
    our policy leaving it out."""
    arch = request.policy.model.arch
    state_dim, action_dim = _dims(request)
    inputs = {f"observation.images.{camera}": {"type": "VISUAL", "shape": [3, *arch.image_size]}
              for camera in arch.cameras}
    inputs[STATE_KEY] = {"type": "STATE", "shape": [state_dim]}
    return inputs, {ACTION_KEY: {"type": "ACTION", "shape": [action_dim]}}


def _norm_map(request: ExportRequest, base: dict) -> Dict[str, str]:
    base_map = base.get("normalization_mapping") or LEROBOT_NORM_MAP
    return {**base_map, **request.policy.normalization.modes}


def lerobot_config(request: ExportRequest, base: dict) -> dict:
    """config.json: the base's fields (completed with LeRobot's defaults) with the trained policy's values."""
    policy = request.policy
    arch, settings = policy.model.arch, policy.settings
    inputs, outputs = _features(request)
    config = {**LEROBOT_PI0_CONFIG, **base}
    config.update(
        type="pi0", input_features=inputs, output_features=outputs, use_peft=False, chunk_size=arch.chunk_size,
        # LeRobot executes n_action_steps of a chunk before it samples the next, as our env does per decision
        n_action_steps=settings.executed_actions, max_state_dim=arch.max_state_dim,
        max_action_dim=arch.max_action_dim, num_inference_steps=settings.steps,
        image_resolution=list(arch.image_size), tokenizer_max_length=arch.tokenizer_max_length,
        min_period=arch.min_period, max_period=arch.max_period, normalization_mapping=_norm_map(request, base))
    return config


def _base_tensors(base_folder: Optional[str]) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of the base checkpoint's tensors (header only); empty without one."""
    path = os.path.join(base_folder, WEIGHTS_FILE) if base_folder else None
    if path is None or not os.path.isfile(path):
        return {}
    with safe_open(path, framework="pt") as f:
        return {key: (tuple(f.get_slice(key).get_shape()), SAFETENSORS_DTYPES[f.get_slice(key).get_dtype()])
                for key in f.keys()}


def _orphan_expert_head(request: ExportRequest, base: dict) -> torch.Tensor:
    """LeRobot's Pi0 has an expert lm_head it never uses; its checkpoints hold it, so ours does:
    the base's values, or zeros."""
    key = UNUSED_KEYS[0]
    if key in base:
        with safe_open(os.path.join(request.base_folder, WEIGHTS_FILE), framework="pt") as f:
            return f.get_tensor(key)
    arch = request.policy.model.arch
    return torch.zeros(arch.vocab_size, arch.expert.width)


def lerobot_weights(request: ExportRequest) -> Dict[str, torch.Tensor]:
    """The Pi0 network's tensors under LeRobot's names, in the base's dtypes (float32 without a
    base); refused unless the names and shapes are the base's."""
    base = _base_tensors(request.base_folder)
    weights = {f"model.{name}": value.detach() for name, value in request.policy.model.state_dict().items()}
    weights[UNUSED_KEYS[0]] = _orphan_expert_head(request, base)
    adapters = sorted(name for name in weights if "lora_" in name)
    if adapters:
        raise ExportError(f"LoRA tensors left after merging (e.g. {adapters[:2]}): LeRobot's Pi0 has no adapters")
    if base:
        names = set(base) - {TIED_EMBEDDING[0]}  # the tied embedding is saved once, as the lm_head
        shapes = {name: tuple(value.shape) for name, value in weights.items()}
        wrong = sorted(name for name in names & set(shapes) if shapes[name] != base[name][0])
        if set(shapes) != names or wrong:
            raise ExportError(f"the exported Pi0 does not match its base {request.base_folder}: missing "
                              f"{sorted(names - set(shapes))[:3]}, extra {sorted(set(shapes) - names)[:3]}, "
                              f"other shapes {wrong[:3]}")
    return {name: value.to(base[name][1] if name in base else torch.float32).contiguous()
            for name, value in weights.items()}


def _pipelines(request: ExportRequest, base_config: dict) -> Tuple[dict, dict]:
    """The processor files' contents: the base's pipelines where it has them (else LeRobot's Pi0
    ones), their (un)normaliser set to the trained features, modes and eps."""
    inputs, outputs = _features(request)
    norm_map, eps = _norm_map(request, base_config), request.policy.normalization.eps
    tokenizer = request.model_cfg.tokenizer
    made = lerobot_pipelines(inputs, outputs, request.policy.model.arch.tokenizer_max_length, norm_map, eps,
                             tokenizer if tokenizer != "words" else PALIGEMMA_TOKENIZER)
    pipelines = []
    for name, template in zip((PREPROCESSOR_FILE, POSTPROCESSOR_FILE), made):
        pipeline = _read_json(request.base_folder, name) or template
        features = {**inputs, **outputs} if name == PREPROCESSOR_FILE else outputs
        for index, step in enumerate(pipeline["steps"]):
            registry_name = step.get("registry_name")
            if registry_name in ("normalizer_processor", "unnormalizer_processor"):
                step["config"].update(eps=eps, features=features, norm_map=norm_map)
                # the trained statistics go into the file LeRobot would name (a base's step may have none)
                step.setdefault("state_file", f"{pipeline['name']}_step_{index}_{registry_name}.safetensors")
            if registry_name == "tokenizer_processor":  # the tokenizer the policy was trained with
                step["config"]["max_length"] = request.policy.model.arch.tokenizer_max_length
                if tokenizer != "words":
                    step["config"]["tokenizer_name"] = tokenizer
        pipelines.append(pipeline)
    return pipelines[0], pipelines[1]


def _statistics_files(pipeline: dict) -> List[str]:
    return [step["state_file"] for step in pipeline["steps"]
            if step.get("registry_name") in ("normalizer_processor", "unnormalizer_processor")]


def write_processors(request: ExportRequest, base_config: dict) -> None:
    """Both pipelines and their statistics files (every statistic in each, as LeRobot saves them)."""
    pre, post = _pipelines(request, base_config)
    stats = {key: value.detach().to(torch.float32).contiguous()
             for key, value in request.policy.normalization.stats.items()}
    for name, pipeline in ((PREPROCESSOR_FILE, pre), (POSTPROCESSOR_FILE, post)):
        _write_json(request.folder, name, pipeline)
        for state_file in _statistics_files(pipeline):
            save_file(stats, os.path.join(request.folder, state_file))


def _write_meta(request: ExportRequest) -> List[str]:
    """meta.json where our loader could not tell the SigLIP head count from the shapes."""
    heads = request.policy.model.arch.vision.num_heads
    if heads == SIGLIP_SO400M_HEADS:
        return []
    _write_json(request.folder, META_FILE, {"tiny_architecture": {
        "config_json_variant_names_are_NOT_the_sizes": True, "siglip_vision": {"num_attention_heads": heads}}})
    return [META_FILE]


def _notes(request: ExportRequest, merged: int, weights: Dict[str, torch.Tensor], meta: List[str]) -> List[str]:
    policy, cfg = request.policy, request.model_cfg
    left_out = [name for name in ("value_head", "noise_head", "action_log_std")
                if getattr(policy, name, None) is not None]
    dtypes = sorted({str(value.dtype).replace("torch.", "") for value in weights.values()})
    cameras = ", ".join(f"observation.images.{camera} <- {key}"
                        for camera, key in zip(policy.model.arch.cameras, policy.camera_keys))
    notes = [f"weights: {len(weights)} tensors under LeRobot's names, {'/'.join(dtypes)}"
             + (f"; {merged} LoRA adapters merged into their layers" if merged else ""),
             f"left out (our RL training's own, LeRobot acts without them): {', '.join(left_out) or 'nothing'}",
             "normalisation: the state and action statistics the policy was trained with, in both processor files",
             f"cameras: {cameras}; LeRobot feeds a declared camera that is absent as a masked blank image",
             f"each decision executes {policy.settings.executed_actions} of the {policy.model.arch.chunk_size} "
             f"actions of a chunk (n_action_steps); {policy.settings.steps} denoising steps, sampled as our "
             "evaluation samples: Euler steps from N(0, I) noise"]
    if policy.settings.initial_noise_scale != 1.0:
        notes.append(f"trained with model.initial_noise_scale={policy.settings.initial_noise_scale}: LeRobot starts "
                     "every chunk from N(0, I) noise, so its actions are drawn differently")
    if cfg.pad_after_scaling:
        notes.append("trained with model.pad_after_scaling=true (openpi's -1 padding): LeRobot pads resized "
                     "images to -3, so non-square images look different to it")
    if cfg.tokenizer == "words":
        notes.append(f"trained with the 'words' tokenizer stand-in: the processor names {PALIGEMMA_TOKENIZER}, "
                     "whose ids differ; prompts mean nothing to this policy there")
    elif os.path.isdir(os.path.expanduser(cfg.tokenizer)):
        notes.append(f"the processor's tokenizer_name is the local folder {cfg.tokenizer}: name its hub repo id "
                     "there before sharing the folder")
    if meta:
        notes.append("tiny sizes: meta.json holds the SigLIP head count for our loader; LeRobot's own code "
                     "builds only its released sizes (gemma_2b / gemma_300m, SigLIP so400m)")
    return notes


def export_pi0(request: ExportRequest) -> ExportResult:
    """Write ``request.policy`` into ``request.folder`` in LeRobot's Pi0 layout. LoRA adapters are
    merged into the policy's own layers in place (the request's policy is built for the export)."""
    merged = merge_lora(request.policy.model)
    base_config = _read_json(request.base_folder, CONFIG_FILE) or {}
    _write_json(request.folder, CONFIG_FILE, lerobot_config(request, base_config), indent=4)  # as LeRobot's
    weights = lerobot_weights(request)
    save_file(weights, os.path.join(request.folder, WEIGHTS_FILE), metadata={TIED_EMBEDDING[0]: TIED_EMBEDDING[1]})
    write_processors(request, base_config)
    meta = _write_meta(request)
    return ExportResult(format=FORMAT, load_with=LOAD_WITH, notes=_notes(request, merged, weights, meta))

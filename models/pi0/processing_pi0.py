"""Pi0 inputs and outputs as LeRobot's processors make them: images, state, actions, prompts.

- Images: float [0, 1] -> resized to fit 224x224 keeping the aspect ratio (bilinear, no
  antialiasing), padded to 224x224, then ``x * 2 - 1``. LeRobot 0.4.4 pads with -1.0 *before*
  that rescaling, so its padding ends at -3.0 (openpi's at -1.0); ``pad_after_scaling=False``
  (the default) reproduces LeRobot, which is what a LeRobot-trained checkpoint has seen.
- State: normalised, then zero-padded to ``max_state_dim``; actions: the first ``action_dim`` of
  the ``max_action_dim`` outputs, un-normalised.
- Normalisation: the statistics LeRobot saves beside the checkpoint (``policy_preprocessor.json``
  names its ``normalizer_processor`` step and that step's safetensors; ``policy_postprocessor.json``
  its ``unnormalizer_processor``, which un-normalises actions at inference), or given statistics;
  modes MEAN_STD, MIN_MAX and IDENTITY per feature type.
- Prompts: the task text plus "\\n", tokenised with the checkpoint's PaliGemma tokenizer and
  right-padded to ``tokenizer_max_length``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

PREPROCESSOR_FILE, POSTPROCESSOR_FILE = "policy_preprocessor.json", "policy_postprocessor.json"
# LeRobot names a step's statistics file after its pipeline and the step's index in it
NORMALIZER_FILE = "policy_preprocessor_step_5_normalizer_processor.safetensors"
UNNORMALIZER_FILE = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
LEROBOT_NORM_MAP = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}  # Pi0's defaults
PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
MODES = ("MEAN_STD", "MIN_MAX", "IDENTITY")
STATE_KEY, ACTION_KEY = "observation.state", "action"


def resize_with_pad(images: torch.Tensor, height: int, width: int, pad_after_scaling: bool = False) -> torch.Tensor:
    """Float images [B, 3, H, W] in [0, 1] -> [B, 3, height, width] in [-1, 1] (see module doc)."""
    images = images.float()
    if tuple(images.shape[-2:]) != (height, width):
        ratio = max(images.shape[-1] / width, images.shape[-2] / height)
        new_h, new_w = int(images.shape[-2] / ratio), int(images.shape[-1] / ratio)
        images = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False).clamp(-1.0, 1.0)
        top, left = (height - new_h) // 2, (width - new_w) // 2
        pad = (left, width - new_w - left, top, height - new_h - top)
        if pad_after_scaling:
            return F.pad(images * 2.0 - 1.0, pad, value=-1.0)
        images = F.pad(images, pad, value=-1.0)
    return images * 2.0 - 1.0


def camera_images(images, height: int, width: int, pad_after_scaling: bool = False, device=None) -> torch.Tensor:
    """uint8 camera frames [B, H, W, 3] (numpy or tensor) -> model images [B, 3, height, width]."""
    frames = images if isinstance(images, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(images))
    frames = frames.to(device).permute(0, 3, 1, 2).float() / 255.0
    return resize_with_pad(frames, height, width, pad_after_scaling)


def pad_to(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-pad the last dimension to ``dim``."""
    if x.shape[-1] > dim:
        raise ValueError(f"a vector of {x.shape[-1]} values does not fit the model's {dim}")
    return F.pad(x, (0, dim - x.shape[-1]))


@dataclass
class Normalization:
    """Per-feature normalisation: ``modes`` by feature type (STATE, ACTION), ``stats`` by
    ``<feature>.<mean|std|min|max>``."""

    modes: Dict[str, str] = field(default_factory=lambda: {"STATE": "IDENTITY", "ACTION": "IDENTITY"})
    stats: Dict[str, torch.Tensor] = field(default_factory=dict)
    eps: float = 1e-8

    def _params(self, key: str, kind: str):
        mode = self.modes.get(kind, "IDENTITY")
        if mode not in MODES:
            raise ValueError(f"normalisation mode {mode!r} for {kind} is not supported; supported: {list(MODES)}")
        names = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max")}.get(mode, ())
        missing = [f"{key}.{n}" for n in names if f"{key}.{n}" not in self.stats]
        if missing:
            raise KeyError(f"{mode} normalisation of {key} needs the statistics {missing}, which were not given")
        return mode, [self.stats[f"{key}.{n}"] for n in names]

    def check_dims(self, state_dim: int, action_dim: int, source: str) -> None:
        """Start-up check: every statistic the modes need is there and has the env's size."""
        for key, kind, dim in ((STATE_KEY, "STATE", state_dim), (ACTION_KEY, "ACTION", action_dim)):
            try:
                _, params = self._params(key, kind)
            except KeyError as err:
                raise ValueError(f"{err.args[0]} ({source}): give them as model.normalization_stats, e.g. "
                                 f"{key}.mean / {key}.std from the dataset the checkpoint was trained on") from None
            for value in params:
                if value.numel() != dim:
                    raise ValueError(
                        f"the {kind.lower()} statistics {key}.* ({source}) have {value.numel()} values and this env's "
                        f"{kind.lower()} has {dim}: the checkpoint was trained on another robot or dataset; give "
                        "statistics for this env as model.normalization_stats (and fine-tune from a checkpoint "
                        "trained on this embodiment)")

    def normalize(self, x: torch.Tensor, key: str, kind: str) -> torch.Tensor:
        mode, params = self._params(key, kind)
        if mode == "MEAN_STD":
            mean, std = (p.to(x) for p in params)
            return (x - mean) / (std + self.eps)
        if mode == "MIN_MAX":
            low, high = (p.to(x) for p in params)
            return (x - low) / (high - low + self.eps) * 2 - 1
        return x

    def unnormalize(self, x: torch.Tensor, key: str, kind: str) -> torch.Tensor:
        mode, params = self._params(key, kind)
        if mode == "MEAN_STD":
            mean, std = (p.to(x) for p in params)
            return x * (std + self.eps) + mean
        if mode == "MIN_MAX":
            low, high = (p.to(x) for p in params)
            return (x + 1) / 2 * (high - low + self.eps) + low
        return x


def read_normalization(folder: str) -> Optional[Normalization]:
    """The statistics LeRobot saved beside a checkpoint: the pre-processor's normaliser, with the
    action statistics of the post-processor's un-normaliser where there is one (what LeRobot
    applies to the actions it outputs); None when the folder has no normaliser."""
    pre = _processor_step(folder, PREPROCESSOR_FILE, "normalizer_processor")
    if pre is None:
        return None
    post = _processor_step(folder, POSTPROCESSOR_FILE, "unnormalizer_processor")
    stats = dict(pre[1])
    if post is not None:
        stats.update({k: v for k, v in post[1].items() if k.startswith(f"{ACTION_KEY}.")})
    return Normalization(modes=dict(pre[0].get("norm_map", {})), stats=stats, eps=float(pre[0].get("eps", 1e-8)))


def _processor_step(folder: str, file: str, registry_name: str):
    """(config, statistics) of one step of a saved LeRobot processor pipeline, or None."""
    from safetensors.torch import load_file

    path = os.path.join(folder, file)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        steps = json.load(f).get("steps", [])
    step = next((s for s in steps if s.get("registry_name") == registry_name), None)
    if step is None:
        return None
    state_file = os.path.join(folder, step.get("state_file", ""))
    if not os.path.isfile(state_file):
        raise FileNotFoundError(f"{path} names the statistics file {state_file}, which is missing")
    return step.get("config", {}), load_file(state_file)


def normalization_from_config(stats: Mapping[str, Sequence[float]], modes: Mapping[str, str]) -> Normalization:
    """Statistics given in YAML (``{"observation.state.mean": [...], ...}``); modes default to
    LeRobot's Pi0 ones (MEAN_STD for state and actions)."""
    return Normalization(modes={"STATE": "MEAN_STD", "ACTION": "MEAN_STD", **dict(modes)},
                         stats={k: torch.tensor(list(v), dtype=torch.float32) for k, v in stats.items()})


def prompt_tokens(texts: Sequence[str], tokenize, max_length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Task texts -> right-padded (ids [B, max_length], mask [B, max_length]); ``tokenize(text) ->
    ids`` (with BOS), applied to the text plus "\\n", as LeRobot's new-line step does."""
    ids = torch.zeros(len(texts), max_length, dtype=torch.long)
    mask = torch.zeros(len(texts), max_length, dtype=torch.bool)
    for row, text in enumerate(texts):
        tokens: List[int] = list(tokenize(f"{text}\n"))[:max_length]
        ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = True
    return ids, mask


def lerobot_pipelines(input_features: Dict[str, dict], output_features: Dict[str, dict], tokenizer_max_length: int,
                      norm_map: Optional[Mapping[str, str]] = None, eps: float = 1e-8,
                      tokenizer_name: str = PALIGEMMA_TOKENIZER) -> Tuple[dict, dict]:
    """The contents of ``policy_preprocessor.json`` and ``policy_postprocessor.json`` as LeRobot
    saves Pi0's pipelines: its steps in its order, the normaliser over every feature and the
    un-normaliser over the outputs, each naming its statistics file (written beside them)."""
    norm_map = dict(LEROBOT_NORM_MAP if norm_map is None else norm_map)
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    preprocessor = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "pi0_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {
            "max_length": tokenizer_max_length, "task_key": "task", "padding_side": "right",
            "padding": "max_length", "truncation": True, "tokenizer_name": tokenizer_name}},
        device,
        {"registry_name": "normalizer_processor", "config": {
            "eps": eps, "features": {**input_features, **output_features}, "norm_map": norm_map},
         "state_file": NORMALIZER_FILE}]}
    postprocessor = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {
            "eps": eps, "features": dict(output_features), "norm_map": norm_map}, "state_file": UNNORMALIZER_FILE},
        device]}
    return preprocessor, postprocessor

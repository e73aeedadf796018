"""The published folder of the state and image policies (MLP, CNN): ``config.json`` (the family,
its architecture and the shapes it was built for) and ``model.safetensors`` (every tensor of the
policy: actor, critic, Gaussian log-std, observation statistics). ``scripts/export.py`` writes it;
``model.path=<folder>`` builds the policy from it, the folder's architecture winning over the
recipe's."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict

from safetensors.torch import load_file, save_file

from embodied_async.export import ExportRequest, ExportResult
from models.mlp.configuration_mlp import PUBLISHED_FORMAT as FORMAT

FORMAT_VERSION = 1
# the config keys that shape the network (the rest, e.g. precision, belong to the run)
ARCHITECTURE_KEYS = {"mlp": ("hidden_sizes", "activation", "init_log_std", "normalize_obs"),
                     "cnn": ("hidden_sizes", "activation", "init_log_std", "normalize_obs", "cnn_channels",
                             "cnn_feature_dim")}


def export_state_policy(request: ExportRequest) -> ExportResult:
    # the architecture the policy was built with: a folder's (model.path) wins over the recipe's
    cfg, spec = getattr(request.policy, "architecture_config", request.model_cfg), request.env_spec
    config = {"format": FORMAT, "version": FORMAT_VERSION, "family": cfg.name,
              "architecture": {k: _plain(getattr(cfg, k)) for k in ARCHITECTURE_KEYS[cfg.name]},
              "observation_shapes": {k: list(v) for k, v in spec.obs_shapes.items() if k in ("states", "main_images")},
              "action_dim": int(spec.action_dim), "num_action_chunks": int(spec.num_action_chunks),
              "action_low": _plain(spec.action_low), "action_high": _plain(spec.action_high)}
    with open(os.path.join(request.folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    state = {k: v.detach().cpu().contiguous() for k, v in request.policy.state_dict().items()}
    save_file(state, os.path.join(request.folder, "model.safetensors"), metadata={"format": "pt"})
    load = (f"Here: `model.name={cfg.name} model.path=<this folder>` in a recipe on an env with the same observation "
            "and action shapes (e.g. `scripts/eval.py <this folder> --recipe <recipe>`, or as the start of another "
            "run). The folder's architecture wins over the recipe's. In plain PyTorch: `safetensors.torch.load_file"
            "(\"model.safetensors\")` holds every tensor; config.json says how they fit.")
    return ExportResult(format=f"{cfg.name.upper()} policy (safetensors + config.json)", load_with=load)


def _plain(value: Any) -> Any:
    """JSON-able: lists for sequences and arrays."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else value


def read_config(folder: str, family: str) -> Dict[str, Any]:
    """``folder/config.json``, checked to be a published policy of ``family``; ValueError naming
    the problem otherwise."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"model.path={folder!r}: cannot read {path} ({err}): point model.path at a folder "
                         "scripts/export.py wrote") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ValueError(f"model.path={folder!r}: {path} is not a policy exported by scripts/export.py")
    if config.get("family") != family:
        raise ValueError(f"model.path={folder!r} holds a '{config.get('family')}' policy and model.name is "
                         f"'{family}': set model.name={config.get('family')}")
    return config


def build_from_folder(policy_cls, cfg, env_spec):
    """``policy_cls`` built with the folder's architecture and loaded with its tensors; the env
    must give the observation and action shapes it was built for."""
    config = read_config(cfg.path, cfg.name)
    cfg = dataclasses.replace(cfg, **config["architecture"])
    env_shapes = {k: list(v) for k, v in env_spec.obs_shapes.items() if k in config["observation_shapes"]}
    expected = (config["observation_shapes"], config["action_dim"], config["num_action_chunks"])
    if (env_shapes, env_spec.action_dim, env_spec.num_action_chunks) != expected:
        raise ValueError(f"model.path={cfg.path!r} was built for observations {expected[0]}, {expected[1]} action "
                         f"values and {expected[2]} actions per decision, and this env gives {env_shapes}, "
                         f"{env_spec.action_dim} and {env_spec.num_action_chunks}: use an env with the same shapes")
    policy = policy_cls(cfg, env_spec)
    policy.architecture_config = cfg
    state = load_file(os.path.join(cfg.path, "model.safetensors"))
    if policy.critic is None:  # a value-free run (grpo) keeps the actor only
        state = {k: v for k, v in state.items() if not k.startswith("critic.")}
    try:
        missing, unexpected = policy.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that do not fit: a config.json edited by hand
        raise ValueError(f"model.path={cfg.path!r}: its tensors do not fit its config.json ({err})") from None
    critic_fresh = [k for k in missing if k.startswith("critic.")]
    if unexpected or len(missing) != len(critic_fresh):
        raise ValueError(f"model.path={cfg.path!r}: its tensors do not fit the {cfg.name} policy (missing "
                         f"{[k for k in missing if k not in critic_fresh][:5]}, unexpected {unexpected[:5]})")
    return policy

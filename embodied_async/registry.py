"""Name -> builder registries for policies and environments.

The framework never imports ``models/`` or ``envs/`` directly. Each known name maps to the module
that registers it; that module is imported only when a config asks for the name, so the heavy
imports (simulators, transformers) happen inside the worker that needs them.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional

# Names a config may use, and the module whose import registers each one.
KNOWN_ENVS: Dict[str, str] = {
    "maniskill": "envs.maniskill",
}
KNOWN_MODELS: Dict[str, str] = {
    "mlp": "models.mlp",
    "cnn": "models.cnn",
    "openvla": "models.openvla",
}

_ENV_BUILDERS: Dict[str, Callable] = {}
_MODEL_BUILDERS: Dict[str, Callable] = {}


def register_env(name: str, module: str | None = None) -> Callable:
    """Decorator: register an env builder ``builder(env_cfg, num_envs, seed, rank) -> Env``."""

    def decorator(builder: Callable) -> Callable:
        _ENV_BUILDERS[name] = builder
        if module is not None:
            KNOWN_ENVS.setdefault(name, module)
        else:
            KNOWN_ENVS.setdefault(name, builder.__module__)
        return builder

    return decorator


def register_model(name: str, module: str | None = None) -> Callable:
    """Decorator: register a policy builder ``builder(model_cfg, env_spec) -> Policy``."""

    def decorator(builder: Callable) -> Callable:
        _MODEL_BUILDERS[name] = builder
        KNOWN_MODELS.setdefault(name, module or builder.__module__)
        return builder

    return decorator


def _import_family(kind: str, name: str, known: Dict[str, str]) -> None:
    """Import the module that registers ``name`` (its builder and, where it has one, its check)."""
    if name not in known:
        raise KeyError(f"unknown {kind} '{name}'; registered {kind}s: {', '.join(sorted(known))}")
    importlib.import_module(known[name])


def _lookup(kind: str, name: str, known: Dict[str, str], builders: Dict[str, Callable]) -> Callable:
    if name not in builders:
        _import_family(kind, name, known)
        if name not in builders:
            raise KeyError(f"module '{known[name]}' did not register {kind} '{name}'")
    return builders[name]


def env_builder(name: str) -> Callable:
    return _lookup("env", name, KNOWN_ENVS, _ENV_BUILDERS)


def model_builder(name: str) -> Callable:
    return _lookup("model", name, KNOWN_MODELS, _MODEL_BUILDERS)


# Start-up config checks a family may register: ``check(section_cfg) -> None`` raising ValueError
# (the message says what is wrong and how to fix it). ``validate.check`` calls them before any
# worker starts, so a family can reject what only it knows (e.g. a simulator's task ids).
_ENV_CHECKS: Dict[str, Callable] = {}


def register_env_check(name: str) -> Callable:
    """Decorator: register ``check(env_cfg) -> None`` (raises ValueError) for env family ``name``."""

    def decorator(check: Callable) -> Callable:
        _ENV_CHECKS[name] = check
        return check

    return decorator


def env_config_check(name: str) -> Optional[Callable]:
    """The config check env family ``name`` registered, or None; imports the family lazily."""
    if name not in _ENV_CHECKS:
        _import_family("env", name, KNOWN_ENVS)
    return _ENV_CHECKS.get(name)

"""Policy and env families: discovered as plugins, looked up by name, built lazily.

A family is its config class: a subclass of ``ModelConfig`` (policies) or ``EnvConfig`` (envs)
whose ``name`` default is the family name and whose ``builder`` names the callable that builds it.
Families are found through Python entry points, so an installed package adds one without
touching this repository::

    [project.entry-points."embodied_async.policies"]
    my_policy = "my_package.configuration_my_policy:MyPolicyConfig"

(``embodied_async.envs`` for env families). The entry point names a light module (dataclasses
only): every registered family's config is loaded at start-up to type-check the YAML, while the
builder's module (torch models, simulators) is imported only inside the worker that builds it.
``register_family`` adds one in this process only (tests, notebooks).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
from typing import Any, Callable, Dict, Optional

from embodied_async.config.checks import ConfigError
from embodied_async.config.schema import EnvConfig, ModelConfig
from embodied_async.contracts import Env, Policy, missing_members

PROJECT_DISTRIBUTION = "embodied-async"  # whose families must load from beside embodied_async/
ENTRY_POINT_GROUPS = {"model": "embodied_async.policies", "env": "embodied_async.envs"}
BASE_CONFIGS = {"model": ModelConfig, "env": EnvConfig}
PROTOCOLS = {"model": Policy, "env": Env}
KINDS = {"model": "policy", "env": "env"}

_registered: Dict[str, Dict[str, type]] = {"model": {}, "env": {}}
_discovered: Optional[Dict[str, Dict[str, type]]] = None
_broken: Dict[str, Dict[str, str]] = {"model": {}, "env": {}}  # entry points that failed to load


def _check_family_class(section: str, name: str, cls: Any, origin: str) -> type:
    base = BASE_CONFIGS[section]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{origin} must be a dataclass subclassing {base.__module__}.{base.__name__}, got {cls!r}")
    default_name = getattr(cls(), "name", None)
    if default_name != name:
        raise TypeError(f"{origin}: {cls.__name__}.name defaults to {default_name!r}; it must default to the "
                        f"family name {name!r}")
    if ":" not in (cls.builder or ""):
        raise TypeError(f"{origin}: {cls.__name__}.builder must name the builder as 'module:callable'")
    return cls


def register_family(section: str, config_cls: type) -> type:
    """Register ``config_cls`` as family ``config_cls().name`` of ``section`` ("model" or "env") in
    this process. Returns the class, so it can decorate it."""
    name = config_cls().name
    existing = families(section).get(name)
    if existing is not None and _qualified(existing) != _qualified(config_cls):
        raise ValueError(f"{KINDS[section]} family {name!r} is already registered by {_qualified(existing)}; "
                         f"give {_qualified(config_cls)} another name")
    _registered[section][name] = _check_family_class(section, name, config_cls, f"family {name!r}")
    return config_cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _discover() -> Dict[str, Dict[str, type]]:
    found: Dict[str, Dict[str, type]] = {"model": {}, "env": {}}
    for section, group in ENTRY_POINT_GROUPS.items():
        _broken[section].clear()
        values: Dict[str, str] = {}
        for entry in importlib.metadata.entry_points(group=group):
            origin = f"entry point '{entry.name} = {entry.value}' (group {group})"
            if values.setdefault(entry.name, entry.value) != entry.value:  # two packages, one name
                found[section].pop(entry.name, None)
                _broken[section][entry.name] = (
                    f"two installed packages register the {KINDS[section]} family {entry.name!r} "
                    f"('{values[entry.name]}' and '{entry.value}', group {group}): uninstall one or rename its "
                    "entry point")
                continue
            if entry.name in _broken[section]:
                continue
            shadowed = _shadowed(entry)
            if shadowed:
                _broken[section][entry.name] = f"{origin}: {shadowed}"
                continue
            try:
                found[section][entry.name] = _check_family_class(section, entry.name, entry.load(), origin)
            except Exception as err:  # a broken plugin fails only the runs that ask for it
                _broken[section][entry.name] = f"{origin} could not be loaded: {type(err).__name__}: {err}"
    return found


def _shadowed(entry) -> Optional[str]:
    """Why a family of this project would load another project's code, or None. This project's
    families live in top-level packages beside ``embodied_async`` (short, common names a user's
    own folder or another installed package may also take): the one Python finds first must be
    ours."""
    if entry.dist is None or entry.dist.name.replace("_", "-") != PROJECT_DISTRIBUTION:
        return None
    top = entry.value.split(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = os.path.abspath(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations \
        else (spec.origin if spec else None)
    if found is not None and os.path.dirname(found) == ours:
        return None
    return (f"the package '{top}' Python finds first is {found or 'missing'}, not this project's "
            f"{os.path.join(ours, top)}: another project's '{top}' shadows it (a folder of that name in the working "
            f"directory or on PYTHONPATH, or an installed package); run from elsewhere, or uninstall or rename it")


def families(section: str, refresh: bool = False) -> Dict[str, type]:
    """Every family of ``section`` ("model" or "env"): name -> config class."""
    global _discovered
    if _discovered is None or refresh:
        _discovered = _discover()
    return {**_discovered[section], **_registered[section]}


def family_config(section: str, name: Any) -> type:
    """The config class of family ``name``; a ConfigError naming the registered ones otherwise."""
    known = families(section)
    if name not in known:
        known = families(section, refresh=True)  # a package installed since the last look
    if name in known:
        return known[name]
    if name in _broken[section]:
        raise ConfigError(f"{section}.name={name!r}: {_broken[section][name]}")
    kind = KINDS[section]
    if name in (None, "???"):
        what = f"{section}.name is not set"
    else:
        what = f"{section}.name={name!r} is not a registered {kind} family"
    hint = ""
    if not known:  # not even this repository's own families: its entry points are not installed
        hint = (" (none at all: the project's entry points are not installed in this Python environment; "
                "re-install it with 'bash scripts/setup.sh' or '.venv/bin/pip install -e .')")
    raise ConfigError(
        f"{what}; registered: {', '.join(sorted(known)) or 'none'}{hint}. Set {section}.name to one of them (or "
        f"compose a {section} config from configs/{section}/); a new family registers its config class under the "
        f"entry point group '{ENTRY_POINT_GROUPS[section]}' (examples/embodiment/README.md, 'Add a policy or an env')")


def _builder(section: str, cfg: Any) -> Callable:
    module, _, attr = type(cfg).builder.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"{section}.name={cfg.name}: its builder '{type(cfg).builder}' cannot be imported "
                          f"({type(err).__name__}: {err})") from err


def _checked(section: str, cfg: Any, built: Any) -> Any:
    missing = missing_members(built, PROTOCOLS[section])
    if missing:
        protocol = PROTOCOLS[section].__name__
        raise TypeError(f"{section}.name={cfg.name}: the object built by '{type(cfg).builder}' lacks "
                        f"{', '.join(missing)} of the {protocol} protocol (embodied_async/contracts.py)")
    return built


def build_policy(model_cfg: ModelConfig, env_spec, device=None, logprob_type: str = "chunk_level") -> Policy:
    """The policy ``model_cfg``'s family builds for ``env_spec``, checked against ``Policy``, on
    ``device``. A builder that takes a ``device`` argument gets it, to load large weights there
    directly (eight processes each holding a 7B copy in host memory at start-up would need
    ~120 GB); the policy is then moved there as a whole, for the parts built elsewhere.
    ``logprob_type`` (``algorithm.logprob_type``): "token_level" makes the policy report one
    log-prob per executed action dimension (a family that lists it in ``logprob_types``)."""
    builder = _builder("model", model_cfg)
    if device is not None and "device" in inspect.signature(builder).parameters:
        policy = builder(model_cfg, env_spec, device=device)
    else:
        policy = builder(model_cfg, env_spec)
    if logprob_type != "chunk_level":  # validation checked that the family reports it (logprob_types)
        policy.logprob_type = logprob_type
    return _checked("model", model_cfg, policy if device is None else policy.to(device))


def reported_logprob_type(cfg) -> str:
    """The log-probs the workers' policy reports for a run ``cfg``: per executed action entry
    ("token_level") where ``algorithm.logprob_type`` asks for them, and also where the env executes
    chunks of several actions and the family can report entries: an episode that ends part-way
    through a chunk leaves the rest of it unexecuted, and the update leaves those actions out of
    the decision's log-prob (summing the executed entries back under chunk_level)."""
    if cfg.algorithm.logprob_type == "token_level":
        return "token_level"
    entries = cfg.env.num_action_chunks > 1 and "token_level" in type(cfg.model).logprob_types
    return "token_level" if entries else "chunk_level"


def build_env(env_cfg: EnvConfig, num_envs: int, seed: int) -> Env:
    """``num_envs`` sub-envs of ``env_cfg``'s family, checked against ``Env``."""
    return _checked("env", env_cfg, _builder("env", env_cfg)(env_cfg, num_envs, seed))

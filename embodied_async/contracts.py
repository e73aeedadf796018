"""The contracts between the framework and its plugins: what a policy and an env must offer.

A policy family (``models/``) and an env family (``envs/``) are plugins: the workers build them
through ``registry.build_policy`` / ``registry.build_env`` and then rely only on what is written
here. Both check a built object against its protocol at start-up, so a missing method is an error naming it, not an
``AttributeError`` halfway through a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

import numpy as np

from embodied_async.data import EnvOutput, Observation, PolicyOutput


@dataclass(frozen=True)
class EnvSpec:
    """What an env tells the policy builder about its observations and actions.

    ``obs_shapes``/``obs_dtypes`` describe one sub-env's entry of every array observation key
    (``states`` ``(D,)`` float32, ``main_images`` ``(H, W, 3)`` uint8, ...); ``task_descriptions``
    is always present and not listed. A decision is a chunk of ``num_action_chunks`` actions of
    ``action_dim`` values within ``[action_low, action_high]``. ``reports_success`` says whether
    ``EnvOutput.successes`` means anything for this task (when not, success rates are logged as
    null rather than 0); ``reports_fail`` whether it ends episodes as failures (always terminal).
    ``control_hz``: actions executed per second of simulated time (a dataset of demonstrations
    must have this frame rate); None where the family does not say. ``instruction``: the first
    sub-env's; ``instructions``: each sub-env's (``task_descriptions`` of the reset it was built
    from); ``tasks``: the task of each sub-env where the env runs several (``env.tasks``), empty
    where it runs one.
    """

    obs_shapes: Dict[str, Tuple[int, ...]]
    obs_dtypes: Dict[str, str]
    action_dim: int
    num_action_chunks: int = 1
    action_low: Tuple[float, ...] = ()
    action_high: Tuple[float, ...] = ()
    instruction: Optional[str] = None
    reports_success: bool = True
    reports_fail: bool = False
    control_hz: Optional[float] = None
    tasks: Tuple[str, ...] = ()
    instructions: Tuple[str, ...] = ()

    @classmethod
    def from_observation(cls, obs: Observation, action_dim: int, num_action_chunks: int = 1,
                         action_low: Sequence[float] = (), action_high: Sequence[float] = (),
                         **flags) -> "EnvSpec":
        """The spec of a batched observation dict (leading dim ``B``), as an env builds it after reset."""
        arrays = {k: np.asarray(v) for k, v in obs.items() if k != "task_descriptions"}
        flags.setdefault("instructions", tuple(str(text) for text in obs.get("task_descriptions", ())))
        return cls(obs_shapes={k: tuple(v.shape[1:]) for k, v in arrays.items()},
                   obs_dtypes={k: v.dtype.name for k, v in arrays.items()}, action_dim=int(action_dim),
                   num_action_chunks=int(num_action_chunks), action_low=tuple(float(v) for v in action_low),
                   action_high=tuple(float(v) for v in action_high), **flags)


# Env.reset's seed: an int (sub-env i is seeded with seed + i), one seed per sub-env (sub-envs
# given the same seed start from the same state: algorithm.adv_type=grpo's groups), or None
# (every sub-env continues its own RNG)
ResetSeed = Union[None, int, Sequence[int]]


def sub_env_seeds(seed: ResetSeed, num_envs: int) -> Optional[List[int]]:
    """The seed of each of ``num_envs`` sub-envs for ``Env.reset(seed)`` (None: none reseeded)."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = [int(s) for s in seed]
    if len(seeds) != num_envs:
        raise ValueError(f"reset got {len(seeds)} seeds for {num_envs} sub-envs: give one per sub-env, or one int")
    return seeds


@runtime_checkable
class Env(Protocol):
    """``num_envs`` sub-environments stepped together (env families, ``envs/``).

    ``step`` executes one action chunk ``[B, C, A]`` in order, sums the rewards of its sub-steps,
    auto-resets a sub-env that finished (keeping its last observation in ``final_obs``) and marks
    with ``EnvOutput.bootstrap`` which finished sub-envs bootstrap (``data.bootstrap_flags``, the
    one rule every family applies). ``reset(seed)`` starts every sub-env anew (``ResetSeed``: one int,
    one seed per sub-env, or None). ``reset_envs`` resets only the given sub-envs (the env worker
    uses it to drop a sub-env whose values went non-finite) and returns the full observation.
    """

    num_envs: int
    spec: EnvSpec

    def reset(self, seed: ResetSeed = None) -> EnvOutput: ...

    def step(self, actions: np.ndarray) -> EnvOutput: ...

    def reset_envs(self, indices: Sequence[int]) -> Observation: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SubStep:
    """What one simulator step of one sub-env reports to ``SerialEnv``. ``terminated``: the task
    ended the episode (a success where the family ends on success, a failure); ``truncated``: the
    time limit; ``fail``: a failure (always terminal, never bootstrapped)."""

    reward: float
    success: bool
    terminated: bool
    truncated: bool
    fail: bool = False


@runtime_checkable
class SubEnv(Protocol):
    """One simulator of an env family that steps its sub-envs one after another in its process
    (``serial_env.SerialEnv`` runs the chunks, the auto-resets and the final observations over
    them, the same for every such family).

    - ``instruction``: its task's instruction (sub-envs of one env may differ).
    - ``reset(seed)``: start a new episode (``seed``: reseed first; None continues its RNG).
    - ``step(action [A]) -> SubStep``: one simulator step; it applies its own time limit.
    - ``observe() -> Observation``: the current observation as a batch of one (arrays ``[1, ...]``,
      no ``task_descriptions``).
    - ``close()``.
    """

    instruction: str

    def reset(self, seed: Optional[int] = None) -> None: ...

    def step(self, action: np.ndarray) -> SubStep: ...

    def observe(self) -> Observation: ...

    def close(self) -> None: ...


@runtime_checkable
class ConcurrentSubEnv(Protocol):
    """A sub-env whose simulator runs elsewhere (a child process): a call is sent (``send_call``)
    and its reply read later (``receive_reply``), so ``SerialEnv`` has all of them work at once. ``call`` is a
    ``SubEnv`` method or ``run_chunk`` (``serial_env.run_chunk`` run where the simulator is)."""

    def send_call(self, call: str, *args) -> None: ...

    def receive_reply(self, call: str) -> Any: ...


@runtime_checkable
class Policy(Protocol):
    """An actor-critic the rollout samples from and the actor trains (policy families, ``models/``).

    - ``predict(obs, mode)``: ``mode="train"`` samples (and lets the policy's observation
      normalisers record what they see), ``"eval"`` acts deterministically. Returns actions
      ``[B, C, A]``, one log-prob and one value per decision, and ``forward_inputs``: exactly the
      tensors ``evaluate`` needs to re-score the same decision.
    - ``evaluate(forward_inputs, actions) -> (logprobs, entropy, values)`` with the log-prob
      semantics of ``predict``, with gradients.
    - ``value(obs)``: values ``[B]`` of observations (bootstrapping from final observations).
    - ``value_parameter_prefixes``: names of the value head's parameters start with one of these
      (they get ``actor.value_lr``).
    - optional ``rl_only_parameter_prefixes``: the heads only RL trains (value head, a noise head),
      which a supervised checkpoint lacks: loading one (``model.init_from``, evaluation, export)
      starts them as the builder made them (``value_parameter_prefixes`` when not declared).

    It is a ``torch.nn.Module``: the actor shards it with FSDP2 and the rollout loads published
    weights into it by parameter name. Parameters with ``requires_grad=False`` (a frozen backbone
    under LoRA) are neither trained nor published; trainable ones are kept in float32 by the
    actor. Optional: ``fsdp_units()``, the submodules (e.g. transformer layers) the actor shards
    as their own FSDP units, so a large model is gathered one unit at a time.
    """

    value_parameter_prefixes: Tuple[str, ...]

    def predict(self, obs: Observation, mode: str = "train") -> PolicyOutput: ...

    def evaluate(self, forward_inputs: Dict[str, object], actions: object) -> Tuple[object, object, object]: ...

    def value(self, obs: Observation) -> object: ...

    def named_parameters(self, *args, **kwargs) -> Iterator: ...

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False): ...


@runtime_checkable
class SupervisedPolicy(Protocol):
    """A policy that can also learn from demonstrations (``runner.mode: sft``), as its own
    reference code trains it (token cross-entropy, flow matching, a Gaussian likelihood).

    - ``supervised_loss(obs, actions, action_pad) -> (losses [B], metrics)``: ``obs`` as the env
      gives it, ``actions`` the expert's next ``supervised_horizon`` actions ``[B, H, A]`` from
      each observation on, ``action_pad`` ``[B, H]`` True where an episode had ended (leave them
      out). ``losses`` one per sample, with gradients; ``metrics`` per-sample means (floats)
      under their final names (``train/sft/...``).
    - ``supervised_horizon``: how many future actions a sample needs (a chunked policy's chunk).
    - Optional ``set_input_statistics(stats)``: the dataset's statistics per policy input
      (``"states"``, ``"actions"``, ...; LeRobot's min/max/mean/std/...), given once before
      training so the policy normalises its inputs with them.
    """

    supervised_horizon: int

    def supervised_loss(self, obs: Observation, actions: object, action_pad: object) -> Tuple[object, Dict]: ...


def missing_members(obj: object, protocol: type) -> list:
    """Names ``protocol`` requires that ``obj`` lacks (empty when it conforms)."""
    names = [n for n in getattr(protocol, "__protocol_attrs__", ()) if not n.startswith("_")]
    if not names:  # Python < 3.12 keeps them elsewhere
        names = [n for n in dir(protocol) if not n.startswith("_") and n not in dir(Protocol)]
        names += list(getattr(protocol, "__annotations__", {}))
    return sorted({n for n in names if not hasattr(obj, n)})


__all__ = ["Env", "EnvSpec", "Policy", "SubEnv", "SubStep", "SupervisedPolicy", "missing_members"]

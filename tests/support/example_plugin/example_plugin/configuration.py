"""The two families' configs: light (dataclasses only), loaded at start-up to type-check YAML."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from embodied_async.config.checks import bound
from embodied_async.config.schema import EnvConfig, ModelConfig


@dataclass
class LinearPolicyConfig(ModelConfig):
    name: str = "linear_gaussian"
    init_log_std: float = -0.5

    builder: ClassVar[str] = "example_plugin.policy:LinearGaussianPolicy"

    def check(self) -> None:
        bound(self.init_log_std, "model.init_log_std", lambda v: -5.0 <= v <= 2.0, "must be in [-5, 2]",
              "use e.g. -0.5")


@dataclass
class DriftPointConfig(EnvConfig):
    name: str = "drift_point"
    dims: int = 3  # the point's dimensions (= the action's)
    horizon: int = 8  # steps per episode (a time limit: bootstrapped)
    num_envs: int = 4

    builder: ClassVar[str] = "example_plugin.env:DriftPointEnv"

    def check(self) -> None:
        bound(self.dims, "env.dims", lambda v: v >= 1, "must be >= 1", "use e.g. 3")
        bound(self.horizon, "env.horizon", lambda v: v >= 1, "must be >= 1", "use e.g. 8")

"""Config of the MLP policy family (``model.name: mlp``): every key and its default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from embodied_async.config.checks import bound, choice
from embodied_async.config.schema import ModelConfig
from models.activations import ACTIVATIONS


@dataclass
class MLPConfig(ModelConfig):
    """Separate policy and value MLPs on the ``states`` vector; Gaussian actions."""

    name: str = "mlp"
    hidden_sizes: List[int] = field(default_factory=lambda: [256, 256, 256])
    activation: str = "tanh"  # a name of models.activations.ACTIVATIONS
    init_log_std: float = -0.5
    # running mean/std normalisation of the states, learned by the actor from what it trains on
    normalize_obs: bool = True

    builder: ClassVar[str] = "models.mlp.modeling_mlp:MLPPolicy"
    cpu_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_mlp"

    def check(self) -> None:
        choice(self.activation, "model.activation", tuple(ACTIVATIONS))
        bound(list(self.hidden_sizes), "model.hidden_sizes", lambda v: all(w >= 1 for w in v),
              "must list positive layer widths", "use e.g. [256, 256, 256] (or [] for a linear policy)")

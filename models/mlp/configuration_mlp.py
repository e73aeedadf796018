"""Config of the MLP policy family (``model.name: mlp``): every key and its default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional

from embodied_async.config.checks import bound, choice, require
from embodied_async.config.schema import ModelConfig
from models.activations import ACTIVATIONS

# what scripts/export.py writes in a state policy's config.json (models/mlp/published.py)
PUBLISHED_FORMAT = "embodied_async.state_policy"


@dataclass
class MLPConfig(ModelConfig):
    """Separate policy and value MLPs on the ``states`` vector; Gaussian actions."""

    name: str = "mlp"
    hidden_sizes: List[int] = field(default_factory=lambda: [256, 256, 256])
    activation: str = "tanh"  # a name of models.activations.ACTIVATIONS
    init_log_std: float = -0.5
    # running mean/std normalisation of the states, learned by the actor from what it trains on
    normalize_obs: bool = True
    # a folder scripts/export.py wrote: the policy starts from its weights, and its config.json's
    # architecture (hidden_sizes, activation, ...) wins over these keys
    path: Optional[str] = None

    builder: ClassVar[str] = "models.mlp.modeling_mlp:build_mlp_policy"
    exporter: ClassVar[Optional[str]] = "models.mlp.published:export_state_policy"
    cpu_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_mlp"

    default_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_mlp"

    @classmethod
    def recognizes(cls, target: str, config: Optional[Dict]) -> bool:
        """A folder scripts/export.py wrote for this family."""
        return bool(config) and config.get("format") == PUBLISHED_FORMAT and config.get("family") == "mlp"

    def check(self) -> None:
        choice(self.activation, "model.activation", tuple(ACTIVATIONS))
        bound(list(self.hidden_sizes), "model.hidden_sizes", lambda v: all(w >= 1 for w in v),
              "must list positive layer widths", "use e.g. [256, 256, 256] (or [] for a linear policy)")
        if self.path is not None:
            require(os.path.isfile(os.path.join(os.path.expanduser(self.path), "config.json")),
                    f"model.path={self.path!r} is not a folder with a config.json: point it at a folder "
                    "scripts/export.py wrote")

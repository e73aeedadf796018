"""Config of the CNN policy family (``model.name: cnn``): the MLP family's keys plus the encoder's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional

from embodied_async.config.checks import bound
from models.mlp.configuration_mlp import PUBLISHED_FORMAT, MLPConfig


@dataclass
class CNNConfig(MLPConfig):
    """A conv encoder on ``main_images`` (plus normalised ``states``) under MLP policy and value heads."""

    name: str = "cnn"
    # conv channels of the image encoder (stride 2 each) and the size of its feature vector
    cnn_channels: List[int] = field(default_factory=lambda: [16, 32, 32])
    cnn_feature_dim: int = 256

    builder: ClassVar[str] = "models.cnn.modeling_cnn:build_cnn_policy"
    cpu_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_cnn"

    default_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_cnn"

    @classmethod
    def recognizes(cls, target: str, config: Optional[Dict]) -> bool:
        """A folder scripts/export.py wrote for this family."""
        return bool(config) and config.get("format") == PUBLISHED_FORMAT and config.get("family") == "cnn"

    def check(self) -> None:
        super().check()
        bound(list(self.cnn_channels), "model.cnn_channels", lambda v: len(v) >= 1 and all(c >= 1 for c in v),
              "must list one or more positive channel counts", "use e.g. [16, 32, 32]")
        bound(self.cnn_feature_dim, "model.cnn_feature_dim", lambda v: v >= 1, "must be >= 1", "use e.g. 256")

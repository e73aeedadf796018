"""LoRA settings shared by the policy families that fine-tune a large pretrained model (peft)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from embodied_async.config.checks import bound


@dataclass
class LoraConfig:
    enabled: bool = False
    rank: int = 32
    alpha: int = 32
    dropout: float = 0.0
    # module names to adapt, or ["all-linear"]
    target_modules: List[str] = field(default_factory=lambda: ["all-linear"])

    def check(self, key: str) -> None:
        """``key``: where this section sits (e.g. "model.lora"), for the messages."""
        if not self.enabled:
            return
        bound(self.rank, f"{key}.rank", lambda v: v >= 1, "must be >= 1", "use e.g. 32")
        bound(self.dropout, f"{key}.dropout", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)", "use e.g. 0.0")

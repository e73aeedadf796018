"""LoRA settings shared by the policy families that fine-tune a large pretrained model (peft)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from embodied_async.config.checks import bound, require


@dataclass
class LoraConfig:
    enabled: bool = False
    rank: int = 32
    alpha: int = 32
    dropout: float = 0.0
    # module names to adapt (matched by suffix anywhere in the model), or ["all-linear"] (the
    # family says which linear layers that covers)
    target_modules: List[str] = field(default_factory=lambda: ["all-linear"])
    # peft's init_lora_weights: true (A Kaiming-uniform, B zero), "gaussian" (A ~ N(0, 1/rank),
    # B zero); either way the adapted model starts equal to the base model
    init_weights: Any = True

    def check(self, key: str) -> None:
        """``key``: where this section sits (e.g. "model.lora"), for the messages."""
        if not self.enabled:
            return
        bound(self.rank, f"{key}.rank", lambda v: v >= 1, "must be >= 1", "use e.g. 32")
        require(self.init_weights in (True, "gaussian"),
                f"{key}.init_weights={self.init_weights!r}: use true (peft's default) or \"gaussian\"")
        bound(self.dropout, f"{key}.dropout", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)", "use e.g. 0.0")

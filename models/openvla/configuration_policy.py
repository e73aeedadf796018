"""Config of the OpenVLA policy family (``model.name: openvla``): every key and its default.

(``configuration_openvla.py`` beside it is the checkpoint's own architecture config.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple

from embodied_async.config.checks import bound, choice
from embodied_async.config.schema import ModelConfig
from models.checkpoints import check_checkpoint_path, fetch_checkpoint, resolve_checkpoint
from models.configuration_lora import LoraConfig


@dataclass
class OpenVLAPolicyConfig(ModelConfig):
    """OpenVLA (official checkpoints, loaded natively) with a value head, sampled over action tokens."""

    name: str = "openvla"
    # a local checkpoint folder or a Hugging Face repo id ("owner/name")
    path: Optional[str] = None
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    # which norm_stats entry un-normalises actions (None: the checkpoint's only one)
    unnorm_key: Optional[str] = None
    # the sampling distribution over the 256 action bins (also the one log-probs are computed under)
    temperature: float = 1.0
    top_k: Optional[int] = None
    # evaluation samples at this temperature (the RLinf recipe: 0.6); None: greedy actions
    eval_temperature: Optional[float] = None
    value_head_hidden_sizes: List[int] = field(default_factory=lambda: [1024, 512])
    # what the value head reads: "prompt", the LLM's last hidden state of the prompt (image and
    # instruction); "privileged_states", the env's privileged state vector (env.privileged_states:
    # an asymmetric critic for simulators; actions still come from the images alone)
    value_input: str = "prompt"
    # resized uint8 images in the trajectory instead of float pixel values (8x smaller)
    store_raw_images: bool = False
    # image resizing: "torch" on the policy's device, "pil" (the official processor, bit-exact),
    # "auto": torch on a GPU, PIL on a CPU (agree within 2 of 255 levels)
    image_preprocessing: str = "auto"
    # build a tiny random-init checkpoint at model.path when that folder does not exist yet
    # (CPU smoke runs and tests: it is saved in the official format and loaded back by path)
    tiny_random_init: bool = False
    # the side of the images the tiny checkpoint's ViTs take (224 as released; 112 has a quarter of
    # the patches, for CPU runs); a tiny checkpoint already at model.path must have been made so
    tiny_image_size: int = 224

    builder: ClassVar[str] = "models.openvla.policy_openvla:build_openvla_policy"
    logprob_types: ClassVar[Tuple[str, ...]] = ("chunk_level", "token_level")
    cpu_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_openvla_tiny"
    exporter: ClassVar[Optional[str]] = "models.openvla.export:export_openvla"
    memory_model: ClassVar[Optional[str]] = "models.openvla.memory"
    default_recipe: ClassVar[Optional[str]] = "maniskill_async_ppo_openvla"


    @classmethod
    def recognizes(cls, target: str, config: Optional[Dict]) -> bool:
        """The official checkpoint format (``model_type`` "openvla"), or a hub id naming OpenVLA."""
        if config is not None:
            return config.get("model_type") == "openvla" or "OpenVLAForActionPrediction" in config.get(
                "architectures", [])
        return "openvla" in target.lower()

    def check(self) -> None:
        bound(self.temperature, "model.temperature", lambda v: v > 0, "must be > 0",
              "use 1.0 to sample from the policy as is")
        bound(self.eval_temperature, "model.eval_temperature", lambda v: v > 0, "must be > 0", "use e.g. 0.6",
              null="for greedy evaluation")
        bound(self.top_k, "model.top_k", lambda v: v >= 1, "must be >= 1", "use e.g. 50",
              null="to sample from all action tokens")
        choice(self.image_preprocessing, "model.image_preprocessing", ("auto", "torch", "pil"))
        choice(self.value_input, "model.value_input", ("prompt", "privileged_states"))
        bound(self.tiny_image_size, "model.tiny_image_size", lambda v: v >= 28 and v % 14 == 0,
              "must be a multiple of the 14 px patch, at least 28", "use 224 or 112")
        self.lora.check("model.lora")
        self._check_path()

    def checkpoint_folder(self) -> Optional[str]:
        return resolve_checkpoint(self.path, "the OpenVLA")

    def fetch(self) -> None:
        fetch_checkpoint(self.path, self.tiny_random_init, "the OpenVLA")

    def _check_path(self) -> None:
        check_checkpoint_path(self.path, self.tiny_random_init, "openvla/openvla-7b", "an OpenVLA")

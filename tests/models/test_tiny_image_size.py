"""model.tiny_image_size: the tiny random checkpoints of OpenVLA and Pi0 made for smaller images
(fewer 14 px patches, the CPU miniature's 112 px) act on the env's images like the 224 px ones, and
a tiny checkpoint already made for another size is refused, naming the fix."""

import json
import os

import numpy as np
import pytest
from test_supervised_loss import ACTION_DIM, demonstrations, spec

from embodied_async.config import ConfigError
from embodied_async.registry import build_policy
from models.openvla.configuration_policy import OpenVLAPolicyConfig
from models.pi0.configuration_policy import Pi0PolicyConfig

CONFIGS = {
    "openvla": lambda folder, size: OpenVLAPolicyConfig(path=folder, tiny_random_init=True, unnorm_key="tiny",
                                                        value_head_hidden_sizes=[16], tiny_image_size=size),
    "pi0": lambda folder, size: Pi0PolicyConfig(path=folder, tiny_random_init=True, tokenizer="words",
                                                value_head_hidden_sizes=[16], camera_keys=["main_images"],
                                                tiny_image_size=size),
}
PATCH_KEYS = {"openvla": "vision_backbone.featurizer.pos_embed", "pi0": "position_embedding.weight"}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_tiny_checkpoint_for_112_px_images_has_a_quarter_of_the_patches_and_acts(family, tmp_path):
    chunks = 5 if family == "pi0" else 1
    sizes = {}
    for size in (224, 112):
        policy = build_policy(CONFIGS[family](str(tmp_path / f"tiny_{size}"), size), spec(chunks)).eval()
        patches = [p for name, p in policy.named_parameters() if name.endswith(PATCH_KEYS[family])]
        assert len(patches) == 1, [n for n, _ in policy.named_parameters() if "pos" in n][:5]
        sizes[size] = patches[0].shape[-2]
        obs, _, _ = demonstrations(1)
        out = policy.predict(obs, mode="eval")
        actions = np.asarray(out.actions)
        assert actions.shape[-1] == ACTION_DIM and np.isfinite(actions).all()
    assert sizes[224] == 16 * 16  # position embeddings: one per 14 px patch
    assert sizes[112] == 8 * 8
    # the folder keeps its size: asking for another one there is refused, naming both ways out
    with pytest.raises(ValueError, match=r"takes 112 px images, not model.tiny_image_size=224.*remove that folder"):
        build_policy(CONFIGS[family](str(tmp_path / "tiny_112"), 224), spec(chunks))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_size_that_is_no_multiple_of_the_patch_is_refused_at_start_up(family, tmp_path):
    with pytest.raises(ConfigError, match="model.tiny_image_size"):
        CONFIGS[family](str(tmp_path / "t"), 100).check()
    assert not os.path.exists(tmp_path / "t")


def test_the_openvla_processor_of_a_112_px_checkpoint_resizes_to_112(tmp_path):
    build_policy(CONFIGS["openvla"](str(tmp_path / "tiny"), 112), spec())
    with open(tmp_path / "tiny" / "preprocessor_config.json") as f:
        assert json.load(f)["input_sizes"] == [[3, 112, 112], [3, 112, 112]]

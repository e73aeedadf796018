"""Image + state CNN actor-critic (Gaussian actions)."""

from embodied_async.registry import register_model
from models.cnn.modeling_cnn import CNNPolicy


@register_model("cnn", module="models.cnn")
def build_cnn_policy(model_cfg, env_spec) -> CNNPolicy:
    return CNNPolicy(model_cfg, env_spec)


__all__ = ["CNNPolicy", "build_cnn_policy"]

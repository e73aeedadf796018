"""State-based MLP actor-critic (Gaussian actions)."""

from embodied_async.registry import register_model
from models.mlp.modeling_mlp import MLPPolicy


@register_model("mlp", module="models.mlp")
def build_mlp_policy(model_cfg, env_spec) -> MLPPolicy:
    return MLPPolicy(model_cfg, env_spec)


__all__ = ["MLPPolicy", "build_mlp_policy"]
